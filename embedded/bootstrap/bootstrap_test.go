package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/internal/configtest"
	"github.com/holdfast-io/holdfast/internal/natstest"
)

// bootstrapped runs a server on cfg and bootstraps it.
func bootstrapped(t *testing.T, cfg *config.Config) (*testServer, *natstest.Buffer) {
	t.Helper()
	log, lb := natstest.Logger(t)
	s := runServerWithLog(t, cfg, log)
	if err := Apply(natstest.Context(t), s.JetStream(), cfg, log); err != nil {
		t.Fatalf("Bootstrap: %v", err)
	}
	return s, lb
}

// wantIn fails t for each of wants that text, what the test calls
// what, lacks.
func wantIn(t *testing.T, what, text string, wants ...string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(text, want) {
			t.Errorf("%s lacks %q:\n%s", what, want, text)
		}
	}
}

func publish(t *testing.T, js jetstream.JetStream, subject string, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		if _, err := js.Publish(natstest.Context(t), subject, fmt.Appendf(nil, `{"id":"%d"}`, i)); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
}

// bootstrapChanged reports whether Bootstrap logged that it created or
// updated a stream or consumer.
func bootstrapChanged(logs string) bool {
	for _, m := range []string{`msg="stream created"`, `msg="stream updated"`, `msg="consumer created"`, `msg="consumer updated"`} {
		if strings.Contains(logs, m) {
			return true
		}
	}
	return false
}

// The defaults are exactly the seed's JetStream setup, as the server
// reports it.
func TestBootstrapCreatesSeedStreamAndConsumer(t *testing.T) {
	t.Parallel()
	s, _ := bootstrapped(t, configtest.Default(t))
	js := s.JetStream()

	sc := natstest.StreamInfo(t, js, "ORDERS").Config
	if !slices.Equal(sc.Subjects, []string{"orders.*"}) {
		t.Errorf("ORDERS subjects = %q, want [orders.*]", sc.Subjects)
	}
	if sc.Retention != jetstream.LimitsPolicy {
		t.Errorf("ORDERS retention = %s, want limits", sc.Retention)
	}
	if sc.MaxMsgs != 1_000_000 {
		t.Errorf("ORDERS max_msgs = %d, want 1000000", sc.MaxMsgs)
	}
	if sc.MaxAge != 72*time.Hour {
		t.Errorf("ORDERS max_age = %s, want 72h", sc.MaxAge)
	}
	if sc.Storage != jetstream.FileStorage {
		t.Errorf("ORDERS storage = %s, want file", sc.Storage)
	}
	if sc.Discard != jetstream.DiscardOld {
		t.Errorf("ORDERS discard = %s, want old", sc.Discard)
	}
	if sc.Replicas != 1 {
		t.Errorf("ORDERS replicas = %d, want 1", sc.Replicas)
	}
	if sc.MaxBytes != -1 {
		t.Errorf("ORDERS max_bytes = %d, want -1", sc.MaxBytes)
	}

	cc := natstest.ConsumerInfo(t, js, "ORDERS", "WORKER1").Config
	if cc.Durable != "WORKER1" {
		t.Errorf("WORKER1 durable name = %q, want WORKER1", cc.Durable)
	}
	if cc.AckPolicy != jetstream.AckExplicitPolicy {
		t.Errorf("WORKER1 ack policy = %s, want explicit", cc.AckPolicy)
	}
	if cc.AckWait != 30*time.Second {
		t.Errorf("WORKER1 ack_wait = %s, want 30s", cc.AckWait)
	}
	if cc.MaxDeliver != 5 {
		t.Errorf("WORKER1 max_deliver = %d, want 5", cc.MaxDeliver)
	}
	if cc.DeliverSubject != "" {
		t.Errorf("WORKER1 is a push consumer (deliver subject %q), want pull", cc.DeliverSubject)
	}
	if cc.FilterSubject != "" || len(cc.FilterSubjects) > 0 {
		t.Errorf("WORKER1 filters %q %q, want all of ORDERS", cc.FilterSubject, cc.FilterSubjects)
	}
	if len(cc.BackOff) > 0 {
		t.Errorf("WORKER1 has a server-side backoff %v: it would override ack_wait", cc.BackOff)
	}

	dl := natstest.StreamInfo(t, js, "ORDERS_DLQ").Config
	if !slices.Equal(dl.Subjects, []string{"dlq.WORKER1.>"}) {
		t.Errorf("ORDERS_DLQ subjects = %q, want [dlq.WORKER1.>]", dl.Subjects)
	}
	if dl.Storage != jetstream.FileStorage {
		t.Errorf("ORDERS_DLQ storage = %s, want file", dl.Storage)
	}
	if dl.Retention != jetstream.LimitsPolicy {
		t.Errorf("ORDERS_DLQ retention = %s, want limits", dl.Retention)
	}
}

