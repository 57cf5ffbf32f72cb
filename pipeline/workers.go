package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultRetryDelay is the delay before a retry when no backoff is
// configured: never a hot loop.
const DefaultRetryDelay = 5 * time.Second

// ConsumerOptions configures the workers of one durable consumer.
type ConsumerOptions struct {
	Stream   string
	Consumer string
	// Workers is the number of concurrent handlers (at least 1).
	Workers int
	// AckWait is the consumer's ack wait; a handler running longer than
	// half of it gets in-progress acks so the message is not redelivered
	// under it.
	AckWait time.Duration
	// MaxDeliver is the consumer's max_deliver: a retry on that delivery
	// is a dead letter instead.
	MaxDeliver int
	// Backoff is the delay before each retry; the last repeats.
	Backoff []time.Duration
	// DeadLetter is the dead-letter stream, or "" to terminate failed
	// messages with a log line only.
	DeadLetter string
	Handler    Handler
	// OnResult, when set, is called after each handled message (metrics).
	OnResult func(consumer string, res Result, took time.Duration)
	// Stats, when set, receives the counters, so that workers replaced at
	// a reload keep counting where the old ones stopped.
	Stats *Stats
}

// Stats counts what a consumer's workers did since they started.
type Stats struct {
	Processed    atomic.Uint64 // handler calls that returned
	Acked        atomic.Uint64 // successes confirmed by the server
	Retried      atomic.Uint64 // naks with delay
	DeadLettered atomic.Uint64 // messages moved to the dead-letter stream (or terminated without one)
	InFlight     atomic.Int64  // handlers running now
	Failures     atomic.Uint64 // acks, naks or dead-letter publishes that failed
	// DeadLetterFailing is the number of messages whose dead letter cannot
	// be stored now: kept (never terminated) and retried until it is.
	DeadLetterFailing atomic.Int64

	deadLetterErr atomic.Pointer[string]
	settledSeqs   settledSeqs
}

// Workers runs a consumer's handlers. Open starts them; Close drains them.
type Workers struct {
	js   jetstream.JetStream
	nc   *nats.Conn
	opts ConsumerOptions
	log  *slog.Logger

	stats *Stats

	// ShutdownTimeout is how long Close lets in-flight handlers finish
	// before cancelling them.
	ShutdownTimeout time.Duration

	mu       sync.Mutex
	cons     jetstream.Consumer
	it       jetstream.MessagesContext
	advisory *nats.Subscription
	replay   *nats.Subscription
	domain   string     // the local JetStream domain, which advisories must carry
	bg       background // dead-letter retries, advisories and replays being handled

	stopping      atomic.Bool
	alive         atomic.Int32 // worker goroutines running
	runCtx        context.Context
	cancelRun     context.CancelFunc
	handlerCtx    context.Context
	cancelHandler context.CancelFunc
	wg            sync.WaitGroup
	closeOnce     sync.Once
}

// NewWorkers returns the workers of one consumer, using js and nc (the
// in-process connection) for messages, acks and dead letters.
func NewWorkers(js jetstream.JetStream, nc *nats.Conn, opts ConsumerOptions, log *slog.Logger) *Workers {
	if opts.Workers < 1 {
		opts.Workers = 1
	}
	if log == nil {
		log = slog.Default()
	}
	stats := opts.Stats
	if stats == nil {
		stats = &Stats{}
	}
	return &Workers{
		stats:           stats,
		js:              js,
		nc:              nc,
		opts:            opts,
		log:             log.With("component", "workers", "consumer", opts.Consumer, "stream", opts.Stream),
		ShutdownTimeout: 20 * time.Second,
	}
}

// Stats returns the live counters.
func (w *Workers) Stats() *Stats { return w.stats }

// Running reports whether every worker goroutine is alive and the
// workers are not shutting down.
func (w *Workers) Running() bool {
	return !w.stopping.Load() && int(w.alive.Load()) == w.opts.Workers
}

// Options returns the options the workers run with.
func (w *Workers) Options() ConsumerOptions { return w.opts }

// Open looks up the durable consumer, subscribes to its max-deliveries
// advisories and starts the workers.
func (w *Workers) Open(ctx context.Context) error {
	if w.opts.Handler == nil {
		return fmt.Errorf("consumer %s: no handler", w.opts.Consumer)
	}
	cons, err := w.js.Consumer(ctx, w.opts.Stream, w.opts.Consumer)
	if err != nil {
		return fmt.Errorf("consumer %s on stream %s: %w", w.opts.Consumer, w.opts.Stream, err)
	}
	w.runCtx, w.cancelRun = context.WithCancel(context.Background())
	w.handlerCtx, w.cancelHandler = context.WithCancel(context.Background())
	// Advisories first: one about a message pulled from now on is not missed.
	if err := w.subscribeDeadLetters(ctx); err != nil {
		w.cancelRun()
		w.cancelHandler()
		return err
	}
	it, err := cons.Messages(w.pullOptions()...)
	if err != nil {
		w.cancelRun()
		w.cancelHandler()
		w.closeDeadLetters()
		return fmt.Errorf("consumer %s: cannot start pulling: %w", w.opts.Consumer, err)
	}
	w.cons, w.it = cons, it
	for i := 0; i < w.opts.Workers; i++ {
		w.wg.Add(1)
		w.alive.Add(1)
		go w.work()
	}
	w.log.Info("workers started", "workers", w.opts.Workers, "dead_letter", w.opts.DeadLetter)
	return nil
}

