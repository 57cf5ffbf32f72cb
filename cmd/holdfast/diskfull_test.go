package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sys/unix"

	"github.com/holdfast-io/holdfast/internal/natstest"
)

// The disk-full tests run holdfast with its store on a small ext4 file
// system (a loop-mounted image file): they need root, loop devices and
// mkfs.ext4 (Debian: e2fsprogs), and skip with the reason otherwise.

// mountExt4 makes an ext4 file system of sizeMB in an image file, mounts it
// and returns the mount point; it is unmounted when the test ends.
func mountExt4(t *testing.T, sizeMB int) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a loop device")
	}
	mkfs, err := exec.LookPath("mkfs.ext4")
	if err != nil {
		t.Skip("mkfs.ext4 not installed (Debian: apt-get install e2fsprogs)")
	}
	dir := t.TempDir()
	img := filepath.Join(dir, "disk.img")
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(int64(sizeMB) << 20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	// -m 0: no blocks reserved for root, so root sees the same space as
	// the holdfast user would.
	if out, err := exec.Command(mkfs, "-q", "-F", "-m", "0", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v\n%s", err, out)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		t.Skipf("cannot loop-mount an ext4 image here: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		for i := 0; ; i++ {
			out, err := exec.Command("umount", mnt).CombinedOutput()
			if err == nil {
				return
			}
			if i == 50 {
				t.Errorf("umount %s: %v\n%s", mnt, err, out)
				_ = exec.Command("umount", "-l", mnt).Run()
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	return mnt
}

// diskFullConfig is a config with the store on mnt and a max_file_store
// far larger than the disk.
func diskFullConfig(t *testing.T, mnt string, port int) string {
	t.Helper()
	return e2eWriteConfig(t, strings.Replace(e2eConfigTOML(filepath.Join(mnt, "store"), port, ""),
		`max_file_store = "1GB"`, `max_file_store = "10GB"`, 1))
}

// diskFullPayload is the body of every message: large, so that the disk
// fills after a few hundred publishes.
var diskFullPayload = strings.Repeat("x", 32<<10)

// publishUntilFull publishes one message at a time with a unique
// Nats-Msg-Id until a publish fails, recording every PubAck in acks. It
// returns the error of the failed publish and how long it took.
func publishUntilFull(t *testing.T, js jetstream.JetStream, prefix string, acks *ackLog) (time.Duration, error) {
	t.Helper()
	for i := 0; i < 100000; i++ {
		id := fmt.Sprintf("%s-%06d", prefix, i)
		msg := &nats.Msg{Subject: "orders.created", Data: []byte(diskFullPayload), Header: nats.Header{}}
		msg.Header.Set(nats.MsgIdHdr, id)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		start := time.Now()
		ack, err := js.PublishMsg(ctx, msg)
		took := time.Since(start)
		cancel()
		if err != nil {
			return took, err
		}
		acks.add(id, ack.Sequence)
	}
	t.Fatal("the disk never filled")
	return 0, nil
}

// storedMsgIDs reads the Nats-Msg-Id of every message in stream ORDERS.
func storedMsgIDs(t *testing.T, js jetstream.JetStream) map[string]bool {
	t.Helper()
	ctx := natstest.Context(t)
	s, err := js.Stream(ctx, "ORDERS")
	if err != nil {
		t.Fatalf("stream ORDERS: %v", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	if info.State.Msgs == 0 {
		return ids
	}
	oc, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for uint64(len(ids)) < info.State.Msgs {
		m, err := oc.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatalf("read stream ORDERS after %d of %d messages: %v", len(ids), info.State.Msgs, err)
		}
		ids[m.Headers().Get(nats.MsgIdHdr)] = true
		if md, err := m.Metadata(); err == nil && md.NumPending == 0 {
			break
		}
	}
	return ids
}

// checkAllAcked fails the test if a message acks recorded is missing.
func checkAllAcked(t *testing.T, js jetstream.JetStream, acks *ackLog, when string) {
	t.Helper()
	have := storedMsgIDs(t, js)
	lost := 0
	for _, id := range acks.ids() {
		if !have[id] {
			lost++
		}
	}
	if lost > 0 {
		t.Fatalf("%s: %d of %d acknowledged messages lost", when, lost, acks.len())
	}
}

// requireStoreFullError checks that a publish to a full store failed with
// a JetStream error, not a timeout or a lost connection.
func requireStoreFullError(t *testing.T, err error, took time.Duration, when string) {
	t.Helper()
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		t.Fatalf("%s: publish failed with %v after %s, want a JetStream error (no PubAck, no timeout)", when, err, took)
	}
	t.Logf("%s: publish refused after %s: JetStream error %d: %s", when, took, apiErr.ErrorCode, apiErr.Description)
}

// TestDiskFull fills holdfast's store on a small ext4 file system: once
// full, every publish gets an error (not a timeout, not a false PubAck),
// holdfast keeps running, every acknowledged message survives a SIGTERM
// restart and a kill -9, and after a purge publishing works again without
// a restart.
func TestDiskFull(t *testing.T) {
	t.Parallel()
	// 20 MB: filled twice and read back four times, in 32 KiB messages.
	mnt := mountExt4(t, 20)
	in := &e2eInstance{store: filepath.Join(mnt, "store"), port: natstest.FreePort(t)}
	in.cfg = diskFullConfig(t, mnt, in.port)
	p := startHoldfast(t, in.cfg)
	p.waitReady()
	if !strings.Contains(p.stderr.String(), "max_file_store lowered") {
		t.Errorf("no warning that max_file_store was lowered to what the disk holds:\n%s", p.stderr.String())
	}
	_, js := e2eConnect(t, in)
	acks := newAckLog()
	took, err := publishUntilFull(t, js, "fill", acks)
	t.Logf("store full after %d acknowledged messages: %v (after %s)", acks.len(), err, took)
	if acks.len() < 100 {
		t.Fatalf("only %d messages fit on a 20 MB disk", acks.len())
	}
	requireStoreFullError(t, err, took, "first publish to a full store")
	// Small messages are refused too, every time, and promptly enough to
	// be an answer (a timeout would take the full 10s).
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		start := time.Now()
		_, err := js.Publish(ctx, "orders.created", []byte(fmt.Sprintf("small-%d", i)))
		cancel()
		if err == nil {
			t.Fatal("a publish to a full store was acknowledged")
		}
		requireStoreFullError(t, err, time.Since(start), "small publish to a full store")
	}
	if p.exited() {
		t.Fatalf("holdfast exited when the store filled: %v", p.state)
	}
	if _, err := js.AccountInfo(natstest.Context(t)); err != nil {
		t.Fatalf("JetStream does not answer with a full store: %v", err)
	}
	checkAllAcked(t, js, acks, "store full")

	// SIGTERM and start again: everything acknowledged is there, and the
	// store is still full.
	p.stop()
	p = startHoldfast(t, in.cfg)
	p.waitReady()
	_, js = e2eConnect(t, in)
	checkAllAcked(t, js, acks, "after SIGTERM and restart")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	start := time.Now()
	_, err = js.Publish(ctx, "orders.created", diskFullPayloadBytes())
	cancel()
	if err == nil {
		t.Fatal("a publish to a full store was acknowledged after a restart")
	}
	requireStoreFullError(t, err, time.Since(start), "after restart")

	// kill -9 and start again.
	p.signal(syscall.SIGKILL)
	p = startHoldfast(t, in.cfg)
	p.waitReady()
	_, js = e2eConnect(t, in)
	checkAllAcked(t, js, acks, "after kill -9 and restart")

	// Free space the way an operator would (nats stream purge), and
	// publishing works again without a restart.
	purge := e2eRunBinary(t, natsBin, nil, nil, "--server", in.url(), "stream", "purge", "ORDERS", "--force")
	if purge.code != 0 {
		t.Fatalf("nats stream purge: %d\n%s%s", purge.code, purge.stdout, purge.stderr)
	}
	natstest.CheckFor(t, 30*time.Second, 200*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := js.Publish(ctx, "orders.created", diskFullPayloadBytes())
		return err
	})
	again := newAckLog()
	took, err = publishUntilFull(t, js, "refill", again)
	requireStoreFullError(t, err, took, "second fill")
	t.Logf("after the purge %d more messages fit", again.len())
	if again.len() < acks.len()/2 {
		t.Errorf("after a purge only %d messages fit, against %d before", again.len(), acks.len())
	}
	checkAllAcked(t, js, again, "second fill")
	p.stop()
}

func diskFullPayloadBytes() []byte { return []byte(diskFullPayload) }

// fillDisk writes zeros to a file on mnt until the file system is full, as
// another program would.
func fillDisk(t *testing.T, mnt string) string {
	t.Helper()
	path := filepath.Join(mnt, "filler")
	out, err := exec.Command("dd", "if=/dev/zero", "of="+path, "bs=1M").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "No space left") {
		t.Fatalf("dd did not fill the disk: %v\n%s", err, out)
	}
	return path
}

