package natstest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
)

// TestRunServer: the default server listens on 127.0.0.1 with JetStream on
// a file store that does not sync every write; a tweak is applied; a client
// reaches it over TCP and stores a message.
func TestRunServer(t *testing.T) {
	s := RunServer(t)
	if a, ok := s.Addr().(*net.TCPAddr); !ok || !a.IP.Equal(net.IPv4(127, 0, 0, 1)) {
		t.Fatalf("server listens on %v, want 127.0.0.1", s.Addr())
	}
	if !s.JetStreamEnabled() || s.JetStreamConfig().SyncAlways {
		t.Fatalf("JetStream enabled %v, config %+v; want enabled without sync always", s.JetStreamEnabled(), s.JetStreamConfig())
	}
	synced := RunServer(t, SyncAlways)
	if !synced.JetStreamConfig().SyncAlways {
		t.Fatal("SyncAlways tweak not applied")
	}
	nc := Connect(t, s)
	if !strings.HasPrefix(nc.ConnectedUrl(), "nats://127.0.0.1:") {
		t.Errorf("connected to %q, want TCP on 127.0.0.1", nc.ConnectedUrl())
	}
	publishOne(t, JetStream(t, nc))
}

// TestRunServerInProcess: a server without a client listener is reached
// in process.
func TestRunServerInProcess(t *testing.T) {
	s := RunServer(t, func(o *server.Options) { o.DontListen = true })
	if s.Addr() != nil {
		t.Fatalf("server listens on %v with DontListen", s.Addr())
	}
	publishOne(t, JetStream(t, Connect(t, s)))
}

func publishOne(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	ctx := Context(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.*"}}); err != nil {
		t.Fatal(err)
	}
	ack, err := js.Publish(ctx, "s.a", []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	if ack.Stream != "S" || ack.Sequence != 1 {
		t.Fatalf("ack = %+v, want S/1", ack)
	}
	if st := StreamInfo(t, js, "S").State; st.Msgs != 1 || st.LastSeq != 1 {
		t.Fatalf("stream state %+v, want 1 message", st)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, "S", jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	if ci := ConsumerInfo(t, js, "S", "C"); ci.NumPending != 1 {
		t.Fatalf("consumer pending %d, want 1", ci.NumPending)
	}
}

// TestFreePort: the port can be bound at once; no port is handed out
// twice, and none from the ephemeral range that outgoing connections take
// theirs from.
func TestFreePort(t *testing.T) {
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", FreePort(t)))
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	seen := map[int]bool{}
	for range 500 {
		p := FreePort(t)
		if seen[p] || p >= 32768 || p < 1024 {
			t.Fatalf("FreePort returned %d (handed out before: %v), want a new port below 32768", p, seen[p])
		}
		seen[p] = true
	}
}

// TestFreePortAcrossTestBinaries: go test runs several packages' test
// binaries at once; a port one of them holds is never handed out by
// another while it runs. The same binary, run again as a child, takes 5
// of the 10 ports of a range and waits; this one then takes the 5 others
// (without the claims, each pick is a guess: the child binds none of
// them). Once the child has ended, its ports are free to take again.
func TestFreePortAcrossTestBinaries(t *testing.T) {
	if os.Getenv("NATSTEST_CLAIM_CHILD") != "" {
		claimAsChild(t)
		return
	}
	// Ten ports no other test uses (FreePort's end at 32000), below the
	// ephemeral ones.
	from := portsTo + os.Getpid()%70*10
	// This binary keeps what it claims until it exits; the range's claims
	// are let go so that go test -count=2 can run the test again.
	t.Cleanup(func() {
		handedOut.Lock()
		defer handedOut.Unlock()
		for p, claim := range handedOut.ports {
			if p >= from && p < from+10 {
				claim.Close()
				delete(handedOut.ports, p)
			}
		}
	})
	child := exec.Command(os.Args[0], "-test.run", "^TestFreePortAcrossTestBinaries$")
	child.Env = append(os.Environ(), "NATSTEST_CLAIM_CHILD="+strconv.Itoa(from))
	stdin, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); _ = child.Wait() })
	var theirs []int
	sc := bufio.NewScanner(out)
	for len(theirs) < 5 && sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "claimed "); ok {
			p, err := strconv.Atoi(rest)
			if err != nil {
				t.Fatalf("child: %q", sc.Text())
			}
			theirs = append(theirs, p)
		}
	}
	if len(theirs) != 5 {
		t.Fatalf("the child claimed %v, want 5 ports", theirs)
	}
	for range 5 {
		p, err := freePort(from, from+10)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(theirs, p) {
			t.Fatalf("port %d handed out here while the child holds it (the child's: %v)", p, theirs)
		}
	}
	if _, err := freePort(from, from+10); err == nil {
		t.Fatal("an eleventh port of a range of ten")
	}
	stdin.Close()
	if err := child.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
	for _, p := range theirs {
		c, err := claimPort(p)
		if err != nil || c == nil {
			t.Fatalf("port %d not free to claim after the child ended: %v", p, err)
		}
		c.Close()
	}
}

