package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/internal/lazyfs"
	"github.com/holdfast-io/holdfast/internal/natstest"
)

// The power-loss harness: holdfast runs with its store on a lazyfs mount
// (a FUSE passthrough that forgets every write not yet fsynced when it
// "crashes"). Each cycle starts holdfast, checks every message
// acknowledged so far is still there, publishes from several publishers
// while the workers process, then kills holdfast at a random moment and
// cuts the power: every file goes back to its last synced state.
//
// HOLDFAST_POWERLOSS_CYCLES sets the number of cycles (make powerloss).

// powerLossResult is what a run of the harness measured.
type powerLossResult struct {
	sync            string
	cycles          int
	acked           int // messages that got a PubAck
	lost            int // acknowledged messages missing at the end
	streamVanished  int // restarts that found no stream ORDERS
	consumerMissing int // restarts that found no consumer WORKER1
	lossReported    int // restarts where holdfast reported a data loss
	droppedBytes    int64
	// The longest of each step over the cycles: start to ready (the
	// check after it included), kill to exit, the load's stop, the cut
	// and the remount; then the last start's drain. A run that takes far
	// longer than usual says here where it waited.
	slowest [5]time.Duration
}

// note keeps the time since since as step i's longest when it is.
func (r *powerLossResult) note(i int, since time.Time) {
	r.slowest[i] = max(r.slowest[i], time.Since(since))
}

func (r powerLossResult) String() string {
	round := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	return fmt.Sprintf("sync=%s: %d power cuts, %d messages acknowledged, %d lost; stream missing at %d restart(s), consumer missing at %d (after the bootstrap); holdfast reported a data loss at %d start(s); %d unsynced bytes dropped by the cuts; longest start to ready %s, kill to exit %s, load stop %s, cut and remount %s; last drain %s",
		r.sync, r.cycles, r.acked, r.lost, r.streamVanished, r.consumerMissing, r.lossReported, r.droppedBytes,
		round(r.slowest[0]), round(r.slowest[1]), round(r.slowest[2]), round(r.slowest[3]), round(r.slowest[4]))
}

// powerCutAndStart cuts the power under proc: kills it, drops what lfs
// holds unflushed and mounts lfs again; then starts holdfast on cfg again
// and waits until it is ready.
func powerCutAndStart(t *testing.T, proc *e2eProc, lfs *lazyfs.FS, cfg string) (*e2eProc, *lazyfs.FS) {
	t.Helper()
	if err := proc.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	proc.wait(30 * time.Second)
	if _, err := lfs.Crash(); err != nil {
		t.Fatal(err)
	}
	lfs, err := lfs.Remount()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lfs.Unmount() })
	proc = startHoldfast(t, cfg)
	proc.waitReady()
	return proc, lfs
}

// powerLossClient connects to url for the test's duration.
func powerLossClient(t *testing.T, url string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// publishAcked publishes total messages to orders.created, each data or
// (nil) its number, and waits for each one's PubAck (the test fails on an
// error or without one in time).
func publishAcked(t *testing.T, ctx context.Context, js jetstream.JetStream, total int, data []byte) {
	t.Helper()
	futs := make([]jetstream.PubAckFuture, 0, total)
	for i := range total {
		body := data
		if body == nil {
			body = fmt.Appendf(nil, "%d", i)
		}
		f, err := js.PublishAsync("orders.created", body)
		if err != nil {
			t.Fatal(err)
		}
		futs = append(futs, f)
	}
	for i, f := range futs {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			t.Fatalf("publish %d of %d: %v", i+1, total, err)
		case <-ctx.Done():
			t.Fatalf("publish %d of %d: no PubAck in time", i+1, total)
		}
	}
}

// checkOrdersHolds fails the test unless ORDERS holds total messages
// (after says when, for the message).
func checkOrdersHolds(t *testing.T, ctx context.Context, js jetstream.JetStream, total uint64, after string) {
	t.Helper()
	s, err := js.Stream(ctx, "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != total {
		t.Errorf("%s, ORDERS holds %d messages (last sequence %d), want %d", after, info.State.Msgs, info.State.LastSeq, total)
	}
}

