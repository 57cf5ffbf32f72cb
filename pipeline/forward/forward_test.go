package forward_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/embedded/bootstrap"
	"github.com/holdfast-io/holdfast/internal/natstest"
	"github.com/holdfast-io/holdfast/internal/pipelinetest"
	"github.com/holdfast-io/holdfast/pipeline"
	"github.com/holdfast-io/holdfast/pipeline/forward"
	"github.com/holdfast-io/holdfast/pipeline/handler"
)

// forwardEnv is a pipelinetest.Env whose own JetStream (domain "") plays the hub:
// the stream HUB on edge.> takes the forwarded messages.
func forwardEnv(t *testing.T, hub jetstream.StreamConfig) (*pipelinetest.Env, *atomic.Bool) {
	t.Helper()
	e := pipelinetest.Start(t, nil)
	hub.Name, hub.Subjects = "HUB", []string{"edge.>"}
	if _, err := e.JS.CreateStream(context.Background(), hub); err != nil {
		t.Fatal(err)
	}
	var up atomic.Bool
	up.Store(true)
	return e, &up
}

func forwarder(e *pipelinetest.Env, up *atomic.Bool, minWindow time.Duration) (*forward.Forwarder, error) {
	e.T.Helper()
	return forwarderWith(e, forward.Options{
		ServerName: "edge1", Stream: "ORDERS", Consumer: config.DefaultConsumerName,
		Subject: config.DefaultForwardSubject, Timeout: 2 * time.Second, MinDuplicateWindow: minWindow,
		LinkUp: up.Load,
	})
}

func forwarderWith(e *pipelinetest.Env, opts forward.Options) (*forward.Forwarder, error) {
	e.T.Helper()
	f, err := forward.New(e.Srv.Conn(), opts, nil)
	if err != nil {
		e.T.Fatal(err)
	}
	if err := f.Open(context.Background()); err != nil {
		return nil, err
	}
	e.T.Cleanup(f.Close)
	return f, nil
}

func hubMsgs(e *pipelinetest.Env) uint64 {
	e.T.Helper()
	return natstest.StreamInfo(e.T, e.JS, "HUB").State.Msgs
}

// waitHubMsgs waits until the hub's stream holds want messages.
func waitHubMsgs(e *pipelinetest.Env, want uint64, within time.Duration) {
	e.T.Helper()
	natstest.CheckFor(e.T, within, 20*time.Millisecond, func() error {
		if n := hubMsgs(e); n != want {
			return fmt.Errorf("hub holds %d, want %d", n, want)
		}
		return nil
	})
}

// TestForwardPausesWhileLinkDown: while the link is down the workers pull
// nothing (no delivery spent) and say they are paused; once it is up every
// message is stored on the hub once, with its origin headers and id.
func TestForwardPausesWhileLinkDown(t *testing.T) {
	t.Parallel()
	e, up := forwardEnv(t, jetstream.StreamConfig{Duplicates: time.Minute})
	f, err := forwarder(e, up, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	up.Store(false)
	w := e.WorkersWith(f, 1, func(o *pipeline.ConsumerOptions) { o.Paused = func() bool { return !f.Ready() } })
	hdr := nats.Header{}
	hdr.Set(nats.MsgIdHdr, "client-id-1")
	hdr.Set("X-Trace", "abc")
	for i := range 3 {
		e.Publish("orders.created", fmt.Sprint(i), hdr)
		hdr = nil
	}
	time.Sleep(500 * time.Millisecond)
	if ci := e.ConsumerInfo(); ci.Delivered.Stream != 0 || ci.NumPending != 3 {
		t.Fatalf("paused workers pulled: delivered %d, pending %d", ci.Delivered.Stream, ci.NumPending)
	}
	if !w.Activity(time.Now()).Paused {
		t.Error("Activity does not say paused")
	}
	up.Store(true)
	waitHubMsgs(e, 3, 10*time.Second)
	s, _ := e.JS.Stream(context.Background(), "HUB")
	m, err := s.GetMsg(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	orders, _ := e.JS.Stream(context.Background(), "ORDERS")
	created := orders.CachedInfo().Created
	first, err := orders.GetMsg(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		nats.MsgIdHdr:                     forward.MsgID("edge1", "ORDERS", 1, first.Time),
		forward.HeaderOriginServer:        "edge1",
		forward.HeaderOriginStream:        "ORDERS",
		forward.HeaderOriginSeq:           "1",
		forward.HeaderOriginSubject:       "orders.created",
		forward.HeaderOriginMsgID:         "client-id-1",
		forward.HeaderOriginStreamCreated: created.UTC().Format(time.RFC3339Nano),
		"X-Trace":                         "abc",
	}
	for k, v := range want {
		if got := m.Header.Get(k); got != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
	if m.Subject != "edge.edge1.orders.created" {
		t.Errorf("subject %s", m.Subject)
	}
	if st := f.Stats(); st.Forwarded.Load() != 3 || st.LastForward.Load() == 0 {
		t.Errorf("stats: forwarded %d", st.Forwarded.Load())
	}
	if ci := e.ConsumerInfo(); ci.Delivered.Consumer != 3 {
		t.Errorf("deliveries: %d, want each message delivered once", ci.Delivered.Consumer)
	}
}

// TestForwardRecreatedStream: after the edge's stream is deleted and
// created again (sequences from 1), its messages get new ids and are not
// dropped by the hub as duplicates of the old incarnation's.
func TestForwardRecreatedStream(t *testing.T) {
	t.Parallel()
	e, up := forwardEnv(t, jetstream.StreamConfig{Duplicates: time.Minute})
	f, err := forwarder(e, up, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	e.WorkersWith(f, 1, func(o *pipeline.ConsumerOptions) { o.Paused = func() bool { return !f.Ready() } })
	e.Publish("orders.created", "old", nil)
	waitHubMsgs(e, 1, 10*time.Second)
	recreateOrders(e)
	if seq := e.Publish("orders.created", "new", nil); seq != 1 {
		t.Fatalf("recreated stream gave seq %d", seq)
	}
	waitHubMsgs(e, 2, 20*time.Second)
	if d := f.Stats().Duplicates.Load(); d != 0 {
		t.Errorf("%d duplicate PubAcks: the new message was taken for the old one", d)
	}
}

// recreateOrders deletes the edge's stream ORDERS and creates it again
// from the config, with a creation time of its own.
func recreateOrders(e *pipelinetest.Env) {
	e.T.Helper()
	ctx := context.Background()
	if err := e.JS.DeleteStream(ctx, "ORDERS"); err != nil {
		e.T.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	if err := bootstrap.Apply(ctx, e.JS, e.Cfg, slog.New(slog.DiscardHandler)); err != nil {
		e.T.Fatal(err)
	}
}

// TestForwardOversizeDeadLettered: a message larger than the hub stream's
// max_msg_size fails at once (dead letter with the reason), the next one
// is forwarded.
func TestForwardOversizeDeadLettered(t *testing.T) {
	t.Parallel()
	e, up := forwardEnv(t, jetstream.StreamConfig{Duplicates: time.Minute, MaxMsgSize: 1024})
	f, err := forwarder(e, up, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	e.Workers(f, 1)
	big := e.Publish("orders.created", strings.Repeat("x", 2048), nil)
	e.Publish("orders.created", "small", nil)
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if n := hubMsgs(e); n != 1 || e.DLQCount() != 1 {
			return fmt.Errorf("hub holds %d, dead letters %d", n, e.DLQCount())
		}
		return nil
	})
	if reason := e.DLQMsg(big).Header.Get(pipeline.HeaderError); !strings.Contains(reason, "max_msg_size 1024") {
		t.Errorf("dead letter reason %q", reason)
	}
}

// TestForwardRefusedComesBackNotSkipped: the hub refuses a message for
// its size (its stream's max_msg_size lowered after the check) while the
// edge's dead-letter stream cannot take it (sealed): the message is given
// back and the next one goes first, past it. When it comes back it is
// sent again, not taken for one the hub holds: never acked while neither
// on the hub nor dead-lettered.
func TestForwardRefusedComesBackNotSkipped(t *testing.T) {
	t.Parallel()
	e, up := forwardEnv(t, jetstream.StreamConfig{Duplicates: time.Minute})
	f, err := forwarder(e, up, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	natstest.EditStream(t, e.JS, "HUB", func(c *jetstream.StreamConfig) { c.MaxMsgSize = 1024 })
	natstest.EditStream(t, e.JS, pipelinetest.DLQ, func(c *jetstream.StreamConfig) { c.Sealed = true })
	e.Workers(f, 1)
	big := e.Publish("orders.created", strings.Repeat("x", 2048), nil)
	e.Publish("orders.created", "small", nil)
	waitHubMsgs(e, 1, 5*time.Second)
	natstest.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		if n := f.Stats().Refused.Load(); n < 3 {
			return fmt.Errorf("refused %d times, want it to come back and be refused again (ack floor %d, skipped %d)",
				n, e.ConsumerInfo().AckFloor.Stream, f.Stats().Skipped.Load())
		}
		return nil
	})
	if ci := e.ConsumerInfo(); ci.AckFloor.Stream >= big || f.Stats().Skipped.Load() > 0 {
		t.Fatalf("message %d acked (ack floor %d, skipped %d) though neither on the hub nor dead-lettered",
			big, ci.AckFloor.Stream, f.Stats().Skipped.Load())
	}
}

// TestForwardLongSubjectDeadLettered: a message whose subject fits the
// server's control line, but whose forward subject (edge.edge1. and its
// last token) does not: the server closed holdfast's connection, and
// nothing was forwarded or dead-lettered after it. It is dead-lettered.
func TestForwardLongSubjectDeadLettered(t *testing.T) {
	t.Parallel()
	e, up := forwardEnv(t, jetstream.StreamConfig{Duplicates: time.Minute})
	f, err := forwarder(e, up, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	e.Workers(f, 1)
	long := e.Publish("orders."+strings.Repeat("x", 4029), "long", nil)
	e.Publish("orders.created", "small", nil)
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if n := hubMsgs(e); n != 1 || e.DLQCount() != 1 {
			return fmt.Errorf("hub holds %d, dead letters %d", n, e.DLQCount())
		}
		return nil
	})
	if reason := e.DLQMsg(long).Header.Get(pipeline.HeaderError); !strings.Contains(reason, "too long to publish") {
		t.Errorf("dead letter reason %q", reason)
	}
}

// TestForwardHeaderTooLargeForHub: a message whose headers fit the
// edge's stream (a header block of at most 65,535 bytes), but not once
// forwarding adds the origin headers, is one the hub can never store
// (10097): it is refused at once and the rest keep flowing. Its dead
// letter adds headers too: the message is kept, its dead letter failing.
func TestForwardHeaderTooLargeForHub(t *testing.T) {
	t.Parallel()
	e, up := forwardEnv(t, jetstream.StreamConfig{Duplicates: time.Minute})
	f, err := forwarder(e, up, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	w := e.Workers(f, 1)
	hdr := nats.Header{}
	hdr.Set("X-Big", strings.Repeat("h", 65300))
	e.Publish("orders.created", "big headers", hdr)
	e.Publish("orders.created", "small", nil)
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if n := hubMsgs(e); n != 1 || f.Stats().Refused.Load() == 0 {
			return fmt.Errorf("hub holds %d, refused %d; forwarding: %q", n, f.Stats().Refused.Load(), f.Problem())
		}
		return nil
	})
	if p := f.Problem(); p != "" {
		t.Errorf("forwarding waits: %s", p)
	}
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if n := w.Stats().DeadLetterFailing.Load(); n != 1 {
			return fmt.Errorf("%d messages with their dead letter failing, want 1", n)
		}
		return nil
	})
}

