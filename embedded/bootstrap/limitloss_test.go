package bootstrap

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/internal/configtest"
	"github.com/holdfast-io/holdfast/internal/natstest"
)

// backlogged bootstraps the default config and publishes n messages
// that WORKER1 has not processed.
func backlogged(t *testing.T, n int) (*config.Config, *testServer, *natstest.Buffer) {
	t.Helper()
	cfg := configtest.Default(t)
	s, lb := bootstrapped(t, cfg)
	publish(t, s.JetStream(), "orders.created", n)
	return cfg, s, lb
}

// TestBootstrapKeepsLimitsThatWouldDeleteUnprocessed: a config that lowers
// max_msgs, max_bytes or max_age below the backlog of a consumer is not
// applied to that limit (logged with the key and what to do), and the
// messages stay; once the consumer has processed them the same config is
// applied. Before, the update deleted 15 of 20 unprocessed messages at
// once.
func TestBootstrapKeepsLimitsThatWouldDeleteUnprocessed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		field string
		lower func(*config.StreamConfig)
		got   func(jetstream.StreamConfig) string
		was   string
	}{
		{"max_msgs", func(sc *config.StreamConfig) { sc.MaxMsgs = 5 }, func(c jetstream.StreamConfig) string { return fmt.Sprint(c.MaxMsgs) }, "1000000"},
		{"max_bytes", func(sc *config.StreamConfig) { sc.MaxBytes = config.Bytes(200) }, func(c jetstream.StreamConfig) string { return fmt.Sprint(c.MaxBytes) }, "-1"},
		{"max_age", func(sc *config.StreamConfig) {
			sc.MaxAge, sc.DuplicateWindow = config.Dur(200*time.Millisecond), config.Dur(100*time.Millisecond)
		}, func(c jetstream.StreamConfig) string { return c.MaxAge.String() }, "72h0m0s"},
	} {
		t.Run(tc.field, func(t *testing.T) {
			t.Parallel()
			cfg, s, lb := backlogged(t, 20)
			js := s.JetStream()
			time.Sleep(400 * time.Millisecond) // older than the lowered max_age

			tc.lower(cfg.Streams["ORDERS"])
			cfg.Consumers["WORKER1"].MaxDeliver = 7 // applied beside the kept limit
			if err := Apply(natstest.Context(t), js, cfg, s.base); err != nil {
				t.Fatalf("Bootstrap with %s lowered: %v", tc.field, err)
			}
			si := natstest.StreamInfo(t, js, "ORDERS")
			if si.State.Msgs != 20 {
				t.Fatalf("ORDERS holds %d messages after %s was lowered below the unprocessed backlog, want 20", si.State.Msgs, tc.field)
			}
			if got := tc.got(si.Config); got != tc.was {
				t.Errorf("ORDERS %s = %s, want it kept at %s", tc.field, got, tc.was)
			}
			if ci := natstest.ConsumerInfo(t, js, "ORDERS", "WORKER1"); ci.Config.MaxDeliver != 7 {
				t.Errorf("WORKER1 max_deliver = %d, want 7 (applied beside the kept limit)", ci.Config.MaxDeliver)
			}
			wantIn(t, "log", lb.String(), "streams.ORDERS."+tc.field, "consumer WORKER1 has not processed", "nats stream edit ORDERS")
			// The config-diff watch says the same, and blames no other node.
			diff := Diff(natstest.Context(t), js, cfg)
			if len(diff) != 1 || !strings.Contains(diff[0], "streams.ORDERS."+tc.field+" = ") || !strings.Contains(diff[0], "not applied") {
				t.Errorf("ConfigDiff = %q, want the one kept %s", diff, tc.field)
			}

			// The consumer processes everything: the same config now applies.
			processWorker1(t, js, 20)
			if err := Apply(natstest.Context(t), js, cfg, s.base); err != nil {
				t.Fatalf("Bootstrap after the consumer caught up: %v", err)
			}
			if got := tc.got(natstest.StreamInfo(t, js, "ORDERS").Config); got == tc.was {
				t.Errorf("ORDERS %s still %s after the consumer caught up", tc.field, got)
			}
		})
	}
}

