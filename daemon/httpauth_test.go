package daemon

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/internal/natstest"
)

func authFor(t *testing.T, listen string, edit func(*config.Config, *config.Secrets)) *httpAuth {
	t.Helper()
	cfg := config.DefaultConfig()
	cfg.HTTP.Listen = listen
	sec := &config.Secrets{Passwords: map[string]string{}}
	edit(cfg, sec)
	return newHTTPAuth(cfg, sec)
}

func hashOf(t *testing.T, password string) string {
	h, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	return string(h)
}

// Who may read: everyone on loopback; beyond it, users and the token,
// and everyone only /healthz and /readyz.
func TestHTTPAuthReading(t *testing.T) {
	users := func(c *config.Config, s *config.Secrets) {
		c.Auth.Users = map[string]*config.UserConfig{"ops": {PasswordFile: "/x", Admin: true}, "viewer": {PasswordFile: "/y"}}
		s.Passwords["ops"], s.Passwords["viewer"] = hashOf(t, "ops-pw"), hashOf(t, "viewer-pw")
	}
	token := func(c *config.Config, s *config.Secrets) {
		c.Auth.Token = "0123456789abcdef0123"
		s.Token = c.Auth.Token
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	for _, tc := range []struct {
		name, listen string
		edit         func(*config.Config, *config.Secrets)
		path         string
		user, pw     string
		want         int
	}{
		{"loopback, nobody", "127.0.0.1:8222", users, "/status.json", "", "", 200},
		{"network, nobody", "0.0.0.0:8222", users, "/status.json", "", "", 401},
		{"network, nobody, healthz", "0.0.0.0:8222", users, "/healthz", "", "", 200},
		{"network, nobody, readyz", "0.0.0.0:8222", users, "/readyz", "", "", 200},
		{"network, viewer", "0.0.0.0:8222", users, "/metrics", "viewer", "viewer-pw", 200},
		{"network, wrong password", "0.0.0.0:8222", users, "/metrics", "viewer", "ops-pw", 401},
		{"network, unknown user", "0.0.0.0:8222", users, "/metrics", "root", "ops-pw", 401},
		{"network, token", "0.0.0.0:8222", token, "/nats/connz", "prometheus", "0123456789abcdef0123", 200},
		{"network, wrong token", "0.0.0.0:8222", token, "/nats/connz", "prometheus", "0123456789abcdef0124", 401},
		{"network, no auth (allow_anonymous)", "0.0.0.0:8222", func(*config.Config, *config.Secrets) {}, "/status.json", "", "", 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := authFor(t, tc.listen, tc.edit)
			for range 2 { // the second time from the cache
				r := httptest.NewRequest("GET", tc.path, nil)
				r.Host = "localhost:8222" // httptest's example.com is not this host (TestHTTPHostsOnLoopback)
				if tc.user != "" {
					r.SetBasicAuth(tc.user, tc.pw)
				}
				w := httptest.NewRecorder()
				a.guard(ok).ServeHTTP(w, r)
				if w.Code != tc.want {
					t.Fatalf("%s: %d, want %d", tc.path, w.Code, tc.want)
				}
				if tc.want == 401 && w.Header().Get("WWW-Authenticate") == "" {
					t.Fatal("401 without a WWW-Authenticate challenge")
				}
			}
		})
	}
}

func TestSameOrigin(t *testing.T) {
	for _, tc := range []struct {
		origin, host string
		want         bool
	}{
		{"http://127.0.0.1:8222", "127.0.0.1:8222", true},
		{"https://edge-01:8222", "EDGE-01:8222", true},
		{"http://evil.example", "127.0.0.1:8222", false},
		{"http://127.0.0.1:8222.evil.example", "127.0.0.1:8222", false},
		{"null", "127.0.0.1:8222", false},
	} {
		if got := sameOrigin(tc.origin, tc.host); got != tc.want {
			t.Errorf("sameOrigin(%q, %q) = %v", tc.origin, tc.host, got)
		}
	}
}

// A loopback listener answers only requests for a loopback name: a web
// page of any site can make a browser on the host send requests to
// 127.0.0.1 under its own name (DNS rebinding) and read the answers
// (dead letters' payloads, connections). The NATS server's handlers allow
// every origin to read them (Access-Control-Allow-Origin: *): not here.
func TestHTTPHostsOnLoopback(t *testing.T) {
	host, _ := os.Hostname()
	cors := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Access-Control-Allow-Origin", "*")
		w.Write([]byte("{}"))
	})
	for _, tc := range []struct {
		listen, host string
		allowed      []string
		want         int
	}{
		{"127.0.0.1:8222", "127.0.0.1:8222", nil, 200},
		{"127.0.0.1:8222", "localhost:8222", nil, 200},
		{"127.0.0.1:8222", "localhost", nil, 200},
		{"127.0.0.1:8222", "app.localhost:8222", nil, 200},
		{"127.0.0.1:8222", "127.0.1.1:8222", nil, 200},
		{"127.0.0.1:8222", "[::1]:8222", nil, 200},
		{"127.0.0.1:8222", host + ":8222", nil, 200},
		{"127.0.0.1:8222", "rebind.attacker.example:8222", nil, 421},
		{"127.0.0.1:8222", "10.0.0.5:8222", nil, 421},
		{"127.0.0.1:8222", "", nil, 421},
		{"127.0.0.1:8222", "edge-01.example.net", []string{"edge-01.example.net"}, 200},
		{"127.0.0.1:8222", "EDGE-01.example.net:443", []string{"edge-01.example.net"}, 200},
		{"0.0.0.0:8222", "rebind.attacker.example:8222", nil, 200}, // credentials guard it (and allow_anonymous says so)
	} {
		a := authFor(t, tc.listen, func(c *config.Config, _ *config.Secrets) { c.HTTP.AllowedHosts = tc.allowed })
		r := httptest.NewRequest("GET", "/nats/connz", nil)
		r.Host = tc.host
		w := httptest.NewRecorder()
		a.guard(cors).ServeHTTP(w, r)
		if w.Code != tc.want {
			t.Errorf("listen %s, Host %q: %d, want %d: %s", tc.listen, tc.host, w.Code, tc.want, w.Body)
		}
		if got := w.Header().Get("Access-Control-Allow-Origin"); got != "" {
			t.Errorf("listen %s, Host %q: Access-Control-Allow-Origin %q", tc.listen, tc.host, got)
		}
	}
}

