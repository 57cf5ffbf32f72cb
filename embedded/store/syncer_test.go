package store

import (
	"bytes"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/holdfast-io/holdfast/internal/lazyfs"
)

// A power cut keeps what the server wrote to its message blocks and
// definitions before a Sync, and drops what it wrote after (nothing else
// flushed it): the Syncer's rounds are what makes a write durable.
func TestSyncerRoundMakesWritesDurable(t *testing.T) {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse: the power-loss harness needs FUSE")
	}
	lfs, err := lazyfs.Mount(t.TempDir(), t.TempDir())
	if err != nil {
		t.Skipf("cannot mount lazyfs: %v", err)
	}
	defer lfs.Unmount()
	msgs := filepath.Join(lfs.Mountpoint, "jetstream", "$G", "streams", "ORDERS", "msgs")
	if err := os.MkdirAll(msgs, 0o755); err != nil {
		t.Fatal(err)
	}
	meta := filepath.Join(filepath.Dir(msgs), "meta.inf")
	block := filepath.Join(msgs, "1.blk")
	state := filepath.Join(filepath.Dir(msgs), "obs", "WORKER1", "o.dat")
	write := func(path string, data []byte) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.Write(data); err != nil {
			t.Fatal(err)
		}
	}
	write(meta, []byte(`{"name":"ORDERS"}`))
	write(block, []byte("first"))
	write(state, []byte("acks"))
	s := NewSyncer(lfs.Mountpoint, 0)
	// Concurrent calls share rounds and all return once flushed.
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if err := s.Sync(); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	write(block, []byte("second"))
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	write(block, []byte("third"))
	if _, err := lfs.Crash(); err != nil {
		t.Fatal(err)
	}
	back := lfs.Backing
	for path, want := range map[string]string{meta: `{"name":"ORDERS"}`, block: "firstsecond", state: ""} {
		rel, _ := filepath.Rel(lfs.Mountpoint, path)
		got, err := os.ReadFile(filepath.Join(back, rel))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, []byte(want)) {
			t.Errorf("%s after the power cut: %q, want %q", rel, got, want)
		}
	}
}

// Rounds begin at most once per window: a second Sync right after a
// round waits for the window to pass.
func TestSyncerWindow(t *testing.T) {
	dir := t.TempDir()
	s := NewSyncer(dir, 100*time.Millisecond)
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 50*time.Millisecond {
		t.Fatalf("a round %s after the last one: the window is 100ms", took)
	}
}
