package monitor_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/embedded"
	"github.com/holdfast-io/holdfast/embedded/bootstrap"
	"github.com/holdfast-io/holdfast/internal/natstest"
	"github.com/holdfast-io/holdfast/pipeline"
	"github.com/holdfast-io/holdfast/pipeline/handler"
	"github.com/holdfast-io/holdfast/pipeline/monitor"
)

// monitorEnv is an embedded server on t.TempDir() with the streams and
// consumers of cfg bootstrapped, and a log that tests can read.
type monitorEnv struct {
	t   *testing.T
	cfg *config.Config
	srv *embedded.Server
	js  jetstream.JetStream
	log *natstest.Buffer
}

// newMonitorEnv starts a server with the stream ORDERS (orders.*) and the
// consumer WORKER1 as tweaked by tweak.
func newMonitorEnv(t *testing.T, tweak func(*config.Config)) *monitorEnv {
	t.Helper()
	cfg := config.DefaultConfig()
	cfg.Server.Port = -1
	cfg.HTTP.Listen = ""
	cfg.JetStream.StoreDir = t.TempDir()
	cc := cfg.Consumers[config.DefaultConsumerName]
	cc.Workers = 0
	cc.Backoff = []config.Duration{config.Dur(50 * time.Millisecond)}
	if tweak != nil {
		tweak(cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	buf := &natstest.Buffer{}
	log := slog.New(slog.NewTextHandler(buf, nil))
	srv := embedded.New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := srv.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close(context.Background()) })
	if err := bootstrap.Apply(context.Background(), srv.JetStream(), cfg, log); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log:\n%s", buf.String())
		}
	})
	return &monitorEnv{t: t, cfg: cfg, srv: srv, js: srv.JetStream(), log: buf}
}

// monitor starts a Monitor on every configured consumer, with workers
// where given.
func (e *monitorEnv) monitor(opts monitor.Options, workers map[string]*pipeline.Workers) *monitor.Monitor {
	e.t.Helper()
	return e.monitorWith(opts, workers, nil)
}

// monitorWith is monitor with handler timeouts by consumer.
func (e *monitorEnv) monitorWith(opts monitor.Options, workers map[string]*pipeline.Workers, timeouts map[string]time.Duration) *monitor.Monitor {
	e.t.Helper()
	opts.Streams = e.cfg.StreamNames()
	for _, name := range e.cfg.ConsumerNames() {
		cc := e.cfg.Consumers[name]
		opts.Consumers = append(opts.Consumers, monitor.Consumer{
			Stream: cc.Stream, Consumer: name, WantWorkers: cc.Workers, Workers: workers[name], DeadLetter: cc.DeadLetter,
			HandlerTimeout: timeouts[name],
		})
	}
	if opts.Interval == 0 {
		opts.Interval = 20 * time.Millisecond
	}
	m := monitor.New(e.js, e.srv.Conn(), opts, slog.New(slog.NewTextHandler(e.log, nil)))
	if err := m.Open(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { m.Close(context.Background()) })
	return m
}

func (e *monitorEnv) publish(subject string, n int) {
	e.t.Helper()
	for i := 0; i < n; i++ {
		if _, err := e.js.Publish(context.Background(), subject, []byte(fmt.Sprintf("%s-%d", subject, i))); err != nil {
			e.t.Fatalf("publish %d to %s: %v", i, subject, err)
		}
	}
}

func consumerStatus(t *testing.T, r *monitor.Report, name string) monitor.ConsumerStatus {
	t.Helper()
	for _, c := range r.Consumers {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no consumer %s in the report", name)
	return monitor.ConsumerStatus{}
}

// waitLost waits until the consumer's loss count is want, and checks that
// it stays there for a few more checks.
func waitLost(t *testing.T, m *monitor.Monitor, consumer string, want uint64) monitor.ConsumerStatus {
	t.Helper()
	var cs monitor.ConsumerStatus
	natstest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		cs = consumerStatus(t, m.CheckNow(context.Background()), consumer)
		if cs.LostToRetention != want {
			return fmt.Errorf("lost to retention = %d, want %d", cs.LostToRetention, want)
		}
		return nil
	})
	for i := 0; i < 5; i++ {
		time.Sleep(25 * time.Millisecond)
		if cs = consumerStatus(t, m.CheckNow(context.Background()), consumer); cs.LostToRetention != want {
			t.Fatalf("lost to retention moved on to %d, want it to stay %d", cs.LostToRetention, want)
		}
	}
	return cs
}

