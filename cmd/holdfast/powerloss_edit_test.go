package main

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/holdfast-io/holdfast/internal/natstest"
)

// TestPowerLossAfterStreamEdit: with a commit window the server rewrites
// a stream's definition (meta.inf, by a temporary file and a rename)
// without flushing it. An operator's `nats stream edit ORDERS
// --max-msgs ...` (which the docs allow) followed by a power cut before
// holdfast's next flush must not cost the stream its acknowledged
// messages.
func TestPowerLossAfterStreamEdit(t *testing.T) {
	t.Parallel()
	lfs := lazyMount(t)
	t.Cleanup(func() { _ = lfs.Unmount() })
	port := natstest.FreePort(t)
	cfg := e2eWriteConfig(t, durConfig{store: filepath.Join(lfs.Mountpoint, "store"), port: port, commitWindow: "1s"}.toml())
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	proc := startHoldfast(t, cfg)
	proc.waitReady()
	js := powerLossClient(t, url)
	const total = 100
	publishAcked(t, ctx, js, total, nil)
	s, err := js.Stream(ctx, "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // every flush of holdfast's own done
	c := s.CachedInfo().Config
	c.MaxMsgs = 2_000_000
	if _, err := js.UpdateStream(ctx, c); err != nil {
		t.Fatal(err)
	}

	// Power cut right after the edit.
	proc, lfs = powerCutAndStart(t, proc, lfs, cfg)
	js = powerLossClient(t, url)
	checkOrdersHolds(t, ctx, js, total, "after a stream edit and a power cut")
	proc.stop()
}
