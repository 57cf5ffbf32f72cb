package daemon

import (
	"cmp"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/crypto/bcrypt"

	"github.com/holdfast-io/holdfast/config"
)

// httpAuth decides who may use the monitoring listener.
//
// Beyond loopback, with [auth], every path but /healthz and /readyz (load
// balancers and systemd probe them) needs HTTP Basic credentials: an
// [auth.users] name and password, or the [auth] token as the password of
// any name. On loopback everything reads without credentials, as before:
// the processes of the host. Changing anything — the status page's
// dead-letter actions — always needs a logged-in user with admin = true,
// and a CSRF token (csrfToken) in the X-Holdfast-CSRF header.
type httpAuth struct {
	// required: reading needs credentials (non-loopback listener, [auth]).
	required bool
	users    map[string]httpUser
	token    string // the [auth] token, plain or bcrypt; "" without
	// decoy is a user's hash that a name no user has is checked against,
	// so that a wrong name costs what a wrong password costs and the
	// time of an answer does not tell which names exist.
	decoy string
	// secret keys the CSRF tokens, new at each start.
	secret [32]byte
	// verified caches sha256(name, password) of credentials bcrypt has
	// accepted (the token's with the name left out), so that a page
	// polling every 3 s costs one bcrypt per login, not one per poll.
	verified sync.Map
	// hosts, on a loopback listener, are the names besides the loopback
	// ones a request's Host may carry (see hostAllowed); nil beyond
	// loopback.
	hosts map[string]bool
	// checks admits one bcrypt check at a time; checksWaiting counts
	// those waiting for it (see identify).
	checks        chan struct{}
	checksWaiting atomic.Int32
	// compare is bcrypt.CompareHashAndPassword (tests count the calls).
	compare func(hash, password []byte) error
}

// maxChecksWaiting bounds the credential checks waiting for the one that
// runs: beyond it a request is answered 429 at once.
const maxChecksWaiting = 8

type httpUser struct {
	hash  string
	admin bool
}

// identity is who a request is from: name "" for nobody. busy: its
// credentials could not be checked now (too many checks waiting).
type identity struct {
	name  string
	admin bool
	busy  bool
}