func TestMonitorCountsRetentionLossExactly(t *testing.T) {
	e := newMonitorEnv(t, func(cfg *config.Config) {
		cfg.Streams["ORDERS"].MaxMsgs = 10
		cfg.Consumers["WORKER1"].MaxAckPending = 5
	})
	m := e.monitor(monitor.Options{FailOnLoss: true}, nil)
	if h := m.Health(); h.Status != monitor.HealthOK || h.HTTPStatus() != http.StatusOK {
		t.Fatalf("health before any message = %+v, want ok", h)
	}

	// Nothing consumes: 25 messages into a stream that keeps 10.
	e.publish("orders.created", 25)
	cs := waitLost(t, m, "WORKER1", 15)
	if cs.LastLoss == nil || cs.LastLoss.LastSeq != 15 || cs.LastLoss.Cause != "max_msgs" {
		t.Errorf("last loss = %+v, want up to seq 15 caused by max_msgs", cs.LastLoss)
	}
	h := m.Health()
	if h.Status != monitor.HealthDegraded || h.HTTPStatus() != http.StatusServiceUnavailable {
		t.Errorf("health after a loss = %s (%d), want degraded with 503 (fail_on_loss)", h.Status, h.HTTPStatus())
	}
	if h.LostToRetention["ORDERS/WORKER1"] != 15 || !strings.Contains(h.Reason, "lost 15 message(s)") {
		t.Errorf("health does not report 15 lost: %+v", h)
	}
	if !strings.Contains(e.log.String(), "consumer=WORKER1") || !strings.Contains(e.log.String(), "lost_total=15") {
		t.Errorf("no log line with the loss:\n%s", e.log.String())
	}
	if len(cs.Warnings) == 0 || cs.BacklogRatio["max_msgs"] != 1 {
		t.Errorf("no max_msgs warning with the backlog at the limit: %+v", cs)
	}

	// Delivered and unacknowledged messages are lost too (the server's
	// advisory), acknowledged ones are not: fetch 16, 17, 18 and ack 17.
	c, err := e.js.Consumer(context.Background(), "ORDERS", "WORKER1")
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.Fetch(3, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var got []jetstream.Msg
	for msg := range batch.Messages() {
		got = append(got, msg)
	}
	if len(got) != 3 {
		t.Fatalf("fetched %d messages, want 3", len(got))
	}
	if err := got[1].DoubleAck(context.Background()); err != nil {
		t.Fatal(err)
	}
	m.CheckNow(context.Background())
	// 12 more remove 16..27: 16 and 18 were pending, 19..27 not delivered.
	e.publish("orders.created", 12)
	waitLost(t, m, "WORKER1", 15+2+9)

	// The consumer catches up: no further loss.
	batch, err = c.Fetch(10, jetstream.FetchMaxWait(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for msg := range batch.Messages() {
		if err := msg.DoubleAck(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	e.publish("orders.created", 5)
	waitLost(t, m, "WORKER1", 26)

	// Without fail_on_loss a loss is degraded with 200. The consumer is
	// at seq 38 of 33..42: 20 more remove 33..52, of which 38..52 unread.
	m2 := e.monitor(monitor.Options{}, nil)
	e.publish("orders.created", 20)
	waitLost(t, m2, "WORKER1", 15)
	if h := m2.Health(); h.Status != monitor.HealthDegraded || h.HTTPStatus() != http.StatusOK {
		t.Errorf("health without fail_on_loss = %s (%d), want degraded with 200", h.Status, h.HTTPStatus())
	}
}

// A consumer that reads part of its stream loses only its own messages.
func TestMonitorCountsFilteredConsumerLoss(t *testing.T) {
	t.Parallel()
	e := newMonitorEnv(t, func(cfg *config.Config) {
		cfg.Streams["ORDERS"].MaxMsgs = 10
		cfg.Consumers["WORKER1"].FilterSubject = "orders.eu"
	})
	m := e.monitor(monitor.Options{Interval: time.Hour}, nil)
	// 15 eu and 15 us, interleaved, with a check between publishes (as
	// when the publish rate is below max_msgs per check interval): 20
	// removed, 10 of them eu.
	for i := 0; i < 15; i++ {
		e.publish("orders.eu", 1)
		m.CheckNow(context.Background())
		e.publish("orders.us", 1)
		m.CheckNow(context.Background())
	}
	waitLost(t, m, "WORKER1", 10)
	// Stream: eu,us x5 (21..30). 2 eu then 4 us remove 21..26: eu 21, 23, 25.
	e.publish("orders.eu", 2)
	m.CheckNow(context.Background())
	e.publish("orders.us", 4)
	waitLost(t, m, "WORKER1", 10+3)

	// A consumer that has read everything of its filter loses nothing
	// when other subjects fill the stream.
	c, err := e.js.Consumer(context.Background(), "ORDERS", "WORKER1")
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.Fetch(20, jetstream.FetchMaxWait(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for msg := range batch.Messages() {
		n++
		if err := msg.DoubleAck(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if n != 4 {
		t.Fatalf("fetched %d eu messages, want 4 (27, 29, 31, 32)", n)
	}
	for i := 0; i < 30; i++ {
		e.publish("orders.us", 1)
		m.CheckNow(context.Background())
	}
	waitLost(t, m, "WORKER1", 13)
}

func TestMonitorDiscardNewRefusesInsteadOfLosing(t *testing.T) {
	e := newMonitorEnv(t, func(cfg *config.Config) {
		cfg.Streams["ORDERS"].MaxMsgs = 10
		cfg.Streams["ORDERS"].Discard = "new"
	})
	m := e.monitor(monitor.Options{FailOnLoss: true}, nil)
	e.publish("orders.created", 10)
	refused := 0
	for i := 0; i < 5; i++ {
		if _, err := e.js.Publish(context.Background(), "orders.created", []byte("over")); err != nil {
			refused++
		}
	}
	if refused != 5 {
		t.Fatalf("%d of 5 publishes over max_msgs refused, want all", refused)
	}
	cs := waitLost(t, m, "WORKER1", 0)
	if h := m.Health(); h.Status != monitor.HealthOK {
		t.Errorf("health with a full discard=new stream = %+v, want ok", h)
	}
	if len(cs.Warnings) == 0 || !strings.Contains(cs.Warnings[0], "refused") {
		t.Errorf("no warning that publishes will be refused: %+v", cs.Warnings)
	}
}

func TestMonitorHealthMissingConsumerAndStream(t *testing.T) {
	e := newMonitorEnv(t, nil)
	m := e.monitor(monitor.Options{}, nil)
	if h := m.Health(); h.Status != monitor.HealthOK {
		t.Fatalf("health = %+v, want ok", h)
	}
	if err := e.js.DeleteConsumer(context.Background(), "ORDERS", "WORKER1"); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		h := m.Health()
		if h.HTTPStatus() != http.StatusServiceUnavailable || !strings.Contains(h.Reason, "consumer WORKER1 on stream ORDERS: consumer does not exist") {
			return fmt.Errorf("health = %+v", h)
		}
		return nil
	})
	if err := e.js.DeleteStream(context.Background(), "ORDERS_DLQ"); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		h := m.Health()
		if !strings.Contains(strings.Join(h.Problems, "\n"), "stream ORDERS_DLQ: stream does not exist") {
			return fmt.Errorf("health = %+v", h)
		}
		return nil
	})
}

func TestMonitorHealthServerCheck(t *testing.T) {
	e := newMonitorEnv(t, nil)
	var fail sync.Mutex
	failing := false
	m := e.monitor(monitor.Options{Check: func() error {
		fail.Lock()
		defer fail.Unlock()
		if failing {
			return errors.New("JetStream is disabled")
		}
		return nil
	}}, nil)
	fail.Lock()
	failing = true
	fail.Unlock()
	natstest.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if h := m.Health(); h.Reason != "JetStream is disabled" {
			return fmt.Errorf("health = %+v", h)
		}
		return nil
	})
}

// Workers whose handler hangs stall the consumer; health recovers when
// it returns.
func TestMonitorDetectsStalledWorkers(t *testing.T) {
	e := newMonitorEnv(t, func(cfg *config.Config) {
		cc := cfg.Consumers["WORKER1"]
		cc.Workers = 2
		cc.MaxAckPending = 2
	})
	release := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	h := handler.Func(func(ctx context.Context, msg *handler.Message) handler.Result {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return handler.Ok()
	})
	w := e.startWorkers(h, 2)
	m := e.monitor(monitor.Options{StallTimeout: 300 * time.Millisecond}, map[string]*pipeline.Workers{"WORKER1": w})
	e.publish("orders.created", 5)
	natstest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		hl := m.Health()
		if hl.HTTPStatus() != http.StatusServiceUnavailable || !strings.Contains(hl.Reason, "consumer WORKER1 on stream ORDERS is stalled") {
			return fmt.Errorf("health = %+v", hl)
		}
		return nil
	})
	if cs := consumerStatus(t, m.Report(), "WORKER1"); !cs.Stalled || cs.AckPending != 2 {
		t.Errorf("consumer status = %+v, want stalled with 2 awaiting ack", cs)
	}
	once.Do(func() { close(release) })
	natstest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if hl := m.Health(); hl.Status != monitor.HealthOK {
			return fmt.Errorf("health = %+v", hl)
		}
		return nil
	})
}

