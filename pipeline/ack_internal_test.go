package pipeline

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/internal/natstest"
)

// TestAckBatchSentWhileUnconfirmedIsSentAgain: a batch's plain acks that
// went out while an earlier confirmation was failing (the consumer had
// no leader: the server drops acks) are sent again before the batch's own
// confirmation. That confirmation reaches the leader elected meanwhile,
// which would otherwise take it as covering acks it never got: the
// messages, handled, stay pending and come back after ack_wait (on their
// last delivery as dead letters).
func TestAckBatchSentWhileUnconfirmedIsSentAgain(t *testing.T) {
	t.Parallel()
	var opts []*server.Options
	servers := natstest.RunCluster(t, 3, func(o *server.Options) { opts = append(opts, o) })
	ctx := natstest.Context(t)
	js := natstest.JetStream(t, natstest.Connect(t, servers[0]))
	natstest.CreateStream(t, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.*"}, Replicas: 3})
	natstest.CreateOrUpdateConsumer(t, js, "ORDERS", jetstream.ConsumerConfig{
		Durable: "WORKER1", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute, Replicas: 3})
	for range 3 {
		if _, err := js.Publish(ctx, "orders.created", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	// The client's node stays; the two others (the consumer's leader
	// among them) go, so that no leader can be elected until they are
	// back.
	leader := natstest.ConsumerInfo(t, js, "ORDERS", "WORKER1").Cluster.Leader
	stay := slices.IndexFunc(servers, func(s *server.Server) bool { return s.Name() != leader })
	nc := natstest.Connect(t, servers[stay])
	cjs := natstest.JetStream(t, nc)
	c, err := cjs.Consumer(ctx, "ORDERS", "WORKER1")
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.FetchNoWait(3)
	if err != nil {
		t.Fatal(err)
	}
	var items []ackItem
	for m := range batch.Messages() {
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		items = append(items, ackItem{msg: m, seq: md.Sequence.Stream})
	}
	if len(items) != 3 {
		t.Fatalf("fetched %d of 3 messages", len(items))
	}
	// Every node knows all three were delivered before two of them go.
	natstest.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		for _, s := range servers {
			if n := delivered(t, s); n < 3 {
				return fmt.Errorf("%s knows of %d delivered", s.Name(), n)
			}
		}
		return nil
	})
	for i, s := range servers {
		if i != stay {
			s.Shutdown()
			s.WaitForShutdown()
		}
	}
	w := NewWorkers(cjs, nc, ConsumerOptions{Stream: "ORDERS", Consumer: "WORKER1", AckWait: time.Minute},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	a := newAcker(w, 4)
	defer a.close()
	// The first batch's confirmation fails and is sent again until a
	// leader answers; the second batch's plain ack goes out meanwhile.
	first := make(chan struct{})
	go func() {
		defer close(first)
		a.confirmBatch(a.send(items[:1]))
	}()
	natstest.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		if a.doubts.Load() == 0 {
			return errors.New("the first confirmation has not failed yet")
		}
		return nil
	})
	second := a.send(items[1:])
	for i := range servers {
		if i != stay {
			s, err := server.NewServer(opts[i].Clone())
			if err != nil {
				t.Fatal(err)
			}
			go s.Start()
			t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
		}
	}
	<-first
	a.confirmBatch(second)
	if n := w.stats.Acked.Load(); n != 3 {
		t.Fatalf("%d of 3 acks confirmed", n)
	}
	natstest.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		info, err := c.Info(ctx)
		if err != nil {
			return err
		}
		if info.NumAckPending != 0 {
			return fmt.Errorf("%d ack(s) pending after every ack was confirmed", info.NumAckPending)
		}
		return nil
	})
}

// delivered is the stream sequence s holds as delivered of ORDERS'
// consumer WORKER1, as its monitoring reports it.
func delivered(t *testing.T, s *server.Server) uint64 {
	t.Helper()
	jsz, err := s.Jsz(&server.JSzOptions{Accounts: true, Streams: true, Consumer: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, acc := range jsz.AccountDetails {
		for _, st := range acc.Streams {
			for _, ci := range st.Consumer {
				if st.Name == "ORDERS" && ci.Name == "WORKER1" {
					return ci.Delivered.Stream
				}
			}
		}
	}
	return 0
}