// processWorker1 fetches and acknowledges n messages of ORDERS as
// WORKER1.
func processWorker1(t *testing.T, js jetstream.JetStream, n int) {
	t.Helper()
	c, err := js.Consumer(natstest.Context(t), "ORDERS", "WORKER1")
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.Fetch(n, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for m := range batch.Messages() {
		if err := m.DoubleAck(natstest.Context(t)); err != nil {
			t.Fatal(err)
		}
		got++
	}
	if got != n {
		t.Fatalf("fetched %d messages, want %d", got, n)
	}
}

// TestBootstrapKeepsMaxBytesOverLargeUnprocessed: max_bytes lowered on a
// stream whose processed messages are small and whose unprocessed ones
// are large is held back when the server would remove an unprocessed
// one, whatever the stream's average message size says.
func TestBootstrapKeepsMaxBytesOverLargeUnprocessed(t *testing.T) {
	t.Parallel()
	cfg := configtest.Default(t)
	s, lb := bootstrapped(t, cfg)
	js := s.JetStream()
	publish(t, js, "orders.small", 5)
	processWorker1(t, js, 5)
	big := strings.Repeat("x", 1000)
	for i := range 5 {
		if _, err := js.Publish(natstest.Context(t), "orders.big", []byte(big)); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	si := natstest.StreamInfo(t, js, "ORDERS")
	// Room for four of the five large messages: removing the small ones
	// is not enough, the first large one (unprocessed) would go too.
	limit := si.State.Bytes*4/5 - 10
	cfg.Streams["ORDERS"].MaxBytes = config.Bytes(int64(limit))
	if err := Apply(natstest.Context(t), js, cfg, s.base); err != nil {
		t.Fatalf("Bootstrap with max_bytes lowered: %v", err)
	}
	si = natstest.StreamInfo(t, js, "ORDERS")
	if ci := natstest.ConsumerInfo(t, js, "ORDERS", "WORKER1"); ci.NumPending != 5 {
		t.Errorf("WORKER1 has %d messages pending after max_bytes = %d, want its 5 unprocessed (the stream holds %d from sequence %d)",
			ci.NumPending, limit, si.State.Msgs, si.State.FirstSeq)
	}
	if si.Config.MaxBytes != -1 {
		t.Errorf("ORDERS max_bytes = %d, want it kept at -1", si.Config.MaxBytes)
	}
	if !strings.Contains(lb.String(), "streams.ORDERS.max_bytes") {
		t.Errorf("log lacks streams.ORDERS.max_bytes:\n%s", lb.String())
	}

	// Room for exactly the five large ones: applied, the small ones go.
	limit = 5 * (30 + uint64(len("orders.big")) + 1000) // their records in the file store
	cfg.Streams["ORDERS"].MaxBytes = config.Bytes(int64(limit))
	if err := Apply(natstest.Context(t), js, cfg, s.base); err != nil {
		t.Fatalf("Bootstrap with max_bytes = %d: %v", limit, err)
	}
	si = natstest.StreamInfo(t, js, "ORDERS")
	if si.Config.MaxBytes != int64(limit) || si.State.Msgs != 5 || si.State.FirstSeq != 6 {
		t.Errorf("after max_bytes = %d: ORDERS max_bytes %d, %d messages from sequence %d; want it applied and the 5 large from 6",
			limit, si.Config.MaxBytes, si.State.Msgs, si.State.FirstSeq)
	}
}

// TestStoredSizeIsTheServers: storedSize, summed over a stream's
// messages, is the stream's bytes as the server counts them (for
// max_bytes), with and without headers, in file and memory storage.
func TestStoredSizeIsTheServers(t *testing.T) {
	t.Parallel()
	cfg := configtest.Default(t)
	cfg.Streams["MEM"] = config.DefaultStream([]string{"mem.*"})
	cfg.Streams["MEM"].Storage, cfg.Streams["MEM"].AllowMemory = "memory", true
	s, _ := bootstrapped(t, cfg)
	js := s.JetStream()
	for stream, subject := range map[string]string{"ORDERS": "orders.created", "MEM": "mem.x"} {
		publish(t, js, subject, 3)
		for i := range 3 {
			if _, err := js.Publish(natstest.Context(t), subject, []byte("with headers"), jetstream.WithMsgID(fmt.Sprintf("id-%d", i))); err != nil {
				t.Fatal(err)
			}
		}
		si := natstest.StreamInfo(t, js, stream)
		st, err := js.Stream(natstest.Context(t), stream)
		if err != nil {
			t.Fatal(err)
		}
		var sum int64
		for seq := si.State.FirstSeq; seq <= si.State.LastSeq; seq++ {
			m, err := st.GetMsg(natstest.Context(t), seq)
			if err != nil {
				t.Fatal(err)
			}
			sum += storedSize(si.Config.Storage, m)
		}
		if sum != int64(si.State.Bytes) {
			t.Errorf("%s (%s): storedSize sums to %d, the server counts %d bytes", stream, si.Config.Storage, sum, si.State.Bytes)
		}
	}
}

// mixedBacklog bootstraps the default config with ORDERS of retention
// and publishes 3 orders.created and 3 orders.paid that WORKER1 has not
// processed.
func mixedBacklog(t *testing.T, retention string) (*config.Config, *testServer, *natstest.Buffer) {
	t.Helper()
	cfg := configtest.Default(t)
	cfg.Streams["ORDERS"].Retention = retention
	s, lb := bootstrapped(t, cfg)
	publish(t, s.JetStream(), "orders.created", 3)
	publish(t, s.JetStream(), "orders.paid", 3)
	return cfg, s, lb
}

// TestBootstrapKeepsFilterThatWouldDeleteUnprocessed: on an interest or
// workqueue stream, a narrowed filter_subject that leaves messages the
// consumer has not processed to no consumer is not applied (the server
// would delete them at once, or keep them for no one); once it has
// processed them, it is.
func TestBootstrapKeepsFilterThatWouldDeleteUnprocessed(t *testing.T) {
	t.Parallel()
	for _, retention := range []string{"interest", "workqueue"} {
		t.Run(retention, func(t *testing.T) {
			t.Parallel()
			cfg, s, lb := mixedBacklog(t, retention)
			js := s.JetStream()

			cfg.Consumers["WORKER1"].FilterSubject = "orders.created"
			cfg.Consumers["WORKER1"].MaxDeliver = 7 // applied beside the kept filter
			if err := Apply(natstest.Context(t), js, cfg, s.base); err != nil {
				t.Fatalf("Bootstrap with the filter narrowed: %v", err)
			}
			if si := natstest.StreamInfo(t, js, "ORDERS"); si.State.Msgs != 6 {
				t.Errorf("ORDERS holds %d messages after WORKER1's filter was narrowed, want its 6 unprocessed", si.State.Msgs)
			}
			ci := natstest.ConsumerInfo(t, js, "ORDERS", "WORKER1")
			if ci.Config.FilterSubject != "" || ci.Config.MaxDeliver != 7 {
				t.Errorf("WORKER1 filter %q, max_deliver %d; want the filter kept at \"\" and max_deliver 7", ci.Config.FilterSubject, ci.Config.MaxDeliver)
			}
			wantIn(t, "log", lb.String(), "consumers.WORKER1.filter_subject = ", "not applied", "orders.paid", "nats consumer edit ORDERS WORKER1")
			if diff := Diff(natstest.Context(t), js, cfg); len(diff) != 1 || !strings.HasPrefix(diff[0], "consumers.WORKER1.filter_subject = ") {
				t.Errorf("ConfigDiff = %q, want the one kept filter_subject", diff)
			}

			processWorker1(t, js, 6)
			if err := Apply(natstest.Context(t), js, cfg, s.base); err != nil {
				t.Fatalf("Bootstrap after the consumer caught up: %v", err)
			}
			if ci := natstest.ConsumerInfo(t, js, "ORDERS", "WORKER1"); ci.Config.FilterSubject != "orders.created" {
				t.Errorf("WORKER1 filter %q after it caught up, want orders.created", ci.Config.FilterSubject)
			}
		})
	}
}

// TestBootstrapKeepsDiscardOldOverLimit: a stream that holds more than
// its max_msgs or max_bytes (lowered while discard was "new", which the
// server does not enforce then) keeps discard "new" when discard "old"
// would delete at once messages a consumer has not processed.
func TestBootstrapKeepsDiscardOldOverLimit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		field string
		lower func(*config.StreamConfig)
	}{
		{"max_msgs", func(sc *config.StreamConfig) { sc.MaxMsgs = 5 }},
		{"max_bytes", func(sc *config.StreamConfig) { sc.MaxBytes = config.Bytes(200) }},
	} {
		t.Run(tc.field, func(t *testing.T) {
			t.Parallel()
			cfg, s, lb := backlogged(t, 20)
			js := s.JetStream()
			cfg.Streams["ORDERS"].Discard = "new"
			tc.lower(cfg.Streams["ORDERS"])
			if err := Apply(natstest.Context(t), js, cfg, s.base); err != nil {
				t.Fatal(err)
			}
			cfg.Streams["ORDERS"].Discard = "old"
			if err := Apply(natstest.Context(t), js, cfg, s.base); err != nil {
				t.Fatal(err)
			}
			si := natstest.StreamInfo(t, js, "ORDERS")
			if si.State.Msgs != 20 {
				t.Errorf("ORDERS holds %d messages after discard = \"old\" with %s below the backlog, want 20", si.State.Msgs, tc.field)
			}
			if si.Config.Discard != jetstream.DiscardNew {
				t.Errorf("ORDERS discard = %s, want it kept at new", si.Config.Discard)
			}
			if !strings.Contains(lb.String(), "streams.ORDERS.discard") {
				t.Errorf("log lacks streams.ORDERS.discard:\n%s", lb.String())
			}
		})
	}
}