func TestBootstrapTwiceIsNoOp(t *testing.T) {
	t.Parallel()
	cfg := configtest.Default(t)
	s, lb := bootstrapped(t, cfg)
	js := s.JetStream()
	publish(t, js, "orders.created", 3)

	orders := natstest.StreamInfo(t, js, "ORDERS")
	dlq := natstest.StreamInfo(t, js, "ORDERS_DLQ")
	worker := natstest.ConsumerInfo(t, js, "ORDERS", "WORKER1")

	before := len(lb.String())
	if err := Apply(natstest.Context(t), js, cfg, s.base); err != nil {
		t.Fatalf("second Bootstrap: %v", err)
	}
	second := lb.String()[before:]
	if bootstrapChanged(second) {
		t.Errorf("second Bootstrap created or updated something:\n%s", second)
	}

	for _, c := range []struct {
		name   string
		before *jetstream.StreamInfo
	}{{"ORDERS", orders}, {"ORDERS_DLQ", dlq}} {
		after := natstest.StreamInfo(t, js, c.name)
		if !after.Created.Equal(c.before.Created) {
			t.Errorf("%s created %s, before %s: recreated", c.name, after.Created, c.before.Created)
		}
		if !reflect.DeepEqual(after.Config, c.before.Config) {
			t.Errorf("%s config changed:\nbefore %+v\nafter  %+v", c.name, c.before.Config, after.Config)
		}
	}
	if got := natstest.StreamInfo(t, js, "ORDERS").State.Msgs; got != 3 {
		t.Errorf("ORDERS has %d messages after the second Bootstrap, want 3", got)
	}
	after := natstest.ConsumerInfo(t, js, "ORDERS", "WORKER1")
	if !after.Created.Equal(worker.Created) {
		t.Errorf("WORKER1 created %s, before %s: recreated", after.Created, worker.Created)
	}
	if !reflect.DeepEqual(after.Config, worker.Config) {
		t.Errorf("WORKER1 config changed:\nbefore %+v\nafter  %+v", worker.Config, after.Config)
	}
	if after.NumPending != 3 {
		t.Errorf("WORKER1 pending = %d, want 3 (its position must be kept)", after.NumPending)
	}
}

func TestBootstrapAppliesUpdatableChanges(t *testing.T) {
	t.Parallel()
	cfg := configtest.Default(t)
	s, lb := bootstrapped(t, cfg)
	js := s.JetStream()
	publish(t, js, "orders.created", 5)
	streamCreated := natstest.StreamInfo(t, js, "ORDERS").Created
	consumerCreated := natstest.ConsumerInfo(t, js, "ORDERS", "WORKER1").Created

	cfg.Streams["ORDERS"].MaxAge = config.Dur(24 * time.Hour)
	cfg.Consumers["WORKER1"].MaxDeliver = 7
	before := len(lb.String())
	if err := Apply(natstest.Context(t), js, cfg, s.base); err != nil {
		t.Fatalf("Bootstrap with changed max_age and max_deliver: %v", err)
	}

	si := natstest.StreamInfo(t, js, "ORDERS")
	if si.Config.MaxAge != 24*time.Hour {
		t.Errorf("ORDERS max_age = %s after update, want 24h", si.Config.MaxAge)
	}
	if !si.Created.Equal(streamCreated) {
		t.Error("ORDERS was recreated instead of updated")
	}
	if si.State.Msgs != 5 {
		t.Errorf("ORDERS has %d messages after the update, want 5", si.State.Msgs)
	}
	ci := natstest.ConsumerInfo(t, js, "ORDERS", "WORKER1")
	if ci.Config.MaxDeliver != 7 {
		t.Errorf("WORKER1 max_deliver = %d after update, want 7", ci.Config.MaxDeliver)
	}
	if !ci.Created.Equal(consumerCreated) {
		t.Error("WORKER1 was recreated instead of updated")
	}

	// Each applied field is logged with its old and new value.
	logged := lb.String()[before:]
	for _, want := range []string{
		`msg="stream updated" component=bootstrap stream=ORDERS field=max_age old=72h0m0s new=24h0m0s`,
		`msg="consumer updated" component=bootstrap consumer=WORKER1 field=max_deliver old=5 new=7`,
	} {
		if !strings.Contains(logged, want) {
			t.Errorf("log does not contain %s:\n%s", want, logged)
		}
	}
}

