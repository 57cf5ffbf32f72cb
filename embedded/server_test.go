package embedded

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/holdfast-io/holdfast/embedded/store"
	"github.com/holdfast-io/holdfast/internal/configtest"
	"github.com/holdfast-io/holdfast/internal/natstest"
	"github.com/holdfast-io/holdfast/internal/subjects"
)

func TestServerOpenVerifiesFileStore(t *testing.T) {
	t.Parallel()
	cfg := configtest.Default(t)
	s := runServer(t, cfg)

	want, err := filepath.Abs(cfg.JetStream.StoreDir)
	if err != nil {
		t.Fatal(err)
	}
	if s.StoreDir() != want {
		t.Errorf("StoreDir() = %q, want %q", s.StoreDir(), want)
	}
	if !s.NATS().JetStreamEnabled() {
		t.Fatal("JetStream not enabled")
	}
	jc := s.NATS().JetStreamConfig()
	if got := filepath.Clean(jc.StoreDir); got != filepath.Join(want, server.JetStreamStoreDir) {
		t.Errorf("JetStream store dir = %q, want %q", got, filepath.Join(want, server.JetStreamStoreDir))
	}
	if jc.MaxStore != cfg.JetStream.MaxFileStore.Bytes {
		t.Errorf("JetStream max store = %d, want %d", jc.MaxStore, cfg.JetStream.MaxFileStore.Bytes)
	}
	if !jc.SyncAlways {
		t.Error("JetStream does not sync every write with sync = \"always\"")
	}
	if !s.Conn().IsConnected() {
		t.Error("in-process connection is not connected")
	}
	if _, err := s.JetStream().AccountInfo(natstest.Context(t)); err != nil {
		t.Fatalf("AccountInfo: %v", err)
	}
	if _, err := os.Stat(filepath.Join(want, store.LockFileName)); err != nil {
		t.Errorf("no lock file in the store dir: %v", err)
	}
}

func TestServerSecondOnSameStoreIsRefused(t *testing.T) {
	t.Parallel()
	cfg := configtest.Default(t)
	first := runServer(t, cfg)

	log, _ := natstest.Logger(t)
	second := New(cfg, log)
	err := openWithin(t, second, 20*time.Second)
	if err == nil {
		second.Close(context.Background())
		t.Fatal("second server on the same store dir opened")
	}
	if !errors.Is(err, store.ErrDir) {
		t.Errorf("error does not unwrap to store.ErrDir: %v", err)
	}
	if !strings.Contains(err.Error(), "locked") || !strings.Contains(err.Error(), first.StoreDir()) {
		t.Errorf("error does not say the store dir %s is locked: %v", first.StoreDir(), err)
	}
	if err := second.Close(context.Background()); err != nil {
		t.Errorf("Close after a failed Open: %v", err)
	}

	// The refusal did not disturb the first server.
	if _, err := first.JetStream().AccountInfo(natstest.Context(t)); err != nil {
		t.Fatalf("first server stopped answering: %v", err)
	}
	// Once the first is closed, the directory is free again.
	if err := first.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	runServer(t, cfg)
}

// JetStream failing to enable is reported by the server through its
// logger's Fatalf, after which it never becomes ready: Open must turn that
// into an error instead of waiting for readiness.
func TestServerJetStreamFailureIsAnError(t *testing.T) {
	t.Parallel()
	cfg := configtest.Default(t)
	log, lb := natstest.Logger(t)
	s := New(cfg, log) // default ReadyTimeout (minutes): only the fatal report can end Open in time
	// holdfast's own checks pass, but the server cannot load the
	// encryption key from a TPM this machine does not have.
	s.tweakOptions = func(o *server.Options) {
		o.JetStreamTpm.KeysFile = filepath.Join(t.TempDir(), "tpm-keys.json")
	}
	err := openWithin(t, s, 20*time.Second)
	if err == nil {
		s.Close(context.Background())
		t.Fatal("Open succeeded although JetStream could not start")
	}
	t.Logf("JetStream failure: %v", err)
	if !strings.Contains(err.Error(), "Can't start JetStream") {
		t.Errorf("error does not mention JetStream: %v", err)
	}
	if strings.Contains(err.Error(), "not ready after") {
		t.Errorf("Open waited for the ready timeout instead of returning the server's error: %v", err)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Errorf("Close after a failed Open: %v", err)
	}
	if t.Failed() {
		t.Logf("log:\n%s", lb.String())
	}
	// The store is not locked any more after the failure.
	runServer(t, cfg)
}

