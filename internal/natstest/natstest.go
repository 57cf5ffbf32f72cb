// Package natstest holds the helpers that holdfast's tests in several
// packages need: a stock nats-server with JetStream on a temporary store,
// clients for it, a free port, a bounded context, polling for a condition,
// a buffer a server may log into while the test reads it and a logger into
// such a buffer.
//
// It is imported by _test.go files only. Everything it starts ends with the
// test (t.Cleanup). It does not import holdfast's own packages, so that any
// of them can use it.
package natstest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// RunServer starts a stock nats-server with JetStream and returns it once it
// is ready for connections; it is shut down when the test ends. By default
// it listens on a random port of 127.0.0.1, keeps its store in t.TempDir()
// with limits of 1 GiB on file and 64 MiB in memory, syncs the store on the
// server's default interval, logs nothing and handles no signals. Each tweak
// changes the options before the server is made (see SyncAlways).
func RunServer(t testing.TB, tweaks ...func(*server.Options)) *server.Server {
	t.Helper()
	opts := &server.Options{
		Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: t.TempDir(), JetStreamMaxStore: 1 << 30, JetStreamMaxMemory: 64 << 20,
	}
	for _, tweak := range tweaks {
		tweak(opts)
	}
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS server not ready")
	}
	return s
}

// RunCluster starts n stock nats-servers (RunServer, each with its own
// store) that form one JetStream cluster on routes of 127.0.0.1, named
// node1..noden, and returns them once the cluster has a meta leader that
// every server knows and that sees every server online (so that a stream
// of n replicas can be placed). Each tweak changes every server's options.
func RunCluster(t testing.TB, n int, tweaks ...func(*server.Options)) []*server.Server {
	t.Helper()
	ports := make([]int, n)
	var routes []*url.URL
	for i := range ports {
		ports[i] = FreePort(t)
		routes = append(routes, &url.URL{Scheme: "nats-route", Host: fmt.Sprintf("127.0.0.1:%d", ports[i])})
	}
	servers := make([]*server.Server, n)
	for i := range servers {
		opts := &server.Options{
			ServerName: fmt.Sprintf("node%d", i+1), Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
			JetStream: true, StoreDir: StoreDir(t), JetStreamMaxStore: 1 << 30, JetStreamMaxMemory: 64 << 20,
			Cluster: server.ClusterOpts{Name: "natstest", Host: "127.0.0.1", Port: ports[i]},
			Routes:  routes,
		}
		for _, tweak := range tweaks {
			tweak(opts)
		}
		s, err := server.NewServer(opts)
		if err != nil {
			t.Fatal(err)
		}
		go s.Start()
		t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
		servers[i] = s
	}
	for _, s := range servers {
		if !s.ReadyForConnections(30 * time.Second) {
			t.Fatalf("NATS server %s not ready", s.Name())
		}
	}
	CheckFor(t, time.Minute, 50*time.Millisecond, func() error {
		leaders := 0
		for _, s := range servers {
			if !s.JetStreamIsCurrent() {
				return fmt.Errorf("%s is not current with the JetStream meta leader", s.Name())
			}
			if s.JetStreamIsLeader() {
				leaders++
				// Stream placement takes only the peers the leader has
				// stats of.
				if peers := s.JetStreamClusterPeers(); len(peers) != n {
					return fmt.Errorf("meta leader %s sees %d of %d JetStream peers online", s.Name(), len(peers), n)
				}
			}
		}
		if leaders != 1 {
			return fmt.Errorf("%d JetStream meta leaders", leaders)
		}
		return nil
	})
	return servers
}

// SyncAlways is a RunServer tweak: the store flushes every write to disk
// (sync = "always", holdfast's default).
func SyncAlways(o *server.Options) { o.SyncAlways = true }

