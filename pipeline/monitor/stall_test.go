package monitor_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/internal/natstest"
	"github.com/holdfast-io/holdfast/pipeline"
	"github.com/holdfast-io/holdfast/pipeline/handler"
	"github.com/holdfast-io/holdfast/pipeline/monitor"
)

// stallTimeout is short so that the old definition of a stall (work
// awaiting ack without a moving position) would trip within the tests.
const stallTimeout = 300 * time.Millisecond

// watchNotStalled checks the monitor's reports for long enough that a
// stall would have been declared many times over (the stall timeout plus
// a dozen checks), and fails on any stalled report or unhealthy verdict.
func watchNotStalled(t *testing.T, m *monitor.Monitor, consumer string, wantStatus string) {
	t.Helper()
	until := time.Now().Add(stallTimeout + 2*time.Second)
	checks := 0
	for time.Now().Before(until) || checks < 20 {
		r := m.CheckNow(context.Background())
		checks++
		cs := consumerStatus(t, r, consumer)
		if cs.Stalled {
			t.Fatalf("consumer reported stalled: %+v", cs)
		}
		if h := m.Health(); h.Status != wantStatus || h.HTTPStatus() != http.StatusOK {
			t.Fatalf("health = %+v, want %s with 200", h, wantStatus)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A handler that keeps failing with a long backoff leaves its messages
// in a deliberate delayed retry: that is waiting, not a stall.
func TestMonitorDelayedRetryIsNotAStall(t *testing.T) {
	t.Parallel()
	e := newMonitorEnv(t, func(cfg *config.Config) {
		cc := cfg.Consumers["WORKER1"]
		cc.Workers = 2
		cc.MaxAckPending = 3
	})
	var calls sync.WaitGroup
	calls.Add(3)
	var once [3]sync.Once
	h := handler.Func(func(ctx context.Context, msg *handler.Message) handler.Result {
		once[msg.Sequence-1].Do(calls.Done)
		return handler.RetryLater("the endpoint is down")
	})
	cc := e.cfg.Consumers["WORKER1"]
	w := e.startWorkersWith(pipeline.ConsumerOptions{
		Stream: "ORDERS", Consumer: "WORKER1", Workers: 2, AckWait: cc.AckWait.Duration,
		MaxDeliver: 5, Backoff: []time.Duration{time.Minute, 10 * time.Minute}, Handler: h,
	})
	m := e.monitor(monitor.Options{StallTimeout: stallTimeout}, map[string]*pipeline.Workers{"WORKER1": w})
	e.publish("orders.created", 4) // 3 fill max_ack_pending, 1 stays pending
	calls.Wait()
	natstest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if n := w.Stats().Retried.Load(); n != 3 {
			return fmt.Errorf("retried = %d, want 3", n)
		}
		return nil
	})
	watchNotStalled(t, m, "WORKER1", monitor.HealthOK)
	cs := consumerStatus(t, m.Report(), "WORKER1")
	if cs.Workers.DelayedRetries != 3 || cs.AckPending != 3 || cs.Pending != 1 {
		t.Fatalf("consumer status = %+v, want 3 delayed retries, 3 awaiting ack, 1 pending", cs)
	}
}

// TestMonitorDelayedRetryOfEarlierWorkersIsNotAStall: a retry delayed by
// the backoff before a reload or a restart (other workers, which did not
// see it given back) is waiting, not a stall. With a backoff longer than
// stall_timeout plus ack_wait it was reported stalled: /healthz 503 and the
// watchdog's pings withheld, so systemd restarted holdfast, and again
// after each start, until the retry was due.
func TestMonitorDelayedRetryOfEarlierWorkersIsNotAStall(t *testing.T) {
	t.Parallel()
	e := newMonitorEnv(t, func(cfg *config.Config) {
		cc := cfg.Consumers["WORKER1"]
		cc.Workers = 1
		cc.AckWait = config.Dur(time.Second)
	})
	opts := pipeline.ConsumerOptions{
		Stream: "ORDERS", Consumer: "WORKER1", Workers: 1, AckWait: time.Second,
		MaxDeliver: 5, Backoff: []time.Duration{time.Minute},
		Handler: handler.Func(func(ctx context.Context, msg *handler.Message) handler.Result {
			return handler.RetryLater("the endpoint is down")
		}),
	}
	w1 := e.startWorkersWith(opts)
	e.publish("orders.created", 1)
	natstest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if n := w1.Stats().Retried.Load(); n != 1 {
			return fmt.Errorf("retried = %d, want 1", n)
		}
		return nil
	})
	if err := w1.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	w2 := e.startWorkersWith(opts) // a restart: counters and all anew
	m := e.monitor(monitor.Options{StallTimeout: stallTimeout}, map[string]*pipeline.Workers{"WORKER1": w2})
	watchNotStalled(t, m, "WORKER1", monitor.HealthOK)
}

