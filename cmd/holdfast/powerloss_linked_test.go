package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/internal/lazyfs"
	"github.com/holdfast-io/holdfast/internal/natstest"
)

// TestPowerLossCommitWindowLinkedJetStream: a store whose jetstream
// directory is a symbolic link to another disk (which holdfast accepts,
// judging the link by its target) keeps the commit window's promise: every
// PubAck'ed message is there after a power cut of that disk.
func TestPowerLossCommitWindowLinkedJetStream(t *testing.T) {
	t.Parallel()
	lfs := lazyMount(t)
	t.Cleanup(func() { _ = lfs.Unmount() })
	store := filepath.Join(t.TempDir(), "store")
	target := filepath.Join(lfs.Mountpoint, "jetstream")
	for _, dir := range []string{store, target} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(target, filepath.Join(store, "jetstream")); err != nil {
		t.Fatal(err)
	}
	port := natstest.FreePort(t)
	cfg := e2eWriteConfig(t, durConfig{store: store, port: port, commitWindow: "40ms"}.toml())
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
	const total = 200
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
	nc.Close()

	// Power cut right after the last PubAck.
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
	s, err := js.Stream(ctx, "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != total {
		t.Errorf("after %d PubAcks and a power cut, ORDERS holds %d messages (last sequence %d)", total, info.State.Msgs, info.State.LastSeq)
	}
	proc.stop()
}
