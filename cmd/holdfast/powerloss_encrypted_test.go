package main

import (
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