func (e *monitorEnv) startWorkers(h handler.Handler, n int) *pipeline.Workers {
	e.t.Helper()
	cc := e.cfg.Consumers["WORKER1"]
	return e.startWorkersWith(pipeline.ConsumerOptions{
		Stream: "ORDERS", Consumer: "WORKER1", Workers: n, AckWait: cc.AckWait.Duration,
		MaxDeliver: cc.MaxDeliver, Backoff: []time.Duration{50 * time.Millisecond}, DeadLetter: cc.DeadLetter, Handler: h,
	})
}

func (e *monitorEnv) startWorkersWith(opts pipeline.ConsumerOptions) *pipeline.Workers {
	e.t.Helper()
	w := pipeline.NewWorkers(e.js, e.srv.Conn(), opts, slog.New(slog.NewTextHandler(io.Discard, nil)))
	w.ShutdownTimeout = 2 * time.Second
	if err := w.Open(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { w.Close(context.Background()) })
	return w
}

// scrape reads the metrics with the Prometheus text parser.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	families, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("metrics do not parse: %v", err)
	}
	return families
}

// sample returns the sum of the values of the metric's series with the
// given labels, and whether there is one. Histograms give their sample
// count.
func sample(families map[string]*dto.MetricFamily, name string, labels map[string]string) (float64, bool) {
	f := families[name]
	if f == nil {
		return 0, false
	}
	var sum float64
	found := false
next:
	for _, m := range f.GetMetric() {
		for k, v := range labels {
			found := false
			for _, lp := range m.GetLabel() {
				if lp.GetName() == k && lp.GetValue() == v {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		found = true
		switch {
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		case m.Histogram != nil:
			sum += float64(m.Histogram.GetSampleCount())
		}
	}
	return sum, found
}

// The metrics move as messages are processed, retried and dead-lettered.
func TestMetricsCountProcessing(t *testing.T) {
	e := newMonitorEnv(t, func(cfg *config.Config) {
		cc := cfg.Consumers["WORKER1"]
		cc.Workers = 2
		cc.MaxDeliver = 3
	})
	metrics := monitor.NewMetrics("test", "2.15.2")
	// "fail" always fails (retried, then dead-lettered on delivery 3),
	// "bad" fails permanently, anything else succeeds.
	h := handler.Func(func(ctx context.Context, msg *handler.Message) handler.Result {
		switch msg.Subject {
		case "orders.fail":
			return handler.RetryLater("always failing")
		case "orders.bad":
			return handler.Fail("malformed")
		}
		return handler.Ok()
	})
	cc := e.cfg.Consumers["WORKER1"]
	w := e.startWorkersWith(pipeline.ConsumerOptions{
		Stream: "ORDERS", Consumer: "WORKER1", Workers: 2, AckWait: cc.AckWait.Duration, MaxDeliver: 3,
		Backoff: []time.Duration{20 * time.Millisecond}, DeadLetter: cc.DeadLetter, Handler: h,
		OnResult: metrics.ObserveResult("ORDERS"),
	})
	m := e.monitor(monitor.Options{}, map[string]*pipeline.Workers{"WORKER1": w})
	metrics.SetMonitor(m)
	ts := httptest.NewServer(metrics.Handler())
	defer ts.Close()

	labels := map[string]string{"stream": "ORDERS", "consumer": "WORKER1"}
	before := scrape(t, ts.URL)
	for _, name := range []string{"holdfast_messages_processed_total", "holdfast_messages_acked_total", "holdfast_messages_retried_total",
		"holdfast_messages_dead_lettered_total", "holdfast_messages_lost_to_retention_total"} {
		if v, ok := sample(before, name, labels); !ok || v != 0 {
			t.Errorf("%s = %v (present %v) before any message, want 0", name, v, ok)
		}
		if f := before[name]; f == nil || f.GetType() != dto.MetricType_COUNTER {
			t.Errorf("%s is not a counter", name)
		}
	}
	for _, name := range []string{"process_cpu_seconds_total", "go_goroutines", "holdfast_build_info",
		"holdfast_stream_messages", "holdfast_consumer_pending_messages", "holdfast_jetstream_storage_used_bytes"} {
		if before[name] == nil {
			t.Errorf("no %s", name)
		}
	}

	e.publish("orders.ok", 5)
	e.publish("orders.fail", 1)
	e.publish("orders.bad", 1)
	natstest.CheckFor(t, 15*time.Second, 10*time.Millisecond, func() error {
		m.CheckNow(context.Background())
		f := scrape(t, ts.URL)
		want := map[string]float64{
			"holdfast_messages_processed_total":      5 + 3 + 1,
			"holdfast_messages_acked_total":          5,
			"holdfast_messages_retried_total":        2,
			"holdfast_messages_dead_lettered_total":  2,
			"holdfast_handler_duration_seconds":      9,
			"holdfast_stream_messages":               7,
			"holdfast_consumer_ack_pending_messages": 0,
			"holdfast_consumer_pending_messages":     0,
			"holdfast_handlers_in_flight":            0,
		}
		var bad []string
		for name, v := range want {
			l := labels
			if name == "holdfast_stream_messages" {
				l = map[string]string{"stream": "ORDERS"}
			}
			if got, ok := sample(f, name, l); !ok || got != v {
				bad = append(bad, fmt.Sprintf("%s = %v (present %v), want %v", name, got, ok, v))
			}
		}
		if got, _ := sample(f, "holdfast_stream_messages", map[string]string{"stream": "ORDERS_DLQ"}); got != 2 {
			bad = append(bad, fmt.Sprintf("ORDERS_DLQ holds %v messages, want 2", got))
		}
		if got, _ := sample(f, "holdfast_handler_duration_seconds", map[string]string{"consumer": "WORKER1", "outcome": "retry"}); got != 3 {
			bad = append(bad, fmt.Sprintf("%v handler durations with outcome retry, want 3", got))
		}
		if len(bad) > 0 {
			return errors.New(strings.Join(bad, "; "))
		}
		return nil
	})
}

// A purge of unprocessed messages from a stream far below its max_age is
// counted, but not blamed on max_age (whose fix, "raise the stream's
// limits", would send the operator after the wrong thing).
func TestMonitorPurgeIsNotBlamedOnMaxAge(t *testing.T) {
	t.Parallel()
	e := newMonitorEnv(t, nil) // max_age 72h
	m := e.monitor(monitor.Options{}, nil)
	e.publish("orders.created", 5)
	// The monitor has seen the five before they go.
	natstest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if cs := consumerStatus(t, m.CheckNow(context.Background()), "WORKER1"); cs.Pending != 5 || cs.LostToRetention != 0 {
			return fmt.Errorf("before the purge: pending %d, lost %d; want 5, 0", cs.Pending, cs.LostToRetention)
		}
		return nil
	})
	s, err := e.js.Stream(context.Background(), "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Purge(context.Background()); err != nil {
		t.Fatal(err)
	}
	cs := waitLost(t, m, "WORKER1", 5)
	if cs.LastLoss == nil || cs.LastLoss.Cause != "deleted" {
		t.Errorf("last loss = %+v, want cause deleted (a purge, nothing near the 72h max_age)", cs.LastLoss)
	}
	if log := e.log.String(); strings.Contains(log, "cause=max_age") || !strings.Contains(log, "purged") {
		t.Errorf("the loss is logged as max_age, or without naming a purge:\n%s", log)
	}
}

// max_age: a warning when the oldest unacknowledged message passes 80% of
// it, and a loss with cause max_age when it expires.
func TestMonitorMaxAgeWarningAndLoss(t *testing.T) {
	t.Parallel()
	e := newMonitorEnv(t, func(cfg *config.Config) {
		s := cfg.Streams["ORDERS"]
		s.MaxAge = config.Dur(2 * time.Second)
		s.DuplicateWindow = config.Dur(time.Second)
	})
	m := e.monitor(monitor.Options{}, nil)
	e.publish("orders.created", 3)
	natstest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		cs := consumerStatus(t, m.CheckNow(context.Background()), "WORKER1")
		if cs.BacklogRatio["max_age"] < 0.8 || len(cs.Warnings) == 0 || !strings.Contains(cs.Warnings[0], "will expire unprocessed") {
			return fmt.Errorf("no max_age warning: %+v", cs)
		}
		return nil
	})
	cs := waitLost(t, m, "WORKER1", 3)
	// The three expire milliseconds apart: one check may see them all, or
	// two checks a part each.
	if cs.LastLoss == nil || cs.LastLoss.Cause != "max_age" || cs.LastLoss.LastSeq != 3 || cs.LastLoss.FirstSeq+cs.LastLoss.Count != 4 {
		t.Errorf("last loss = %+v, want up to seq 3 by max_age", cs.LastLoss)
	}
	if len(cs.Warnings) != 0 {
		t.Errorf("warnings remain with nothing left to process: %q", cs.Warnings)
	}
	if !strings.Contains(e.log.String(), "limit=max_age") || !strings.Contains(e.log.String(), "back below the warning level") {
		t.Errorf("the max_age warning was not logged, or its end:\n%s", e.log.String())
	}
}