// TestMonitorRetryAfterAcrossReloadIsNotAStall: a retry delayed by the
// handler's own Retry-After (longer than any backoff) before a reload is
// still known to the workers that replace them (they share the
// consumer's Stats, as the daemon's reload does), so it is waiting, not a
// stall.
func TestMonitorRetryAfterAcrossReloadIsNotAStall(t *testing.T) {
	t.Parallel()
	e := newMonitorEnv(t, func(cfg *config.Config) {
		cc := cfg.Consumers["WORKER1"]
		cc.Workers = 1
		cc.AckWait = config.Dur(time.Second)
	})
	stats := &pipeline.Stats{}
	opts := pipeline.ConsumerOptions{
		Stream: "ORDERS", Consumer: "WORKER1", Workers: 1, AckWait: time.Second,
		MaxDeliver: 5, Backoff: []time.Duration{100 * time.Millisecond}, Stats: stats,
		Handler: handler.Func(func(ctx context.Context, msg *handler.Message) handler.Result {
			r := handler.RetryLater("HTTP 503 Service Unavailable")
			r.RetryAfter = time.Minute
			return r
		}),
	}
	w1 := e.startWorkersWith(opts)
	e.publish("orders.created", 1)
	natstest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if n := stats.Retried.Load(); n != 1 {
			return fmt.Errorf("retried = %d, want 1", n)
		}
		return nil
	})
	if err := w1.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	w2 := e.startWorkersWith(opts)
	m := e.monitor(monitor.Options{StallTimeout: stallTimeout}, map[string]*pipeline.Workers{"WORKER1": w2})
	watchNotStalled(t, m, "WORKER1", monitor.HealthOK)
	if cs := consumerStatus(t, m.Report(), "WORKER1"); cs.Workers.DelayedRetries != 1 {
		t.Fatalf("delayed retries = %d, want the one given back before the reload", cs.Workers.DelayedRetries)
	}
}

// A handler that runs long (within its timeout) while in-progress acks
// keep its message is working, not stalled.
func TestMonitorLongHandlerIsNotAStall(t *testing.T) {
	t.Parallel()
	e := newMonitorEnv(t, func(cfg *config.Config) {
		cc := cfg.Consumers["WORKER1"]
		cc.Workers = 1
		cc.AckWait = config.Dur(time.Second) // in-progress acks every 500ms
	})
	release := make(chan struct{})
	var rel sync.Once
	t.Cleanup(func() { rel.Do(func() { close(release) }) })
	started := make(chan struct{}, 10)
	h := handler.Func(func(ctx context.Context, msg *handler.Message) handler.Result {
		started <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return handler.Ok()
	})
	w := e.startWorkersWith(pipeline.ConsumerOptions{
		Stream: "ORDERS", Consumer: "WORKER1", Workers: 1, AckWait: time.Second, MaxDeliver: 5, Handler: h,
	})
	opts := monitor.Options{StallTimeout: stallTimeout}
	m := e.monitorWith(opts, map[string]*pipeline.Workers{"WORKER1": w}, map[string]time.Duration{"WORKER1": time.Hour})
	e.publish("orders.created", 2)
	<-started
	watchNotStalled(t, m, "WORKER1", monitor.HealthOK)
	cs := consumerStatus(t, m.Report(), "WORKER1")
	if cs.Redelivered != 0 || cs.Workers.OldestHandlerStart.IsZero() {
		t.Fatalf("consumer status = %+v: want the running message kept alive by in-progress acks and its handler reported", cs)
	}
	rel.Do(func() { close(release) })
	natstest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if n := w.Stats().Acked.Load(); n != 2 {
			return fmt.Errorf("acked = %d, want 2", n)
		}
		return nil
	})
}

