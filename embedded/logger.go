package embedded

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/holdfast-io/holdfast/embedded/store"
)

// serverLogger bridges nats-server's Logger interface to slog. Fatalf does
// not exit the process: it records the error so that start-up can return
// it (the server calls Fatalf when, for example, JetStream cannot be
// enabled, and then never becomes ready).
type serverLogger struct {
	log   *slog.Logger
	once  sync.Once
	fatal chan error

	// The store's write errors, as the server logs them.
	mu         sync.Mutex
	writeErrs  uint64
	firstWrite string
	firstAt    time.Time

	// Why the other nodes refuse this node's routes, as the server last
	// logged it, and when.
	routeRefusal   string
	routeRefusedAt time.Time

	// The last route refused because the server at the other end has
	// this node's server name: that name, the other end's address, when.
	dupName, dupAddr string
	dupAt            time.Time

	// When the hub at an address (host:port) last sent this node's
	// leafnode connection each of the errors below, or the TLS handshake
	// with it failed, and the server's words.
	leafErrs map[leafErrKey]leafErrSeen

	// The streams and consumers the server could not load while it
	// recovered the store, by name.
	loadFailures map[string]store.StreamLoadFailure

	// The server's reason for the last stream or consumer it failed to
	// create (its API error to the client says only "error creating store").
	createFailure string

	// Lines per kind (the server's format, which names the connection),
	// so that no client can flood the log.
	repeats repeatLimit
}

// logLimited logs msg at level unless lines of format came too often (see
// repeatBurst); the first one logged after some were held back says how
// many.
func (l *serverLogger) logLimited(level slog.Level, format, msg string) {
	ok, held := l.repeats.allow(format, time.Now())
	if !ok {
		return
	}
	if held > 0 {
		l.log.Log(context.Background(), level, msg, "similar_lines_held_back", held)
		return
	}
	l.log.Log(context.Background(), level, msg)
}

// The leafnode errors a hub sends an edge that holdfast reports, as the
// nats-server in go.mod words them.
const (
	// leafDuplicate: the hub dropped the connection because another one
	// came from a server of the same name (or the same server, over a
	// second remote), in the same account.
	leafDuplicate = "Duplicate Remote LeafNode Connection"
	// leafPayloadViolation: the hub closed it for a message larger than
	// its max_payload.
	leafPayloadViolation = "Maximum Payload Violation"
	// leafAuthViolation: the hub refused its credentials.
	leafAuthViolation = "Authorization Violation"
	// leafTLSFailure: the TLS handshake with the hub failed: a ca_file
	// that did not sign the hub's certificate, TLS on one side only, a
	// client certificate missing or refused. Not a hub error: what the
	// edge's server logs of its own handshake (leafTLSError).
	leafTLSFailure = "TLS handshake"
)

// leafTLSError is how nats-server logs a leafnode's
// failed TLS handshake, and then the connection's close for it; the
// prefix names the hub's address on the edge. When the hub spoke no TLS
// (or did not answer) the handshake error is logged at debug level only,
// and the close says it all.
var leafTLSError = regexp.MustCompile(`^(\S+) - lid:\d+ - (?:TLS leafnode handshake error: (.*)|Leafnode connection closed: TLS Handshake Failure)$`)

// leafReadError: the hub closed the connection, seen as a read error.
// Over TLS 1.3 a hub with leafnodes.verify refuses an edge without a
// client certificate that way: the handshake ends on the edge's side
// before the hub checks, and its refusal comes with the first read.
const leafReadError = "Read Error"

// leafReadErrorLine is how nats-server logs it.
var leafReadErrorLine = regexp.MustCompile(`^(\S+) - lid:\d+ - Leafnode connection closed: Read Error$`)

// leafTLSNoDetail stands for the handshake error the server logged at
// debug level only.
const leafTLSNoDetail = "the hub answered without TLS (does it have leafnodes.cert_file?), or did not finish the handshake"

