package embedded

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/embedded/bootstrap"
	"github.com/holdfast-io/holdfast/embedded/store"
	"github.com/holdfast-io/holdfast/internal/configtest"
	"github.com/holdfast-io/holdfast/internal/natstest"
	"github.com/holdfast-io/holdfast/internal/subjects"
)

// lossServer opens a server on cfg, bootstraps it and publishes n
// messages to ORDERS. It does not close it.
func lossServer(t *testing.T, cfg *config.Config, n int) (*Server, *natstest.Buffer) {
	t.Helper()
	log, lb := natstest.Logger(t)
	s := New(cfg, log)
	s.ReadyTimeout = 30 * time.Second
	if err := s.Open(natstest.Context(t)); err != nil {
		t.Fatalf("Open: %v", err)
	}
	if err := bootstrap.Apply(natstest.Context(t), s.JetStream(), cfg, log); err != nil {
		t.Fatalf("Bootstrap: %v", err)
	}
	for range n {
		if _, err := s.JetStream().Publish(natstest.Context(t), "orders.created", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	return s, lb
}

// reopen opens a second server on the same config and returns Open's error.
func reopen(t *testing.T, cfg *config.Config, accept bool) (*Server, *natstest.Buffer, error) {
	t.Helper()
	log, lb := natstest.Logger(t)
	s := New(cfg, log)
	s.ReadyTimeout = 30 * time.Second
	s.AcceptDataLoss = accept
	err := s.Open(natstest.Context(t))
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s, lb, err
}

func closeServer(t *testing.T, s *Server) {
	t.Helper()
	if err := s.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// bumpRecorded raises the recorded last sequence of a stream, as if the
// store had lost that many messages since.
func bumpRecorded(t *testing.T, dir, stream string, by uint64) {
	t.Helper()
	st, err := store.ReadStoreState(dir)
	if err != nil || st == nil {
		t.Fatalf("no recorded state (%v)", err)
	}
	rec := st.Streams[stream]
	rec.LastSeq += by
	st.Streams[stream] = rec
	if err := store.WriteStoreState(dir, st); err != nil {
		t.Fatal(err)
	}
}

func TestCleanRestartReportsNoLoss(t *testing.T) {
	cfg := configtest.Default(t)
	s, _ := lossServer(t, cfg, 5)
	// An operator purge keeps the last sequence: no loss either.
	str, err := s.JetStream().Stream(natstest.Context(t), "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	if err := str.Purge(natstest.Context(t)); err != nil {
		t.Fatal(err)
	}
	closeServer(t, s)
	st, err := store.ReadStoreState(cfg.JetStream.StoreDir)
	if err != nil || st == nil || st.Streams["ORDERS"].LastSeq != 5 || st.Consumers["ORDERS/WORKER1"].Name != "WORKER1" {
		t.Fatalf("recorded state at Close = %+v, %v; want ORDERS at last seq 5 and WORKER1", st, err)
	}
	cfg.JetStream.OnDataLoss = "refuse"
	s2, lb, err := reopen(t, cfg, false)
	if err != nil {
		t.Fatalf("clean restart refused: %v", err)
	}
	if l := s2.DataLosses(); len(l) != 0 || strings.Contains(lb.String(), "data loss") {
		t.Errorf("clean restart reported losses %v", l)
	}
}

func TestStreamGoneBackwardsWarns(t *testing.T) {
	cfg := configtest.Default(t)
	s, _ := lossServer(t, cfg, 3)
	closeServer(t, s)
	bumpRecorded(t, cfg.JetStream.StoreDir, "ORDERS", 7)

	s2, lb, err := reopen(t, cfg, false)
	if err != nil {
		t.Fatalf("on_data_loss = warn refused to start: %v", err)
	}
	losses := s2.DataLosses()
	if len(losses) != 1 || losses[0].Stream != "ORDERS" || losses[0].Messages != 7 || losses[0].FoundLast != 3 || !losses[0].Lost() {
		t.Fatalf("losses = %+v, want ORDERS 10 → 3, 7 lost", losses)
	}
	if !strings.Contains(lb.String(), "data loss: stream ORDERS went backwards") || !strings.Contains(lb.String(), "level=ERROR") {
		t.Errorf("the loss is not logged as an error:\n%s", lb.String())
	}
	// Once warned, the state is recorded anew at Close: the next start
	// is clean.
	closeServer(t, s2)
	s3, _, err := reopen(t, cfg, false)
	if err != nil || len(s3.DataLosses()) != 0 {
		t.Errorf("start after the warning: %v, losses %v", err, s3.DataLosses())
	}
}

func TestStreamGoneBackwardsRefuses(t *testing.T) {
	cfg := configtest.Default(t)
	s, _ := lossServer(t, cfg, 3)
	closeServer(t, s)
	bumpRecorded(t, cfg.JetStream.StoreDir, "ORDERS", 7)
	cfg.JetStream.OnDataLoss = "refuse"

	_, _, err := reopen(t, cfg, false)
	var dle *store.DataLossError
	if !errors.Is(err, store.ErrDataLoss) || !errors.As(err, &dle) {
		t.Fatalf("Open = %v, want a store.DataLossError", err)
	}
	for _, want := range []string{"stream ORDERS went backwards", "10 recorded, 3 found", "on_data_loss = \"warn\"", store.StateFileName} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q: %v", want, err)
		}
	}
	// Refused again, until accepted: the record is untouched.
	if _, _, err := reopen(t, cfg, false); !errors.Is(err, store.ErrDataLoss) {
		t.Fatalf("second start = %v, want refused again", err)
	}
	s3, _, err := reopen(t, cfg, true)
	if err != nil || len(s3.DataLosses()) != 1 {
		t.Fatalf("start with AcceptDataLoss: %v, losses %v", err, s3.DataLosses())
	}
}

// A power cut with a sync interval leaves the stream's meta file empty:
// the server then starts without the stream. holdfast reports it and
// moves the orphaned directory aside before the bootstrap creates the
// stream anew.
func TestVanishedStreamIsReportedAndMovedAside(t *testing.T) {
	cfg := configtest.Default(t)
	s, _ := lossServer(t, cfg, 4)
	closeServer(t, s)
	dir := cfg.JetStream.StoreDir
	streamDir := filepath.Join(dir, "jetstream", "$G", "streams", "ORDERS")
	if err := os.Truncate(filepath.Join(streamDir, "meta.inf"), 0); err != nil {
		t.Fatal(err)
	}

	s2, lb, err := reopen(t, cfg, false)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	losses := s2.DataLosses()
	if len(losses) != 1 || !losses[0].Vanished || losses[0].Messages != 4 || losses[0].MovedTo == "" {
		t.Fatalf("losses = %+v, want ORDERS vanished with 4 messages, moved aside", losses)
	}
	moved := losses[0].MovedTo
	if !strings.HasPrefix(moved, filepath.Join(dir, store.OrphanDirName)) {
		t.Errorf("moved to %s, want under %s", moved, store.OrphanDirName)
	}
	if _, err := os.Stat(filepath.Join(moved, "msgs")); err != nil {
		t.Errorf("orphaned messages not kept: %v", err)
	}
	if _, err := os.Stat(streamDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("orphaned dir still in the server's way: %v", err)
	}
	if !strings.Contains(lb.String(), "stream ORDERS vanished") || !strings.Contains(lb.String(), moved) {
		t.Errorf("log does not name the vanished stream and where its data went:\n%s", lb.String())
	}
	log, _ := natstest.Logger(t)
	if err := bootstrap.Apply(natstest.Context(t), s2.JetStream(), cfg, log); err != nil {
		t.Fatalf("Bootstrap after the loss: %v", err)
	}
}

func TestVanishedStreamRefusedKeepsItsDirectory(t *testing.T) {
	cfg := configtest.Default(t)
	s, _ := lossServer(t, cfg, 2)
	closeServer(t, s)
	streamDir := filepath.Join(cfg.JetStream.StoreDir, "jetstream", "$G", "streams", "ORDERS")
	if err := os.Truncate(filepath.Join(streamDir, "meta.inf"), 0); err != nil {
		t.Fatal(err)
	}
	cfg.JetStream.OnDataLoss = "refuse"
	_, _, err := reopen(t, cfg, false)
	if !errors.Is(err, store.ErrDataLoss) || !strings.Contains(err.Error(), "stream ORDERS vanished") {
		t.Fatalf("Open = %v, want refused for the vanished ORDERS", err)
	}
	if _, err := os.Stat(streamDir); err != nil {
		t.Errorf("refused start moved or removed the stream dir: %v", err)
	}
}

// A consumer that lost its position redelivers: reported, never refused.
func TestConsumerGoneBackwardsOnlyWarns(t *testing.T) {
	cfg := configtest.Default(t)
	s, _ := lossServer(t, cfg, 1)
	closeServer(t, s)
	st, _ := store.ReadStoreState(cfg.JetStream.StoreDir)
	c := st.Consumers["ORDERS/WORKER1"]
	c.AckFloor = 1
	st.Consumers["ORDERS/WORKER1"] = c
	if err := store.WriteStoreState(cfg.JetStream.StoreDir, st); err != nil {
		t.Fatal(err)
	}
	cfg.JetStream.OnDataLoss = "refuse"
	s2, lb, err := reopen(t, cfg, false)
	if err != nil {
		t.Fatalf("refused for a consumer position: %v", err)
	}
	if l := s2.DataLosses(); len(l) != 1 || l[0].Consumer != "WORKER1" || l[0].Lost() {
		t.Errorf("losses = %+v", l)
	}
	if !strings.Contains(lb.String(), "consumer WORKER1 on stream ORDERS went back") {
		t.Errorf("not logged:\n%s", lb.String())
	}
}

func TestRecorderRecordsWhileRunning(t *testing.T) {
	cfg := configtest.Default(t)
	log, _ := natstest.Logger(t)
	s := New(cfg, log)
	s.StateInterval = 50 * time.Millisecond
	if err := s.Open(natstest.Context(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	if err := bootstrap.Apply(natstest.Context(t), s.JetStream(), cfg, log); err != nil {
		t.Fatal(err)
	}
	if _, err := s.JetStream().Publish(natstest.Context(t), "orders.x", nil); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		st, err := store.ReadStoreState(cfg.JetStream.StoreDir)
		if err != nil {
			return err
		}
		if st == nil || st.Streams["ORDERS"].LastSeq != 1 {
			return errors.New("ORDERS at seq 1 not recorded yet")
		}
		return nil
	})
}

// A damaged message block (bytes cut off or overwritten while holdfast was
// stopped) never starts silently: the server recovers what it can and
// holdfast reports what is gone.
func TestCorruptMessageBlockIsReported(t *testing.T) {
	for _, tc := range []struct {
		name    string
		corrupt func(t *testing.T, blk string)
	}{
		{"truncated", func(t *testing.T, blk string) {
			fi, err := os.Stat(blk)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(blk, fi.Size()/2); err != nil {
				t.Fatal(err)
			}
		}},
		{"overwritten", func(t *testing.T, blk string) {
			f, err := os.OpenFile(blk, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			fi, _ := f.Stat()
			junk := make([]byte, fi.Size()/2)
			for i := range junk {
				junk[i] = 0xA5
			}
			if _, err := f.WriteAt(junk, fi.Size()/2); err != nil {
				t.Fatal(err)
			}
		}},
		{"removed", func(t *testing.T, blk string) {
			if err := os.Remove(blk); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := configtest.Default(t)
			s, _ := lossServer(t, cfg, 20)
			closeServer(t, s)
			blks, _ := filepath.Glob(filepath.Join(cfg.JetStream.StoreDir, "jetstream", "$G", "streams", "ORDERS", "msgs", "*.blk"))
			if len(blks) == 0 {
				t.Fatal("no message block")
			}
			tc.corrupt(t, blks[len(blks)-1])
			// The server's index would describe the block as it was.
			_ = os.Remove(filepath.Join(filepath.Dir(blks[0]), "index.db"))

			s2, lb, err := reopen(t, cfg, false)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			info, err := corruptStreamState(t, s2, "ORDERS")
			if err != nil {
				t.Fatalf("stream ORDERS after the damage: %v", err)
			}
			t.Logf("after %s block: %d messages, last seq %d; losses %v", tc.name, info.Msgs, info.LastSeq, s2.DataLosses())
			if info.Msgs == 20 {
				return // the server recovered everything
			}
			losses := s2.DataLosses()
			if len(losses) != 1 || losses[0].Stream != "ORDERS" || !losses[0].Lost() || losses[0].FoundLast != info.LastSeq {
				t.Errorf("stream left with %d of 20 messages (last seq %d), losses reported %v", info.Msgs, info.LastSeq, losses)
			}
			if !strings.Contains(lb.String(), "data loss: stream ORDERS") {
				t.Errorf("loss not logged:\n%s", lb.String())
			}
		})
	}
}

func corruptStreamState(t *testing.T, s *Server, name string) (jetstream.StreamState, error) {
	t.Helper()
	str, err := s.JetStream().Stream(natstest.Context(t), name)
	if err != nil {
		return jetstream.StreamState{}, err
	}
	info, err := str.Info(natstest.Context(t))
	if err != nil {
		return jetstream.StreamState{}, err
	}
	return info.State, nil
}

// An idle server does not rewrite the state file every interval; a change
// is recorded.
func TestRecorderWritesOnlyOnChange(t *testing.T) {
	cfg := configtest.Default(t)
	log, _ := natstest.Logger(t)
	s := New(cfg, log)
	s.StateInterval = 20 * time.Millisecond
	if err := s.Open(natstest.Context(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	if err := bootstrap.Apply(natstest.Context(t), s.JetStream(), cfg, log); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(cfg.JetStream.StoreDir, store.StateFileName)
	// Each write renames a new file over the old one: a new inode.
	inode := func() uint64 {
		fi, err := os.Stat(path)
		if err != nil {
			return 0
		}
		return fi.Sys().(*syscall.Stat_t).Ino
	}
	var first uint64
	natstest.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		st, err := store.ReadStoreState(cfg.JetStream.StoreDir)
		if err != nil || st == nil || len(st.Consumers) == 0 {
			return fmt.Errorf("bootstrap not recorded yet: %v", err)
		}
		first = inode()
		return nil
	})
	// Fifty recorder intervals with nothing changing.
	deadline := time.Now().Add(50 * s.StateInterval)
	for time.Now().Before(deadline) {
		if got := inode(); got != first {
			t.Fatalf("the state file was rewritten although nothing changed (inode %d -> %d)", first, got)
		}
		time.Sleep(s.StateInterval / 2)
	}
	if _, err := s.JetStream().Publish(natstest.Context(t), "orders.x", nil); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		st, err := store.ReadStoreState(cfg.JetStream.StoreDir)
		if err != nil || st == nil || st.Streams["ORDERS"].LastSeq != 1 {
			return fmt.Errorf("ORDERS at seq 1 not recorded yet: %v", err)
		}
		return nil
	})
}