// claimAsChild takes 5 ports of the range given by the parent, says
// which, and holds them until its stdin closes.
func claimAsChild(t *testing.T) {
	from, err := strconv.Atoi(os.Getenv("NATSTEST_CLAIM_CHILD"))
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		p, err := freePort(from, from+10)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("claimed %d\n", p)
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// TestCheckFor: CheckFor returns once f succeeds, having called it until
// then.
func TestCheckFor(t *testing.T) {
	calls := 0
	CheckFor(t, 10*time.Second, time.Millisecond, func() error {
		if calls++; calls < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if calls != 3 {
		t.Fatalf("f called %d times, want 3", calls)
	}
}

// fatalTB records Fatalf and stops the goroutine, as testing.T does.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// TestCheckForFails: when f never succeeds, CheckFor fails the test with
// f's last error after total, and f was called more than once.
func TestCheckForFails(t *testing.T) {
	tb := &fatalTB{TB: t}
	calls := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		CheckFor(tb, 50*time.Millisecond, 5*time.Millisecond, func() error {
			calls++
			return fmt.Errorf("attempt %d", calls)
		})
	}()
	<-done
	if calls < 2 || tb.msg != fmt.Sprintf("condition not met after 50ms: attempt %d", calls) {
		t.Fatalf("after %d calls the failure is %q", calls, tb.msg)
	}
}

// TestBuffer: writers and a reader at once (run with -race).
func TestBuffer(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				io.WriteString(&b, "x")
				_ = b.String()
			}
		}()
	}
	wg.Wait()
	if n := len(b.String()); n != 400 {
		t.Fatalf("len = %d, want 400", n)
	}
}

// TestLogger: debug lines go into the buffer.
func TestLogger(t *testing.T) {
	log, lb := Logger(t)
	log.Debug("hello", "n", 1)
	if !strings.Contains(lb.String(), "level=DEBUG msg=hello n=1") {
		t.Fatalf("log = %q", lb.String())
	}
}

// TestStoreDirOutlastsLateWriters: a goroutine that goes on creating
// directories and files in the store after the test's other cleanups ran
// (as nats-server's do after a clustered server's Shutdown) does not fail
// the test, and the directory is gone once the test ended.
func TestStoreDirOutlastsLateWriters(t *testing.T) {
	var dir string
	writing := make(chan struct{})
	ok := t.Run("store", func(t *testing.T) {
		dir = StoreDir(t)
		t.Cleanup(func() {
			go func() {
				defer close(writing)
				for i := 0; i < 400; i++ {
					sub := filepath.Join(dir, fmt.Sprint(i%5))
					_ = os.Mkdir(sub, 0o700)
					_ = os.WriteFile(filepath.Join(sub, fmt.Sprint(i)), []byte("x"), 0o600)
					time.Sleep(time.Millisecond)
				}
			}()
			time.Sleep(50 * time.Millisecond)
		})
	})
	<-writing
	if !ok {
		t.Fatal("the test using the store failed")
	}
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s left behind: %v", d, err)
		}
	}
}