// lazyMount mounts a lazyfs over a fresh backing dir, or skips the test
// when FUSE cannot be mounted here.
func lazyMount(t *testing.T) *lazyfs.FS {
	t.Helper()
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse: the power-loss harness needs FUSE")
	}
	lfs, err := lazyfs.MountIn(lazyfsBin, durTempDir(t, "backing"), durTempDir(t, "mnt"))
	if err != nil {
		if os.Geteuid() != 0 {
			t.Skipf("cannot mount lazyfs (run as root, or install fuse3): %v", err)
		}
		t.Fatal(err)
	}
	return lfs
}

func runPowerLoss(t *testing.T, syncSetting string, groupCommit bool, cycles int, publishers int) powerLossResult {
	t.Helper()
	return runPowerLossWith(t, powerLossLoad{sync: syncSetting, groupCommit: groupCommit, cycles: cycles,
		start: func(cycle int, url string, acks *ackLog) func() {
			return startPublishers(t, url, fmt.Sprintf("c%03d", cycle), publishers, acks).stop
		}})
}

// powerLossLoad is what a power-loss run configures and publishes.
type powerLossLoad struct {
	sync        string // jetstream.sync; "" keeps the default
	groupCommit bool
	// commitWindow is jetstream.commit_window; "" keeps the default.
	commitWindow string
	cycles       int
	label        string // added to the result's sync
	// extra is config appended to the harness's (durConfig.extra), with
	// port free ports for its listeners.
	extra func(port func() int) string
	// start starts the publishers of a cycle, recording what was
	// acknowledged in acks; the func it returns stops them.
	start func(cycle int, url string, acks *ackLog) func()
}

func runPowerLossWith(t *testing.T, load powerLossLoad) powerLossResult {
	t.Helper()
	lfs := lazyMount(t)
	t.Cleanup(func() { _ = lfs.Unmount() })
	port := natstest.FreePort(t)
	dc := durConfig{store: filepath.Join(lfs.Mountpoint, "store"), port: port, sync: load.sync, workers: 2, groupCommit: load.groupCommit,
		commitWindow: load.commitWindow}
	if load.extra != nil {
		dc.extra = load.extra(func() int { return natstest.FreePort(t) })
	}
	cfgPath := e2eWriteConfig(t, dc.toml())
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	acks := newAckLog()
	res := powerLossResult{sync: load.sync, cycles: load.cycles}
	if load.sync == "" {
		res.sync = "always (default)"
	}
	if load.groupCommit {
		res.sync += " with group_commit"
	}
	if load.commitWindow != "" {
		res.sync += " and commit_window = " + load.commitWindow
	}
	res.sync += load.label

	check := func(proc *e2eProc) {
		t.Helper()
		v := checkAcked(t, url, acks)
		if v.streamMissing {
			res.streamVanished++
		}
		if v.consumerMissing {
			res.consumerMissing++
		}
		if strings.Contains(proc.stderr.String(), "data loss") {
			res.lossReported++
		}
		if v.lost > 0 && res.lost == 0 {
			t.Logf("first lost: %s", v.firstLost)
		}
		res.acked, res.lost = v.acked, v.lost
	}

	for cycle := range load.cycles {
		began := time.Now()
		proc := startHoldfast(t, cfgPath)
		proc.waitReady()
		if cycle > 0 {
			check(proc)
		}
		res.note(0, began)
		stop := load.start(cycle, url, acks)
		time.Sleep(randDuration(300*time.Millisecond, 1500*time.Millisecond))
		if err := proc.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		proc.wait(30 * time.Second)
		res.note(1, killed)
		stopping := time.Now()
		stop()
		res.note(2, stopping)
		cut := time.Now()
		rep, err := lfs.Crash()
		if err != nil {
			t.Fatalf("cycle %d: power cut: %v", cycle, err)
		}
		res.droppedBytes += rep.BytesDropped
		if lfs, err = lfs.Remount(); err != nil {
			t.Fatalf("cycle %d: remount: %v", cycle, err)
		}
		t.Cleanup(func() { _ = lfs.Unmount() })
		res.note(3, cut)
	}

	proc := startHoldfast(t, cfgPath)
	proc.waitReady()
	check(proc)
	if res.lost == 0 && res.streamVanished == 0 {
		// Every message is processed: the workers drain the consumer.
		draining := time.Now()
		waitDrained(t, url, 60*time.Second)
		res.note(4, draining)
	}
	proc.stop()
	return res
}