// A flood of wrong passwords runs one bcrypt check at a time, lets
// maxChecksWaiting wait and answers the rest 429 at once: unbounded, it
// took every core from the server (NATS and MQTT clients were refused
// during one). Credentials already checked never wait.
func TestHTTPAuthChecksBounded(t *testing.T) {
	a := authFor(t, "0.0.0.0:8222", func(c *config.Config, s *config.Secrets) {
		c.Auth.Users = map[string]*config.UserConfig{"ops": {PasswordFile: "/x"}}
		s.Passwords["ops"] = hashOf(t, "ops-pw")
	})
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	get := func(user, pw string) int {
		r := httptest.NewRequest("GET", "/status.json", nil)
		r.SetBasicAuth(user, pw)
		w := httptest.NewRecorder()
		a.guard(ok).ServeHTTP(w, r)
		return w.Code
	}
	if code := get("ops", "ops-pw"); code != 200 {
		t.Fatalf("ops: %d", code)
	}
	var running, most atomic.Int32
	compare := a.compare
	a.compare = func(hash, pw []byte) error {
		n := running.Add(1)
		defer running.Add(-1)
		for old := most.Load(); n > old && !most.CompareAndSwap(old, n); old = most.Load() {
		}
		return compare(hash, pw)
	}
	a.checks <- struct{}{} // a check runs
	codes := make(chan int, maxChecksWaiting)
	for i := range maxChecksWaiting {
		go func() { codes <- get("ops", fmt.Sprintf("wrong-%d", i)) }()
	}
	natstest.CheckFor(t, 10*time.Second, time.Millisecond, func() error {
		if n := a.checksWaiting.Load(); n != maxChecksWaiting {
			return fmt.Errorf("%d checks waiting", n)
		}
		return nil
	})
	if code := get("ops", "wrong-again"); code != http.StatusTooManyRequests {
		t.Errorf("a check beyond those waiting: %d, want 429", code)
	}
	done := make(chan int, 1)
	go func() { done <- get("ops", "ops-pw") }()
	select {
	case code := <-done:
		if code != 200 {
			t.Errorf("ops, already checked, during the flood: %d", code)
		}
	case <-time.After(10 * time.Second):
		t.Error("ops, already checked, waits for the checks of others")
	}
	<-a.checks
	for range maxChecksWaiting {
		if code := <-codes; code != 401 {
			t.Errorf("a wrong password that waited: %d, want 401", code)
		}
	}
	if most.Load() != 1 {
		t.Errorf("%d bcrypt checks ran at once, want 1", most.Load())
	}
}

// A wrong name costs the bcrypt check a wrong password costs: answered
// sooner, it would tell anyone who reaches the listener which user
// names exist (the admin's among them).
func TestHTTPAuthUnknownUserChecked(t *testing.T) {
	t.Parallel()
	a := authFor(t, "0.0.0.0:8222", func(c *config.Config, s *config.Secrets) {
		c.Auth.Users = map[string]*config.UserConfig{"ops": {PasswordFile: "/x", Admin: true}}
		s.Passwords["ops"] = hashOf(t, "ops-pw")
	})
	var checks atomic.Int32
	compare := a.compare
	a.compare = func(hash, pw []byte) error {
		checks.Add(1)
		return compare(hash, pw)
	}
	for _, name := range []string{"ops", "root"} {
		checks.Store(0)
		r := httptest.NewRequest("GET", "/status.json", nil)
		r.SetBasicAuth(name, "wrong")
		if id := a.identify(r); id.name != "" {
			t.Fatalf("%s with a wrong password identified as %+v", name, id)
		}
		if n := checks.Load(); n != 1 {
			t.Errorf("%s with a wrong password: %d bcrypt checks, want 1", name, n)
		}
	}
}

// With a token, the name is anyone's to choose: each name presented with
// the token must not be remembered apart, or a client that holds the
// token grows the daemon's memory without bound, one name a request.
func TestHTTPAuthTokenCacheBounded(t *testing.T) {
	t.Parallel()
	a := authFor(t, "0.0.0.0:8222", func(c *config.Config, s *config.Secrets) {
		c.Auth.Token = "0123456789abcdef0123"
		s.Token = c.Auth.Token
	})
	for i := range 100 {
		r := httptest.NewRequest("GET", "/metrics", nil)
		r.SetBasicAuth(fmt.Sprintf("name-%d", i), "0123456789abcdef0123")
		if id := a.identify(r); id.name != fmt.Sprintf("name-%d", i) {
			t.Fatalf("the token with name-%d: %+v", i, id)
		}
	}
	cached := 0
	a.verified.Range(func(any, any) bool { cached++; return true })
	if cached != 1 {
		t.Fatalf("%d credentials remembered after 100 names with the one token, want 1", cached)
	}
}