// newHTTPAuth builds the listener's authentication from cfg and its
// secrets (nil without [auth]).
func newHTTPAuth(cfg *config.Config, sec *config.Secrets) *httpAuth {
	a := &httpAuth{users: map[string]httpUser{}, checks: make(chan struct{}, 1), compare: bcrypt.CompareHashAndPassword}
	if _, err := rand.Read(a.secret[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	host, _, err := net.SplitHostPort(cfg.HTTP.Listen)
	a.required = err == nil && !config.IsLoopback(host) && cfg.Auth.Enabled()
	if err == nil && config.IsLoopback(host) {
		a.hosts = map[string]bool{}
		if name, err := os.Hostname(); err == nil {
			a.hosts[strings.ToLower(name)] = true
		}
		for _, h := range cfg.HTTP.AllowedHosts {
			a.hosts[strings.ToLower(h)] = true
		}
	}
	if sec == nil {
		return a
	}
	a.token = sec.Token
	for _, name := range slices.Sorted(maps.Keys(cfg.Auth.Users)) {
		if hash, ok := sec.Passwords[name]; ok {
			a.users[name] = httpUser{hash: hash, admin: cfg.Auth.Users[name].Admin}
			a.decoy = cmp.Or(a.decoy, hash)
		}
	}
	return a
}

// identify returns who the request's Basic credentials name, if they hold.
func (a *httpAuth) identify(r *http.Request) identity {
	if a == nil {
		return identity{}
	}
	name, password, ok := r.BasicAuth()
	if !ok {
		return identity{}
	}
	u, isUser := a.users[name]
	// Credentials that name no user can only be the token's, whatever
	// the name: they are remembered by the password alone, once.
	who := name
	if !isUser {
		who = ""
	}
	key := sha256.Sum256([]byte(who + "\x00" + password))
	if _, seen := a.verified.Load(key); seen {
		return identity{name: name, admin: isUser && u.admin}
	}
	// A bcrypt check costs tens of milliseconds of a core, by design.
	// Unbounded, a flood of wrong passwords (no credentials needed to
	// send one) would take every core from the server: NATS and MQTT
	// clients were refused in such a test. One check runs at a time, a
	// few wait, the rest are refused at once; credentials already
	// checked (verified) never wait.
	if a.checksWaiting.Add(1) > maxChecksWaiting {
		a.checksWaiting.Add(-1)
		return identity{busy: true}
	}
	a.checks <- struct{}{}
	a.checksWaiting.Add(-1)
	defer func() { <-a.checks }()
	switch {
	case isUser && a.compare([]byte(u.hash), []byte(password)) == nil:
		a.verified.Store(key, struct{}{})
		return identity{name: name, admin: u.admin}
	case !isUser && a.token != "" && a.tokenMatches(password):
		a.verified.Store(key, struct{}{})
		return identity{name: name}
	case !isUser && a.decoy != "":
		_ = a.compare([]byte(a.decoy), []byte(password))
	}
	return identity{}
}

// tokenMatches checks presented against the [auth] token.
func (a *httpAuth) tokenMatches(presented string) bool {
	if config.IsBcrypt(a.token) {
		return a.compare([]byte(a.token), []byte(presented)) == nil
	}
	return subtle.ConstantTimeCompare([]byte(a.token), []byte(presented)) == 1
}

// tooBusy answers a request whose credentials could not be checked now.
func tooBusy(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "1")
	writeJSON(w, http.StatusTooManyRequests, map[string]string{"error": "too many logins being checked at once: try again in a second"})
}

// open paths answer without credentials wherever the listener is.
var openPaths = map[string]bool{"/healthz": true, "/readyz": true}

// guard wraps the listener's handler: 401 for a read without valid
// credentials where they are required.
func (a *httpAuth) guard(next http.Handler) http.Handler {
	if a == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !a.hostAllowed(r.Host) {
			// The names it answers are not listed: a page that reached
			// here under its own name would read them.
			writeJSON(w, http.StatusMisdirectedRequest, map[string]string{"error": fmt.Sprintf(
				"Host %q is not a name of this host: the listener is on loopback, and answers localhost, loopback addresses, the host's name and http.allowed_hosts; to reach it under another name (a reverse proxy passing its own Host), add it to http.allowed_hosts",
				r.Host)})
			return
		}
		w = noCORS{w}
		if a.required && !openPaths[r.URL.Path] {
			if id := a.identify(r); id.busy {
				tooBusy(w)
				return
			} else if id.name == "" {
				challenge(w, "log in with an [auth.users] name and password")
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// hostAllowed reports whether a request for host (the Host header, with
// or without port) is one the listener answers. Beyond loopback every
// one: credentials guard it. On loopback only localhost and its
// subdomains, loopback addresses, this host's name and
// http.allowed_hosts: a web page of any site can make a browser on the
// host send requests to 127.0.0.1 under the site's own name (DNS
// rebinding) and read the answers; browsers never resolve *.localhost
// elsewhere, and a site cannot have the others as its name.
func (a *httpAuth) hostAllowed(host string) bool {
	if a.hosts == nil {
		return true
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.ToLower(strings.TrimSuffix(strings.Trim(host, "[]"), "."))
	if host == "localhost" || strings.HasSuffix(host, ".localhost") || a.hosts[host] {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// noCORS drops the Access-Control-Allow-Origin: * the NATS server's
// monitoring handlers set: it lets a page of any web site read their
// answers (connections with their users, subscriptions, accounts).
type noCORS struct{ http.ResponseWriter }

func (w noCORS) WriteHeader(code int) {
	w.Header().Del("Access-Control-Allow-Origin")
	w.ResponseWriter.WriteHeader(code)
}

func (w noCORS) Write(b []byte) (int, error) {
	w.Header().Del("Access-Control-Allow-Origin")
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w noCORS) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func challenge(w http.ResponseWriter, why string) {
	w.Header().Set("WWW-Authenticate", `Basic realm="holdfast", charset="UTF-8"`)
	writeJSON(w, http.StatusUnauthorized, map[string]string{"error": why})
}

// csrfToken is the token an admin's page sends back with each action:
// only a page that could read this listener's answers (same origin)
// knows it.
func (a *httpAuth) csrfToken(name string) string {
	m := hmac.New(sha256.New, a.secret[:])
	m.Write([]byte(name))
	return hex.EncodeToString(m.Sum(nil))
}

// admin checks an action: an admin's credentials, the CSRF token, and an
// Origin (when the browser sends one) of this listener. It answers the
// refusal itself and returns false then.
func (a *httpAuth) admin(w http.ResponseWriter, r *http.Request) (identity, bool) {
	id := a.identify(r)
	if id.busy {
		tooBusy(w)
		return id, false
	}
	if id.name == "" {
		challenge(w, "log in as a user with admin = true to change anything")
		return id, false
	}
	if !id.admin {
		writeJSON(w, http.StatusForbidden, map[string]string{"error": "user " + id.name + " may read, not change: set admin = true in [auth.users." + id.name + "]"})
		return id, false
	}
	got := r.Header.Get("X-Holdfast-CSRF")
	if got == "" || !hmac.Equal([]byte(got), []byte(a.csrfToken(id.name))) {
		writeJSON(w, http.StatusForbidden, map[string]string{"error": "missing or wrong CSRF token (X-Holdfast-CSRF): reload the page"})
		return id, false
	}
	if origin := r.Header.Get("Origin"); origin != "" && !sameOrigin(origin, r.Host) {
		writeJSON(w, http.StatusForbidden, map[string]string{"error": "cross-origin request refused"})
		return id, false
	}
	return id, true
}

func sameOrigin(origin, host string) bool {
	rest, ok := strings.CutPrefix(origin, "http://")
	if !ok {
		rest, ok = strings.CutPrefix(origin, "https://")
	}
	return ok && strings.EqualFold(rest, host)
}
