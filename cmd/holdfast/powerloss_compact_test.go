package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/holdfast-io/holdfast/internal/natstest"
)

// TestPowerLossCommitWindowCompaction: with jetstream.commit_window the
// server flushes nothing itself, and a message block it rewrites (the
// inline compaction that follows deleting over half of a block out of
// order: `nats stream rmm`, a subject purge, a rollup, a work queue's
// acks) goes to a new file renamed over the old one, unflushed. Messages
// acknowledged (and flushed) long before, which the rewrite only copied,
// must survive a power cut that comes right after it.
func TestPowerLossCommitWindowCompaction(t *testing.T) {
	t.Parallel()
	// A max_bytes of 12 MB gives the stream blocks of 4 MB (not 8 MB): the
	// server compacts a block of over 2 MB inline. 1,100 messages of 4
	// KiB fill one block and start a second, every one acknowledged, so
	// flushed.
	const total = 1100
	lfs := lazyMount(t)
	t.Cleanup(func() { _ = lfs.Unmount() })
	port := natstest.FreePort(t)
	cfg := e2eWriteConfig(t, durConfig{store: filepath.Join(lfs.Mountpoint, "store"), port: port, commitWindow: "40ms",
		ordersExtra: "max_bytes = \"12MB\"\n"}.toml())
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)

	proc := startHoldfast(t, cfg)
	proc.waitReady()
	js := powerLossClient(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	publishAcked(t, ctx, js, total, make([]byte, 4096))
	s, err := js.Stream(ctx, "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	// Delete most of the first block out of order (its first message
	// stays): the server compacts the block in place each time half of
	// what it holds is deleted, the last time a few deletes before the
	// power cut (holdfast's recorder flushes once a second).
	const deleted = 960
	for seq := uint64(2); seq < 2+deleted; seq++ {
		if err := s.DeleteMsg(ctx, seq); err != nil {
			t.Fatalf("delete %d: %v", seq, err)
		}
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := info.State.Msgs
	if want != total-deleted {
		t.Fatalf("stream holds %d messages after the deletes, want %d", want, total-deleted)
	}

	// Power cut.
	proc, lfs = powerCutAndStart(t, proc, lfs, cfg)
	js = powerLossClient(t, url)
	s, err = js.Stream(ctx, "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	// A delete not flushed may come back (at least once); a message
	// that was not deleted must be there.
	var lost []uint64
	for _, seq := range append([]uint64{1}, seqRange(2+deleted, total)...) {
		if _, err := s.GetMsg(ctx, seq); err != nil {
			lost = append(lost, seq)
		}
	}
	if len(lost) > 0 {
		t.Errorf("%d acknowledged messages the power cut after the deletes took (of %d not deleted), first %d, last %d",
			len(lost), want, lost[0], lost[len(lost)-1])
	}
	t.Logf("restart: put back as flushed: %v", strings.Contains(proc.stderr.String(), "put back as flushed"))
	proc.stop()
}

// seqRange is the sequences from..to.
func seqRange(from, to uint64) []uint64 {
	var out []uint64
	for seq := from; seq <= to; seq++ {
		out = append(out, seq)
	}
	return out
}
