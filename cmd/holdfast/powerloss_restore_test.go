package main

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/holdfast-io/holdfast/internal/natstest"
)

// TestPowerLossAfterRestore: a `holdfast restore` that succeeded put the
// backup's messages into the store durably: a power cut right after it
// loses none of them, with sync = "always" and with a commit window (the
// longest, so that no flush of holdfast's own comes in time by chance).
func TestPowerLossAfterRestore(t *testing.T) {
	t.Parallel()
	for _, window := range []string{"", "1s"} {
		name := "sync always"
		if window != "" {
			name = "commit window " + window
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testPowerLossAfterRestore(t, window)
		})
	}
}

func testPowerLossAfterRestore(t *testing.T, window string) {
	lfs := lazyMount(t)
	t.Cleanup(func() { _ = lfs.Unmount() })
	port := natstest.FreePort(t)
	cfg := e2eWriteConfig(t, durConfig{store: filepath.Join(lfs.Mountpoint, "store"), port: port, commitWindow: window}.toml())
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	proc := startHoldfast(t, cfg)
	proc.waitReady()
	const total = 1000
	publishAcked(t, ctx, powerLossClient(t, url), total, nil)
	dir := filepath.Join(t.TempDir(), "backup")
	if res := runHoldfast(t, nil, "backup", "--config", cfg, dir); res.code != 0 {
		t.Fatalf("backup: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	if res := runHoldfast(t, nil, "restore", "--config", cfg, "--replace", dir); res.code != 0 {
		t.Fatalf("restore: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}

	// Power cut right after the restore said it succeeded.
	proc, lfs = powerCutAndStart(t, proc, lfs, cfg)
	js := powerLossClient(t, url)
	checkOrdersHolds(t, ctx, js, total, "after a restore that succeeded and a power cut")
	proc.stop()
}