// TestForwardSubjectNoHubStreamTakes: the hub's stream takes only
// edge.*.orders.created; a message on orders.paid is dead-lettered at
// once, saying which subject no hub stream takes (before, each attempt
// waited out the publish timeout), and the rest keep flowing.
func TestForwardSubjectNoHubStreamTakes(t *testing.T) {
	t.Parallel()
	e := pipelinetest.Start(t, nil)
	if _, err := e.JS.CreateStream(context.Background(), jetstream.StreamConfig{Name: "HUB", Subjects: []string{"edge.*.orders.created"}, Duplicates: time.Minute}); err != nil {
		t.Fatal(err)
	}
	var up atomic.Bool
	up.Store(true)
	f, err := forwarder(e, &up, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	e.Workers(f, 1)
	paid := e.Publish("orders.paid", "p", nil)
	e.Publish("orders.created", "c", nil)
	natstest.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		if n := hubMsgs(e); n != 1 || e.DLQCount() != 1 {
			return fmt.Errorf("hub holds %d, dead letters %d", n, e.DLQCount())
		}
		return nil
	})
	if reason := e.DLQMsg(paid).Header.Get(pipeline.HeaderError); !strings.Contains(reason, "no stream of the hub") || !strings.Contains(reason, "edge.edge1.orders.paid") {
		t.Errorf("dead letter reason %q", reason)
	}
}

// TestForwardHubStreamNarrowedWhileLinked: the hub's stream, checked
// on edge.>, is narrowed to edge.*.orders.created (a hub reload: the
// link stays up) while the hub's edge view still listens on edge.>, so
// a publish on another subject gets no answer at all. Sent alone or in
// an atomic batch, that message is dead-lettered, saying which subject
// no hub stream takes, and the one after it reaches the hub, instead of
// both waiting forever on "no PubAck".
func TestForwardHubStreamNarrowedWhileLinked(t *testing.T) {
	t.Parallel()
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			t.Parallel()
			hubCfg := jetstream.StreamConfig{Name: "HUB", Subjects: []string{"edge.>"}, Duplicates: time.Minute, AllowAtomicPublish: true}
			e, up := forwardEnv(t, hubCfg)
			f, err := forwarder(e, up, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
			defer cancel()
			if r := f.Handle(ctx, storedMessage(e, e.Publish("orders.created", "c0", nil))); r.Outcome != handler.Success {
				t.Fatalf("first message: %+v", r)
			}
			hubCfg.Subjects = []string{"edge.*.orders.created"}
			if _, err := e.JS.UpdateStream(ctx, hubCfg); err != nil {
				t.Fatal(err)
			}
			view, err := e.Srv.Conn().Subscribe("edge.>", func(*nats.Msg) {})
			if err != nil {
				t.Fatal(err)
			}
			defer view.Unsubscribe()
			msgs := []*handler.Message{storedMessage(e, e.Publish("orders.paid", "p", nil)), storedMessage(e, e.Publish("orders.created", "c1", nil))}
			results := make([]handler.Result, len(msgs))
			if batch {
				f.HandleBatch(ctx, msgs, func(i int, r handler.Result) { results[i] = r })
			} else {
				for i, m := range msgs {
					results[i] = f.Handle(ctx, m)
				}
			}
			if r := results[0]; r.Outcome != handler.Permanent || !strings.Contains(r.Reason, "no stream of the hub") || !strings.Contains(r.Reason, "edge.edge1.orders.paid") {
				t.Errorf("orders.paid: %+v, want a dead letter naming the subject no hub stream takes", r)
			}
			if r := results[1]; r.Outcome != handler.Success {
				t.Errorf("orders.created after it: %+v", r)
			}
			waitHubMsgs(e, 2, 5*time.Second)
		})
	}
}