// TestPowerLossSyncAlways is Promise 1 under power cuts: with the default
// sync = "always", no acknowledged message is ever lost, the stream and
// the consumer survive, and every message is processed.
func TestPowerLossSyncAlways(t *testing.T) {
	t.Parallel()
	cycles := durEnvInt("HOLDFAST_POWERLOSS_CYCLES", 5)
	requireNoLoss(t, runPowerLoss(t, "", false, cycles, 4), `sync = "always"`)
}

// requireNoLoss reports a power-loss run and fails on any acknowledged
// message lost, any stream or consumer missing, or a loss holdfast
// reported, under what.
func requireNoLoss(t *testing.T, res powerLossResult, what string) {
	t.Helper()
	t.Log(res)
	fmt.Println("powerloss:", res)
	if res.acked == 0 {
		t.Fatal("no message was acknowledged: the harness measured nothing")
	}
	if res.lost != 0 || res.streamVanished != 0 || res.consumerMissing != 0 {
		t.Errorf("with %s: %s", what, res)
	}
	if res.lossReported != 0 {
		t.Errorf("holdfast reported a data loss with %s", what)
	}
}

// TestPowerLossSyncInterval measures what a sync interval costs at a
// power cut. It asserts only that holdfast does not hide a loss: when
// acknowledged messages are gone, holdfast said so at start-up.
func TestPowerLossSyncInterval(t *testing.T) {
	t.Parallel()
	cycles := durEnvInt("HOLDFAST_POWERLOSS_CYCLES", 2)
	res := runPowerLoss(t, "2m", false, cycles, 4)
	t.Log(res)
	fmt.Println("powerloss:", res)
	if res.lost > 0 && res.lossReported == 0 {
		t.Errorf("%d acknowledged messages lost and holdfast never reported a data loss", res.lost)
	}
}

// TestPowerLossGroupCommit is Promise 1 with group_commit = true: 16
// concurrent publishers (with Nats-Msg-Id, so batches hold ids), power cut
// at a random moment each cycle; every PubAck'ed message is on disk after
// the cut (none lost, none acknowledged before its batch was flushed), and
// every message is processed.
func TestPowerLossGroupCommit(t *testing.T) {
	t.Parallel()
	cycles := durEnvInt("HOLDFAST_POWERLOSS_CYCLES", 5)
	requireNoLoss(t, runPowerLoss(t, "", true, cycles, 16), "group commit")
}

// TestPowerLossCommitWindow is Promise 1 with jetstream.commit_window: the
// server flushes nothing itself, holdfast flushes the streams once per
// window and answers each publish after the flush that holds it. 16
// concurrent publishers (with Nats-Msg-Id) and power cuts at random
// moments: every PubAck'ed message is on disk after the cut, the stream
// and consumer are there, and every message is processed.
// HOLDFAST_POWERLOSS_WINDOW sets the window (default 20ms).
func TestPowerLossCommitWindow(t *testing.T) {
	t.Parallel()
	cycles := durEnvInt("HOLDFAST_POWERLOSS_CYCLES", 5)
	window := cmp.Or(os.Getenv("HOLDFAST_POWERLOSS_WINDOW"), "20ms")
	requireNoLoss(t, runPowerLossWith(t, powerLossLoad{commitWindow: window, cycles: cycles,
		start: func(cycle int, url string, acks *ackLog) func() {
			return startPublishers(t, url, fmt.Sprintf("c%03d", cycle), 16, acks).stop
		}}), "commit_window")
}
