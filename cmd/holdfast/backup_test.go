package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/backup"
	"github.com/holdfast-io/holdfast/internal/natstest"
)

// seqSet reads the sequences a handler script wrote, one a line.
func seqSet(t *testing.T, path string) map[uint64]int {
	t.Helper()
	out := map[uint64]int{}
	for _, l := range e2eLines(t, path) {
		n, err := strconv.ParseUint(strings.TrimSpace(l), 10, 64)
		if err != nil {
			t.Fatalf("%s: line %q", path, l)
		}
		out[n]++
	}
	return out
}

// A backup taken while messages are published and processed, restored
// into a fresh holdfast (whose bootstrap already created the streams,
// empty, as after a disk loss): the restored streams and consumers match
// the manifest, and the workers go on from the restored ack floor without
// handling again anything acknowledged before the snapshot.
func TestBackupUnderLoadThenRestore(t *testing.T) {
	t.Parallel()
	// Instance A: handles every message, recording its sequence.
	inA := newE2EInstance(t)
	outA := filepath.Join(t.TempDir(), "handled-a")
	// A handler of about 20 ms: the workers fall behind the publisher.
	e2ePipelineConfig(t, inA, e2eScript(t, fmt.Sprintf("sleep 0.02\necho \"$HOLDFAST_SEQ\" >> %s\n", outA)), "")
	dA := startHoldfast(t, inA.cfg)
	dA.waitReady()
	_, jsA := e2eConnect(t, inA)

	// Publish without pause until told to stop.
	var published atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	pubCtx, cancelPub := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancelPub()
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := jsA.Publish(pubCtx, "orders.created", fmt.Appendf(nil, `{"id":"%d"}`, i)); err != nil {
				t.Errorf("publish %d: %v", i, err)
				return
			}
			published.Add(1)
		}
	}()
	stopPublishing := func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}
	t.Cleanup(stopPublishing)

	// Under load: a backlog and workers busy with it.
	natstest.CheckFor(t, 60*time.Second, 20*time.Millisecond, func() error {
		if n := len(e2eLines(t, outA)); n < 100 || published.Load() < 800 {
			return fmt.Errorf("%d published, %d handled", published.Load(), n)
		}
		return nil
	})
	before := published.Load()
	dir := filepath.Join(t.TempDir(), "backup")
	res := runHoldfast(t, nil, "backup", "--config", inA.cfg, dir)
	if res.code != 0 {
		t.Fatalf("backup: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	during := published.Load() - before
	// A goes on handling and acking past the snapshot point.
	handledAtBackup := len(e2eLines(t, outA))
	natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		if n := len(e2eLines(t, outA)); n < handledAtBackup+10 {
			return fmt.Errorf("A handled %d messages since the backup", n-handledAtBackup)
		}
		return nil
	})
	stopPublishing()
	total := published.Load()
	t.Logf("backup while publishing: %d published before it, %d during it, %d in all\n%s", before, during, total, res.stdout)
	dA.stop()

	m, err := backup.Verify(dir)
	if err != nil {
		t.Fatalf("the backup written under load: %v", err)
	}
	if m.Format != backup.FormatVersion || m.NATSServerVersion == "" || !strings.Contains(m.HoldfastVersion, "holdfast") || m.Created.IsZero() {
		t.Fatalf("manifest header: %+v", m)
	}
	orders, dlq := m.Stream("ORDERS"), m.Stream("ORDERS_DLQ")
	if orders == nil || dlq == nil {
		t.Fatalf("manifest streams: %+v", m.Streams)
	}
	if orders.Messages < before || orders.Messages > total || orders.LastSeq != orders.Messages || orders.FirstSeq != 1 || orders.Bytes == 0 {
		t.Fatalf("ORDERS in the manifest: %+v (published %d before the backup, %d in all)", orders, before, total)
	}
	worker := orders.Consumer("WORKER1")
	if worker == nil || worker.AckFloor == 0 || worker.AckFloor > worker.Delivered || worker.Delivered > orders.LastSeq {
		t.Fatalf("WORKER1 in the manifest: %+v", worker)
	}
	if len(m.Files) != 4 {
		t.Fatalf("manifest files: %+v", m.Files)
	}
	handledA := seqSet(t, outA)
	for seq := uint64(1); seq <= worker.AckFloor; seq++ {
		if handledA[seq] == 0 {
			t.Fatalf("seq %d is below the ack floor %d in the backup but A never handled it", seq, worker.AckFloor)
		}
	}

	// Instance B: a fresh store; its bootstrap creates ORDERS, ORDERS_DLQ
	// and WORKER1 empty. Its handler waits for a go file, so that the
	// restored ack floor can be read before anything moves it.
	inB := newE2EInstance(t)
	outB := filepath.Join(t.TempDir(), "handled-b")
	goFile := filepath.Join(t.TempDir(), "go")
	e2ePipelineConfig(t, inB, e2eScript(t, fmt.Sprintf("while [ ! -e %s ]; do sleep 0.05; done\necho \"$HOLDFAST_SEQ\" >> %s\n", goFile, outB)), "")
	dB := startHoldfast(t, inB.cfg)
	dB.waitReady()
	_, jsB := e2eConnect(t, inB)
	if st := natstest.StreamInfo(t, jsB, "ORDERS").State; st.LastSeq != 0 {
		t.Fatalf("fresh ORDERS: %+v", st)
	}

	res = runHoldfast(t, nil, "restore", "--config", inB.cfg, dir)
	if res.code != 0 {
		t.Fatalf("restore: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	t.Logf("restore:\n%s%s", res.stdout, res.stderr)
	if !strings.Contains(res.stdout, "restored 2 stream(s)") {
		t.Fatalf("restore output:\n%s", res.stdout)
	}
	// The running holdfast saw the restore for what it is: no stream
	// "disappeared" and was created again empty under it.
	if log := dB.stderr.String(); strings.Contains(log, "disappeared while running") || !strings.Contains(log, "stream being restored from a backup") {
		t.Errorf("the restored holdfast's log does not show the restore, or a false loss:\n%s", log)
	}
	for _, e := range m.Streams {
		st := natstest.StreamInfo(t, jsB, e.Name).State
		if st.Msgs != e.Messages || st.LastSeq != e.LastSeq || st.Bytes != e.Bytes {
			t.Fatalf("restored %s: %d messages, %d bytes, last seq %d; the manifest says %d, %d, %d", e.Name, st.Msgs, st.Bytes, st.LastSeq, e.Messages, e.Bytes, e.LastSeq)
		}
	}
	if ci := natstest.ConsumerInfo(t, jsB, "ORDERS", "WORKER1"); ci.AckFloor.Stream != worker.AckFloor || ci.AckFloor.Consumer != worker.AckFloorConsumer {
		t.Fatalf("restored WORKER1 ack floor %+v, the manifest says stream %d, consumer %d", ci.AckFloor, worker.AckFloor, worker.AckFloorConsumer)
	}

	// The workers resume: everything after the ack floor is handled, a new
	// message continues the sequence, nothing at or below the floor again.
	if err := os.WriteFile(goFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ack, err := jsB.Publish(natstest.Context(t), "orders.created", []byte(`{"id":"after-restore"}`))
	if err != nil || ack.Sequence != orders.LastSeq+1 {
		t.Fatalf("publish after the restore: %v, %+v (want seq %d)", err, ack, orders.LastSeq+1)
	}
	last := orders.LastSeq + 1
	// Above the floor, the backup holds as acknowledged what was delivered
	// and not pending at the snapshot (A acked it out of order): B never
	// gets those; every other sequence up to the last it must handle.
	ackedAbove := int(worker.Delivered-worker.AckFloor) - worker.AckPending
	natstest.CheckFor(t, 120*time.Second, 100*time.Millisecond, func() error {
		got := seqSet(t, outB)
		var byA []uint64
		for seq := worker.AckFloor + 1; seq <= last; seq++ {
			if got[seq] > 0 {
				continue
			}
			if seq > worker.Delivered || handledA[seq] == 0 {
				return fmt.Errorf("seq %d not handled by B yet (%d handled), nor acked by A above the floor before the backup", seq, len(got))
			}
			byA = append(byA, seq)
		}
		if len(byA) != ackedAbove {
			return fmt.Errorf("%d sequences above the floor handled by A only (%v), the backup holds %d as acknowledged above its floor (delivered %d, floor %d, %d pending)",
				len(byA), byA, ackedAbove, worker.Delivered, worker.AckFloor, worker.AckPending)
		}
		return nil
	})
	handledB := seqSet(t, outB)
	again := 0
	for seq := range handledB {
		if seq <= worker.AckFloor {
			t.Errorf("seq %d was acked before the backup (floor %d) and handled again after the restore", seq, worker.AckFloor)
		}
		if seq <= orders.LastSeq && handledA[seq] > 0 {
			again++
		}
	}
	// At least once: what A acked after the snapshot point (and what was
	// in flight at it) is handled again by B; nothing else.
	t.Logf("backup: ORDERS to seq %d, ack floor %d (delivered %d, %d pending); A handled %d messages before it stopped; B handled %d, of which %d had been handled by A too (acked after the snapshot point or in flight at it)",
		orders.LastSeq, worker.AckFloor, worker.Delivered, worker.AckPending, len(handledA), len(handledB), again)
	if again > len(handledA)-int(worker.AckFloor) {
		t.Errorf("%d messages handled again, but A handled only %d after the floor", again, len(handledA)-int(worker.AckFloor))
	}
	dB.stop()
}

// A damaged backup is refused before anything changes, with the file
// named; a stream that holds messages is not overwritten without
// --replace; a backup never goes into a directory that holds files.
func TestRestoreRefusesDamagedBackup(t *testing.T) {
	t.Parallel()
	in := newE2EInstance(t)
	d := startHoldfast(t, in.cfg)
	d.waitReady()
	_, js := e2eConnect(t, in)
	e2ePublishAcked(t, js, 0, 50)
	dir := filepath.Join(t.TempDir(), "backup")
	if res := runHoldfast(t, nil, "backup", "--config", in.cfg, dir); res.code != 0 || res.stderr != "" {
		// Not a terminal: no progress bar.
		t.Fatalf("backup: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	// On a terminal (script(1) gives it one): the progress bar on stderr.
	if script, err := exec.LookPath("script"); err == nil {
		tty := filepath.Join(t.TempDir(), "tty-backup")
		res := e2eRunBinary(t, script, nil, nil, "-qec", holdfastBin+" backup --config "+in.cfg+" "+tty, "/dev/null")
		if res.code != 0 || !strings.Contains(res.stdout, "backing up ORDERS (1/2) [") || !strings.Contains(res.stdout, "100%") {
			t.Fatalf("backup on a terminal: exit %d, no progress bar:\n%q\n%q", res.code, res.stdout, res.stderr)
		}
	} else {
		t.Log("script(1) not installed (util-linux): progress bar on a terminal not checked")
	}
	if res := runHoldfast(t, nil, "backup", "--config", in.cfg, dir); res.code != 1 || !strings.Contains(res.stderr, "is not empty") ||
		!strings.Contains(res.stderr, "left as it is") || strings.Contains(res.stderr, "nothing kept") {
		t.Fatalf("backup into a used directory: exit %d\n%s", res.code, res.stderr)
	}
	e2ePublishAcked(t, js, 50, 10) // ORDERS now ends at 60, the backup at 50
	created := func() time.Time {
		s, err := js.Stream(natstest.Context(t), "ORDERS")
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo().Created
	}
	origCreated := created()
	unchanged := func(what string) {
		t.Helper()
		if st := natstest.StreamInfo(t, js, "ORDERS").State; st.LastSeq != 60 || st.Msgs != 60 || !created().Equal(origCreated) {
			t.Fatalf("after %s: ORDERS changed: %+v", what, st)
		}
	}

	// The stream holds messages: refused without --replace, naming it.
	res := runHoldfast(t, nil, "restore", "--config", in.cfg, dir)
	if res.code != 1 || !strings.Contains(res.stderr, "ORDERS (60 messages, last sequence 60)") || !strings.Contains(res.stderr, "--replace") {
		t.Fatalf("restore over a stream with messages: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	unchanged("a refused restore")

	copyBackup := func(name string) string {
		t.Helper()
		dst := filepath.Join(t.TempDir(), name)
		if err := os.CopyFS(dst, os.DirFS(dir)); err != nil {
			t.Fatal(err)
		}
		return dst
	}
	archive := filepath.Join("streams", "ORDERS", "stream.arc.s2")
	for _, c := range []struct {
		name   string
		damage func(dir string) error
		want   string
	}{
		{"flipped byte", func(dir string) error {
			p := filepath.Join(dir, archive)
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			b[len(b)/2] ^= 0x01
			return os.WriteFile(p, b, 0o600)
		}, archive + ": corrupted: SHA-256"},
		{"truncated", func(dir string) error {
			p := filepath.Join(dir, archive)
			fi, err := os.Stat(p)
			if err != nil {
				return err
			}
			return os.Truncate(p, fi.Size()/2)
		}, archive + ": truncated"},
		{"edited manifest", func(dir string) error {
			p := filepath.Join(dir, backup.ManifestFile)
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(p, []byte(strings.Replace(string(b), `"last_seq": 50`, `"last_seq": 51`, 1)), 0o600)
		}, backup.ManifestFile + ": corrupted"},
		{"unfinished", func(dir string) error {
			if err := os.Remove(filepath.Join(dir, backup.SumsFile)); err != nil {
				return err
			}
			return os.Remove(filepath.Join(dir, backup.ManifestFile))
		}, "did not finish"},
	} {
		bad := copyBackup(strings.ReplaceAll(c.name, " ", "-"))
		if err := c.damage(bad); err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{{"restore", "--config", in.cfg, "--replace", bad}, {"restore", "--verify-only", bad}} {
			res := runHoldfast(t, nil, args...)
			if res.code != 1 || !strings.Contains(res.stderr, c.want) || !strings.Contains(res.stderr, bad) {
				t.Fatalf("%s: holdfast %s: exit %d, want 1 and %q in:\n%s%s", c.name, strings.Join(args, " "), res.code, c.want, res.stdout, res.stderr)
			}
			t.Logf("%s: %s", c.name, strings.TrimSpace(res.stderr))
		}
		unchanged(c.name)
	}

	// A stream the backup does not hold: a usage error naming --stream,
	// before connecting to anything.
	if res := runHoldfast(t, nil, "restore", "--config", in.cfg, "--server", "nats://127.0.0.1:1", "--stream", "NOPE", dir); res.code != 2 ||
		!strings.Contains(res.stderr, "--stream: stream NOPE is not in the backup (it holds ORDERS, ORDERS_DLQ)") {
		t.Fatalf("restore --stream NOPE: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	if res := runHoldfast(t, nil, "restore", "--verify-only", dir); res.code != 0 || !strings.Contains(res.stdout, "complete and intact") {
		t.Fatalf("verify-only of the good backup: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	res = runHoldfast(t, nil, "restore", "--config", in.cfg, "--replace", dir)
	if res.code != 0 || !strings.Contains(res.stdout, "yes (60 messages deleted, last sequence 60)") {
		t.Fatalf("restore --replace: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	if st := natstest.StreamInfo(t, js, "ORDERS").State; st.LastSeq != 50 || st.Msgs != 50 {
		t.Fatalf("after restore --replace: %+v, want the backup's 50 messages", st)
	}
	d.stop()
}

// The snapshot library reports progress from its own goroutines, some of
// them after the backup returned: the bar takes those calls while done()
// runs, and draws nothing after it (run with -race).
func TestBackupProgressBarAfterDone(t *testing.T) {
	t.Parallel()
	f, err := os.Create(filepath.Join(t.TempDir(), "tty"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	bar := newProgressBar(f, "backing up")
	bar.on = true // as on a terminal
	var calls atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := uint64(0); ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			bar.update(backup.Progress{Stream: "ORDERS", Index: 1, Count: 1, Done: i % 101, Total: 100})
			calls.Add(1)
		}
	}()
	size := func() int64 {
		fi, err := f.Stat()
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	natstest.CheckFor(t, 10*time.Second, time.Millisecond, func() error {
		if size() == 0 {
			return fmt.Errorf("nothing drawn after %d updates", calls.Load())
		}
		return nil
	})
	bar.done()
	drawn, after := size(), calls.Load()
	natstest.CheckFor(t, 10*time.Second, time.Millisecond, func() error {
		if n := calls.Load() - after; n < 1000 {
			return fmt.Errorf("%d updates after done()", n)
		}
		return nil
	})
	close(stop)
	wg.Wait()
	if n := size(); n != drawn {
		t.Fatalf("bar drew %d bytes after done()", n-drawn)
	}
}

// TestRestoreInterruptedStreamCreatedAgain: a restore interrupted (Ctrl-C)
// deletes what it left and puts back the stream that --replace deleted
// (it used to leave it empty: its 30000 messages gone, the backup's not
// restored), and nats-server 2.15.2 never announces the end of
// a restore its client gave up (no RESTORE_COMPLETE advisory), so the
// running holdfast took the stream for "being restored" for 30 minutes:
// unhealthy, the stream missing, every publish to it failing. The
// deletion now ends the restore for holdfast, which creates the stream
// again.
//
// A closed terminal (SIGHUP: an ssh session lost) interrupts it alike;
// it killed the restore before, with nothing cleaned up.
//
// The interrupt is a Ctrl-C on `holdfast restore --replace DIR | tee
// log`, which stops tee too: the restore's next line (putting the stream
// back) went to a broken pipe, Go killed it with SIGPIPE, and the replaced
// stream was left deleted, its messages only in a copy nobody named. The
// hangup case reads the restore's output to the end. A kill -9 is in
// restoreKilled.
func TestRestoreInterruptedStreamCreatedAgain(t *testing.T) {
	t.Parallel()
	// The first subtest to run fills the store the others start from:
	// filled before the subtests, in the parent, it put them at the end
	// of the queue of parallel tests, the last to finish.
	filled := &sharedFill{dir: t.TempDir()}
	for _, c := range []struct {
		sig        os.Signal
		brokenPipe bool
	}{{os.Interrupt, true}, {syscall.SIGHUP, false}, {syscall.SIGKILL, false}} {
		name := c.sig.String()
		if c.brokenPipe {
			name += " with its output gone"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testRestoreInterrupted(t, filled.get(t), c.sig, c.brokenPipe)
		})
	}
}

// filledStore is a stopped holdfast's store holding 30000 messages in
// ORDERS, and a backup of it.
type filledStore struct{ store, backup string }

// sharedFill is a filledStore made once, in dir, by the first test that
// asks for it.
type sharedFill struct {
	dir    string
	once   sync.Once
	filled filledStore
	ok     bool
}

func (s *sharedFill) get(t *testing.T) filledStore {
	s.once.Do(func() {
		s.filled = fillForInterruptedRestore(t, s.dir)
		s.ok = true
	})
	if !s.ok {
		t.Fatal("filling the store failed: see the test that filled it")
	}
	return s.filled
}

// fillForInterruptedRestore fills a store in dir for the interrupted
// restores, each of which starts on a copy of it.
func fillForInterruptedRestore(t *testing.T, dir string) filledStore {
	in := newE2EInstanceIn(t, dir)
	d := startHoldfast(t, in.cfg)
	d.waitReady()
	_, js := e2eConnect(t, in)
	// Enough messages that the restore into a sync = "always" store takes
	// a few seconds; published in windows of 500, which on a loaded
	// machine take longer than natstest.Context's 30 s in all.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for i := 0; i < 30000; i += 500 {
		for j := range 500 {
			if _, err := js.PublishAsync("orders.created", fmt.Appendf(nil, "%d", i+j)); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-ctx.Done():
			t.Fatal("publishing did not complete")
		}
	}
	backup := filepath.Join(dir, "backup")
	if res := runHoldfast(t, nil, "backup", "--config", in.cfg, backup); res.code != 0 {
		t.Fatalf("backup: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	d.stop()
	return filledStore{store: in.store, backup: backup}
}

func testRestoreInterrupted(t *testing.T, filled filledStore, sig os.Signal, brokenPipe bool) {
	in := newE2EInstance(t)
	dir := filepath.Join(t.TempDir(), "backup")
	for from, to := range map[string]string{filled.store: in.store, filled.backup: dir} {
		if out, err := exec.Command("cp", "-a", from, to).CombinedOutput(); err != nil {
			t.Fatalf("cp: %v %s", err, out)
		}
	}
	d := startHoldfast(t, in.cfg)
	d.waitReady()
	_, js := e2eConnect(t, in)

	restore := exec.Command(holdfastBin, "restore", "--config", in.cfg, "--replace", dir)
	restore.Env = e2eEnv()
	var out natstest.Buffer
	restore.Stdout, restore.Stderr = &out, &out
	var pipe *os.File
	if brokenPipe {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		restore.Stdout, restore.Stderr, pipe = w, w, r
		go func() { _, _ = io.Copy(&out, r) }()
	}
	if err := restore.Start(); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		if !strings.Contains(d.stderr.String(), "stream being restored from a backup") {
			return errors.New("the restore has not started")
		}
		return nil
	})
	if pipe != nil {
		pipe.Close() // what the restore writes from now on goes nowhere
	}
	if err := restore.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	werr := restore.Wait()
	if werr == nil {
		t.Skipf("the restore finished before the interrupt reached it:\n%s", out.String())
	}
	t.Logf("interrupted restore (%v):\n%s", werr, out.String())
	if sig == syscall.SIGKILL {
		restoreKilled(t, in, js, out.String())
		return
	}

	// The restore deleted what it left and put back the ORDERS it had
	// replaced, all 30000 messages (it used to leave it empty: the
	// --replace had deleted them, the backup's were not restored).
	s, err := js.Stream(natstest.Context(t), "ORDERS")
	if err != nil {
		t.Fatalf("ORDERS after the interrupted restore: %v", err)
	}
	if st := s.CachedInfo().State; st.Msgs != 30000 || st.LastSeq != 30000 {
		t.Fatalf("ORDERS after the interrupted restore: %+v, want its 30000 messages put back", st)
	}
	if !brokenPipe && !strings.Contains(out.String(), "put back as it was (30000 messages") {
		t.Errorf("the interrupted restore does not say ORDERS was put back:\n%s", out.String())
	}
	ack, err := js.Publish(natstest.Context(t), "orders.created", []byte("after"))
	if err != nil || ack.Sequence != 30001 {
		t.Fatalf("publish after the interrupted restore: %+v, %v", ack, err)
	}
}

// restoreKilled checks what a `restore --replace` killed while it
// restored leaves: part of the backup that takes no publishes (it used to
// acknowledge them, into a stream the next restore deletes), even once the
// running holdfast took the restore for gone, and the copy of the stream
// it replaced, named before the delete (it was named only by a restore
// that failed or was interrupted), which `restore --replace` puts back.
func restoreKilled(t *testing.T, in *e2eInstance, js jetstream.JetStream, out string) {
	m := regexp.MustCompile(`saved in (\S+) \(30000 messages, last sequence 30000\) before it is replaced`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("the restore did not name the copy of ORDERS before it deleted it:\n%s", out)
	}
	// At once, and once holdfast took the server's restore for gone (and
	// created ORDERS again, empty, if the server kept nothing of it).
	for _, after := range []time.Duration{0, 12 * time.Second} {
		time.Sleep(after)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		ack, err := js.Publish(ctx, "orders.created", []byte("into a partial restore"))
		cancel()
		if err == nil && (after == 0 || ack.Sequence != 1) {
			t.Fatalf("%v after the restore was killed: a publish was acknowledged (%+v) by what it left", after, ack)
		}
	}
	// 30000 messages, each flushed: over 30 s on a loaded machine.
	if res := runHoldfastWithin(t, 3*time.Minute, "restore", "--config", in.cfg, "--replace", m[1]); res.code != 0 {
		t.Fatalf("restore --replace of the copy: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	s, err := js.Stream(natstest.Context(t), "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	if st := s.CachedInfo().State; st.Msgs != 30000 || st.LastSeq != 30000 {
		t.Fatalf("ORDERS put back from the copy: %+v, want its 30000 messages", st)
	}
	if ack, err := js.Publish(natstest.Context(t), "orders.created", []byte("after")); err != nil || ack.Sequence != 30001 {
		t.Fatalf("publish after the copy was put back: %+v, %v", ack, err)
	}
}

// TestRestoreRefusesBackupTheConfigContradicts: a backup whose stream has
// a retention the config does not (here workqueue against limits) is
// refused before anything changes, naming the stream, the field and both
// values. The restore used to succeed, and holdfast then refused to start
// at its next start: the server cannot change retention in place.
func TestRestoreRefusesBackupTheConfigContradicts(t *testing.T) {
	t.Parallel()
	b, pb, res := restoreIntoNewInstance(t, backupOfAnotherConfig(t, "subjects = [\"orders.*\"]\n", "subjects = [\"orders.*\"]\nretention = \"workqueue\"\n", "orders.created"))
	if res.code != 1 || !strings.Contains(res.stderr, "stream ORDERS: retention is WorkQueue in the backup, Limits in the config ([streams.ORDERS])") ||
		!strings.Contains(res.stderr, "nothing was restored") {
		t.Errorf("restore of a workqueue backup into a limits config: exit %d, want 1 naming the retention\n%s%s", res.code, res.stdout, res.stderr)
	}
	pb.stop()
	// The next start works: nothing was restored that it would refuse.
	pb = startHoldfast(t, b.cfg)
	pb.waitReady()
	pb.stop()
}

// backupOfAnotherConfig backs up a holdfast whose config is the e2e one
// with from replaced by to, after 3 messages published to subject, and
// returns the backup's directory.
func backupOfAnotherConfig(t *testing.T, from, to, subject string) string {
	t.Helper()
	a := newE2EInstance(t)
	a.cfg = e2eWriteConfig(t, strings.Replace(e2eConfigTOML(a.store, a.port, ""), from, to, 1))
	pa := startHoldfast(t, a.cfg)
	pa.waitReady()
	if res := runHoldfast(t, nil, "pub", "--config", a.cfg, "--count", "3", subject, "x"); res.code != 0 {
		t.Fatalf("pub: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	dir := filepath.Join(t.TempDir(), "backup")
	if res := runHoldfast(t, nil, "backup", "--config", a.cfg, dir); res.code != 0 {
		t.Fatalf("backup: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	pa.stop()
	return dir
}

// restoreIntoNewInstance starts a holdfast of the e2e config on a new
// store and restores the backup dir into it.
func restoreIntoNewInstance(t *testing.T, dir string) (*e2eInstance, *e2eProc, e2eResult) {
	t.Helper()
	b := newE2EInstance(t)
	pb := startHoldfast(t, b.cfg)
	pb.waitReady()
	return b, pb, runHoldfast(t, nil, "restore", "--config", b.cfg, dir)
}

// TestRestoreAcrossClusterAndSingleNode: a backup of a single holdfast
// (streams with one replica) restored into a three-node cluster comes back
// with the replicas every node's config gives its streams (3), all of them
// current. A backup of that cluster (three replicas) is refused by the
// single holdfast before anything changes, even with --replace: a server
// outside a cluster cannot hold a stream of three replicas.
func TestRestoreAcrossClusterAndSingleNode(t *testing.T) {
	t.Parallel()
	single := newE2EInstance(t)
	sd := startHoldfast(t, single.cfg)
	sd.waitReady()
	_, sjs := e2eConnect(t, single)
	e2ePublishAcked(t, sjs, 0, 20)
	fromSingle := filepath.Join(t.TempDir(), "from-single")
	if res := runHoldfast(t, nil, "backup", "--config", single.cfg, fromSingle); res.code != 0 {
		t.Fatalf("backup of the single node: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}

	nodes := newTestCluster(t, 3, "")
	startAll(t, nodes)
	cjs := clusterJetStream(t, nodes)
	res := runHoldfast(t, nil, "restore", "--config", nodes[1].cfg, fromSingle)
	t.Logf("restore into the cluster: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	if res.code != 0 {
		t.Fatalf("restore of the single node's backup into the cluster: exit %d", res.code)
	}
	for _, name := range []string{"ORDERS", "ORDERS_DLQ"} {
		if info := streamClusterInfo(t, cjs, name); info.Config.Replicas != 3 {
			t.Fatalf("%s restored into the cluster with %d replica(s); every node's config says 3", name, info.Config.Replicas)
		}
		waitReplicasCurrent(t, cjs, name, 3)
	}
	if st := streamClusterInfo(t, cjs, "ORDERS").State; st.Msgs != 20 || st.LastSeq != 20 {
		t.Fatalf("ORDERS in the cluster after the restore: %+v, want the backup's 20 messages", st)
	}
	natstest.CheckFor(t, 30*time.Second, 200*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := cjs.Consumer(ctx, "ORDERS", "WORKER1")
		if err != nil {
			return err
		}
		if cl := c.CachedInfo().Cluster; cl == nil || cl.Leader == "" || len(cl.Replicas) != 2 {
			return fmt.Errorf("WORKER1 after the restore: %+v, want a leader and two replicas", cl)
		}
		return nil
	})

	fromCluster := filepath.Join(t.TempDir(), "from-cluster")
	if res := runHoldfast(t, nil, "backup", "--config", nodes[0].cfg, fromCluster); res.code != 0 {
		t.Fatalf("backup of the cluster: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	before := natstest.StreamInfo(t, sjs, "ORDERS")
	res = runHoldfast(t, nil, "restore", "--config", single.cfg, "--replace", fromCluster)
	t.Logf("restore of the cluster's backup into the single node: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	if res.code != 1 || !strings.Contains(res.stderr, "ORDERS has 3 replicas in the backup") || !strings.Contains(res.stderr, "nothing was restored") {
		t.Fatalf("restore of an R3 backup into a single node: exit %d, want 1 and the refusal", res.code)
	}
	if strings.Contains(res.stderr, "deleted") || strings.Contains(res.stderr, "held back") {
		t.Fatalf("the refused restore changed the stream first")
	}
	after := natstest.StreamInfo(t, sjs, "ORDERS")
	if after.State.Msgs != 20 || !after.Created.Equal(before.Created) || !slices.Equal(after.Config.Subjects, []string{"orders.*"}) {
		t.Fatalf("ORDERS on the single node after the refused restore: %+v, created %v (was %v), subjects %v",
			after.State, after.Created, before.Created, after.Config.Subjects)
	}
	for _, nd := range nodes {
		nd.proc.stop()
	}
	sd.stop()
}

// TestRestoreSaysWhatKeepsTheBackupsSettings: a backup taken with other
// subjects, restored, keeps them until a reload: publishes to the config's
// subjects find no stream meanwhile. The restore says so, naming the
// field and both values; it said only "restored 1 stream(s)", and status
// said OK.
func TestRestoreSaysWhatKeepsTheBackupsSettings(t *testing.T) {
	t.Parallel()
	_, pb, res := restoreIntoNewInstance(t, backupOfAnotherConfig(t, `subjects = ["orders.*"]`, `subjects = ["legacy.*"]`, "legacy.created"))
	if res.code != 0 || !strings.Contains(res.stderr, "keep the backup's settings") ||
		!strings.Contains(res.stderr, "subjects is [legacy.*] on the server, [orders.*] in this node's config") {
		t.Errorf("restore of a backup with other subjects: exit %d, want 0 saying the subjects differ until a reload\n%s%s", res.code, res.stdout, res.stderr)
	}
	pb.stop()
}

// TestBackupAndRestoreNameAWrongDIR: an empty DIR, a file, and for
// restore a missing directory are usage errors that say so, before
// anything connects. backup "" tried "mkdir :"; restore "" verified the
// current directory ("backup  is not usable: manifest.json: missing"),
// and restore of a file failed on FILE/SHA256SUMS.
func TestBackupAndRestoreNameAWrongDIR(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "missing")
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"backup", ""}, "DIR is empty"},
		{[]string{"backup", file}, file + " is not a directory"},
		{[]string{"restore", ""}, "DIR is empty"},
		{[]string{"restore", file}, file + " is not a directory"},
		{[]string{"restore", "--verify-only", missing}, missing + " cannot be read (no such file or directory)"},
	} {
		args := append([]string{tt.args[0], "--server", "nats://127.0.0.1:1"}, tt.args[1:]...)
		res := runHoldfast(t, nil, args...)
		if res.code != 2 || !strings.Contains(res.stderr, tt.want) {
			t.Errorf("holdfast %q: exit %d, want 2 saying %q\n%s%s", tt.args, res.code, tt.want, res.stdout, res.stderr)
		}
	}
}