func TestServerPortInUseIsAnError(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg := configtest.Default(t)
	cfg.Server.Port = ln.Addr().(*net.TCPAddr).Port

	log, _ := natstest.Logger(t)
	s := New(cfg, log)
	err = openWithin(t, s, 20*time.Second)
	if err == nil {
		s.Close(context.Background())
		t.Fatalf("Open succeeded on port %d, which is in use", cfg.Server.Port)
	}
	if strings.Contains(err.Error(), "not ready after") {
		t.Errorf("Open waited for the ready timeout instead of returning the server's error: %v", err)
	}
	t.Logf("port in use: %v", err)
	if err := s.Close(context.Background()); err != nil {
		t.Errorf("Close after a failed Open: %v", err)
	}
	// The failed start released the store lock.
	cfg.Server.Port = -1
	runServer(t, cfg)
}

func TestServerCloseIsIdempotent(t *testing.T) {
	t.Parallel()
	cfg := configtest.Default(t)
	log, _ := natstest.Logger(t)

	never := New(cfg, log)
	if err := never.Close(context.Background()); err != nil {
		t.Errorf("Close of a server never opened: %v", err)
	}

	s := New(cfg, log)
	if err := s.Open(natstest.Context(t)); err != nil {
		t.Fatal(err)
	}
	ns := s.NATS()
	for i := 0; i < 3; i++ {
		if err := s.Close(context.Background()); err != nil {
			t.Fatalf("Close #%d: %v", i+1, err)
		}
	}
	if ns.Running() {
		t.Error("NATS server still running after Close")
	}
	if !s.Conn().IsClosed() {
		t.Error("in-process connection still open after Close")
	}
	if holder := store.LockHolder(s.StoreDir()); holder != "" {
		t.Errorf("store dir still locked by %s after Close", holder)
	}
}

func TestServerOpenHonoursContext(t *testing.T) {
	t.Parallel()
	cfg := configtest.Default(t)
	log, _ := natstest.Logger(t)
	s := New(cfg, log)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := s.Open(ctx)
	if err == nil {
		s.Close(context.Background())
		t.Fatal("Open with a cancelled context succeeded")
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Open with a cancelled context: %v, want context.Canceled", err)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Errorf("Close: %v", err)
	}
	if holder := store.LockHolder(cfg.JetStream.StoreDir); holder != "" {
		t.Errorf("store dir still locked by %s after a cancelled Open", holder)
	}
}

func TestOptionsFromConfig(t *testing.T) {
	t.Parallel()
	cfg := configtest.Default(t)
	cfg.Server.Port = 14222
	cfg.JetStream.Domain = "edge"
	opts := Options(cfg, "/var/lib/holdfast")
	if !opts.JetStream || opts.StoreDir != "/var/lib/holdfast" {
		t.Errorf("JetStream %v in %q, want enabled in /var/lib/holdfast", opts.JetStream, opts.StoreDir)
	}
	if !opts.NoSigs {
		t.Error("the server handles signals itself: holdfast must own them")
	}
	if opts.Host != "127.0.0.1" || opts.Port != 14222 || opts.ServerName != "holdfast-test" {
		t.Errorf("listener %s:%d name %q", opts.Host, opts.Port, opts.ServerName)
	}
	if opts.JetStreamMaxStore != 1<<30 || opts.JetStreamMaxMemory != 64<<20 {
		t.Errorf("max store %d, max memory %d: both must be set from the config", opts.JetStreamMaxStore, opts.JetStreamMaxMemory)
	}
	if opts.JetStreamDomain != "edge" || opts.MaxPayload != 1<<20+subjects.DeadLetterHeadroom {
		t.Errorf("domain %q, max payload %d", opts.JetStreamDomain, opts.MaxPayload)
	}
	if !opts.SyncAlways {
		t.Error(`sync = "always" did not set SyncAlways`)
	}

	cfg.JetStream.Sync = "2m"
	opts = Options(cfg, "/var/lib/holdfast")
	if opts.SyncAlways || opts.SyncInterval != 2*time.Minute {
		t.Errorf(`sync = "2m": SyncAlways %v, SyncInterval %s`, opts.SyncAlways, opts.SyncInterval)
	}
}