// TestBootstrapSplitsWorkQueueConsumer: a workqueue stream's consumer
// narrowed while a consumer added in the same config takes the rest is
// applied: the new consumer gets the messages the old one leaves.
func TestBootstrapSplitsWorkQueueConsumer(t *testing.T) {
	t.Parallel()
	cfg, s, _ := mixedBacklog(t, "workqueue")
	js := s.JetStream()

	cfg.Consumers["WORKER1"].FilterSubject = "orders.created"
	paid := *cfg.Consumers["WORKER1"]
	paid.FilterSubject = "orders.paid"
	cfg.Consumers["WORKER2"] = &paid
	if err := Apply(natstest.Context(t), js, cfg, s.base); err != nil {
		t.Fatalf("Bootstrap splitting WORKER1: %v", err)
	}
	if ci := natstest.ConsumerInfo(t, js, "ORDERS", "WORKER2"); ci.NumPending != 3 {
		t.Errorf("WORKER2 has %d messages pending, want the 3 orders.paid", ci.NumPending)
	}
}

// TestBootstrapKeepsMaxMsgsOverInteriorDeletes: max_msgs is judged by the
// messages the stream holds, not by its sequence numbers: with processed
// messages deleted in between (nats stream rmm, a workqueue's acks out
// of order), the lowest sequences the server removes reach further than
// first sequence + count. Before, max_msgs = 9 here was applied and
// deleted unprocessed message 11.
func TestBootstrapKeepsMaxMsgsOverInteriorDeletes(t *testing.T) {
	t.Parallel()
	cfg, s, lb := backlogged(t, 20)
	js := s.JetStream()
	processWorker1(t, js, 10)
	st, err := js.Stream(natstest.Context(t), "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(3); seq <= 8; seq++ {
		if err := st.DeleteMsg(natstest.Context(t), seq); err != nil {
			t.Fatal(err)
		}
	}
	// Held: 1, 2, 9 and 10 processed, 11 to 20 not. max_msgs = 9 keeps
	// the newest nine, 12 to 20.
	cfg.Streams["ORDERS"].MaxMsgs = 9
	if err := Apply(natstest.Context(t), js, cfg, s.base); err != nil {
		t.Fatal(err)
	}
	si := natstest.StreamInfo(t, js, "ORDERS")
	if si.State.Msgs != 14 || si.Config.MaxMsgs != 1_000_000 {
		t.Fatalf("ORDERS after max_msgs = 9: %d messages from %d, max_msgs %d; want all 14 kept and max_msgs held back (11 is unprocessed)",
			si.State.Msgs, si.State.FirstSeq, si.Config.MaxMsgs)
	}
	if !strings.Contains(lb.String(), "streams.ORDERS.max_msgs = 9 not applied") || !strings.Contains(lb.String(), "from stream sequence 11") {
		t.Errorf("log does not say max_msgs = 9 was held back for sequence 11:\n%s", lb.String())
	}
	// max_msgs = 10 removes 1, 2, 9 and 10 only: applied.
	cfg.Streams["ORDERS"].MaxMsgs = 10
	if err := Apply(natstest.Context(t), js, cfg, s.base); err != nil {
		t.Fatal(err)
	}
	si = natstest.StreamInfo(t, js, "ORDERS")
	if si.Config.MaxMsgs != 10 || si.State.Msgs != 10 || si.State.FirstSeq != 11 {
		t.Fatalf("ORDERS after max_msgs = 10: %d messages from %d, max_msgs %d; want it applied, 11 to 20 kept",
			si.State.Msgs, si.State.FirstSeq, si.Config.MaxMsgs)
	}
}