// TestForwardWaitsOnShortDuplicateWindow: a hub stream whose duplicate
// window is too short does not stop the edge: Open succeeds, forwarding
// waits with Problem naming the stream and the fix, and goes on once the
// hub's stream is fixed. With the hub's position (the default template)
// the window must cover twice forward.timeout; without it (no {server}
// in the template), the promised outage, unreachable_after.
func TestForwardWaitsOnShortDuplicateWindow(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, template, want string
		window, fixed        time.Duration
		retention            jetstream.RetentionPolicy
	}{
		{"position", config.DefaultForwardSubject, `duplicate_window = "4s"`, time.Second, 4 * time.Second, jetstream.LimitsPolicy},
		{"no position", "edge.all.{subject}", `duplicate_window = "5m0s"`, 2 * time.Minute, 5 * time.Minute, jetstream.LimitsPolicy},
		// The hub removes what it consumed, the position with it: a
		// kill -9 of the edge stored 1,005 of 20,000 twice (found
		// 2026-12-04).
		{"interest retention", config.DefaultForwardSubject, `duplicate_window = "5m0s"`, 2 * time.Minute, 5 * time.Minute, jetstream.InterestPolicy},
		{"work queue", config.DefaultForwardSubject, "workqueue retention", 2 * time.Minute, 5 * time.Minute, jetstream.WorkQueuePolicy},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := pipelinetest.Start(t, nil)
			ctx := context.Background()
			hub := jetstream.StreamConfig{Name: "HUB", Subjects: []string{"edge.>"}, Duplicates: tt.window, Retention: tt.retention}
			if _, err := e.JS.CreateStream(ctx, hub); err != nil {
				t.Fatal(err)
			}
			f, err := forwarderWith(e, forward.Options{
				ServerName: "edge1", Stream: "ORDERS", Consumer: config.DefaultConsumerName,
				Subject: tt.template, Timeout: 2 * time.Second, MinDuplicateWindow: 5 * time.Minute,
			})
			if err != nil {
				t.Fatalf("Open = %v, want nil: the hub's stream never stops the edge", err)
			}
			if f.Ready() {
				t.Fatal("ready with the hub's window too short")
			}
			for _, want := range []string{"duplicate window is too short", "stream HUB", tt.want} {
				if p := f.Problem(); !strings.Contains(p, want) {
					t.Errorf("Problem = %q, want %q in it", p, want)
				}
			}
			hub.Duplicates = tt.fixed
			if _, err := e.JS.UpdateStream(ctx, hub); err != nil {
				t.Fatal(err)
			}
			natstest.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
				if !f.Ready() {
					return fmt.Errorf("not ready after the hub's window was fixed: %s", f.Problem())
				}
				return nil
			})
		})
	}
}

// TestForwardRechecksAfterLinkDown: a hub whose stream's window became
// too short while the link was down (a hub restarted with another
// config) is checked again once the link is back: forwarding waits and
// Problem says why, instead of going on from the check made before.
func TestForwardRechecksAfterLinkDown(t *testing.T) {
	t.Parallel()
	e, up := forwardEnv(t, jetstream.StreamConfig{Duplicates: 10 * time.Minute})
	f, err := forwarder(e, up, 5*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !f.Ready() {
		t.Fatal("not ready after Open")
	}
	up.Store(false)
	if f.Ready() {
		t.Fatal("ready with the link down")
	}
	if _, err := e.JS.UpdateStream(context.Background(), jetstream.StreamConfig{Name: "HUB", Subjects: []string{"edge.>"}, Duplicates: time.Second}); err != nil {
		t.Fatal(err)
	}
	up.Store(true)
	if f.Ready() {
		t.Error("ready at once when the link came back, before the hub was checked again")
	}
	natstest.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		if p := f.Problem(); !strings.Contains(p, "duplicate window is too short") {
			return fmt.Errorf("Problem = %q", p)
		}
		return nil
	})
	if f.Ready() {
		t.Error("ready with a window too short")
	}
}

// TestForwardChecksEveryHubStream: the hub splits the destination over
// two streams; the one the hub does not name first deduplicates over too
// short a window, and forwarding waits for it, by name.
func TestForwardChecksEveryHubStream(t *testing.T) {
	t.Parallel()
	e := pipelinetest.Start(t, nil)
	ctx := context.Background()
	for _, sc := range []jetstream.StreamConfig{
		{Name: "A_ORDERS", Subjects: []string{"edge.*.orders.>"}, Duplicates: 10 * time.Minute},
		{Name: "Z_METRICS", Subjects: []string{"edge.*.metrics.>"}, Duplicates: time.Second},
	} {
		if _, err := e.JS.CreateStream(ctx, sc); err != nil {
			t.Fatal(err)
		}
	}
	var up atomic.Bool
	up.Store(true)
	f, err := forwarder(e, &up, 5*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if p := f.Problem(); f.Ready() || !strings.Contains(p, "stream Z_METRICS") {
		t.Fatalf("ready %v, Problem %q: want waiting, naming Z_METRICS", f.Ready(), p)
	}
}

// TestForwardOpenInterrupted: Open returns the context's error when it
// ends while the hub is being checked, instead of going on as if started.
func TestForwardOpenInterrupted(t *testing.T) {
	t.Parallel()
	e, up := forwardEnv(t, jetstream.StreamConfig{Duplicates: time.Minute})
	f, err := forward.New(e.Srv.Conn(), forward.Options{
		ServerName: "edge1", Stream: "ORDERS", Consumer: config.DefaultConsumerName,
		Subject: config.DefaultForwardSubject, Timeout: 2 * time.Second, MinDuplicateWindow: time.Minute, LinkUp: up.Load,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := f.Open(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Open with a cancelled context: %v, want context.Canceled", err)
	}
}

func TestForwardSubject(t *testing.T) {
	t.Parallel()
	if got := forward.Subject("edge.{server}.{subject}", "e1", "orders.created"); got != "edge.e1.orders.created" {
		t.Errorf("got %s", got)
	}
}

// TestForwardShutdownWhileLinkDown: a forward handler waiting for the
// link does not hold up Close for the shutdown timeout: the message is
// given back at once, and forwarded once by the next workers.
func TestForwardShutdownWhileLinkDown(t *testing.T) {
	t.Parallel()
	e, up := forwardEnv(t, jetstream.StreamConfig{Duplicates: time.Minute})
	f, err := forwarder(e, up, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	paused := func(o *pipeline.ConsumerOptions) { o.Paused = func() bool { return !f.Ready() } }
	// The link falls as the handler starts: it waits for the link.
	w := e.WorkersWith(handler.Func(func(ctx context.Context, m *handler.Message) handler.Result {
		up.Store(false)
		return f.Handle(ctx, m)
	}), 1, paused)
	w.ShutdownTimeout = time.Minute
	e.Publish("orders.created", "x", nil)
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if !w.Activity(time.Now()).Paused || len(w.Activity(time.Now()).Running) != 1 {
			return errors.New("the handler is not waiting for the link")
		}
		return nil
	})
	closed := make(chan struct{})
	go func() { w.Close(context.Background()); close(closed) }()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("Close waited for the handler that waits for the link")
	}
	if n := hubMsgs(e); n != 0 {
		t.Fatalf("hub holds %d before the link is up", n)
	}
	up.Store(true)
	e.WorkersWith(f, 1, paused)
	waitHubMsgs(e, 1, 10*time.Second)
	// The ack is confirmed off the worker's path: wait for it.
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if ci := e.ConsumerInfo(); ci.NumAckPending != 0 || e.DLQCount() != 0 {
			return fmt.Errorf("ack pending %d, dead letters %d", ci.NumAckPending, e.DLQCount())
		}
		return nil
	})
}