// leafError is how nats-server logs on an edge an error its hub
// sent over a leafnode connection; the connection's prefix names the
// hub's address.
var leafError = regexp.MustCompile(`^(\S+) - lid:\d+ - Leafnode Error '([^']*)'`)

type leafErrKey struct{ addr, kind string }

type leafErrSeen struct {
	at     time.Time
	detail string
	count  int // in a row, each within leafDuplicateFor of the one before
}

// noteLeafError records the hub's address when msg says it sent one of
// the leafnode errors above, or that the TLS handshake with it failed.
func (l *serverLogger) noteLeafError(msg string) {
	var addr, kind, detail string
	if m := leafError.FindStringSubmatch(msg); m != nil {
		switch m[2] {
		case leafDuplicate, leafPayloadViolation, leafAuthViolation:
			addr, kind = m[1], m[2]
		default:
			return
		}
	} else if m := leafReadErrorLine.FindStringSubmatch(msg); m != nil {
		addr, kind = m[1], leafReadError
	} else if m := leafTLSError.FindStringSubmatch(msg); m != nil {
		// A timeout is a link that does not answer, not a TLS mismatch.
		if strings.Contains(m[2], "timeout") {
			return
		}
		addr, kind, detail = m[1], leafTLSFailure, m[2]
	} else {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.leafErrs == nil {
		l.leafErrs = map[leafErrKey]leafErrSeen{}
	}
	k := leafErrKey{addr, kind}
	if kind == leafTLSFailure && detail == "" {
		// The close after a handshake error: keep the error's words.
		detail = leafTLSNoDetail
		if prev := l.leafErrs[k]; time.Since(prev.at) < time.Second {
			detail = prev.detail
		}
	}
	if len(l.leafErrs) >= 64 {
		// A hub logs the failed handshakes of the edges that connect to
		// it under their ephemeral ports: keep only what is reported.
		for old, e := range l.leafErrs {
			if time.Since(e.at) >= leafDuplicateFor {
				delete(l.leafErrs, old)
			}
		}
	}
	n := 1
	if prev := l.leafErrs[k]; time.Since(prev.at) < leafDuplicateFor {
		n = prev.count + 1
	}
	l.leafErrs[k] = leafErrSeen{at: time.Now(), detail: detail, count: n}
}

// LeafErrorAt returns when the hub at addr last sent this node's leafnode
// connection the error kind (leafDuplicate, leafPayloadViolation,
// leafAuthViolation), or the TLS handshake with it last failed
// (leafTLSFailure); zero: never.
func (l *serverLogger) LeafErrorAt(addr, kind string) time.Time {
	at, _ := l.LeafError(addr, kind)
	return at
}

// LeafError is LeafErrorAt with the server's words for the error ("" when
// it gave none).
func (l *serverLogger) LeafError(addr, kind string) (time.Time, string) {
	at, detail, _ := l.leafErrorCount(addr, kind)
	return at, detail
}

// leafErrorCount is LeafError with how many times in a row it came.
func (l *serverLogger) leafErrorCount(addr, kind string) (time.Time, string, int) {
	if l == nil {
		return time.Time{}, "", 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.leafErrs[leafErrKey{addr, kind}]
	return e.at, e.detail, e.count
}

// routeNameConflict is what nats-server logs when a
// route's cluster name is not this node's: the remote's, then ours; or,
// inside "Route Error '...'", what the other node sent back (ours first).
var routeNameConflict = regexp.MustCompile(`Rejecting connection, cluster name "([^"]*)" does not match "([^"]*)"`)

// noteRouteRefusal records why a route was refused, when msg says so, in
// the words of the keys to fix.
func (l *serverLogger) noteRouteRefusal(msg string) {
	var why string
	switch m := routeNameConflict.FindStringSubmatch(msg); {
	case m != nil:
		ours, theirs := m[2], m[1]
		if strings.Contains(msg, "Route Error '") {
			// The other node's words, sent back: its name comes second.
			ours, theirs = theirs, ours
		}
		why = fmt.Sprintf("cluster.name is %q here but %q on the node at the other end of a route: give every node of the cluster the same cluster.name", ours, theirs)
	case strings.Contains(msg, "Route Error 'Authorization Violation'"):
		why = "the other nodes refuse this node's cluster.user and cluster.password_file (Authorization Violation): every node needs the same user and password"
	default:
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.routeRefusal, l.routeRefusedAt = why, time.Now()
}

// routeDuplicateName is what nats-server logs when it
// accepts a route from a server with its own server name (the connection's
// prefix names the other end's address); it then closes that route, and
// the nodes keep trying again.
var routeDuplicateName = regexp.MustCompile(`^(\S+) - rid:\d+ - Remote server has a duplicate name: "([^"]*)"`)

// noteDuplicateName records the name and the other end's address when msg
// says a route came from a server with this node's name.
func (l *serverLogger) noteDuplicateName(msg string) {
	m := routeDuplicateName.FindStringSubmatch(msg)
	if m == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dupName, l.dupAddr, l.dupAt = m[2], m[1], time.Now()
}

// RouteRefusal is why routes were last refused, when that was within
// the last d; "" otherwise.
func (l *serverLogger) RouteRefusal(d time.Duration) string {
	if l == nil {
		return ""
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.routeRefusal == "" || time.Since(l.routeRefusedAt) > d {
		return ""
	}
	return l.routeRefusal
}

// storeWriteErrors are what nats-server logs when a write to the file
// store fails: "Critical write error", "JetStream failed to store a msg",
// "JetStream out of ... resources" and the permission-denied shutdowns. A
// file store that got a write error refuses every later write until it
// is opened again, even after space is freed.
var storeWriteErrors = []string{"Critical write error", "JetStream failed to store a msg", "JetStream out of",
	"permission denied while writing"}

// noteStoreError records msg when it reports a failed write to the store.
func (l *serverLogger) noteStoreError(msg string) {
	for _, p := range storeWriteErrors {
		if strings.Contains(msg, p) {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.writeErrs++
			if l.firstWrite == "" {
				l.firstWrite, l.firstAt = msg, time.Now()
			}
			return
		}
	}
}

func newServerLogger(log *slog.Logger) *serverLogger {
	return &serverLogger{log: log, fatal: make(chan error, 1)}
}

func (l *serverLogger) Noticef(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	if strings.HasSuffix(msg, "TLS Handshake Failure") || strings.HasSuffix(msg, "closed: Read Error") {
		l.noteLeafError(msg)
	}
	l.logLimited(slog.LevelInfo, format, msg)
}

func (l *serverLogger) Warnf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	l.noteStoreError(msg)
	l.noteLoadFailure(format, v)
	if strings.HasPrefix(format, "Stream create failed for ") || strings.HasPrefix(format, "Consumer create failed for ") {
		l.mu.Lock()
		l.createFailure = msg
		l.mu.Unlock()
	}
	if msg == plaintextPasswordsWarning {
		// About holdfast's own identities (the in-process user's random
		// per-start password, the password-less no_auth_user): configured
		// users must have bcrypt hashes, so it never concerns the operator.
		l.log.Debug(msg)
		return
	}
	l.logLimited(slog.LevelWarn, format, msg)
}

// plaintextPasswordsWarning is what nats-server logs at every start when
// a user has no bcrypt hash.
const plaintextPasswordsWarning = "Plaintext passwords detected, use nkeys or bcrypt"

func (l *serverLogger) Errorf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	l.noteStoreError(msg)
	l.noteRouteRefusal(msg)
	l.noteDuplicateName(msg)
	l.noteLeafError(msg)
	l.logLimited(slog.LevelError, format, msg)
}

func (l *serverLogger) Fatalf(format string, v ...any) {
	err := fmt.Errorf(format, v...)
	l.log.Error(err.Error(), "fatal", true)
	l.once.Do(func() { l.fatal <- err })
}

func (l *serverLogger) Debugf(format string, v ...any) {
	if l.log.Enabled(context.Background(), slog.LevelDebug) {
		l.log.Debug(fmt.Sprintf(format, v...))
	}
}

func (l *serverLogger) Tracef(format string, v ...any) {
	if l.log.Enabled(context.Background(), slog.LevelDebug-4) {
		l.log.Log(context.Background(), slog.LevelDebug-4, fmt.Sprintf(format, v...))
	}
}

// ErrStoreWrite is the sentinel a StoreWriteError unwraps to.
var ErrStoreWrite = errors.New("the store cannot be written")

// StoreWriteError says that the server failed to write to the store: the
// first error it logged, when, and how many since.
type StoreWriteError struct {
	First string
	At    time.Time
	Count uint64
}

func (e *StoreWriteError) Error() string {
	return fmt.Sprintf("%s: %d write error(s) since %s, first: %s (a stream that failed a write refuses every later one until holdfast restarts; "+
		"free space on the store's disk or repair it)", ErrStoreWrite, e.Count, e.At.UTC().Format(time.RFC3339), e.First)
}

// Unwrap returns ErrStoreWrite.
func (e *StoreWriteError) Unwrap() error { return ErrStoreWrite }

// StoreWriteErrors returns how many store write errors the server logged
// since start.
func (s *Server) StoreWriteErrors() uint64 {
	l := s.serverLogger()
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.writeErrs
}

// StoreWriteFault returns a *StoreWriteError once the server logged a
// failed write to the store, nil before.
func (s *Server) StoreWriteFault() error {
	l := s.serverLogger()
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.writeErrs == 0 {
		return nil
	}
	return &StoreWriteError{First: l.firstWrite, At: l.firstAt, Count: l.writeErrs}
}

// ErrDuplicateServerName is the sentinel a DuplicateNameError unwraps to.
var ErrDuplicateServerName = errors.New("another node of the cluster has this node's server.name")

// DuplicateNameError says that a server with this node's server.name
// connected to the cluster: nats-server refuses the route between the two,
// but both still join through the other nodes, which count them as one
// Raft peer (a peer's identity is a hash of its name), so each one's vote
// and each one's copy may stand for the other's.
type DuplicateNameError struct {
	Cluster, Name, Addr string
	At                  time.Time
}

func (e *DuplicateNameError) Error() string {
	return fmt.Sprintf("%s: a server connecting from %s also calls itself %q in cluster %s (last seen %s): the other nodes would count both as one Raft peer, "+
		"so a message acknowledged by one of them may be missing on the other; give every node its own server.name: "+
		"stop the misnamed one, empty its store dir (the others hold the data) and start it under its own name",
		ErrDuplicateServerName, e.Addr, e.Name, e.Cluster, e.At.UTC().Format(time.RFC3339))
}

// Unwrap returns ErrDuplicateServerName.
func (e *DuplicateNameError) Unwrap() error { return ErrDuplicateServerName }

// DuplicateName returns a *DuplicateNameError when the server refused a
// route from a server with this node's name within the last d (the two
// keep trying to connect, so a conflict that lasts is seen again and
// again), nil otherwise.
func (s *Server) DuplicateName(d time.Duration) error {
	l := s.serverLogger()
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dupName == "" || time.Since(l.dupAt) > d {
		return nil
	}
	return &DuplicateNameError{Cluster: s.cfg.Cluster.Name, Name: l.dupName, Addr: l.dupAddr, At: l.dupAt}
}

func (s *Server) serverLogger() *serverLogger {
	ns := s.NATS()
	if ns == nil {
		return nil
	}
	l, _ := ns.Logger().(*serverLogger)
	return l
}

// CreateFailure is the server's own words for the last stream or consumer
// it failed to create ("Stream create failed for '$G > ORDERS': ... no
// space left on device"), or "".
func (s *Server) CreateFailure() string {
	l := s.serverLogger()
	if l == nil {
		return ""
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.createFailure
}