// What the client library reports only asynchronously on an in-process
// connection — here a subscription too slow for its messages, which are
// dropped — is logged with the connection and the subject, not lost.
func TestInProcessConnectionErrorsAreLogged(t *testing.T) {
	log, lb := natstest.Logger(t)
	s := runServerWithLog(t, configtest.Default(t), log)
	nc, err := s.Connect("holdfast-test-conn")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := nc.ChanSubscribe("slow.subject", make(chan *nats.Msg)); err != nil { // nobody reads it
		t.Fatal(err)
	}
	for range 10 {
		if err := nc.Publish("slow.subject", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(lb.String(), "slow consumer") {
		if time.Now().After(deadline) {
			t.Fatal("no log line for the slow subscription")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, want := range []string{"connection=holdfast-test-conn", "subject=slow.subject"} {
		if !strings.Contains(lb.String(), want) {
			t.Errorf("the log line does not name %s", want)
		}
	}
}

// TestNoteRouteRefusal: the server's log lines about refused routes
// become a reason naming the keys, with the cluster names in the right
// order whichever side logged them.
func TestNoteRouteRefusal(t *testing.T) {
	for _, tc := range []struct{ line, want string }{
		{`127.0.0.1:4 - rid:5 - Rejecting connection, cluster name "c1" does not match "c2"`, `cluster.name is "c2" here but "c1" on the node`},
		{`127.0.0.1:4 - rid:5 - Route Error 'Rejecting connection, cluster name "c2" does not match "c1"'`, `cluster.name is "c2" here but "c1" on the node`},
		{`127.0.0.1:4 - rid:5 - Route Error 'Authorization Violation'`, "cluster.user and cluster.password_file"},
		{`127.0.0.1:4 - rid:5 - Router connection closed: Client Closed`, ""},
	} {
		l := newServerLogger(slog.New(slog.DiscardHandler))
		l.Errorf("%s", tc.line)
		got := l.RouteRefusal(time.Minute)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: RouteRefusal = %q, want %q", tc.line, got, tc.want)
		}
	}
}

// TestNoteLeafDuplicate: the edge's log lines about a link its hub
// dropped as a duplicate, closed for a message over its max_payload, or
// whose credentials it refused are each recorded under the hub's address
// and that error alone; other leafnode lines are not.
func TestNoteLeafDuplicate(t *testing.T) {
	l := newServerLogger(slog.New(slog.DiscardHandler))
	for _, line := range []string{
		"127.0.0.1:7422 - lid:5 - Leafnode Error 'Duplicate Remote LeafNode Connection'",
		"127.0.0.1:7423 - lid:6 - Leafnode connection closed: Client Closed",
		"127.0.0.1:7424 - lid:7 - Leafnode Error 'Maximum Payload Violation'",
		"127.0.0.1:7425 - lid:8 - Leafnode Error 'Authorization Violation'",
		"127.0.0.1:7426 - lid:9 - TLS leafnode handshake error: tls: failed to verify certificate: x509: certificate signed by unknown authority",
	} {
		l.Errorf("%s", line)
	}
	// The close after it keeps its words; a close alone (the hub spoke no
	// TLS: the error was at debug level) is noted too; a handshake that
	// timed out is a link down, not a TLS mismatch.
	l.Noticef("%s - lid:%d - Leafnode connection closed: %s", "127.0.0.1:7426", 9, "TLS Handshake Failure")
	l.Noticef("%s - lid:%d - Leafnode connection closed: %s", "127.0.0.1:7427", 10, "TLS Handshake Failure")
	l.Errorf("127.0.0.1:7428 - lid:11 - TLS leafnode handshake error: read tcp 127.0.0.1:1->127.0.0.1:7428: i/o timeout")
	if _, d := l.LeafError("127.0.0.1:7426", leafTLSFailure); !strings.Contains(d, "unknown authority") {
		t.Errorf("LeafError(127.0.0.1:7426, TLS) detail %q", d)
	}
	if _, d := l.LeafError("127.0.0.1:7427", leafTLSFailure); d != leafTLSNoDetail {
		t.Errorf("LeafError(127.0.0.1:7427, TLS) detail %q", d)
	}
	// A hub that closes each link at once (a client certificate it wants):
	// counted in a row.
	for range 3 {
		l.Noticef("%s - lid:%d - Leafnode connection closed: %s", "127.0.0.1:7429", 12, "Read Error")
	}
	if _, _, n := l.leafErrorCount("127.0.0.1:7429", leafReadError); n != 3 {
		t.Errorf("read errors in a row at 127.0.0.1:7429: %d, want 3", n)
	}
	for _, c := range []struct {
		addr, kind string
		noted      bool
	}{
		{"127.0.0.1:7422", leafDuplicate, true},
		{"127.0.0.1:7423", leafDuplicate, false},
		{"127.0.0.1:7424", leafPayloadViolation, true},
		{"127.0.0.1:7424", leafDuplicate, false},
		{"127.0.0.1:7422", leafPayloadViolation, false},
		{"127.0.0.1:7425", leafAuthViolation, true},
		{"127.0.0.1:7425", leafPayloadViolation, false},
		{"127.0.0.1:7426", leafTLSFailure, true},
		{"127.0.0.1:7425", leafTLSFailure, false},
		{"127.0.0.1:7427", leafTLSFailure, true},
		{"127.0.0.1:7428", leafTLSFailure, false},
	} {
		at := l.LeafErrorAt(c.addr, c.kind)
		if c.noted && time.Since(at) > time.Minute {
			t.Errorf("LeafErrorAt(%s, %q) = %v, want now", c.addr, c.kind, at)
		}
		if !c.noted && !at.IsZero() {
			t.Errorf("LeafErrorAt(%s, %q) = %v, want zero", c.addr, c.kind, at)
		}
	}
}

// TestInProcessDisconnectLogged: the server drops an in-process
// connection that falls behind its messages (a slow consumer: group
// commit's under a burst of large publishes, measured with 8 publishers
// of 500 × 200 KiB) and the connection comes back at once; what was in
// flight on it is lost (group commit's clients then get no answer). That
// passed without a word; it is logged as a warning now, with the
// connection's name.
func TestInProcessDisconnectLogged(t *testing.T) {
	log, lb := natstest.Logger(t)
	s := runServerWithLog(t, configtest.Default(t), log)
	nc, err := s.Connect("holdfast-ingest")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	cid, err := nc.GetClientID()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.NATS().DisconnectClientByID(cid); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		if out := lb.String(); !strings.Contains(out, "in-process connection lost") || !strings.Contains(out, "holdfast-ingest") {
			return fmt.Errorf("no warning for the lost connection:\n%s", out)
		}
		return nil
	})
}

// TestInProcessCloseNotLogged: closing an in-process connection (holdfast
// shutting down or reloading) is no loss and logs no warning.
func TestInProcessCloseNotLogged(t *testing.T) {
	log, lb := natstest.Logger(t)
	s := runServerWithLog(t, configtest.Default(t), log)
	nc, err := s.Connect("holdfast-ingest")
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
	time.Sleep(100 * time.Millisecond) // the callbacks run on their own goroutine
	if strings.Contains(lb.String(), "in-process connection lost") {
		t.Fatalf("a connection closed by holdfast logged as lost:\n%s", lb.String())
	}
}
