package store

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// guardedStore makes a store with one stream directory holding a block.
func guardedStore(t *testing.T) (storeDir, live string) {
	t.Helper()
	storeDir = t.TempDir()
	live = filepath.Join(storeDir, "jetstream", "$G", "streams", "ORDERS")
	if err := os.MkdirAll(filepath.Join(live, "msgs"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(live, "msgs", "1.blk"), []byte("acknowledged"), 0o640); err != nil {
		t.Fatal(err)
	}
	return storeDir, live
}

func wantBlock(t *testing.T, dir string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "msgs", "1.blk"))
	if err != nil || string(b) != "acknowledged" {
		t.Fatalf("block in %s: %q, %v; want the acknowledged data", dir, b, err)
	}
}

func TestRecoveryGuard(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	t.Run("nothing deleted: links removed", func(t *testing.T) {
		storeDir, live := guardedStore(t)
		g, _, err := GuardStreams(storeDir, nil, log)
		if err != nil || g == nil {
			t.Fatalf("GuardStreams: %v, %v", g, err)
		}
		rescued, err := g.Finish(nil, log)
		if err != nil || len(rescued) != 0 {
			t.Fatalf("finish: %v, %v", rescued, err)
		}
		wantBlock(t, live)
		if _, err := os.Lstat(filepath.Join(storeDir, RecoveryLinksDirName)); !os.IsNotExist(err) {
			t.Errorf("links left: %v", err)
		}
	})
	t.Run("deleted for a host cause: put back, start refused", func(t *testing.T) {
		storeDir, live := guardedStore(t)
		g, _, _ := GuardStreams(storeDir, nil, log)
		os.RemoveAll(live) // what the server does
		_, err := g.Finish(map[string]StreamLoadFailure{"ORDERS": {Name: "ORDERS", Err: "open 1.blk: too many open files"}}, log)
		if err == nil || !strings.Contains(err.Error(), "ORDERS (open 1.blk: too many open files)") || !strings.Contains(err.Error(), "put $G/streams/ORDERS back") {
			t.Fatalf("finish: %v, want a refusal naming ORDERS and its cause", err)
		}
		wantBlock(t, live)
	})
	t.Run("half deleted for a host cause: put back whole", func(t *testing.T) {
		storeDir, live := guardedStore(t)
		g, _, _ := GuardStreams(storeDir, nil, log)
		// The server's RemoveAll ran out of files too: the block is gone,
		// the directory is left.
		os.Remove(filepath.Join(live, "msgs", "1.blk"))
		_, err := g.Finish(map[string]StreamLoadFailure{"ORDERS > WORKER1": {Name: "ORDERS > WORKER1", Err: "open o.dat: too many open files"}}, log)
		if err == nil {
			t.Fatal("a host failure did not stop the start")
		}
		wantBlock(t, live)
	})
	t.Run("deleted for another cause: kept in the orphans", func(t *testing.T) {
		storeDir, live := guardedStore(t)
		g, _, _ := GuardStreams(storeDir, nil, log)
		os.RemoveAll(live)
		rescued, err := g.Finish(map[string]StreamLoadFailure{"ORDERS": {Name: "ORDERS", Err: "corrupt state file"}}, log)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(rescued["ORDERS"], filepath.Join(storeDir, OrphanDirName, "$G.ORDERS.")) {
			t.Fatalf("rescued %v, want ORDERS in %s", rescued, OrphanDirName)
		}
		wantBlock(t, rescued["ORDERS"])
	})
	t.Run("start killed after the server deleted a stream", func(t *testing.T) {
		storeDir, live := guardedStore(t)
		if _, _, err := GuardStreams(storeDir, nil, log); err != nil {
			t.Fatal(err)
		}
		os.RemoveAll(live) // and the process is killed before finish
		g, _, err := GuardStreams(storeDir, nil, log)
		if err != nil || g == nil {
			t.Fatalf("GuardStreams after the kill: %v, %v", g, err)
		}
		wantBlock(t, live)
		if _, err := g.Finish(nil, log); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("start killed after the server half deleted a stream", func(t *testing.T) {
		storeDir, live := guardedStore(t)
		if _, _, err := GuardStreams(storeDir, nil, log); err != nil {
			t.Fatal(err)
		}
		os.Remove(filepath.Join(live, "msgs", "1.blk"))
		g, _, err := GuardStreams(storeDir, nil, log)
		if err != nil {
			t.Fatal(err)
		}
		wantBlock(t, live)
		if _, err := g.Finish(nil, log); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("start killed after the server was ready", func(t *testing.T) {
		storeDir, live := guardedStore(t)
		g, _, _ := GuardStreams(storeDir, nil, log)
		if err := g.Ready(); err != nil {
			t.Fatal(err)
		}
		// A client purges the stream: its block goes, a new one comes.
		os.Remove(filepath.Join(live, "msgs", "1.blk"))
		if err := os.WriteFile(filepath.Join(live, "msgs", "2.blk"), []byte("new"), 0o640); err != nil {
			t.Fatal(err)
		}
		g, rescued, err := GuardStreams(storeDir, nil, log)
		if err != nil || g == nil || len(rescued) != 0 {
			t.Fatalf("GuardStreams after the kill: %v, %v, %v", g, rescued, err)
		}
		if b, err := os.ReadFile(filepath.Join(live, "msgs", "2.blk")); err != nil || string(b) != "new" {
			t.Fatalf("the stream as the client left it was replaced: %q, %v", b, err)
		}
		if _, err := g.Finish(nil, log); err != nil {
			t.Fatal(err)
		}
		// Deleted after the server was ready: kept aside, not put back.
		g, _, _ = GuardStreams(storeDir, nil, log)
		if err := g.Ready(); err != nil {
			t.Fatal(err)
		}
		os.RemoveAll(live)
		g, rescued, err = GuardStreams(storeDir, nil, log)
		if err != nil || g != nil {
			t.Fatalf("GuardStreams after the kill: %v, %v", g, err)
		}
		if _, err := os.Lstat(live); !os.IsNotExist(err) {
			t.Fatalf("a stream deleted while running came back: %v", err)
		}
		if !strings.HasPrefix(rescued["ORDERS"], filepath.Join(storeDir, OrphanDirName, "$G.ORDERS.")) {
			t.Fatalf("rescued %v, want ORDERS in %s", rescued, OrphanDirName)
		}
	})
	t.Run("start killed after the server was ready, a stream half deleted", func(t *testing.T) {
		storeDir, live := guardedStore(t)
		if err := os.WriteFile(filepath.Join(live, "meta.inf"), []byte("{}"), 0o640); err != nil {
			t.Fatal(err)
		}
		g, _, _ := GuardStreams(storeDir, nil, log)
		if err := g.Ready(); err != nil {
			t.Fatal(err)
		}
		// The server failed on it (too many open files) and removed its
		// metadata before it failed again: it never loaded the stream.
		os.Remove(filepath.Join(live, "meta.inf"))
		if _, _, err := GuardStreams(storeDir, nil, log); err != nil {
			t.Fatal(err)
		}
		wantBlock(t, live)
		if _, err := os.Stat(filepath.Join(live, "meta.inf")); err != nil {
			t.Errorf("not put back whole: %v", err)
		}
	})
	t.Run("links left after a finished start never bring a deleted stream back", func(t *testing.T) {
		storeDir, live := guardedStore(t)
		g, _, _ := GuardStreams(storeDir, nil, log)
		// finish could not remove them (too many open files): they stay
		// under the trash name while the stream is deleted with the CLI.
		if err := os.Rename(g.dir, g.trash()); err != nil {
			t.Fatal(err)
		}
		os.RemoveAll(live)
		if _, _, err := GuardStreams(storeDir, nil, log); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(live); !os.IsNotExist(err) {
			t.Fatalf("a stream deleted while running came back: %v", err)
		}
		if _, err := os.Lstat(g.trash()); !os.IsNotExist(err) {
			t.Errorf("old links not removed: %v", err)
		}
	})
	t.Run("host failure without a guard still refuses", func(t *testing.T) {
		var g *RecoveryGuard
		_, err := g.Finish(map[string]StreamLoadFailure{"S1": {Name: "S1", Err: "permission denied"}}, log)
		if err == nil || !strings.Contains(err.Error(), "S1 (permission denied)") {
			t.Fatalf("finish: %v, want a refusal", err)
		}
	})
}
