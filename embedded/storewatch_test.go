package embedded

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/embedded/store"
	"github.com/holdfast-io/holdfast/internal/configtest"
	"github.com/holdfast-io/holdfast/internal/natstest"
)

// TestCheckStore: each way the store can change under a running server is
// reported as ErrStoreLost, naming the path; an untouched store is not.
func TestCheckStore(t *testing.T) {
	for _, tc := range []struct {
		name string
		lose func(t *testing.T, storeDir string) string // returns the path the error must name
	}{
		{"lock file replaced", func(t *testing.T, storeDir string) string {
			p := filepath.Join(storeDir, store.LockFileName)
			mustDo(t, os.Remove(p))
			mustDo(t, os.WriteFile(p, nil, 0o640))
			return p
		}},
		{"jetstream dir moved", func(t *testing.T, storeDir string) string {
			p := filepath.Join(storeDir, server.JetStreamStoreDir)
			mustDo(t, os.Rename(p, p+".moved"))
			return p
		}},
		{"store dir replaced", func(t *testing.T, storeDir string) string {
			mustDo(t, os.Rename(storeDir, storeDir+".old"))
			mustDo(t, os.Mkdir(storeDir, 0o750))
			return storeDir
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := runServer(t, configtest.Default(t))
			if err := s.CheckStore(); err != nil {
				t.Fatalf("untouched store: %v", err)
			}
			path := tc.lose(t, s.StoreDir())
			err := s.CheckStore()
			if !errors.Is(err, store.ErrStoreLost) {
				t.Fatalf("CheckStore = %v, want ErrStoreLost", err)
			}
			if !strings.Contains(err.Error(), path) {
				t.Fatalf("error %q does not name %s", err, path)
			}
		})
	}
}

// TestWatchStoreStopsJetStream: once the store is lost, JetStream stops
// (no more PubAcks) and onLost is called once with the reason.
func TestWatchStoreStopsJetStream(t *testing.T) {
	s := runServer(t, configtest.Default(t))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lost := make(chan error, 2)
	go s.WatchStore(ctx, 100*time.Millisecond, func(err error) { lost <- err })
	mustDo(t, os.RemoveAll(s.StoreDir()))
	select {
	case err := <-lost:
		if !errors.Is(err, store.ErrStoreLost) {
			t.Fatalf("onLost(%v), want ErrStoreLost", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the deleted store was not noticed")
	}
	if s.NATS().JetStreamEnabled() {
		t.Fatal("JetStream still enabled after the store was lost")
	}
	if !s.StoreLost() {
		t.Fatal("StoreLost() = false")
	}
	pctx, pcancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer pcancel()
	if _, err := s.JetStream().Publish(pctx, "orders.created", []byte("x")); err == nil {
		t.Fatal("a publish was acknowledged after the store was lost")
	}
}

func mustDo(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestLastStreamDeletedIsNoStoreLoss: the server removes an account's
// directory (jetstream/$G and its streams directory) when the account's
// last stream is deleted. The store watch once took that for a store lost
// while running, and holdfast exited 1 after a `nats stream rm` of the
// last stream.
func TestLastStreamDeletedIsNoStoreLoss(t *testing.T) {
	s := runServer(t, configtest.Default(t))
	js := s.JetStream()
	if _, err := js.CreateStream(natstest.Context(t), jetstream.StreamConfig{Name: "ONLY", Subjects: []string{"only.>"}}); err != nil {
		t.Fatal(err)
	}
	if err := s.CheckStore(); err != nil { // records the account's directories
		t.Fatal(err)
	}
	if err := js.DeleteStream(natstest.Context(t), "ONLY"); err != nil {
		t.Fatal(err)
	}
	// The server removes the (empty) directories in a goroutine of its
	// own, which finds the streams directory still holding the stream's
	// directory, renamed for removal, in some runs and then leaves both:
	// do what it does once that is gone.
	acc := filepath.Join(s.StoreDir(), "jetstream", "$G")
	streams := filepath.Join(acc, "streams")
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		entries, err := os.ReadDir(streams)
		if err == nil && len(entries) > 0 {
			return fmt.Errorf("%s still holds %s", streams, entries[0].Name())
		}
		return nil
	})
	_ = os.Remove(streams)
	_ = os.Remove(acc)
	if _, err := os.Stat(acc); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s still there (%v)", acc, err)
	}
	if err := s.CheckStore(); err != nil {
		t.Fatalf("the server removed the directory of an account without streams: %v", err)
	}
	// A stream created again makes the directories anew; they are watched.
	if _, err := js.CreateStream(natstest.Context(t), jetstream.StreamConfig{Name: "AGAIN", Subjects: []string{"again.>"}}); err != nil {
		t.Fatal(err)
	}
	if err := s.CheckStore(); err != nil {
		t.Fatal(err)
	}
}

// TestWatchStoreSeesEventsWithoutPolling: with an interval far longer
// than the test, the store watch still finds at once an account's streams
// directory swapped (inotify on the account's directory, watched once it
// appeared).
func TestWatchStoreSeesEventsWithoutPolling(t *testing.T) {
	s := runServer(t, configtest.Default(t))
	if _, err := s.JetStream().CreateStream(natstest.Context(t), jetstream.StreamConfig{Name: "ONE", Subjects: []string{"one.>"}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lost := make(chan error, 1)
	streams := filepath.Join(s.StoreDir(), "jetstream", "$G", "streams")
	// The directories as the server opened them: a swap before the watch
	// set its inotify watches is found by its first check, one after by
	// the events.
	mustDo(t, s.CheckStore())
	go s.WatchStore(ctx, time.Hour, func(err error) { lost <- err })
	mustDo(t, os.Rename(streams, streams+".old"))
	mustDo(t, os.Mkdir(streams, 0o750))
	select {
	case err := <-lost:
		if !errors.Is(err, store.ErrStoreLost) {
			t.Fatalf("onLost(%v), want ErrStoreLost", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the swapped streams directory was not noticed without polling")
	}
}

// TestCheckStoreNamesWhereTheStoreMoved: a store directory moved (or
// renamed) while running is reported as moved, naming where its files are
// now, so that the operator moves it back instead of starting on an empty
// store. It was reported as gone, as if deleted.
func TestCheckStoreNamesWhereTheStoreMoved(t *testing.T) {
	for _, replaced := range []bool{false, true} {
		s := runServer(t, configtest.Default(t))
		moved := s.StoreDir() + ".moved"
		mustDo(t, os.Rename(s.StoreDir(), moved))
		if replaced {
			mustDo(t, os.Mkdir(s.StoreDir(), 0o750))
		}
		err := s.CheckStore()
		if !errors.Is(err, store.ErrStoreLost) || !errors.Is(err, store.ErrStoreMoved) || !strings.Contains(err.Error(), "to "+moved+":") {
			t.Errorf("store dir moved to %s (an empty one made in its place: %v): CheckStore = %v; want ErrStoreMoved naming %s", moved, replaced, err, moved)
		}
		// Moved back, so that the server's shutdown finds its files.
		if replaced {
			mustDo(t, os.Remove(s.StoreDir()))
		}
		mustDo(t, os.Rename(moved, s.StoreDir()))
	}
	s := runServer(t, configtest.Default(t))
	mustDo(t, os.RemoveAll(s.StoreDir()))
	if err := s.CheckStore(); !errors.Is(err, store.ErrStoreLost) || errors.Is(err, store.ErrStoreMoved) {
		t.Errorf("store dir deleted: CheckStore = %v; want ErrStoreLost, not moved", err)
	}
}