// TestAckWaitEditedWhileHandlersRun: when the consumer's ack_wait is
// lowered on the server while a handler runs (nats consumer edit, another
// node's config), the workers learn it from the Monitor and keep the
// message alive at the new pace. They used to keep the pace of the
// ack_wait they started with (20s: an in-progress ack every 10s), and the
// server delivered the message again 3s after its receipt while its 5s
// handler still ran, and again 3s later: 3 concurrent runs of one message.
func TestAckWaitEditedWhileHandlersRun(t *testing.T) {
	t.Parallel()
	e := newMonitorEnv(t, func(cfg *config.Config) {
		cc := cfg.Consumers["WORKER1"]
		cc.Workers = 2
		cc.AckWait = config.Dur(20 * time.Second)
	})
	var mu sync.Mutex
	runs := map[uint64][]uint64{} // seq -> deliveries handled
	started := make(chan struct{}, 10)
	h := handler.Func(func(ctx context.Context, msg *handler.Message) handler.Result {
		mu.Lock()
		runs[msg.Sequence] = append(runs[msg.Sequence], msg.Delivery)
		mu.Unlock()
		started <- struct{}{}
		select {
		case <-time.After(5 * time.Second):
		case <-ctx.Done():
		}
		return handler.Ok()
	})
	w := e.startWorkersWith(pipeline.ConsumerOptions{
		Stream: "ORDERS", Consumer: "WORKER1", Workers: 2, AckWait: 20 * time.Second, MaxDeliver: 5, Handler: h,
	})
	e.monitor(monitor.Options{StallTimeout: time.Minute}, map[string]*pipeline.Workers{"WORKER1": w})
	e.publish("orders.created", 1)
	<-started
	natstest.EditConsumer(t, e.js, "ORDERS", "WORKER1", func(c *jetstream.ConsumerConfig) { c.AckWait = 3 * time.Second })
	natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		if n := w.Stats().Acked.Load(); n == 0 {
			return errors.New("not acked yet")
		}
		return nil
	})
	time.Sleep(time.Second) // a redelivery while the handler ran would have shown by now
	mu.Lock()
	defer mu.Unlock()
	if d := runs[1]; len(d) != 1 {
		t.Fatalf("the message was handled %d times (deliveries %v) while its first handler ran, want once", len(d), d)
	}
	if got := w.AckWait(); got != 3*time.Second {
		t.Errorf("workers keep messages alive for ack_wait %s, want the server's 3s", got)
	}
}

