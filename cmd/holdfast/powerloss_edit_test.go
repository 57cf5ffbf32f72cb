package main

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/internal/lazyfs"
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
	nc, err := nats.Connect(url, nats.MaxReconnects(0))
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	const total = 100
	for i := range total {
		if _, err := js.PublishAsync("orders.created", fmt.Appendf(nil, "%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal("publishing did not complete")
	}
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
	nc.Close()

	// Power cut right after the edit.
	if err := proc.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	proc.wait(30 * time.Second)
	if _, err := lfs.Crash(); err != nil {
		t.Fatal(err)
	}
	if lfs, err = lazyfs.Mount(lfs.Backing, lfs.Mountpoint); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lfs.Unmount() })

	proc = startHoldfast(t, cfg)
	proc.waitReady()
	nc, err = nats.Connect(url, nats.MaxReconnects(0))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ = jetstream.New(nc)
	if s, err = js.Stream(ctx, "ORDERS"); err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != total {
		t.Errorf("after a stream edit and a power cut, ORDERS holds %d messages (last sequence %d), want %d", info.State.Msgs, info.State.LastSeq, total)
	}
	proc.stop()
}