func TestBootstrapRefusesNonUpdatableChanges(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		field  string
		change func(*config.StreamConfig)
	}{
		{"retention", func(sc *config.StreamConfig) { sc.Retention = "workqueue" }},
		{"storage", func(sc *config.StreamConfig) { sc.Storage = "memory"; sc.AllowMemory = true }},
	} {
		t.Run(tc.field, func(t *testing.T) {
			t.Parallel()
			cfg := configtest.Default(t)
			s, _ := bootstrapped(t, cfg)
			js := s.JetStream()
			publish(t, js, "orders.created", 10)
			before := natstest.StreamInfo(t, js, "ORDERS")

			tc.change(cfg.Streams["ORDERS"])
			if err := cfg.Validate(); err != nil {
				t.Fatalf("changed config does not validate: %v", err)
			}
			err := Apply(natstest.Context(t), js, cfg, s.base)
			if err == nil {
				t.Fatalf("Bootstrap applied a %s change", tc.field)
			}
			if !errors.Is(err, ErrDrift) {
				t.Errorf("error does not unwrap to ErrDrift: %v", err)
			}
			var de *DriftError
			if !errors.As(err, &de) {
				t.Fatalf("error is not a *DriftError: %v", err)
			}
			if de.Kind != "stream" || de.Name != "ORDERS" || de.Field != tc.field {
				t.Errorf("drift names %s %s field %s, want stream ORDERS field %s", de.Kind, de.Name, de.Field, tc.field)
			}
			msg := err.Error()
			t.Logf("drift: %s", msg)
			if !strings.Contains(msg, tc.field) || !strings.Contains(msg, "streams.ORDERS."+tc.field) {
				t.Errorf("error does not name the field and its key: %s", msg)
			}

			// Nothing was deleted or changed.
			after := natstest.StreamInfo(t, js, "ORDERS")
			if after.State.Msgs != before.State.Msgs || after.State.Msgs != 10 {
				t.Errorf("ORDERS has %d messages after the refused change, had %d", after.State.Msgs, before.State.Msgs)
			}
			if !after.Created.Equal(before.Created) || !reflect.DeepEqual(after.Config, before.Config) {
				t.Errorf("ORDERS changed after the refused %s change:\nbefore %+v\nafter  %+v", tc.field, before.Config, after.Config)
			}
			natstest.ConsumerInfo(t, js, "ORDERS", "WORKER1")
		})
	}
}

// Data and streams survive a restart of the embedded server, and the
// restarted server's bootstrap changes nothing.
func TestBootstrapAfterRestartKeepsData(t *testing.T) {
	t.Parallel()
	cfg := configtest.Default(t)
	s, _ := bootstrapped(t, cfg)
	publish(t, s.JetStream(), "orders.created", 20)
	created := natstest.StreamInfo(t, s.JetStream(), "ORDERS").Created
	if err := s.Close(t.Context()); err != nil {
		t.Fatal(err)
	}

	s2, lb := bootstrapped(t, cfg)
	si := natstest.StreamInfo(t, s2.JetStream(), "ORDERS")
	if si.State.Msgs != 20 || si.State.LastSeq != 20 {
		t.Errorf("after restart ORDERS has %d messages (last seq %d), want 20", si.State.Msgs, si.State.LastSeq)
	}
	if !si.Created.Equal(created) {
		t.Error("ORDERS was recreated at restart")
	}
	if logs := lb.String(); bootstrapChanged(logs) {
		t.Errorf("bootstrap after restart created or updated something:\n%s", logs)
	}
}