// TestForwardWaitsForHubStream: while the hub's stream is gone (deleted,
// its hub restarting) with the link up, forwarding waits in the same
// delivery instead of spending deliveries and dead-lettering; once the
// stream is back the message is forwarded.
func TestForwardWaitsForHubStream(t *testing.T) {
	t.Parallel()
	e, up := forwardEnv(t, jetstream.StreamConfig{Duplicates: time.Minute})
	f, err := forwarder(e, up, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	e.WorkersWith(f, 1, func(o *pipeline.ConsumerOptions) { o.Paused = func() bool { return !f.Ready() } })
	ctx := context.Background()
	if err := e.JS.DeleteStream(ctx, "HUB"); err != nil {
		t.Fatal(err)
	}
	e.Publish("orders.created", "x", nil)
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if f.Ready() || !strings.Contains(f.Problem(), "no stream on edge.edge1.>") {
			return fmt.Errorf("ready %v, problem %q", f.Ready(), f.Problem())
		}
		return nil
	})
	time.Sleep(2 * time.Second) // longer than the backoff: no retries meanwhile
	if ci := e.ConsumerInfo(); ci.Delivered.Consumer != 1 || e.DLQCount() != 0 {
		t.Fatalf("deliveries spent while the hub's stream was gone: %d, dead letters %d", ci.Delivered.Consumer, e.DLQCount())
	}
	if _, err := e.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "HUB", Subjects: []string{"edge.>"}, Duplicates: time.Minute}); err != nil {
		t.Fatal(err)
	}
	waitHubMsgs(e, 1, 10*time.Second)
	// The hub holding it does not mean the edge's ack was applied yet: the
	// ack is confirmed off the worker's path.
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if ci := e.ConsumerInfo(); ci.Delivered.Consumer != 1 || ci.NumAckPending != 0 {
			return fmt.Errorf("deliveries %d, ack pending %d: want one delivery, acked", ci.Delivered.Consumer, ci.NumAckPending)
		}
		return nil
	})
}

// TestForwardRestoredStreamReusesSequences: an edge store restored from a
// backup older than what it forwarded continues the backup's sequences
// under the same stream creation time (a restore keeps it), so a new
// message gets the sequence of one the hub already stored. It must not be
// taken for that one (a duplicate PubAck, acked locally, never stored);
// the same message sent again still is.
func TestForwardRestoredStreamReusesSequences(t *testing.T) {
	t.Parallel()
	e, up := forwardEnv(t, jetstream.StreamConfig{Duplicates: time.Minute})
	f, err := forwarder(e, up, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	e.Publish("orders.created", "stored before the backup", nil)
	ctx := context.Background()
	orders, err := e.JS.Stream(ctx, "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	stored, err := orders.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	forwarded := &handler.Message{Subject: "orders.created", Stream: "ORDERS", Sequence: 1, Delivery: 1,
		Data: []byte("forwarded before the restore"), Published: stored.Time}
	// What the restored store holds at sequence 1 afterwards: another
	// message, stored later.
	reused := &handler.Message{Subject: "orders.created", Stream: "ORDERS", Sequence: 1, Delivery: 1,
		Data: []byte("published after the restore"), Published: stored.Time.Add(time.Second)}
	for _, m := range []*handler.Message{forwarded, forwarded, reused} {
		if r := f.Handle(ctx, m); r.Outcome != handler.Success {
			t.Fatalf("Handle(%q): %+v", m.Data, r)
		}
	}
	if n := hubMsgs(e); n != 2 {
		t.Errorf("hub holds %d messages, want 2: the message published after the restore was taken for the one forwarded before", n)
	}
	if s := f.Stats(); s.Skipped.Load() != 1 || s.Duplicates.Load() != 0 {
		t.Errorf("%d skipped, %d duplicate PubAcks: want the same message sent twice skipped by the hub's position", s.Skipped.Load(), s.Duplicates.Load())
	}
}

// TestForwardMessageOlderThanItsStream: holdfast restore gives a stream
// a new creation time and keeps its messages, stored before it. They are
// forwarded (not retried until max_deliver as belonging to a stream since
// deleted), under ids that do not depend on the creation time, so a
// message the hub took before the restore is a duplicate, not a second
// copy.
func TestForwardMessageOlderThanItsStream(t *testing.T) {
	t.Parallel()
	e, up := forwardEnv(t, jetstream.StreamConfig{Duplicates: time.Minute})
	f, err := forwarder(e, up, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	orders, err := e.JS.Stream(ctx, "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	restored := &handler.Message{Subject: "orders.created", Stream: "ORDERS", Sequence: 7, Delivery: 1,
		Data: []byte("stored before the restore"), Published: orders.CachedInfo().Created.Add(-time.Hour)}
	for i := range 2 {
		if r := f.Handle(ctx, restored); r.Outcome != handler.Success {
			t.Fatalf("Handle #%d of a message older than its stream: %+v", i+1, r)
		}
	}
	if n := hubMsgs(e); n != 1 {
		t.Errorf("hub holds %d messages, want 1", n)
	}
	if s := f.Stats(); s.Skipped.Load()+s.Duplicates.Load() != 1 {
		t.Errorf("%d skipped, %d duplicate PubAcks: want 1 in all", s.Skipped.Load(), s.Duplicates.Load())
	}
}

// TestForwardPositionOutlivesDuplicateWindow: messages the hub stored
// are not stored again when they come back after the hub's duplicate
// window passed — a local ack lost in an outage longer than the window,
// an edge restarted — because the hub's position (the last message it
// holds of this edge's stream, read back after each reconnect) shows it
// has them. A Forwarder opened anew reads the position from the hub. The
// hub's stream is read both ways nats.go reads a message (direct get or
// not).
func TestForwardPositionOutlivesDuplicateWindow(t *testing.T) {
	t.Parallel()
	for _, direct := range []bool{false, true} {
		t.Run(fmt.Sprintf("allow_direct=%v", direct), func(t *testing.T) {
			t.Parallel()
			window := time.Second
			e, up := forwardEnv(t, jetstream.StreamConfig{Duplicates: window, AllowDirect: direct})
			opts := forward.Options{
				ServerName: "edge1", Stream: "ORDERS", Consumer: config.DefaultConsumerName,
				Subject: config.DefaultForwardSubject, Timeout: window / 2, MinDuplicateWindow: time.Hour, LinkUp: up.Load,
			}
			f, err := forwarderWith(e, opts)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			handle := func(f *forward.Forwarder, seq uint64) {
				m := storedMessage(e, seq)
				m.Delivery = 2
				if r := f.Handle(ctx, m); r.Outcome != handler.Success {
					t.Fatalf("Handle(%d): %+v", seq, r)
				}
			}
			for i := range 3 {
				e.Publish([]string{"orders.created", "orders.paid"}[i%2], fmt.Sprint(i), nil)
			}
			for seq := uint64(1); seq <= 3; seq++ {
				handle(f, seq)
			}
			time.Sleep(window + window/2)
			handle(f, 2)
			if n := hubMsgs(e); n != 3 {
				t.Fatalf("hub holds %d, want 3: a message sent again after the duplicate window was stored twice", n)
			}
			up.Store(false) // a reconnect: the position is read from the hub
			up.Store(true)
			natstest.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
				if !f.Ready() {
					return fmt.Errorf("not ready: %s", f.Problem())
				}
				return nil
			})
			handle(f, 3)
			restarted, err := forwarderWith(e, opts)
			if err != nil {
				t.Fatal(err)
			}
			for seq := uint64(1); seq <= 3; seq++ {
				handle(restarted, seq)
			}
			if n := hubMsgs(e); n != 3 {
				t.Fatalf("hub holds %d, want 3: an edge restarted after the duplicate window sent again what the hub held", n)
			}
			if s := f.Stats().Skipped.Load() + restarted.Stats().Skipped.Load(); s != 5 {
				t.Errorf("%d skipped, want 5", s)
			}
			e.Publish("orders.created", "new", nil)
			handle(restarted, 4)
			if n := hubMsgs(e); n != 4 {
				t.Fatalf("hub holds %d, want 4: the message after the position was not forwarded", n)
			}
		})
	}
}