// nextWait bounds each wait for a message. nats.go (v1.55.0) decides
// whether to send the next pull request only when Next is called or a
// message arrives, and skips it while the previous request is still being
// written; if that was the last message due, nothing re-checks and the
// workers wait until the pull request expires (30s), although the server
// holds messages for them. Seen under load on the in-process connection
// (about 2 runs in 5 of 20,000 messages); returning from Next every
// nextWait makes the check run again. Idle, it costs a timer per worker.
const nextWait = 250 * time.Millisecond

// pullOptions buffers at most one message per worker, so that a buffered
// message cannot outlive ack_wait before a handler sees it.
func (w *Workers) pullOptions() []jetstream.PullMessagesOpt {
	return []jetstream.PullMessagesOpt{jetstream.PullMaxMessages(w.opts.Workers)}
}

func (w *Workers) iterator() jetstream.MessagesContext {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.it
}

// restart replaces an iterator that closed without being asked to (the
// consumer was deleted, the connection dropped), once per failure.
func (w *Workers) restart(old jetstream.MessagesContext) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.it != old || w.stopping.Load() {
		return
	}
	select {
	case <-w.runCtx.Done():
		return
	case <-time.After(time.Second):
	}
	ctx, cancel := context.WithTimeout(w.runCtx, 5*time.Second)
	defer cancel()
	cons, err := w.js.Consumer(ctx, w.opts.Stream, w.opts.Consumer)
	if err != nil {
		w.log.Error("consumer unavailable: workers idle until it is back", "err", err)
		return
	}
	it, err := cons.Messages(w.pullOptions()...)
	if err != nil {
		w.log.Error("cannot resume pulling", "err", err)
		return
	}
	w.cons, w.it = cons, it
	w.log.Warn("message iterator restarted")
}

func (w *Workers) work() {
	defer w.alive.Add(-1)
	defer w.wg.Done()
	for {
		it := w.iterator()
		msg, err := it.Next(jetstream.NextMaxWait(nextWait))
		if errors.Is(err, nats.ErrTimeout) {
			continue // nothing yet; see nextWait
		}
		if err != nil {
			if w.stopping.Load() {
				return
			}
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				w.restart(it)
				continue
			}
			w.log.Warn("pull failed", "err", err)
			continue
		}
		if w.stopping.Load() {
			// Buffered after the drain began: give it back at once.
			if err := msg.Nak(); err != nil {
				w.log.Warn("nak of undelivered message failed; it is redelivered after ack_wait", "err", err)
			}
			continue
		}
		w.process(msg)
	}
}

// process runs the handler on one message and settles it.
func (w *Workers) process(msg jetstream.Msg) {
	md, err := msg.Metadata()
	if err != nil {
		w.log.Error("message without JetStream metadata: terminated", "subject", msg.Subject(), "err", err)
		_ = msg.Term()
		return
	}
	m := &Message{
		Subject:   msg.Subject(),
		Stream:    md.Stream,
		Consumer:  w.opts.Consumer,
		Sequence:  md.Sequence.Stream,
		Delivery:  md.NumDelivered,
		Header:    msg.Headers(),
		Data:      msg.Data(),
		Published: md.Timestamp,
	}
	m.IdempotencyKey = m.Header.Get(nats.MsgIdHdr)
	if m.IdempotencyKey == "" {
		m.IdempotencyKey = m.Stream + ":" + strconv.FormatUint(m.Sequence, 10)
	}

	w.stats.InFlight.Add(1)
	start := time.Now()
	res := w.handle(msg, m)
	took := time.Since(start)
	w.stats.InFlight.Add(-1)
	w.stats.Processed.Add(1)
	if w.opts.OnResult != nil {
		w.opts.OnResult(w.opts.Consumer, res, took)
	}
	w.settle(msg, m, res)
}

// handle calls the handler, keeping the message alive with in-progress
// acks while it runs and turning a panic into a retry.
func (w *Workers) handle(msg jetstream.Msg, m *Message) (res Result) {
	if w.opts.AckWait > 0 {
		defer keepAlive(msg, w.opts.AckWait/2, func(err error) {
			w.log.Warn("in-progress ack failed", "seq", m.Sequence, "err", err)
		})()
	}
	defer func() {
		if r := recover(); r != nil {
			w.log.Error("handler panicked", "seq", m.Sequence, "panic", r, "stack", string(debug.Stack()))
			res = RetryLater(fmt.Sprintf("handler panicked: %v", r))
		}
	}()
	return w.opts.Handler.Handle(w.handlerCtx, m)
}