// TestBootstrapMovesDeadLetterStream: changing a consumer's dead_letter to
// another stream used to stop start-up ("subjects overlap with an existing
// stream"). The old stream gives up the consumer's dead-letter subject and
// keeps its dead letters; the new one takes the subject.
func TestBootstrapMovesDeadLetterStream(t *testing.T) {
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprintf("old stream shared=%v", shared), func(t *testing.T) {
			cfg := configtest.Default(t)
			if shared {
				// Another consumer keeps using the old dead-letter stream.
				other := *cfg.Consumers[config.DefaultConsumerName]
				other.Workers = 0
				cfg.Consumers["OTHER"] = &other
			}
			s, _ := bootstrapped(t, cfg)
			js := s.JetStream()
			publish(t, js, "dlq.WORKER1.orders.created", 2)

			cfg.Consumers[config.DefaultConsumerName].DeadLetter = "NEW_DLQ"
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			log, lb := natstest.Logger(t)
			if err := Apply(natstest.Context(t), js, cfg, log); err != nil {
				t.Fatalf("Bootstrap after moving dead_letter: %v", err)
			}
			if !strings.Contains(lb.String(), "dead letters of the consumer moved") {
				t.Fatalf("the move was not logged:\n%s", lb.String())
			}
			old := natstest.StreamInfo(t, js, "ORDERS_DLQ")
			if old.State.Msgs != 2 {
				t.Fatalf("old dead-letter stream has %d messages, want its 2 kept", old.State.Msgs)
			}
			if slices.Contains(old.Config.Subjects, "dlq.WORKER1.>") {
				t.Fatalf("old dead-letter stream still has dlq.WORKER1.>: %v", old.Config.Subjects)
			}
			if shared && !slices.Contains(old.Config.Subjects, "dlq.OTHER.>") {
				t.Fatalf("old dead-letter stream lost the other consumer's subject: %v", old.Config.Subjects)
			}
			publish(t, js, "dlq.WORKER1.orders.created", 1)
			if n := natstest.StreamInfo(t, js, "NEW_DLQ").State.Msgs; n != 1 {
				t.Fatalf("new dead-letter stream has %d messages, want 1", n)
			}
			// And again: nothing left to change.
			log, lb = natstest.Logger(t)
			if err := Apply(natstest.Context(t), js, cfg, log); err != nil {
				t.Fatal(err)
			}
			if bootstrapChanged(lb.String()) || strings.Contains(lb.String(), "moved") {
				t.Fatalf("second bootstrap changed something:\n%s", lb.String())
			}
			// The old stream takes nothing a client may publish: given
			// no subject, the server would give it its own name.
			want := []string{"$HOLDFAST.RETIRED.ORDERS_DLQ"}
			if shared {
				want = []string{"dlq.OTHER.>"}
			}
			if got := natstest.StreamInfo(t, js, "ORDERS_DLQ").Config.Subjects; !slices.Equal(got, want) {
				t.Fatalf("old dead-letter stream's subjects %v, want %v", got, want)
			}
			// And back: the old stream takes the dead letters again.
			cfg.Consumers[config.DefaultConsumerName].DeadLetter = "ORDERS_DLQ"
			if err := Apply(natstest.Context(t), js, cfg, log); err != nil {
				t.Fatalf("Bootstrap after moving dead_letter back: %v", err)
			}
			want = []string{"dlq.WORKER1.>"}
			if shared {
				want = []string{"dlq.OTHER.>", "dlq.WORKER1.>"}
			}
			if got := natstest.StreamInfo(t, js, "ORDERS_DLQ").Config.Subjects; !slices.Equal(got, want) {
				t.Fatalf("dead-letter stream moved back takes %v, want %v", got, want)
			}
		})
	}
}