// healthz reads /healthz: the status code and the body.
func healthz(t *testing.T, addr string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestDiskFilledByAnotherProgram: another program fills the disk after
// holdfast started (below the store limit it computed at start-up). The
// first failed write makes /healthz 503 naming it, the metric counts it,
// and the watchdog ping stops — the server keeps a stream that failed a
// write broken until it is opened again — so that systemd restarts
// holdfast, whose start-up caps the store to what the disk holds.
func TestDiskFilledByAnotherProgram(t *testing.T) {
	t.Parallel()
	mnt := mountExt4(t, 40)
	in := &e2eInstance{store: filepath.Join(mnt, "store"), port: natstest.FreePort(t)}
	addr := fmt.Sprintf("127.0.0.1:%d", natstest.FreePort(t))
	text := strings.Replace(e2eConfigTOML(in.store, in.port, ""), `max_file_store = "1GB"`, `max_file_store = "10GB"`, 1)
	in.cfg = e2eWriteConfig(t, strings.Replace(text, "[http]\nlisten = \"\"", fmt.Sprintf("[http]\nlisten = %q", addr), 1))
	ns := newNotifySocket(t)
	p := startHoldfastEnv(t, in.cfg, "NOTIFY_SOCKET="+ns.path, "WATCHDOG_USEC=1000000")
	p.waitReady()
	ns.waitFor(t, "WATCHDOG=1", 0)
	_, js := e2eConnect(t, in)
	if code, body := healthz(t, addr); code != http.StatusOK {
		t.Fatalf("/healthz before the disk filled: %d %s", code, body)
	}
	filler := fillDisk(t, mnt)
	// Publish until the store hits the full disk.
	acks := newAckLog()
	took, err := publishUntilFull(t, js, "fill", acks)
	t.Logf("store failed after %d acknowledged messages: %v (after %s)", acks.len(), err, took)

	natstest.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		code, body := healthz(t, addr)
		if code != http.StatusServiceUnavailable || !strings.Contains(body, `"reason": "the store cannot be written`) ||
			!strings.Contains(body, "no space left on device") {
			return fmt.Errorf("/healthz = %d %s", code, body)
		}
		return nil
	})
	natstest.CheckFor(t, 10*time.Second, 100*time.Millisecond, func() error {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if !strings.Contains(string(b), "holdfast_store_write_errors_total ") || strings.Contains(string(b), "holdfast_store_write_errors_total 0\n") {
			return errors.New("holdfast_store_write_errors_total missing or 0")
		}
		return nil
	})
	natstest.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		if !strings.Contains(p.stderr.String(), "withholding watchdog ping") {
			return errors.New("the watchdog ping was not withheld")
		}
		return nil
	})
	// systemd would now restart holdfast: with the space freed, it serves
	// and stores again, and nothing acknowledged is lost.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	p.stop()
	p = startHoldfast(t, in.cfg)
	p.waitReady()
	_, js = e2eConnect(t, in)
	checkAllAcked(t, js, acks, "after the restart")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.Publish(ctx, "orders.created", []byte("after")); err != nil {
		t.Fatalf("publish after the restart: %v", err)
	}
	natstest.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		if code, body := healthz(t, addr); code != http.StatusOK {
			return fmt.Errorf("/healthz after the restart: %d %s", code, body)
		}
		return nil
	})
	p.stop()
}

