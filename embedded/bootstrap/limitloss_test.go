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
			cfg := configtest.Default(t)
			s, lb := bootstrapped(t, cfg)
			js := s.JetStream()
			publish(t, js, "orders.created", 20)
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
			for _, want := range []string{"streams.ORDERS." + tc.field, "consumer WORKER1 has not processed", "nats stream edit ORDERS"} {
				if !strings.Contains(lb.String(), want) {
					t.Errorf("log lacks %q:\n%s", want, lb.String())
				}
			}
			// The config-diff watch says the same, and blames no other node.
			diff := Diff(natstest.Context(t), js, cfg)
			if len(diff) != 1 || !strings.Contains(diff[0], "streams.ORDERS."+tc.field+" = ") || !strings.Contains(diff[0], "not applied") {
				t.Errorf("ConfigDiff = %q, want the one kept %s", diff, tc.field)
			}

			// The consumer processes everything: the same config now applies.
			c, err := js.Consumer(natstest.Context(t), "ORDERS", "WORKER1")
			if err != nil {
				t.Fatal(err)
			}
			batch, err := c.Fetch(20, jetstream.FetchMaxWait(5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for m := range batch.Messages() {
				if err := m.DoubleAck(natstest.Context(t)); err != nil {
					t.Fatal(err)
				}
				n++
			}
			if n != 20 {
				t.Fatalf("fetched %d messages, want 20", n)
			}
			if err := Apply(natstest.Context(t), js, cfg, s.base); err != nil {
				t.Fatalf("Bootstrap after the consumer caught up: %v", err)
			}
			if got := tc.got(natstest.StreamInfo(t, js, "ORDERS").Config); got == tc.was {
				t.Errorf("ORDERS %s still %s after the consumer caught up", tc.field, got)
			}
		})
	}
}