// TestForwardAfterCrashSendsTakenMessagesFirst: a process that took
// messages and died without acking them (here a plain fetch) leaves them
// to be delivered again only after ack_wait, behind the newer ones. Sent
// in that order, the hub's position would pass over them, and they would
// be skipped when they came: Open sets the consumer back to its ack
// floor, so they go first and every message reaches the hub.
func TestForwardAfterCrashSendsTakenMessagesFirst(t *testing.T) {
	t.Parallel()
	e := pipelinetest.Start(t, func(cc *config.ConsumerConfig) { cc.AckWait = config.Dur(2 * time.Second) })
	ctx := context.Background()
	if _, err := e.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "HUB", Subjects: []string{"edge.>"}, Duplicates: time.Minute}); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		e.Publish("orders.created", fmt.Sprint(i), nil)
	}
	cons, err := e.JS.Consumer(ctx, "ORDERS", config.DefaultConsumerName)
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(5, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for range batch.Messages() { // taken, never acked: the process died
	}
	var up atomic.Bool
	up.Store(true)
	f, err := forwarder(e, &up, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	e.Workers(f, 1)
	waitHubMsgs(e, 10, 10*time.Second)
	hub, err := e.JS.Stream(ctx, "HUB")
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= 10; seq++ {
		m, err := hub.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		if origin := m.Header.Get(forward.HeaderOriginSeq); origin != fmt.Sprint(seq) {
			t.Errorf("hub seq %d holds origin seq %s: not in order", seq, origin)
		}
	}
}

// TestForwardReplayedDeadLetterNotSkipped: a dead letter replayed to the
// forward handler (out of band: its sequence lies behind the hub's
// position, since later messages went on without it) is sent, not taken
// for one the hub holds.
func TestForwardReplayedDeadLetterNotSkipped(t *testing.T) {
	t.Parallel()
	e, up := forwardEnv(t, jetstream.StreamConfig{Duplicates: time.Minute})
	f, err := forwarder(e, up, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var msgs []*handler.Message
	for i := range 3 {
		msgs = append(msgs, storedMessage(e, e.Publish("orders.created", fmt.Sprint(i), nil)))
	}
	// 2 failed and was dead-lettered; 1 and 3 went to the hub.
	for _, m := range []*handler.Message{msgs[0], msgs[2]} {
		if r := f.Handle(ctx, m); r.Outcome != handler.Success {
			t.Fatal(r)
		}
	}
	replayed := *msgs[1]
	replayed.OutOfBand, replayed.Delivery = true, 2
	if r := f.Handle(ctx, &replayed); r.Outcome != handler.Success {
		t.Fatal(r)
	}
	if n := hubMsgs(e); n != 3 {
		t.Fatalf("hub holds %d, want 3: the replayed dead letter was taken for one the hub held", n)
	}
	if seq, _ := f.Position(); seq != 3 {
		t.Errorf("position %d after the replay, want 3: an out-of-band message does not move it", seq)
	}
}

// TestForwardReplayFromEarlierIncarnation: a dead letter of the edge's
// stream as it was before it was deleted and created again goes to the hub
// under that earlier incarnation: taken for one of the stream as it is
// now, the hub's last message claims a sequence this stream never sent it,
// and after the next reconnect the edge logs that a client on the hub
// forged its position.
func TestForwardReplayFromEarlierIncarnation(t *testing.T) {
	t.Parallel()
	e, up := forwardEnv(t, jetstream.StreamConfig{Duplicates: time.Minute})
	f, err := forwarder(e, up, 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	handle := func(m *handler.Message) {
		t.Helper()
		if r := f.Handle(ctx, m); r.Outcome != handler.Success {
			t.Fatalf("Handle(%d): %+v", m.Sequence, r)
		}
	}
	orders, err := e.JS.Stream(ctx, "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	before := orders.CachedInfo().Created
	var msgs []*handler.Message
	for i := range 3 {
		msgs = append(msgs, storedMessage(e, e.Publish("orders.created", fmt.Sprint(i), nil)))
	}
	handle(msgs[0])
	// The second failed; its dead letter outlives the stream.
	dl := pipeline.NewDeadLetter(config.DefaultConsumerName, msgs[1], before, "hub unreachable", time.Now())
	parsed := pipeline.ParseDeadLetter("ORDERS_DLQ", &jetstream.RawStreamMsg{Subject: dl.Subject, Sequence: 1, Header: dl.Header, Data: dl.Data})
	replay, err := pipeline.ReplayMessage(parsed)
	if err != nil {
		t.Fatal(err)
	}
	replay.OutOfBand = true
	recreateOrders(e)
	handle(storedMessage(e, e.Publish("orders.created", "new", nil)))
	handle(replay)

	hub, err := e.JS.Stream(ctx, "HUB")
	if err != nil {
		t.Fatal(err)
	}
	last, err := hub.GetLastMsgForSubject(ctx, "edge.edge1.orders.created")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := last.Header.Get(forward.HeaderOriginStreamCreated), before.UTC().Format(time.RFC3339Nano); got != want {
		t.Errorf("replay sent as of the stream created %s, want %s (the incarnation that stored it)", got, want)
	}
	reconnect(t, f, up)
	if n := f.Stats().Untrusted.Load(); n != 0 {
		t.Errorf("%d hub position(s) taken for forged after the replay", n)
	}
}

// TestForwardBacklogInAtomicBatches: a backlog stored while the link was
// down goes to a hub stream that takes atomic batches (allow_atomic, as a
// holdfast hub sets on its streams of edge messages) in batches, each
// message once, in the edge's order; a message too large for the hub's
// stream in the middle of it is dead-lettered, and those around it
// arrive.
func TestForwardBacklogInAtomicBatches(t *testing.T) {
	t.Parallel()
	e, up := forwardEnv(t, jetstream.StreamConfig{Duplicates: time.Minute, AllowAtomicPublish: true, MaxMsgSize: 4096})
	f := pausedForwarding(e, up)
	const n = 1500
	big := 734
	for i := range n {
		body := fmt.Sprint(i)
		if i == big {
			body = strings.Repeat("x", 5000)
		}
		e.Publish([]string{"orders.created", "orders.paid"}[i%2], body, nil)
	}
	up.Store(true)
	start := time.Now()
	waitHubMsgs(e, n-1, 30*time.Second)
	took := time.Since(start)
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if d := e.DLQCount(); d != 1 {
			return fmt.Errorf("%d dead letters, want the one too large", d)
		}
		return nil
	})
	ctx := context.Background()
	hub, err := e.JS.Stream(ctx, "HUB")
	if err != nil {
		t.Fatal(err)
	}
	want := uint64(1)
	for seq := uint64(1); seq <= n-1; seq++ {
		m, err := hub.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		if want == uint64(big+1) {
			want++
		}
		if got := m.Header.Get(forward.HeaderOriginSeq); got != fmt.Sprint(want) {
			t.Fatalf("hub seq %d holds origin seq %s, want %d", seq, got, want)
		}
		want++
	}
	if b := f.Stats().Batches.Load(); b == 0 || b > n/10 {
		t.Errorf("%d atomic batches for %d messages", b, n)
	}
	t.Logf("%d messages in %d atomic batches, on the hub %s after the link came up", n-1, f.Stats().Batches.Load(), took.Round(time.Millisecond))
}

// TestForwardBatchIntoFullStream: a hub stream with room for fewer
// messages than a batch (discard new) refuses the batch whole; the
// messages then go one by one, as many as fit (acked here at once), and
// the rest wait in place until room is made.
func TestForwardBatchIntoFullStream(t *testing.T) {
	t.Parallel()
	hubCfg := jetstream.StreamConfig{Duplicates: time.Minute, AllowAtomicPublish: true, MaxMsgs: 5, Discard: jetstream.DiscardNew}
	e, up := forwardEnv(t, hubCfg)
	pausedForwarding(e, up)
	for i := range 20 {
		e.Publish("orders.created", fmt.Sprint(i), nil)
	}
	up.Store(true)
	waitHubMsgs(e, 5, 10*time.Second)
	// Those the hub stored are acked here while the rest wait.
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if f := e.ConsumerInfo().AckFloor.Stream; f != 5 {
			return fmt.Errorf("ack floor %d, want the 5 stored", f)
		}
		return nil
	})
	hubCfg.Name, hubCfg.Subjects, hubCfg.MaxMsgs = "HUB", []string{"edge.>"}, -1
	if _, err := e.JS.UpdateStream(context.Background(), hubCfg); err != nil {
		t.Fatal(err)
	}
	waitHubMsgs(e, 20, 10*time.Second)
	if d := e.DLQCount(); d != 0 {
		t.Errorf("%d dead letters", d)
	}
}

