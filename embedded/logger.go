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

	// When the hub at an address (host:port) last dropped this node's
	// leafnode connection as a duplicate.
	leafDups map[string]time.Time
	// When the hub at an address last closed this node's leafnode
	// connection for a message over its max_payload.
	leafPayload map[string]time.Time
	// When the hub at an address last refused this node's leafnode
	// credentials.
	leafAuth map[string]time.Time
}

// leafDuplicate is what nats-server (v2.15.2) logs on an edge whose hub
// dropped its leafnode connection because another one came from a server
// of the same name (or the same server, over a second remote), in the same
// account; the connection's prefix names the hub's address.
var leafDuplicate = regexp.MustCompile(`^(\S+) - lid:\d+ - Leafnode Error 'Duplicate Remote LeafNode Connection'`)

// leafPayloadViolation is what nats-server (v2.15.2) logs on an edge whose
// hub closed its leafnode connection for a message larger than the hub's
// max_payload (leafnode.go, maxPayloadViolation).
var leafPayloadViolation = regexp.MustCompile(`^(\S+) - lid:\d+ - Leafnode Error 'Maximum Payload Violation'`)

// leafAuthViolation is what nats-server (v2.15.2) logs on an edge whose
// hub refused its leafnode credentials.
var leafAuthViolation = regexp.MustCompile(`^(\S+) - lid:\d+ - Leafnode Error 'Authorization Violation'`)

// noteLeafDuplicate records the hub's address when msg says it dropped a
// leafnode connection as a duplicate, or closed it for a message over its
// max_payload.
func (l *serverLogger) noteLeafDuplicate(msg string) {
	at, m := &l.leafDups, leafDuplicate.FindStringSubmatch(msg)
	if m == nil {
		at, m = &l.leafPayload, leafPayloadViolation.FindStringSubmatch(msg)
	}
	if m == nil {
		at, m = &l.leafAuth, leafAuthViolation.FindStringSubmatch(msg)
	}
	if m == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if *at == nil {
		*at = map[string]time.Time{}
	}
	(*at)[m[1]] = time.Now()
}

// LeafAuthViolationAt returns when the hub at addr last refused this
// node's leafnode credentials (zero: never).
func (l *serverLogger) LeafAuthViolationAt(addr string) time.Time {
	if l == nil {
		return time.Time{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leafAuth[addr]
}

// LeafPayloadViolationAt returns when the hub at addr last closed a
// leafnode connection of this node for a message over its max_payload
// (zero: never).
func (l *serverLogger) LeafPayloadViolationAt(addr string) time.Time {
	if l == nil {
		return time.Time{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leafPayload[addr]
}

// LeafDuplicateAt returns when the hub at addr last dropped a leafnode
// connection of this node as a duplicate (zero: never).
func (l *serverLogger) LeafDuplicateAt(addr string) time.Time {
	if l == nil {
		return time.Time{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leafDups[addr]
}

// routeNameConflict is what nats-server (v2.15.2, route.go) logs when a
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

// storeWriteErrors are what nats-server (v2.15.2) logs when a write to the
// file store fails: filestore.go and raft.go "Critical write error",
// stream.go "JetStream failed to store a msg", jetstream.go "JetStream out
// of ... resources" and the permission-denied shutdowns. A file store that
// got a write error refuses every later write until it is opened again
// (fileStore.werr is never cleared), even after space was freed.
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
	l.log.Info(fmt.Sprintf(format, v...))
}

func (l *serverLogger) Warnf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	l.noteStoreError(msg)
	if msg == plaintextPasswordsWarning {
		// About holdfast's own identities (the in-process user's random
		// per-start password, the password-less no_auth_user): configured
		// users must have bcrypt hashes, so it never concerns the operator.
		l.log.Debug(msg)
		return
	}
	l.log.Warn(msg)
}

// plaintextPasswordsWarning is what nats-server logs at every start when
// a user has no bcrypt hash.
const plaintextPasswordsWarning = "Plaintext passwords detected, use nkeys or bcrypt"

func (l *serverLogger) Errorf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	l.noteStoreError(msg)
	l.noteRouteRefusal(msg)
	l.noteLeafDuplicate(msg)
	l.log.Error(msg)
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

func (s *Server) serverLogger() *serverLogger {
	ns := s.NATS()
	if ns == nil {
		return nil
	}
	l, _ := ns.Logger().(*serverLogger)
	return l
}