// heldFrom counts the messages held from a sequence on; with the deletes
// not listed (too many to ask for) it takes them all as before it, so
// that a max_msgs is held back rather than applied when in doubt.
func TestHeldFrom(t *testing.T) {
	// Held: 1, 2, 9 to 20 (3 to 8 deleted).
	listed := &deletedSeqs{msgs: 14, first: 1, num: 6, seqs: []uint64{3, 4, 5, 6, 7, 8}}
	unlisted := &deletedSeqs{msgs: 14, first: 1, num: 6}
	for _, c := range []struct {
		d        *deletedSeqs
		seq      uint64
		want     uint64
		deletion string
	}{
		{listed, 1, 14, "listed"}, {listed, 2, 13, "listed"}, {listed, 5, 12, "listed"},
		{listed, 9, 12, "listed"}, {listed, 11, 10, "listed"}, {listed, 20, 1, "listed"}, {listed, 21, 0, "listed"},
		{unlisted, 2, 14, "unlisted"}, {unlisted, 5, 14, "unlisted"}, {unlisted, 11, 10, "unlisted"}, {unlisted, 40, 0, "unlisted"},
	} {
		if got := c.d.heldFrom(c.seq); got != c.want {
			t.Errorf("%s deletes: heldFrom(%d) = %d, want %d", c.deletion, c.seq, got, c.want)
		}
	}
}