// pausedForwarding opens a forwarder and its one worker, as the daemon
// runs them (prefetch, pausing while the hub is not ready), with the link
// down: what is published meanwhile is a backlog when up is set.
func pausedForwarding(e *pipelinetest.Env, up *atomic.Bool) *forward.Forwarder {
	e.T.Helper()
	f, err := forwarder(e, up, time.Minute)
	if err != nil {
		e.T.Fatal(err)
	}
	up.Store(false)
	e.WorkersWith(f, 1, func(o *pipeline.ConsumerOptions) {
		o.Paused = func() bool { return !f.Ready() }
		o.Prefetch, o.MaxPrefetch = 256, 999 // the daemon's defaults
	})
	return f
}

// TestForwardHubStoreLost: the hub loses messages it acknowledged (its
// stream deleted and created again, as after a wiped store). Once the
// link is back the edge sends them again from its own stream, in order,
// before anything new; those its stream no longer holds (here purged
// below 4, as its limits would) are counted gone on both sides.
func TestForwardHubStoreLost(t *testing.T) {
	t.Parallel()
	hubCfg := jetstream.StreamConfig{Name: "HUB", Subjects: []string{"edge.>"}, Duplicates: time.Minute}
	e, up := forwardEnv(t, hubCfg)
	f := pausedForwarding(e, up)
	up.Store(true)
	for i := range 10 {
		e.Publish("orders.created", fmt.Sprint(i), nil)
	}
	waitHubMsgs(e, 10, 10*time.Second)
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if fl := e.ConsumerInfo().AckFloor.Stream; fl != 10 {
			return fmt.Errorf("ack floor %d", fl)
		}
		return nil
	})
	ctx := context.Background()
	up.Store(false)
	natstest.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		if f.Ready() {
			return errors.New("ready with the link down")
		}
		return nil
	})
	if err := e.JS.DeleteStream(ctx, "HUB"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.JS.CreateStream(ctx, hubCfg); err != nil {
		t.Fatal(err)
	}
	orders, err := e.JS.Stream(ctx, "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	if err := orders.Purge(ctx, jetstream.WithPurgeSequence(4)); err != nil {
		t.Fatal(err)
	}
	up.Store(true)
	waitHubMsgs(e, 7, 10*time.Second)
	e.Publish("orders.created", "after", nil)
	waitHubMsgs(e, 8, 10*time.Second)
	hub, err := e.JS.Stream(ctx, "HUB")
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= 8; seq++ {
		m, err := hub.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := m.Header.Get(forward.HeaderOriginSeq), fmt.Sprint(seq+3); got != want {
			t.Errorf("hub seq %d holds origin seq %s, want %s", seq, got, want)
		}
		// What the hub needs to see its own loss: the messages sent again
		// marked, and the count lost on both sides on each one after it.
		resent, lost := m.Header.Get(forward.HeaderOriginResent), m.Header.Get(forward.HeaderOriginLost)
		if (seq <= 7) != (resent == "1") || lost != "3" {
			t.Errorf("hub seq %d: %s %q, %s %q; want it marked sent again only up to 7, and 3 lost", seq,
				forward.HeaderOriginResent, resent, forward.HeaderOriginLost, lost)
		}
	}
	if s := f.Stats(); s.Resent.Load() != 7 || s.Gone.Load() != 3 {
		t.Errorf("resent %d, gone %d: want 7 and 3", s.Resent.Load(), s.Gone.Load())
	}
}

// TestForwardHubStoreLostResendOutlastsTimeout: sending again what the
// hub lost takes longer than forward.timeout (here 2,000 messages at
// 200ms). It goes on to the end in one go, Problem saying what it does,
// never that it failed on a deadline, and then forwarding goes on.
func TestForwardHubStoreLostResendOutlastsTimeout(t *testing.T) {
	t.Parallel()
	hubCfg := jetstream.StreamConfig{Name: "HUB", Subjects: []string{"edge.>"}, Duplicates: time.Minute}
	e, up := forwardEnv(t, hubCfg)
	f, err := forwarderWith(e, forward.Options{
		ServerName: "edge1", Stream: "ORDERS", Consumer: config.DefaultConsumerName,
		Subject: config.DefaultForwardSubject, Timeout: 200 * time.Millisecond, MinDuplicateWindow: time.Minute,
		LinkUp: up.Load,
	})
	if err != nil {
		t.Fatal(err)
	}
	e.WorkersWith(f, 1, func(o *pipeline.ConsumerOptions) { o.Paused = func() bool { return !f.Ready() } })
	const n = 2000
	for i := range n {
		e.Publish("orders.created", fmt.Sprint(i), nil)
	}
	waitHubMsgs(e, n, 60*time.Second)
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if fl := e.ConsumerInfo().AckFloor.Stream; fl != n {
			return fmt.Errorf("ack floor %d", fl)
		}
		return nil
	})
	ctx := context.Background()
	up.Store(false)
	if err := e.JS.DeleteStream(ctx, "HUB"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.JS.CreateStream(ctx, hubCfg); err != nil {
		t.Fatal(err)
	}
	up.Store(true)
	deadline := time.Now().Add(60 * time.Second)
	for hubMsgs(e) < n && time.Now().Before(deadline) {
		if p := f.Problem(); strings.Contains(p, "deadline") {
			t.Fatalf("while sending again (%d on the hub): %s", hubMsgs(e), p)
		}
		time.Sleep(5 * time.Millisecond)
	}
	e.Publish("orders.created", "after", nil)
	waitHubMsgs(e, n+1, 10*time.Second)
	if r := f.Stats().Resent.Load(); r != n {
		t.Errorf("%d sent again, want %d", r, n)
	}
}

