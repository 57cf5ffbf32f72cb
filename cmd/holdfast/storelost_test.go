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

// TestStoreLostWhileRunning: a store directory deleted or replaced while
// holdfast runs stops it with exit 1 and one clear line, instead of a
// server that goes on acknowledging publishes into deleted files (which
// were all gone after the next restart, without a word).
func TestStoreLostWhileRunning(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		lose func(store string) error
	}{
		{"deleted", os.RemoveAll},
		{"replaced", func(store string) error {
			if err := os.Rename(store, store+".old"); err != nil {
				return err
			}
			return os.Mkdir(store, 0o750)
		}},
		// The account's directory (every stream of it) swapped, say for
		// a copy put back by hand: the server went on writing into the
		// files it held open, moved away.
		{"account replaced", func(store string) error {
			acc := filepath.Join(store, "jetstream", "$G")
			if err := os.Rename(acc, filepath.Join(store, "jetstream", "old-G")); err != nil {
				return err
			}
			return os.Mkdir(acc, 0o750)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := newE2EInstance(t)
			p := startHoldfast(t, in.cfg)
			p.waitReady()
			_, js := e2eConnect(t, in)
			for i := range 10 {
				if _, err := js.Publish(natstest.Context(t), "orders.created", fmt.Appendf(nil, "m%d", i)); err != nil {
					t.Fatal(err)
				}
			}
			if err := tc.lose(in.store); err != nil {
				t.Fatal(err)
			}
			// Publishing goes on; once holdfast noticed, no publish may be
			// acknowledged any more.
			done := make(chan struct{})
			acked := 0
			go func() {
				defer close(done)
				for !p.exited() {
					ctx, cancel := context.WithTimeout(context.Background(), time.Second)
					if _, err := js.Publish(ctx, "orders.created", []byte("late")); err == nil {
						acked++
					}
					cancel()
					time.Sleep(10 * time.Millisecond)
				}
			}()
			if code := p.wait(60 * time.Second); code != 1 {
				t.Fatalf("exit code %d, want 1", code)
			}
			<-done
			log := p.stderr.String()
			if !strings.Contains(log, "store directory lost while running") || !strings.Contains(log, in.store) {
				t.Fatalf("the log does not say that the store %s was lost:\n%s", in.store, log)
			}
			lostAt := strings.Index(log, "store directory changed under the running server")
			if lostAt < 0 {
				t.Fatalf("no log line that JetStream was stopped:\n%s", log)
			}
			t.Logf("%d publishes acknowledged after the store was lost, before holdfast noticed", acked)
			if tc.name == "replaced" {
				// Nothing of holdfast's may land in the directory that took
				// the store's place.
				entries, err := os.ReadDir(in.store)
				if err != nil {
					t.Fatal(err)
				}
				if len(entries) > 0 {
					var names []string
					for _, e := range entries {
						names = append(names, e.Name())
					}
					t.Fatalf("holdfast wrote into the replacement directory: %v", names)
				}
				if _, err := os.Stat(filepath.Join(in.store+".old", "holdfast.lock")); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