// A loss found when the store was opened makes the health degraded, with
// the description, and 503 only with fail_on_loss.
func TestMonitorHealthStartupLoss(t *testing.T) {
	e := newMonitorEnv(t, nil)
	loss := "stream ORDERS went backwards: last sequence 20 recorded, 10 found"
	for _, failOnLoss := range []bool{true, false} {
		m := e.monitor(monitor.Options{StartupLosses: []string{loss}, FailOnLoss: failOnLoss}, nil)
		natstest.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
			h := m.Health()
			if h.Status != monitor.HealthDegraded || !strings.Contains(h.Reason, loss) {
				return fmt.Errorf("health = %+v", h)
			}
			want := http.StatusOK
			if failOnLoss {
				want = http.StatusServiceUnavailable
			}
			if h.HTTPStatus() != want {
				return fmt.Errorf("fail_on_loss %v: status %d, want %d", failOnLoss, h.HTTPStatus(), want)
			}
			return nil
		})
	}
}

// TestMonitorIgnoresForeignTerminatedAdvisories: a MSG_TERMINATED advisory
// that names one of our consumers but comes from another JetStream domain
// (a hub's, across a leafnode) is not counted as our loss; the same
// advisory from the local domain is.
func TestMonitorIgnoresForeignTerminatedAdvisories(t *testing.T) {
	e := newMonitorEnv(t, nil)
	m := e.monitor(monitor.Options{Interval: time.Hour}, nil)
	send := func(domain string, seq uint64) {
		t.Helper()
		adv := fmt.Sprintf(`{"type":"io.nats.jetstream.advisory.v1.terminated","stream":"ORDERS","consumer":"WORKER1","stream_seq":%d,"reason":"Unacknowledged message was deleted","domain":%q}`, seq, domain)
		if err := e.srv.Conn().Publish("$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.ORDERS.WORKER1", []byte(adv)); err != nil {
			t.Fatal(err)
		}
		if err := e.srv.Conn().Flush(); err != nil {
			t.Fatal(err)
		}
	}
	send("hub", 7)
	send("", 8) // the local server has no domain
	waitLost(t, m, "WORKER1", 1)
}