// ext4IocShutdown is EXT4_IOC_SHUTDOWN (_IOR('X', 125, __u32)), the same
// number as XFS's; ext4ShutdownNoLogFlush is EXT4_GOING_FLAGS_NOLOGFLUSH.
const (
	ext4IocShutdown        = 0x8004587d
	ext4ShutdownNoLogFlush = 2
)

// TestStoreFileSystemShutDown: the store's file system fails every write
// (an ext4 forced shutdown, as after an I/O error with errors=panic-less
// setups). /healthz must name the real cause, the store, and not a
// consequence ("consumer WORKER1 does not exist"); holdfast must not
// acknowledge publishes it cannot store.
func TestStoreFileSystemShutDown(t *testing.T) {
	t.Parallel()
	mnt := mountExt4(t, 40)
	in := &e2eInstance{store: filepath.Join(mnt, "store"), port: natstest.FreePort(t)}
	addr := fmt.Sprintf("127.0.0.1:%d", natstest.FreePort(t))
	in.cfg = e2eWriteConfig(t, strings.Replace(e2eConfigTOML(in.store, in.port, ""), "[http]\nlisten = \"\"", fmt.Sprintf("[http]\nlisten = %q", addr), 1))
	p := startHoldfast(t, in.cfg)
	p.waitReady()
	_, js := e2eConnect(t, in)
	if _, err := js.Publish(natstest.Context(t), "orders.created", []byte("before")); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(mnt)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.IoctlSetPointerInt(int(f.Fd()), ext4IocShutdown, ext4ShutdownNoLogFlush); err != nil {
		t.Skipf("cannot shut the ext4 file system down here: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	if _, err := js.Publish(ctx, "orders.created", []byte("after")); err == nil {
		t.Error("a publish was acknowledged after the store's file system shut down")
	}
	cancel()
	var last string
	natstest.CheckFor(t, 60*time.Second, 200*time.Millisecond, func() error {
		if p.exited() {
			// Exiting with the cause named is an answer too (the store
			// watcher's): the log must say it.
			return nil
		}
		code, body := healthz(t, addr)
		last = body
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "store") {
			return fmt.Errorf("/healthz = %d %s", code, body)
		}
		return nil
	})
	log := p.stderr.String()
	if p.exited() {
		if !strings.Contains(log, "store directory lost") && !strings.Contains(log, "store cannot be written") {
			t.Fatalf("holdfast exited without naming the store:\n%s", log)
		}
		return
	}
	var h struct {
		Reason string `json:"reason"`
	}
	if err := json.Unmarshal([]byte(last), &h); err != nil {
		t.Fatalf("/healthz is not JSON: %v\n%s", err, last)
	}
	if !strings.Contains(h.Reason, "store") || strings.Contains(h.Reason, "does not exist") {
		t.Fatalf("/healthz reason %q does not name the store as the cause", h.Reason)
	}
	t.Logf("/healthz reason: %s", h.Reason)
}