// TestBootstrapWarnsOfUnconfiguredConsumers: a durable consumer on an
// interest stream that the config no longer names (removed from the file)
// keeps every message it has not acknowledged; holdfast leaves it, and
// nothing said so (status lists configured consumers only).
func TestBootstrapWarnsOfUnconfiguredConsumers(t *testing.T) {
	t.Parallel()
	cfg := configtest.Default(t)
	cfg.Streams["ORDERS"].Retention = "interest"
	s, lb := bootstrapped(t, cfg)
	js := s.JetStream()
	if _, err := js.CreateOrUpdateConsumer(natstest.Context(t), "ORDERS", jetstream.ConsumerConfig{Durable: "OLD", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	publish(t, js, "orders.created", 3)
	if err := Apply(natstest.Context(t), js, cfg, s.base); err != nil {
		t.Fatal(err)
	}
	if log := lb.String(); !strings.Contains(log, "consumer not in the config") || !strings.Contains(log, "consumer=OLD") || !strings.Contains(log, "pending=3") || strings.Contains(log, "consumer=WORKER1 retention") {
		t.Fatalf("log:\n%s", log)
	}
}

// lateOnce is a JetStream client whose first CreateConsumer is carried out
// by the server but answered after the client gave up, as a server busy
// with a slow disk does.
type lateOnce struct {
	jetstream.JetStream
	calls int
}

func (j *lateOnce) CreateConsumer(ctx context.Context, stream string, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	j.calls++
	c, err := j.JetStream.CreateConsumer(ctx, stream, cfg)
	if j.calls == 1 && err == nil {
		return nil, fmt.Errorf("consumer %s on stream %s: %w", cfg.Durable, stream, context.DeadlineExceeded)
	}
	return c, err
}

// TestBootstrapRetriesTimeoutOnOneNode: on a single node too, a request the
// server answered too late is tried again (the consumer it created is
// then found and checked), instead of failing the start; a refusal still
// fails at once.
func TestBootstrapRetriesTimeoutOnOneNode(t *testing.T) {
	t.Parallel()
	cfg := configtest.Default(t)
	log, lb := natstest.Logger(t)
	s := runServerWithLog(t, cfg, log)
	js := &lateOnce{JetStream: s.JetStream()}
	if err := Apply(natstest.Context(t), js, cfg, log); err != nil {
		t.Fatalf("Bootstrap after one late answer: %v", err)
	}
	if !strings.Contains(lb.String(), "bootstrap tries again") {
		t.Errorf("no retry logged:\n%s", lb.String())
	}
	natstest.ConsumerInfo(t, s.JetStream(), "ORDERS", "WORKER1")

}

// TestBootstrapDriftChangesNothing: a difference the server cannot apply
// on one stream stops the bootstrap before anything else changes, and
// every such difference is named at once. The streams sorted before the
// drifting one used to be updated first, and a reload then said "not
// changed" while keeping the old config as the running one.
func TestBootstrapDriftChangesNothing(t *testing.T) {
	t.Parallel()
	cfg := configtest.Default(t)
	cfg.Streams["ZZZ"] = config.DefaultStream([]string{"zzz.*"})
	cfg.Streams["ZZZ"].MaxBytes = config.Bytes(1 << 20)
	cfg.Streams["ORDERS"].MaxBytes = config.Bytes(1 << 20)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s, _ := bootstrapped(t, cfg)
	js := s.JetStream()
	before := natstest.StreamInfo(t, js, "ORDERS").Config

	cfg.Streams["ORDERS"].MaxAge = config.Dur(24 * time.Hour)
	cfg.Streams["ZZZ"].Retention = "workqueue"
	// A server-side backoff set by a client is drift too.
	natstest.EditConsumer(t, js, "ORDERS", "WORKER1", func(c *jetstream.ConsumerConfig) { c.BackOff = []time.Duration{time.Second} })
	if err := cfg.Validate(); err != nil {
		t.Fatalf("changed config does not validate: %v", err)
	}
	err := Apply(natstest.Context(t), js, cfg, s.base)
	if !errors.Is(err, ErrDrift) {
		t.Fatalf("Bootstrap = %v, want ErrDrift", err)
	}
	wantIn(t, "error", err.Error(), "streams.ZZZ.retention", "consumers.WORKER1", "backoff")
	if after := natstest.StreamInfo(t, js, "ORDERS").Config; !reflect.DeepEqual(after, before) {
		t.Errorf("ORDERS changed although the bootstrap was refused:\nbefore %+v\nafter  %+v", before, after)
	}
}

// TestBootstrapOverlapNamesTheOtherStream: a stream renamed in the config
// (ORDERS -> SALES, same subjects) cannot be created beside the old one,
// which holdfast never deletes; the error names the key, the old stream
// with its messages, and what to do. The server's error named neither
// ("subjects overlap with an existing stream").
func TestBootstrapOverlapNamesTheOtherStream(t *testing.T) {
	t.Parallel()
	cfg := configtest.Default(t)
	s, _ := bootstrapped(t, cfg)
	js := s.JetStream()
	publish(t, js, "orders.created", 3)

	cfg.Streams = map[string]*config.StreamConfig{"SALES": cfg.Streams["ORDERS"]}
	cfg.Consumers["WORKER1"].Stream, cfg.Consumers["WORKER1"].DeadLetter = "SALES", "SALES_DLQ"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	err := Apply(natstest.Context(t), js, cfg, s.base)
	if err == nil {
		t.Fatal("Bootstrap created SALES beside ORDERS on the same subjects")
	}
	wantIn(t, "error", err.Error(), "streams.SALES.subjects = [orders.*]", "overlap stream ORDERS", "3 messages", "nats stream rm")
	if si := natstest.StreamInfo(t, js, "ORDERS"); si.State.Msgs != 3 {
		t.Errorf("ORDERS holds %d messages, want 3", si.State.Msgs)
	}
}

// TestBootstrapWorkQueueNamesTheOtherConsumer: a consumer renamed in the
// config (WORKER1 -> WORKER2) on a workqueue stream cannot be created
// beside the old one, which holdfast never deletes and which holds the
// stream's messages; the error names the key, the old consumer with its
// messages, and what to do.
func TestBootstrapWorkQueueNamesTheOtherConsumer(t *testing.T) {
	t.Parallel()
	for _, filter := range []string{"", "orders.created"} {
		t.Run("filter="+filter, func(t *testing.T) {
			t.Parallel()
			cfg := configtest.Default(t)
			cfg.Streams["ORDERS"].Retention = "workqueue"
			cfg.Consumers["WORKER1"].FilterSubject = filter
			s, _ := bootstrapped(t, cfg)
			js := s.JetStream()
			publish(t, js, "orders.created", 3)

			cfg.Consumers = map[string]*config.ConsumerConfig{"WORKER2": cfg.Consumers["WORKER1"]}
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			err := Apply(natstest.Context(t), js, cfg, s.base)
			if err == nil {
				t.Fatal("Bootstrap created WORKER2 beside WORKER1 on a workqueue stream")
			}
			wantIn(t, "error", err.Error(), "[consumers.WORKER2]", "consumer WORKER1", "3 messages", "nats consumer rm ORDERS WORKER1")
		})
	}
}

// TestBootstrapDeadLetterDriftNamesDeadLetterKey: a consumer's
// dead_letter set to a stream outside the config that holdfast cannot
// make a dead-letter stream (a client's workqueue stream) is refused
// naming consumers.NAME.dead_letter, without telling to delete a stream
// that is not holdfast's.
func TestBootstrapDeadLetterDriftNamesDeadLetterKey(t *testing.T) {
	t.Parallel()
	cfg := configtest.Default(t)
	s, _ := bootstrapped(t, cfg)
	js := s.JetStream()
	if _, err := js.CreateStream(natstest.Context(t), jetstream.StreamConfig{Name: "ARCHIVE", Subjects: []string{"archive.*"}, Retention: jetstream.WorkQueuePolicy}); err != nil {
		t.Fatal(err)
	}
	cfg.Consumers["WORKER1"].DeadLetter = "ARCHIVE"
	err := Apply(natstest.Context(t), js, cfg, s.base)
	if err == nil {
		t.Fatal("Bootstrap made the workqueue stream ARCHIVE a dead-letter stream")
	}
	if !strings.Contains(err.Error(), "consumers.WORKER1.dead_letter") || strings.Contains(err.Error(), "streams.ARCHIVE") || strings.Contains(err.Error(), "delete it") {
		t.Errorf("error does not name consumers.WORKER1.dead_letter, or names streams.ARCHIVE or tells to delete it: %v", err)
	}
	if lines := Drift(natstest.Context(t), js, cfg); len(lines) != 1 || !strings.Contains(lines[0], "consumers.WORKER1.dead_letter") {
		t.Errorf("Drift = %q, want the one naming consumers.WORKER1.dead_letter", lines)
	}
}

// TestBootstrapHubStreamAllowsDirectGets: on a hub, a stream of the edges'
// messages gets allow_direct, also one an older holdfast created without
// it: an edge reads the last message it forwarded there at each reconnect,
// and the API's get answers it base64-encoded, larger than the edge's
// max_payload lets over the leafnode for a message near that size. A
// stream of the operator's keeps the allow_direct set on it.
func TestBootstrapHubStreamAllowsDirectGets(t *testing.T) {
	t.Parallel()
	cfg := configtest.Default(t)
	cfg.Streams["EDGE"] = config.DefaultStream([]string{"edge.>"})
	s, lb := bootstrapped(t, cfg) // not a hub yet: no allow_direct
	js := s.JetStream()
	ctx := natstest.Context(t)
	orders := natstest.StreamInfo(t, js, "ORDERS").Config
	orders.AllowDirect = true
	if _, err := js.UpdateStream(ctx, orders); err != nil {
		t.Fatal(err)
	}
	if natstest.StreamInfo(t, js, "EDGE").Config.AllowDirect {
		t.Fatal("EDGE allows direct gets before it is a hub's")
	}
	cfg.LeafNodes.Listen = "127.0.0.1:7422"
	before := len(lb.String())
	if err := Apply(ctx, js, cfg, s.base); err != nil {
		t.Fatal(err)
	}
	if !natstest.StreamInfo(t, js, "EDGE").Config.AllowDirect {
		t.Error("the hub's EDGE does not allow direct gets")
	}
	if !natstest.StreamInfo(t, js, "ORDERS").Config.AllowDirect {
		t.Error("ORDERS lost the allow_direct its operator set")
	}
	wantIn(t, "bootstrap's log", lb.String()[before:], `msg="stream updated" component=bootstrap stream=EDGE field=allow_direct old=false new=true`)
}

// TestBootstrapRefusesImpliedHandlerSwitch: a consumer that ran with
// the exec handler, whose table a file no longer has, would take the
// built-in default log handler, which acknowledges its waiting messages
// unseen by the exec command: refused, start and reload alike, naming the
// table to write back. A table that says handler = "log" applies.
func TestBootstrapRefusesImpliedHandlerSwitch(t *testing.T) {
	t.Parallel()
	cfg := configtest.Default(t)
	cc := cfg.Consumers["WORKER1"]
	cc.Handler, cc.Exec.Command = "exec", []string{"/bin/true"}
	s, lb := bootstrapped(t, cfg)
	js := s.JetStream()
	ctx := natstest.Context(t)
	if got := natstest.ConsumerInfo(t, js, "ORDERS", "WORKER1").Config.Metadata[HandlerMetadata]; got != "exec" {
		t.Fatalf("consumer metadata %s = %q, want exec", HandlerMetadata, got)
	}

	parse := func(text string) *config.Config {
		t.Helper()
		next, err := config.Parse(strings.NewReader(text), "holdfast.toml")
		if err != nil {
			t.Fatal(err)
		}
		next.Server.Port, next.JetStream.StoreDir = cfg.Server.Port, cfg.JetStream.StoreDir
		return next
	}
	implied := parse("[streams.ORDERS]\nsubjects = [\"orders.*\"]\n")
	err := Apply(ctx, js, implied, s.base)
	var ie *ImpliedHandlerError
	if !errors.As(err, &ie) || !errors.Is(err, ErrDrift) {
		t.Fatalf("Apply without the consumer's table: %v, want an ImpliedHandlerError", err)
	}
	wantIn(t, "the error", err.Error(), `no table for consumer WORKER1, which ran with handler "exec"`, `[consumers.WORKER1] table`, `workers = 0`)
	if got := natstest.ConsumerInfo(t, js, "ORDERS", "WORKER1").Config.Metadata[HandlerMetadata]; got != "exec" {
		t.Errorf("after the refusal the consumer says handler %q, want exec", got)
	}

	before := len(lb.String())
	explicit := parse("[streams.ORDERS]\nsubjects = [\"orders.*\"]\n[consumers.WORKER1]\nstream = \"ORDERS\"\nhandler = \"log\"\n")
	if err := Apply(ctx, js, explicit, s.base); err != nil {
		t.Fatalf("Apply with handler = \"log\" in the table: %v", err)
	}
	wantIn(t, "bootstrap's log", lb.String()[before:], `msg="consumer updated" component=bootstrap consumer=WORKER1 field="metadata holdfast.handler" old=exec new=log`)
	if err := Apply(ctx, js, implied, s.base); err != nil {
		t.Fatalf("Apply without the table, the consumer on the log handler already: %v", err)
	}
}