// TestMetricsCoverEveryStream: streams holdfast does not manage (a KV
// bucket, a stream made by a client) get holdfast_stream_* too, without
// holdfast_stream_exists (which is about the configured ones).
func TestMetricsCoverEveryStream(t *testing.T) {
	e := newMonitorEnv(t, nil)
	ctx := context.Background()
	kv, err := e.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "settings"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := kv.Put(ctx, fmt.Sprintf("k%d", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.js.CreateStream(ctx, jetstream.StreamConfig{Name: "AUDIT", Subjects: []string{"audit.>"}, MaxMsgs: 100}); err != nil {
		t.Fatal(err)
	}
	e.publish("audit.login", 2)
	metrics := monitor.NewMetrics("test", "2.15.2")
	m := e.monitor(monitor.Options{}, nil)
	metrics.SetMonitor(m)
	ts := httptest.NewServer(metrics.Handler())
	defer ts.Close()
	m.CheckNow(ctx)
	f := scrape(t, ts.URL)
	for stream, want := range map[string]float64{"KV_settings": 3, "AUDIT": 2, "ORDERS": 0} {
		if v, ok := sample(f, "holdfast_stream_messages", map[string]string{"stream": stream}); !ok || v != want {
			t.Errorf("holdfast_stream_messages{stream=%q} = %v (present %v), want %v", stream, v, ok, want)
		}
	}
	if v, ok := sample(f, "holdfast_stream_max_messages", map[string]string{"stream": "AUDIT"}); !ok || v != 100 {
		t.Errorf("holdfast_stream_max_messages{stream=AUDIT} = %v (present %v), want 100", v, ok)
	}
	if _, ok := sample(f, "holdfast_stream_exists", map[string]string{"stream": "AUDIT"}); ok {
		t.Error("holdfast_stream_exists for a stream holdfast does not manage")
	}
	if h := m.Health(); h.Status != monitor.HealthOK {
		t.Errorf("health %s with unmanaged streams: %v", h.Status, h.Problems)
	}

	// WORKER1 has no workers here: its backlog ages.
	worker1 := map[string]string{"stream": "ORDERS", "consumer": "WORKER1"}
	if v, ok := sample(f, "holdfast_consumer_oldest_unprocessed_age_seconds", worker1); !ok || v != 0 {
		t.Errorf("oldest unprocessed age without a backlog = %v (present %v), want 0", v, ok)
	}
	e.publish("orders.created", 2)
	time.Sleep(100 * time.Millisecond)
	m.CheckNow(ctx)
	if v, ok := sample(scrape(t, ts.URL), "holdfast_consumer_oldest_unprocessed_age_seconds", worker1); !ok || v < 0.1 || v > 60 {
		t.Errorf("oldest unprocessed age = %v (present %v), want the age of the first message (>= 0.1s)", v, ok)
	}
}

// Issue 12: a message whose dead letter cannot be stored makes health
// degraded, with the reason, until the dead letter is stored.
func TestHealthDegradedWhileDeadLetterFails(t *testing.T) {
	e := newMonitorEnv(t, func(cfg *config.Config) {
		cc := cfg.Consumers["WORKER1"]
		cc.Workers = 1
		cc.MaxDeliver = 1
		cc.AckWait = config.Dur(2 * time.Second)
	})
	ctx := context.Background()
	// The dead-letter stream exists but is full: it refuses the dead letter.
	natstest.EditStream(t, e.js, "ORDERS_DLQ", func(c *jetstream.StreamConfig) { c.MaxMsgs, c.Discard = 1, jetstream.DiscardNew })
	if _, err := e.js.Publish(ctx, "dlq.WORKER1.filler", nil); err != nil {
		t.Fatal(err)
	}
	w := e.startWorkers(handler.Func(func(context.Context, *handler.Message) handler.Result { return handler.Fail("bad") }), 1)
	m := e.monitor(monitor.Options{}, map[string]*pipeline.Workers{"WORKER1": w})
	e.publish("orders.created", 1)
	natstest.CheckFor(t, 15*time.Second, 10*time.Millisecond, func() error {
		h := m.Health()
		if h.Status != monitor.HealthDegraded || !strings.Contains(h.Reason, "dead letter cannot be stored") {
			return fmt.Errorf("health %s: %s", h.Status, h.Reason)
		}
		return nil
	})
	dlq, err := e.js.Stream(ctx, "ORDERS_DLQ")
	if err != nil {
		t.Fatal(err)
	}
	if err := dlq.DeleteMsg(ctx, 1); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 15*time.Second, 10*time.Millisecond, func() error {
		if h := m.Health(); h.Status != monitor.HealthOK {
			return fmt.Errorf("health %s: %s", h.Status, h.Reason)
		}
		return nil
	})
}

// TestIdleMonitorDoesNotReadJetStream: while the server's fingerprint of
// the positions stays the same and all is well, a check confirms the last
// report (dated anew) without a JetStream API request; a message stored
// changes the fingerprint and the next check reads JetStream again.
func TestIdleMonitorDoesNotReadJetStream(t *testing.T) {
	env := newMonitorEnv(t, nil)
	m := env.monitor(monitor.Options{IdleInterval: time.Hour, Activity: env.srv.StoreActivity}, nil)
	apiTotal := func() uint64 {
		jsz, err := env.srv.NATS().Jsz(nil)
		if err != nil {
			t.Fatal(err)
		}
		return jsz.API.Total
	}
	// Idle: the API count stands still over several checks (the embedded
	// server's recorder skips its reads too once nothing changes).
	var before uint64
	var since time.Time
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		r := m.Report()
		if r == nil || r.Health.Status != monitor.HealthOK {
			return errors.New("no healthy report yet")
		}
		now := apiTotal()
		if now != before || since.IsZero() {
			before, since = now, r.Time
			return fmt.Errorf("%d API requests so far", now)
		}
		if r.Time.Sub(since) < 20*m.Options().Interval {
			return errors.New("not idle for 20 intervals yet")
		}
		return nil
	})
	if got := m.Report().Streams[0]; got.Messages != 0 {
		t.Fatalf("stream %s holds %d messages before the publish", got.Name, got.Messages)
	}
	env.publish("orders.created", 1)
	natstest.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		for _, s := range m.Report().Streams {
			if s.Name == "ORDERS" && s.Messages == 1 {
				return nil
			}
		}
		return errors.New("the stored message is not in the report yet")
	})
}