// keepAlive sends an in-progress ack every interval until the returned
// stop is called: one timer, and nothing at all for a handler faster than
// interval.
func keepAlive(msg jetstream.Msg, interval time.Duration, onErr func(error)) (stop func()) {
	var mu sync.Mutex
	stopped := false
	var t *time.Timer
	mu.Lock()
	defer mu.Unlock()
	t = time.AfterFunc(interval, func() {
		if err := msg.InProgress(); err != nil {
			onErr(err)
		}
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			t.Reset(interval)
		}
	})
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		t.Stop()
	}
}

// settle acks, naks or dead-letters a handled message.
func (w *Workers) settle(msg jetstream.Msg, m *Message, res Result) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if w.handlerCtx.Err() != nil && res.Outcome != Success {
		// Cancelled by shutdown: hand it back for the next start.
		if err := msg.Nak(); err != nil {
			w.log.Warn("nak at shutdown failed; redelivered after ack_wait", "seq", m.Sequence, "err", err)
		}
		w.log.Info("handler interrupted by shutdown: message returned", "seq", m.Sequence)
		return
	}
	switch res.Outcome {
	case Success:
		// DoubleAck waits for the server to confirm, so a lost ack is seen
		// (and the message is known to come back) instead of assumed.
		if err := msg.DoubleAck(ctx); err != nil {
			w.stats.Failures.Add(1)
			w.log.Error("ack not confirmed: the message will be redelivered", "seq", m.Sequence, "err", err)
			return
		}
		w.stats.Acked.Add(1)
		w.stats.noteSettled(m.Sequence)
	case Retry:
		if w.opts.MaxDeliver > 0 && m.Delivery >= uint64(w.opts.MaxDeliver) {
			reason := fmt.Sprintf("gave up after %d deliveries: %s", m.Delivery, res.Reason)
			w.deadLetter(ctx, msg, m, reason, true)
			return
		}
		delay := w.retryDelay(m.Delivery)
		if res.RetryAfter > 0 {
			delay = res.RetryAfter
		}
		if err := msg.NakWithDelay(delay); err != nil {
			w.stats.Failures.Add(1)
			w.log.Error("nak failed: the message is redelivered after ack_wait", "seq", m.Sequence, "err", err)
			return
		}
		w.stats.Retried.Add(1)
		w.log.Warn("handler failed: will retry", "seq", m.Sequence, "subject", m.Subject,
			"delivery", m.Delivery, "max_deliver", w.opts.MaxDeliver, "retry_in", delay, "reason", res.Reason)
	case Permanent:
		w.deadLetter(ctx, msg, m, res.Reason, m.Delivery >= uint64(w.opts.MaxDeliver))
	default:
		w.log.Error("handler returned an unknown outcome: retrying", "seq", m.Sequence, "outcome", res.Outcome.String())
		_ = msg.NakWithDelay(w.retryDelay(m.Delivery))
	}
}

// retryDelay is the backoff before the retry that follows delivery n.
func (w *Workers) retryDelay(delivery uint64) time.Duration {
	b := w.opts.Backoff
	if len(b) == 0 {
		return DefaultRetryDelay
	}
	i := int(delivery) - 1
	if i < 0 {
		i = 0
	}
	if i >= len(b) {
		i = len(b) - 1
	}
	return b[i]
}

// Close stops pulling, lets in-flight handlers finish for up to
// ShutdownTimeout, cancels the rest (their messages are nak'ed without
// delay) and waits for the workers. It is idempotent.
func (w *Workers) Close(ctx context.Context) error {
	w.closeOnce.Do(func() {
		if w.cancelRun == nil {
			return
		}
		w.stopping.Store(true)
		w.cancelRun()
		if it := w.iterator(); it != nil {
			it.Drain()
		}
		done := make(chan struct{})
		// Advisories and replays are taken until the workers stopped; a
		// message kept for its dead letter is held until the timeout.
		go func() { w.wg.Wait(); w.closeDeadLetters(); close(done) }()
		timer := time.NewTimer(w.ShutdownTimeout)
		defer timer.Stop()
		select {
		case <-done:
		case <-timer.C:
			w.log.Warn("shutdown timeout: cancelling handlers still running", "in_flight", w.stats.InFlight.Load(), "timeout", w.ShutdownTimeout)
			w.cancelHandler()
			<-done
		case <-ctx.Done():
			w.cancelHandler()
			<-done
		}
		w.cancelHandler()
		w.log.Info("workers stopped", "processed", w.stats.Processed.Load(), "acked", w.stats.Acked.Load(),
			"retried", w.stats.Retried.Load(), "dead_lettered", w.stats.DeadLettered.Load())
	})
	return nil
}
