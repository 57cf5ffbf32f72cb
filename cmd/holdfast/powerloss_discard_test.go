package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/holdfast-io/holdfast/internal/natstest"
)

// TestPowerLossCommitWindowDiscardOld: a stream at its max_msgs drops its
// oldest message for each new one, and once a message block is empty the
// server removes its file at once, a change to a directory that a power
// cut does not undo. With jetstream.commit_window the new messages that
// caused it are not yet flushed: the cut must not take both, leaving the
// stream fewer messages than its limit keeps though each was
// acknowledged. After a kill -9 (nothing lost) the stream is as it was,
// and the emptied block stays removed.
func TestPowerLossCommitWindowDiscardOld(t *testing.T) {
	t.Parallel()
	for _, powerCut := range []bool{true, false} {
		name := map[bool]string{true: "power cut", false: "kill -9"}[powerCut]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			discardOldThenCut(t, powerCut)
		})
	}
}

func discardOldThenCut(t *testing.T, powerCut bool) {
	// A max_bytes of 12 MB (never reached) gives blocks of 4 MB: about
	// 1,000 messages of 4 KiB. max_msgs = 2,000 keeps two blocks' worth.
	const limit, more = 2000, 1100
	lfs := lazyMount(t)
	t.Cleanup(func() { _ = lfs.Unmount() })
	port := natstest.FreePort(t)
	store := filepath.Join(lfs.Mountpoint, "store")
	cfg := e2eWriteConfig(t, durConfig{store: store, port: port, commitWindow: "1s",
		ordersExtra: fmt.Sprintf("max_bytes = \"12MB\"\nmax_msgs = %d\n", limit)}.toml())
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)

	proc := startHoldfast(t, cfg)
	proc.waitReady()
	js := powerLossClient(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	data := make([]byte, 4096)
	publishAcked(t, ctx, js, limit, data)
	s, err := js.Stream(ctx, "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	// Right after a flush, so the next is a window away: more messages,
	// not waited for, push the first block's messages out of the stream.
	for range more {
		if _, err := js.PublishAsync("orders.created", data); err != nil {
			t.Fatal(err)
		}
	}
	natstest.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		info, err := s.Info(ctx)
		if err != nil {
			return err
		}
		if info.State.FirstSeq <= more {
			return fmt.Errorf("first sequence %d", info.State.FirstSeq)
		}
		return nil
	})

	if powerCut {
		proc, _ = powerCutAndStart(t, proc, lfs, cfg)
	} else {
		if err := proc.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		proc.wait(30 * time.Second)
		proc = startHoldfast(t, cfg)
		proc.waitReady()
	}
	defer proc.stop()
	js = powerLossClient(t, url)
	s, err = js.Stream(ctx, "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Whatever of the last messages the cut took, the limit keeps the
	// limit's worth before the last one left.
	first := uint64(1)
	if info.State.LastSeq > limit {
		first = info.State.LastSeq - limit + 1
	}
	var lost []uint64
	for _, seq := range seqRange(first, info.State.LastSeq) {
		if _, err := s.GetMsg(ctx, seq); err != nil {
			lost = append(lost, seq)
		}
	}
	if len(lost) > 0 {
		t.Errorf("ORDERS holds %d messages (%d to %d), and %d its limit keeps are gone, first %d, last %d",
			info.State.Msgs, info.State.FirstSeq, info.State.LastSeq, len(lost), lost[0], lost[len(lost)-1])
	}
	if powerCut {
		return
	}
	if info.State.LastSeq != limit+more || info.State.Msgs != limit {
		t.Errorf("after a kill -9 ORDERS holds %d messages to %d, want %d to %d", info.State.Msgs, info.State.LastSeq, limit, limit+more)
	}
	if _, err := os.Stat(filepath.Join(store, "jetstream", "$G", "streams", "ORDERS", "msgs", "1.blk")); err == nil {
		t.Error("the block the server emptied and removed before the kill is back in the store")
	}
}
