package pipeline_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/embedded"
	"github.com/holdfast-io/holdfast/pipeline"
)

func failing(reason string) pipeline.Handler {
	return pipeline.HandlerFunc(func(ctx context.Context, m *pipeline.Message) pipeline.Result {
		return pipeline.Fail(reason)
	})
}

func (e *testEnv) waitDLQ(want uint64) {
	e.t.Helper()
	checkFor(e.t, 15*time.Second, func() error {
		if n := e.dlqCount(); n != want {
			return fmt.Errorf("%d dead letters, want %d", n, want)
		}
		return nil
	})
}

// Issue 11: after ORDERS is deleted and recreated (holdfast's advice for a
// change the server cannot apply), its sequences start at 1 again. The
// dead letters of the new incarnation must be stored, not taken for
// duplicates of the old incarnation's dead letters (same stream, consumer
// and sequence, inside the dead-letter stream's duplicate window).
func TestDeadLettersStoredAfterStreamRecreated(t *testing.T) {
	e := startEnv(t, nil)
	ctx := context.Background()
	w := e.workers(failing("exit status 65"), 1)
	for i := 0; i < 3; i++ {
		e.publish("orders.created", fmt.Sprintf("old-%d", i), nil)
	}
	e.waitDLQ(3)
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}

	// Back up, delete, change retention, restart: bootstrap recreates
	// ORDERS (at seq 1) and WORKER1; the dead-letter stream stays.
	if err := e.js.DeleteStream(ctx, "ORDERS"); err != nil {
		t.Fatal(err)
	}
	e.cfg.Streams["ORDERS"].Retention = "workqueue"
	if err := embedded.Bootstrap(ctx, e.js, e.cfg, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatal(err)
	}
	w2 := e.workers(failing("exit status 65"), 1)
	for i := 0; i < 3; i++ {
		if seq := e.publish("orders.created", fmt.Sprintf("new-%d", i), nil); seq != uint64(i+1) {
			t.Fatalf("recreated stream stored at seq %d", seq)
		}
	}
	e.waitDLQ(6)
	for seq := uint64(4); seq <= 6; seq++ {
		dl := e.dlqMsg(seq)
		if want := fmt.Sprintf("new-%d", seq-4); string(dl.Data) != want {
			t.Fatalf("dead letter %d holds %q, want %q", seq, dl.Data, want)
		}
	}
	// The originals are terminated only now that their own dead letters
	// are stored: the workqueue stream empties.
	checkFor(t, 10*time.Second, func() error {
		s, err := e.js.Stream(ctx, "ORDERS")
		if err != nil {
			return err
		}
		info, err := s.Info(ctx)
		if err != nil {
			return err
		}
		if info.State.Msgs != 0 {
			return fmt.Errorf("%d messages left in ORDERS", info.State.Msgs)
		}
		return nil
	})
	if n := w2.Stats().DeadLettered.Load(); n != 3 {
		t.Fatalf("dead-lettered %d, want 3", n)
	}
	if n := e.dlqCount(); n != 6 {
		t.Fatalf("%d dead letters, want 6", n)
	}
}

// A duplicate PubAck is checked against what the dead-letter stream holds:
// a different message stored under the same Nats-Msg-Id is no proof, and
// the original is kept.
func TestDeadLetterDuplicateOfAnotherMessageKeepsOriginal(t *testing.T) {
	e := startEnv(t, func(cc *config.ConsumerConfig) { cc.MaxDeliver = 100 })
	ctx := context.Background()
	s, err := e.js.Stream(ctx, "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	created := s.CachedInfo().Created
	// Something else already stored under the id the dead letter of seq 1
	// will have.
	squatter := nats.NewMsg("dlq.WORKER1.orders.created")
	squatter.Header.Set(nats.MsgIdHdr, pipeline.DeadLetterMsgID("ORDERS", "WORKER1", 1, created))
	squatter.Data = []byte("not the message")
	if _, err := e.js.PublishMsg(ctx, squatter); err != nil {
		t.Fatal(err)
	}
	w := e.workers(failing("bad"), 1)
	seq := e.publish("orders.created", "the message", nil)
	checkFor(t, 10*time.Second, func() error {
		if n := w.Stats().Failures.Load(); n < 1 {
			return fmt.Errorf("%d failures", n)
		}
		return nil
	})
	if info := e.consumerInfo(); info.AckFloor.Stream >= seq {
		t.Fatal("original terminated on a duplicate PubAck that points at another message")
	}
	if n := w.Stats().DeadLettered.Load(); n != 0 {
		t.Fatalf("counted %d dead letters", n)
	}
	if n := e.dlqCount(); n != 1 {
		t.Fatalf("%d messages in the dead-letter stream", n)
	}
	if got := e.dlqMsg(1).Header.Get("Holdfast-Original-Seq"); got != "" {
		t.Fatalf("squatter changed: %q", got)
	}
}