// Connect returns a client connection to s with opts, closed when the test
// ends: over TCP to s.ClientURL(), or in process (nats.InProcessServer) when
// s has no client listener (DontListen).
func Connect(t testing.TB, s *server.Server, opts ...nats.Option) *nats.Conn {
	t.Helper()
	if s.Addr() == nil {
		opts = append([]nats.Option{nats.InProcessServer(s)}, opts...)
	}
	nc, err := nats.Connect(s.ClientURL(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// JetStream returns a JetStream client (the jetstream package) on nc.
func JetStream(t testing.TB, nc *nats.Conn, opts ...jetstream.JetStreamOpt) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(nc, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// StreamInfo returns the stream's info as the server has it now, and
// fails the test when the stream cannot be read.
func StreamInfo(t testing.TB, js jetstream.JetStream, name string) *jetstream.StreamInfo {
	t.Helper()
	st, err := js.Stream(Context(t), name) // asks the server for the info
	if err != nil {
		t.Fatalf("stream %s: %v", name, err)
	}
	return st.CachedInfo()
}

// ConsumerInfo returns the consumer's info as the server has it now, and
// fails the test when the consumer cannot be read.
func ConsumerInfo(t testing.TB, js jetstream.JetStream, stream, name string) *jetstream.ConsumerInfo {
	t.Helper()
	c, err := js.Consumer(Context(t), stream, name) // asks the server for the info
	if err != nil {
		t.Fatalf("consumer %s on %s: %v", name, stream, err)
	}
	return c.CachedInfo()
}

// FreePort returns a TCP port of 127.0.0.1 that was free a moment ago:
// the listener that found it is closed again, so something else may take
// it before the test binds it. With tests in parallel, the kernel may hand
// the same port to two calls (a cluster's config would list one route
// twice), and the servers' outgoing connections may take a port from the
// ephemeral range before its test binds it (a node never becomes ready).
// So the ports come from below the ephemeral range (ip_local_port_range
// starts at 32768), and none is handed out twice on the machine while the
// test binary that took it runs: go test runs several packages' binaries
// at once, and two of them took the same port in the moment between its
// pick and its bind (a node failed with "address already in use"). A
// port is claimed with a lock on a file named after it (claimPort), which
// the kernel lets go when the binary ends, however it ends. The claims are
// per user: two users' test runs on one machine may still meet.
func FreePort(t testing.TB) int {
	t.Helper()
	p, err := freePort(portsFrom, portsTo)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func freePort(from, to int) (int, error) {
	handedOut.Lock()
	defer handedOut.Unlock()
	if handedOut.ports == nil {
		handedOut.ports = map[int]*os.File{}
	}
	for range 1000 {
		p := from + rand.IntN(to-from)
		if _, ok := handedOut.ports[p]; ok {
			continue
		}
		claim, err := claimPort(p)
		if err != nil {
			return 0, err
		}
		if claim == nil {
			continue // another test binary's
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			claim.Close()
			continue // taken
		}
		ln.Close()
		handedOut.ports[p] = claim
		return p, nil
	}
	return 0, fmt.Errorf("no free TCP port of 127.0.0.1 in %d-%d after 1000 tries", from, to)
}

// claimPort takes an exclusive lock on the file of port p in portLocks,
// kept (the file open) until this process ends. It returns nil when
// another process holds it.
func claimPort(p int) (*os.File, error) {
	// Per user: a directory another user made first would refuse this
	// one's files.
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("%s-%d", portLocks, os.Getuid()))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("port claims: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(p)), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("port claims: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, nil
		}
		return nil, fmt.Errorf("port claims: lock %s: %w", f.Name(), err)
	}
	return f, nil
}

// The range FreePort picks from: below Linux's ephemeral ports (32768-
// 60999 by default), above the well-known ones; portLocks names the
// directory under os.TempDir() of the claims (with the user's uid).
const (
	portsFrom = 20000
	portsTo   = 32000
	portLocks = "holdfast-test-ports"
)

// handedOut holds every port FreePort returned in this test binary, with
// the file that claims it.
var handedOut struct {
	sync.Mutex
	ports map[int]*os.File
}

// Context returns a context that ends with the test or after 30 seconds,
// whichever comes first, so that a stuck call fails the test instead of
// hanging it.
func Context(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// CheckFor calls f until it returns nil or total has passed, sleeping sleep
// between calls, and then fails the test with f's last error (nats-server's
// checkFor). f is called at least once.
func CheckFor(t testing.TB, total, sleep time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(total)
	for {
		err := f()
		if err == nil {
			return
		}
		if !time.Now().Before(deadline) {
			t.Fatalf("condition not met after %s: %v", total, err)
		}
		time.Sleep(sleep)
	}
}

// StoreDir returns a new directory for a server's store, removed when
// the test ends like t.TempDir's, but after every cleanup registered later
// (closing the servers that use it) and with retries for up to 10 s: some
// of nats-server's goroutines (Raft health checks, a stream reset) may
// still create files under a clustered server's store after its Shutdown
// returned, and a plain RemoveAll then fails with "directory not empty".
// The store is alone in a directory of its own, which goes with it, so
// that what a test puts beside it (a store moved aside) goes too.
// A directory still there after 10 s fails the test.
func StoreDir(t testing.TB) string {
	t.Helper()
	parent, err := os.MkdirTemp("", "holdfast-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		CheckFor(t, 10*time.Second, 100*time.Millisecond, func() error { return os.RemoveAll(parent) })
	})
	dir := filepath.Join(parent, "store")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Buffer is a bytes.Buffer that one goroutine may write (a logger, a
// subprocess's output) while others read it.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p to the buffer.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Logger returns a debug logger that writes into the returned buffer,
// which is printed into the test's log only when the test fails: server
// goroutines that log during shutdown then never call t.Log after the
// test has returned.
func Logger(t testing.TB) (*slog.Logger, *Buffer) {
	t.Helper()
	lb := &Buffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log:\n%s", lb.String())
		}
	})
	return slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelDebug})), lb
}

