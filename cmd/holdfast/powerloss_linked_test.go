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
	const total = 200
	publishAcked(t, ctx, powerLossClient(t, url), total, nil)

	// Power cut right after the last PubAck.
	proc, lfs = powerCutAndStart(t, proc, lfs, cfg)
	js := powerLossClient(t, url)
	checkOrdersHolds(t, ctx, js, total, fmt.Sprintf("after %d PubAcks and a power cut", total))
	proc.stop()
}
