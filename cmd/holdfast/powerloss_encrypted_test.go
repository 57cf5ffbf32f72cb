package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/holdfast-io/holdfast/internal/natstest"
)

// TestPowerLossCommitWindowEncrypted: an encrypted store
// (jetstream.encryption_key_file) keeps the commit window's promise: every
// PubAck'ed message is there after a power cut. nats-server writes a key
// file per message block (N.key, beside N.blk) without flushing it.
func TestPowerLossCommitWindowEncrypted(t *testing.T) {
	t.Parallel()
	lfs := lazyMount(t)
	t.Cleanup(func() { _ = lfs.Unmount() })
	key := filepath.Join(t.TempDir(), "store.key")
	if err := os.WriteFile(key, []byte("kW3x9d7Jq2Zp8vN4mT6yR1sB5hL0cF3gA9eU7iO2wQ=\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	port := natstest.FreePort(t)
	toml := durConfig{store: filepath.Join(lfs.Mountpoint, "store"), port: port, commitWindow: "40ms"}.toml()
	toml = strings.Replace(toml, "max_memory_store = \"64MB\"\n", fmt.Sprintf("max_memory_store = \"64MB\"\nencryption_key_file = %q\n", key), 1)
	cfg := e2eWriteConfig(t, toml)
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