// storedMessage is the edge's message at seq as a worker hands it to the
// forward handler on its first delivery.
func storedMessage(e *pipelinetest.Env, seq uint64) *handler.Message {
	e.T.Helper()
	orders, err := e.JS.Stream(context.Background(), "ORDERS")
	if err != nil {
		e.T.Fatal(err)
	}
	m, err := orders.GetMsg(context.Background(), seq)
	if err != nil {
		e.T.Fatal(err)
	}
	return &handler.Message{Subject: m.Subject, Stream: "ORDERS", Sequence: seq, Delivery: 1, Data: m.Data, Published: m.Time}
}

// idleForwarding starts a forwarder with the link up and one worker,
// looking at the hub every idleCheck while nothing is forwarded.
func idleForwarding(e *pipelinetest.Env, idleCheck time.Duration) *forward.Forwarder {
	e.T.Helper()
	f, err := forwarderWith(e, forward.Options{
		ServerName: "edge1", Stream: "ORDERS", Consumer: config.DefaultConsumerName,
		Subject: config.DefaultForwardSubject, Timeout: 2 * time.Second, MinDuplicateWindow: time.Minute,
		IdleCheck: idleCheck,
	})
	if err != nil {
		e.T.Fatal(err)
	}
	e.WorkersWith(f, 1, func(o *pipeline.ConsumerOptions) {
		o.Paused = func() bool { return !f.Ready() }
	})
	return f
}

// hubOriginSeqs are the origin sequences the hub's stream holds, in its
// order.
func hubOriginSeqs(e *pipelinetest.Env) []string {
	e.T.Helper()
	ctx := context.Background()
	hub, err := e.JS.Stream(ctx, "HUB")
	if err != nil {
		e.T.Fatal(err)
	}
	var seqs []string
	for seq := uint64(1); seq <= hub.CachedInfo().State.LastSeq; seq++ {
		m, err := hub.GetMsg(ctx, seq)
		if err != nil {
			e.T.Fatal(err)
		}
		seqs = append(seqs, m.Header.Get(forward.HeaderOriginSeq))
	}
	return seqs
}

// forwardTenThenRecreate forwards 10 messages (see idleForwarding), then
// deletes the hub's stream and creates it again, empty.
func forwardTenThenRecreate(t *testing.T, idleCheck time.Duration) (*pipelinetest.Env, *forward.Forwarder) {
	t.Helper()
	cfg := jetstream.StreamConfig{Name: "HUB", Subjects: []string{"edge.>"}, Duplicates: time.Minute}
	e, _ := forwardEnv(t, cfg)
	f := idleForwarding(e, idleCheck)
	for i := range 10 {
		e.Publish("orders.created", fmt.Sprint(i), nil)
	}
	const n = 10
	waitHubMsgs(e, n, 10*time.Second)
	natstest.CheckFor(e.T, 10*time.Second, 20*time.Millisecond, func() error {
		if fl := e.ConsumerInfo().AckFloor.Stream; fl != n {
			return fmt.Errorf("ack floor %d", fl)
		}
		return nil
	})
	ctx := context.Background()
	if err := e.JS.DeleteStream(ctx, "HUB"); err != nil {
		e.T.Fatal(err)
	}
	if _, err := e.JS.CreateStream(ctx, cfg); err != nil {
		e.T.Fatal(err)
	}
	return e, f
}

// TestForwardHubStreamRecreatedWhileIdle: the hub's stream is deleted and
// created anew while the link stays up and the edge has nothing to send.
// No publish fails, so only a look at the hub while idle finds it: the
// edge sends again, in order, what the old stream had acknowledged.
func TestForwardHubStreamRecreatedWhileIdle(t *testing.T) {
	t.Parallel()
	e, f := forwardTenThenRecreate(t, time.Second)
	waitHubMsgs(e, 10, 15*time.Second)
	if got, want := strings.Join(hubOriginSeqs(e), ","), "1,2,3,4,5,6,7,8,9,10"; got != want {
		t.Errorf("the new stream holds origin sequences %s, want %s", got, want)
	}
	if n := f.Stats().Resent.Load(); n != 10 {
		t.Errorf("resent %d, want 10", n)
	}
}

// TestForwardHubStreamWentBackUnderPublish: the hub's stream is created
// anew between two publishes. The next PubAck gives a sequence not above
// the one before: the edge looks at the hub at once (not after its idle
// interval, an hour here) and sends again what the old stream lost, so the
// new stream holds every origin sequence once.
func TestForwardHubStreamWentBackUnderPublish(t *testing.T) {
	t.Parallel()
	e, f := forwardTenThenRecreate(t, time.Hour)
	e.Publish("orders.created", "after", nil)
	waitHubMsgs(e, 11, 15*time.Second)
	seqs := hubOriginSeqs(e)
	if seqs[0] != "11" {
		t.Errorf("the new stream's first message has origin sequence %s, want 11 (the publish after the delete)", seqs[0])
	}
	slices.Sort(seqs)
	if got, want := strings.Join(seqs, ","), "1,10,11,2,3,4,5,6,7,8,9"; got != want {
		t.Errorf("the new stream holds origin sequences %s, want each of 1..11 once", got)
	}
	if n := f.Stats().Resent.Load(); n != 10 {
		t.Errorf("resent %d, want 10", n)
	}
}