// EditConsumer changes the configuration of consumer name of stream as
// `nats consumer edit` would: edit gets the current one and changes it in
// place.
func EditConsumer(t testing.TB, js jetstream.JetStream, stream, name string, edit func(*jetstream.ConsumerConfig)) {
	t.Helper()
	cfg := ConsumerInfo(t, js, stream, name).Config
	edit(&cfg)
	if _, err := js.UpdateConsumer(Context(t), stream, cfg); err != nil {
		t.Fatalf("edit consumer %s/%s: %v", stream, name, err)
	}
}

// EditStream changes stream name's configuration as `nats stream edit`
// would: edit gets the current one and changes it in place.
func EditStream(t testing.TB, js jetstream.JetStream, name string, edit func(*jetstream.StreamConfig)) {
	t.Helper()
	cfg := StreamInfo(t, js, name).Config
	edit(&cfg)
	if _, err := js.UpdateStream(Context(t), cfg); err != nil {
		t.Fatalf("edit stream %s: %v", name, err)
	}
}

// CreateStream creates a stream, asking again (each request bounded to
// 5 s, for up to a minute) while a fresh cluster does not answer: under
// the load of the whole suite a request sent while it still settles can
// go unanswered until a 30 s context ends (seen in CI).
func CreateStream(t testing.TB, js jetstream.JetStream, cfg jetstream.StreamConfig) {
	t.Helper()
	CheckFor(t, time.Minute, 100*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := js.CreateStream(ctx, cfg)
		return err
	})
}

// CreateOrUpdateConsumer is CreateStream's counterpart for a consumer.
func CreateOrUpdateConsumer(t testing.TB, js jetstream.JetStream, stream string, cfg jetstream.ConsumerConfig) {
	t.Helper()
	CheckFor(t, time.Minute, 100*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := js.CreateOrUpdateConsumer(ctx, stream, cfg)
		return err
	})
}