// A handler stuck past its timeout is a real stall: the worker does not
// pull any more, and a restart would cure it.
func TestMonitorHandlerPastItsTimeoutIsAStall(t *testing.T) {
	e := newMonitorEnv(t, func(cfg *config.Config) { cfg.Consumers["WORKER1"].Workers = 1 })
	release := make(chan struct{})
	var rel sync.Once
	h := handler.Func(func(ctx context.Context, msg *handler.Message) handler.Result {
		<-release // ignores ctx and its own timeout: stuck
		return handler.Ok()
	})
	w := e.startWorkers(h, 1)
	// Registered after the workers, so it runs before their Close waits.
	t.Cleanup(func() { rel.Do(func() { close(release) }) })
	m := e.monitorWith(monitor.Options{StallTimeout: stallTimeout}, map[string]*pipeline.Workers{"WORKER1": w},
		map[string]time.Duration{"WORKER1": 200 * time.Millisecond})
	e.publish("orders.created", 3)
	natstest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		hl := m.Health()
		if hl.HTTPStatus() != http.StatusServiceUnavailable || !strings.Contains(hl.Reason, "consumer WORKER1 on stream ORDERS is stalled: a handler has been running for") ||
			!strings.Contains(hl.Reason, "its timeout is 200ms") {
			return fmt.Errorf("health = %+v", hl)
		}
		return nil
	})
	rel.Do(func() { close(release) })
	natstest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if hl := m.Health(); hl.Status != monitor.HealthOK {
			return fmt.Errorf("health = %+v", hl)
		}
		return nil
	})
}

// A consumer without in-process workers whose client fetched
// max_ack_pending messages and went away is reported (degraded, 200), but
// is not a stall: a restart of holdfast would not mend it.
func TestMonitorConsumerWithoutWorkersIsBlockedNotStalled(t *testing.T) {
	e := newMonitorEnv(t, func(cfg *config.Config) {
		cc := cfg.Consumers["WORKER1"]
		cc.Workers = 0
		cc.MaxAckPending = 2
		cc.AckWait = config.Dur(time.Second)
	})
	m := e.monitor(monitor.Options{StallTimeout: stallTimeout}, nil)
	e.publish("orders.created", 3)
	c, err := e.js.Consumer(context.Background(), "ORDERS", "WORKER1")
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.Fetch(2, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for range batch.Messages() {
		n++ // taken and never acknowledged
	}
	if n != 2 {
		t.Fatalf("fetched %d messages, want 2", n)
	}
	natstest.CheckFor(t, 15*time.Second, 10*time.Millisecond, func() error {
		cs := consumerStatus(t, m.CheckNow(context.Background()), "WORKER1")
		hl := m.Health()
		if cs.Stalled || !cs.Blocked || hl.Status != monitor.HealthDegraded || hl.HTTPStatus() != http.StatusOK ||
			!strings.Contains(hl.Reason, "blocked") {
			return fmt.Errorf("consumer %+v, health %+v: want blocked, not stalled, degraded with 200", cs, hl)
		}
		return nil
	})
}

// Checking an idle filtered consumer creates no probe consumers (each one
// was a JetStream API write, and a meta-layer proposal in a cluster).
func TestMonitorIdleFilteredConsumerCreatesNoProbes(t *testing.T) {
	e := newMonitorEnv(t, func(cfg *config.Config) {
		cfg.Consumers["WORKER1"].FilterSubject = "orders.created"
	})
	m := e.monitor(monitor.Options{}, nil)
	e.publish("orders.created", 3)
	e.publish("orders.updated", 2)
	created := make(chan string, 100)
	sub, err := e.srv.Conn().Subscribe("$JS.EVENT.ADVISORY.CONSUMER.CREATED.ORDERS.>", func(msg *nats.Msg) { created <- msg.Subject })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := e.srv.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	// Once the stream is idle (a second after the last message), checks
	// read the consumer's own count.
	time.Sleep(1100 * time.Millisecond)
	for len(created) > 0 {
		<-created // probes of the busy second
	}
	for range 20 {
		cs := consumerStatus(t, m.CheckNow(context.Background()), "WORKER1")
		if cs.Pending != 3 {
			t.Fatalf("pending = %d, want 3", cs.Pending)
		}
	}
	if err := e.srv.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case subj := <-created:
		t.Fatalf("a consumer was created while the stream was idle: %s", subj)
	case <-time.After(200 * time.Millisecond):
	}
}