// TestForwardLooksUpItsStreamWhenItChanges: the forwarder names the local
// stream's incarnation (its creation time) in each message, and looks it
// up again only when the server says the stream changed, not for every
// message: a JetStream API request per message was a tenth of an edge's
// CPU at a steady 200 msg/s. A stream deleted and created again is still
// seen at once.
func TestForwardLooksUpItsStreamWhenItChanges(t *testing.T) {
	t.Parallel()
	e, up := forwardEnv(t, jetstream.StreamConfig{Duplicates: time.Minute})
	var lookups atomic.Int64
	sub, err := e.Srv.Conn().Subscribe("$JS.API.STREAM.INFO.ORDERS", func(*nats.Msg) { lookups.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	f, err := forwarder(e, up, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	e.WorkersWith(f, 1, func(o *pipeline.ConsumerOptions) { o.Paused = func() bool { return !f.Ready() } })
	// One at a time, each published after the last one was forwarded.
	// The checks of the hub look the stream up too, now and then: what
	// counts is that the messages do not, each.
	const n = 30
	e.Publish("orders.created", "first", nil)
	waitHubMsgs(e, 1, 10*time.Second)
	before := lookups.Load()
	for i := 1; i < n; i++ {
		e.Publish("orders.created", fmt.Sprint("steady ", i), nil)
		waitHubMsgs(e, uint64(i+1), 10*time.Second)
	}
	if got := lookups.Load() - before; got > n/3 {
		t.Errorf("%d lookups of ORDERS while %d messages were forwarded one by one, want none per message", got, n-1)
	}

	recreateOrders(e)
	ctx := context.Background()
	orders, err := e.JS.Stream(ctx, "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	e.Publish("orders.created", "after the recreation", nil)
	waitHubMsgs(e, n+1, 20*time.Second)
	hub, err := e.JS.Stream(ctx, "HUB")
	if err != nil {
		t.Fatal(err)
	}
	last, err := hub.GetMsg(ctx, n+1)
	if err != nil {
		t.Fatal(err)
	}
	want := orders.CachedInfo().Created.UTC().Format(time.RFC3339Nano)
	if got := last.Header.Get(forward.HeaderOriginStreamCreated); got != want {
		t.Errorf("the message after the recreation names the stream created at %s, want %s (the new one)", got, want)
	}
}

// TestForwardForgedHubPositionNotTrusted: a message put on the hub with
// this edge's origin headers by someone else (any client allowed to
// publish on the hub's edge subjects) is not taken as the hub's position:
// taken, it had the edge ack every later message without sending it
// (found 2026-12-04). A claim past the edge's stream, or of a message
// the edge stored at another time, is refused and counted; the messages
// after the real position still reach the hub.
func TestForwardForgedHubPositionNotTrusted(t *testing.T) {
	t.Parallel()
	e, up := forwardEnv(t, jetstream.StreamConfig{Duplicates: time.Minute})
	f, err := forwarder(e, up, 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	handle := func(seq uint64) {
		t.Helper()
		if r := f.Handle(ctx, storedMessage(e, seq)); r.Outcome != handler.Success {
			t.Fatalf("Handle(%d): %+v", seq, r)
		}
	}
	e.Publish("orders.created", "1", nil)
	handle(1)
	hub, err := e.JS.Stream(ctx, "HUB")
	if err != nil {
		t.Fatal(err)
	}
	real, err := hub.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	for i, claim := range []struct{ seq, time string }{
		{"1000000", "2099-01-01T00:00:00Z"},                       // past the edge's stream
		{"2", real.Header.Get(forward.HeaderOriginTime)},          // a message the edge stored at another time
		{"1", time.Now().Add(time.Hour).Format(time.RFC3339Nano)}, // its first message, another time
	} {
		e.Publish("orders.created", fmt.Sprint(i+2), nil)
		forged := nats.NewMsg("edge.edge1.orders.created")
		for _, h := range []string{forward.HeaderOriginServer, forward.HeaderOriginStream, forward.HeaderOriginStreamCreated} {
			forged.Header.Set(h, real.Header.Get(h))
		}
		forged.Header.Set(forward.HeaderOriginSeq, claim.seq)
		forged.Header.Set(forward.HeaderOriginTime, claim.time)
		if _, err := e.JS.PublishMsg(ctx, forged); err != nil {
			t.Fatal(err)
		}
		reconnect(t, f, up)
		handle(uint64(i + 2))
		if s := f.Stats().Skipped.Load(); s != 0 {
			t.Fatalf("claim %d: %d message(s) skipped: the forged position was taken", i, s)
		}
		if n := f.Stats().Untrusted.Load(); n != uint64(i+1) {
			t.Fatalf("claim %d: %d positions not trusted, want %d", i, n, i+1)
		}
	}
	// The edge's 4 messages and the 3 forged ones.
	if n := hubMsgs(e); n != 7 {
		t.Fatalf("hub holds %d, want 7", n)
	}
}

// reconnect takes f's link (up) down and back, and waits until f is
// ready again: the hub checked again, its position read.
func reconnect(t *testing.T, f *forward.Forwarder, up *atomic.Bool) {
	t.Helper()
	up.Store(false)
	if f.Ready() {
		t.Fatal("ready with the link down")
	}
	up.Store(true)
	natstest.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		if !f.Ready() {
			return fmt.Errorf("not ready: %s", f.Problem())
		}
		return nil
	})
}

// TestNewMsgDropsClientOriginHeaders: the origin headers are the edge's
// alone. A local client's Holdfast-Origin-Lost and -Resent went to the
// hub, which reported losses that never happened (found 2026-12-04); its
// other origin headers are replaced, in whatever case they came.
func TestNewMsgDropsClientOriginHeaders(t *testing.T) {
	h := nats.Header{}
	h.Set(forward.HeaderOriginLost, "42")
	h.Set(forward.HeaderOriginResent, "1")
	h["holdfast-origin-seq"] = []string{"1000000"}
	h.Set("X-Kept", "yes")
	m := &handler.Message{Subject: "orders.created", Stream: "ORDERS", Sequence: 7, Delivery: 1,
		Published: time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC), Header: h, Data: []byte("x")}
	out := forward.NewMsg("edge.edge1.orders.created", "edge1", m, time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	for _, k := range []string{forward.HeaderOriginLost, forward.HeaderOriginResent} {
		if v := out.Header.Values(k); len(v) != 0 {
			t.Errorf("%s: %q sent to the hub, from a client", k, v)
		}
	}
	if v := out.Header.Values(forward.HeaderOriginSeq); len(v) != 1 || v[0] != "7" {
		t.Errorf("%s: %q, want [7]", forward.HeaderOriginSeq, v)
	}
	for k := range out.Header {
		if strings.EqualFold(k, forward.HeaderOriginSeq) && k != forward.HeaderOriginSeq {
			t.Errorf("the client's %s went along", k)
		}
	}
	if out.Header.Get("X-Kept") != "yes" {
		t.Error("a client header was dropped")
	}
}

// A forwarded message replayed from its dead letter (holdfast dlq
// replay) goes to the hub as the same message, with the Nats-Msg-Id and
// origin time of its first attempts: the hub may hold it already (stored
// by an attempt whose PubAck was lost), and must take it once. The
// replay carried the dead letter's failure time as the message's stored
// time, so its id was new and the hub stored it twice.
func TestReplayedDeadLetterForwardsAsTheSameMessage(t *testing.T) {
	stored := time.Date(2026, 12, 5, 10, 0, 0, 123456789, time.UTC)
	created := stored.Add(-time.Hour)
	m := &handler.Message{Subject: "orders.created", Stream: "ORDERS", Consumer: "FWD", Sequence: 42, Delivery: 5,
		Header: nats.Header{"X-Order": {"7"}}, Data: []byte("order 7"), Published: stored}
	first := forward.NewMsg("edge.e1.orders.created", "e1", m, created)

	dl := pipeline.NewDeadLetter("FWD", m, created, "hub unreachable", stored.Add(10*time.Minute))
	parsed := pipeline.ParseDeadLetter("FWD_DLQ", &jetstream.RawStreamMsg{Subject: dl.Subject, Sequence: 3, Header: dl.Header, Data: dl.Data})
	replay, err := pipeline.ReplayMessage(parsed)
	if err != nil {
		t.Fatal(err)
	}
	again := forward.NewMsg("edge.e1.orders.created", "e1", replay, created)
	for _, h := range []string{nats.MsgIdHdr, forward.HeaderOriginTime, forward.HeaderOriginSeq} {
		if a, b := first.Header.Get(h), again.Header.Get(h); a != b {
			t.Errorf("%s: first attempt %q, replay %q", h, a, b)
		}
	}
}