// TestStateFileWithInvalidNames: a state file naming a stream no stream
// can be named ("..", "../x": edited or damaged) stops start-up with an
// error that names the file and says to remove it. Before, the error was
// `cannot look for the data directory of stream "..": not a valid stream
// name`, which named neither the file nor what to do.
func TestStateFileWithInvalidNames(t *testing.T) {
	for _, body := range []string{
		`{"version":1,"streams":{"..":{"last_seq":10}}}`,
		`{"version":1,"streams":{"../x":{"last_seq":10}}}`,
		`{"version":1,"streams":{},"consumers":{"ORDERS/W":{"stream":"../ORDERS","name":"W","ack_floor":3}}}`,
	} {
		cfg := configtest.Default(t)
		s, _ := lossServer(t, cfg, 3)
		closeServer(t, s)
		path := filepath.Join(cfg.JetStream.StoreDir, store.StateFileName)
		if err := os.WriteFile(path, []byte(body), 0o640); err != nil {
			t.Fatal(err)
		}
		_, _, err := reopen(t, cfg, false)
		if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "remove it to start afresh") {
			t.Errorf("state file %s: %v", body, err)
		}
	}
}

// A consumer that keeps its state in memory is no durable position: the
// workers' claims on dead letters being replayed (holdfast-claim-SEQ) are
// such consumers, recorded when a record fell during a replay, and their
// absence at the next start was reported as a consumer that vanished.
func TestMemoryConsumerIsNotRecorded(t *testing.T) {
	cfg := configtest.Default(t)
	s, _ := lossServer(t, cfg, 1)
	if _, err := s.JetStream().CreateConsumer(natstest.Context(t), "ORDERS_DLQ", jetstream.ConsumerConfig{
		Durable: subjects.ReplayClaim(1), AckPolicy: jetstream.AckNonePolicy, DeliverPolicy: jetstream.DeliverNewPolicy,
		MemoryStorage: true, InactiveThreshold: time.Hour,
	}); err != nil {
		t.Fatal(err)
	}
	closeServer(t, s)
	if st, _ := store.ReadStoreState(cfg.JetStream.StoreDir); st == nil || len(st.Consumers) != 1 {
		t.Errorf("recorded consumers: %+v, want only ORDERS/WORKER1", st)
	}
	s2, lb, err := reopen(t, cfg, false)
	if err != nil {
		t.Fatal(err)
	}
	if l := s2.DataLosses(); len(l) != 0 {
		t.Errorf("losses = %+v, want none\n%s", l, lb.String())
	}
}
