package store

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/holdfast-io/holdfast/internal/lazyfs"
)

// lazyStream mounts a lazyfs for the test (or skips it without FUSE) and
// makes the message directory of a stream ORDERS in its jetstream/.
func lazyStream(t *testing.T) (*lazyfs.FS, string) {
	t.Helper()
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse: the power-loss harness needs FUSE")
	}
	lfs, err := lazyfs.Mount(t.TempDir(), t.TempDir())
	if err != nil {
		t.Skipf("cannot mount lazyfs: %v", err)
	}
	t.Cleanup(func() { _ = lfs.Unmount() })
	msgs := filepath.Join(lfs.Mountpoint, "jetstream", "$G", "streams", "ORDERS", "msgs")
	if err := os.MkdirAll(msgs, 0o755); err != nil {
		t.Fatal(err)
	}
	return lfs, msgs
}

// A power cut keeps what the server wrote to its message blocks and
// definitions before a Sync, and drops what it wrote after (nothing else
// flushed it): the Syncer's rounds are what makes a write durable.
func TestSyncerRoundMakesWritesDurable(t *testing.T) {
	lfs, msgs := lazyStream(t)
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

// A message block or definition the server rewrites between two rounds (a
// compaction, a stream edit: a new file renamed over the old one, not
// flushed) is lost at a power cut; RestoreSyncGuard puts it back as the
// last round flushed it, so that the messages the block held, and the
// stream, survive. A block removed since (the oldest messages of a stream
// at its limits, deleted for new ones the cut then took) is put back too,
// and the stream's index removed for the server to read the blocks. The
// guard directory is gone afterwards.
func TestSyncGuardPutsBackRewrittenAndRemovedBlocks(t *testing.T) {
	lfs, msgs := lazyStream(t)
	block, gone := filepath.Join(msgs, "1.blk"), filepath.Join(msgs, "2.blk")
	meta := filepath.Join(filepath.Dir(msgs), "meta.inf")
	index := filepath.Join(msgs, streamIndexName)
	for _, path := range []string{block, gone, meta, index} {
		if err := os.WriteFile(path, []byte("flushed messages"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s := NewSyncer(lfs.Mountpoint, 0)
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	// The server compacts block 1 (as nats-server does with sync off:
	// temporary file, rename, no flush) and removes block 2 (its
	// messages all deleted, by the new ones a stream at its limits
	// takes), writes its index, and edits the stream.
	for path, data := range map[string]string{block: "compacted", meta: "edited"} {
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Remove(gone); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(index, []byte("blocks 1 and 3"), 0o644); err != nil {
		t.Fatal(err)
	}
	flushFile(index) // as the kernel may have done before the cut
	if _, err := lfs.Crash(); err != nil {
		t.Fatal(err)
	}
	rel, _ := filepath.Rel(lfs.Mountpoint, block)
	if got, _ := os.ReadFile(filepath.Join(lfs.Backing, rel)); len(got) != 0 {
		t.Fatalf("the harness kept the unflushed rewrite: %q", got)
	}
	restored, err := RestoreSyncGuard(lfs.Backing)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(restored)
	if want := []string{filepath.Join("$G", "streams", "ORDERS", "meta.inf"), filepath.Join("$G", "streams", "ORDERS", "msgs", "1.blk"),
		filepath.Join("$G", "streams", "ORDERS", "msgs", "2.blk")}; !slices.Equal(restored, want) {
		t.Errorf("put back %q, want %q", restored, want)
	}
	for _, path := range []string{block, gone, meta} {
		rel, _ := filepath.Rel(lfs.Mountpoint, path)
		if got, _ := os.ReadFile(filepath.Join(lfs.Backing, rel)); string(got) != "flushed messages" {
			t.Errorf("%s after the restore: %q, want the flushed one", rel, got)
		}
	}
	if _, err := os.Stat(filepath.Join(lfs.Backing, "jetstream", "$G", "streams", "ORDERS", "msgs", streamIndexName)); err == nil {
		t.Error("the stream's index is still there: the server would not read the blocks put back")
	}
	if _, err := os.Stat(filepath.Join(lfs.Backing, SyncGuardDirName)); err == nil {
		t.Errorf("%s is still there", SyncGuardDirName)
	}
}

// A block the server removed is not put back once a round after the
// removal flushed what caused it, nor once its stream is deleted.
func TestSyncGuardForgetsRemovedBlocks(t *testing.T) {
	lfs, msgs := lazyStream(t)
	meta := filepath.Join(filepath.Dir(msgs), "meta.inf")
	flushed, deleted := filepath.Join(msgs, "1.blk"), filepath.Join(lfs.Mountpoint, "jetstream", "$G", "streams", "GONE")
	for _, path := range []string{meta, flushed, filepath.Join(msgs, "2.blk"), filepath.Join(deleted, "meta.inf"), filepath.Join(deleted, "msgs", "1.blk")} {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte("flushed messages"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s := NewSyncer(lfs.Mountpoint, 0)
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(flushed); err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(deleted); err != nil {
		t.Fatal(err)
	}
	if _, err := lfs.Crash(); err != nil {
		t.Fatal(err)
	}
	restored, err := RestoreSyncGuard(lfs.Backing)
	if err != nil {
		t.Fatal(err)
	}
	if len(restored) > 0 {
		t.Errorf("put back %q, want nothing", restored)
	}
}

// In an encrypted store each message block has a key file beside it
// (N.key), written once with the block and never flushed by the server
// under a commit window: a round flushes it, or the block's messages
// cannot be read after a power cut.
func TestSyncerFlushesBlockKeyFiles(t *testing.T) {
	for _, name := range []string{"1.blk", "1.key", "meta.inf", "meta.sum", "meta.key"} {
		if !syncedFile(name) {
			t.Errorf("%s is not flushed by a round", name)
		}
	}
	for _, name := range []string{"o.dat", "index.db", "1.blk.tmp", "meta.inf.tmp"} {
		if syncedFile(name) {
			t.Errorf("%s is flushed by a round", name)
		}
	}
}

// What nats-server stages of an atomic batch (a stream's batches
// directory, removed once the batch is committed into the stream's
// blocks) is neither flushed nor guarded by a round: nothing there is
// acknowledged, and each batch would cost fsyncs.
func TestSyncerSkipsBatchStaging(t *testing.T) {
	dir := t.TempDir()
	stream := filepath.Join(dir, "jetstream", "$G", "streams", "ORDERS")
	for _, path := range []string{filepath.Join(stream, "msgs", "1.blk"), filepath.Join(stream, "batches", "b1", "msgs", "1.blk")} {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s := NewSyncer(dir, 0)
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	guard := filepath.Join(dir, SyncGuardDirName, "$G", "streams", "ORDERS")
	if _, err := os.Stat(filepath.Join(guard, "msgs", "1.blk")); err != nil {
		t.Errorf("the stream's block is not guarded: %v", err)
	}
	if _, err := os.Stat(filepath.Join(guard, "batches")); err == nil {
		t.Error("the batch staging directory is guarded")
	}
	for path := range s.marks {
		if strings.Contains(path, "batches") {
			t.Errorf("%s was flushed", path)
		}
	}
}
