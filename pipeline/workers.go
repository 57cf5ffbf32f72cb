package pipeline

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/internal/settle"
	"github.com/holdfast-io/holdfast/pipeline/handler"
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
	// AckWait is the consumer's ack wait; a message held longer than half
	// of it gets in-progress acks so that it is not redelivered while
	// queued or handled. Zero means the server's default (30s).
	AckWait time.Duration
	// MaxDeliver is the consumer's max_deliver: a retry on that delivery
	// is a dead letter instead.
	MaxDeliver int
	// Backoff is the delay before each retry; the last repeats.
	Backoff []time.Duration
	// DeadLetter is the dead-letter stream, or "" to terminate failed
	// messages with a log line only.
	DeadLetter string
	// FlushDeadLetters, when set, makes a stored dead letter durable
	// before its original is terminated (jetstream.commit_window: the
	// server's PubAck precedes the flush).
	FlushDeadLetters func() error
	// Handler handles each message. When it keeps connections for reuse
	// (it has a CloseIdleConnections method, as handler.HTTP does), Close
	// closes them once the workers stopped.
	Handler handler.Handler
	// OnResult, when set, is called after each handled message (metrics).
	OnResult func(consumer string, res handler.Result, took time.Duration)
	// Stats, when set, receives the counters, so that workers replaced at
	// a reload keep counting where the old ones stopped.
	Stats *Stats
	// Paused, when set, is asked before each pull: while it reports true
	// the workers pull nothing (the forward handler's hub is unreachable),
	// so a wait spends no deliveries of max_deliver, and the monitor does
	// not count it as a stall.
	Paused func() bool
	// Prefetch is how many messages are pulled ahead of the handlers,
	// beyond one per worker. Each is kept alive with in-progress acks from
	// its receipt, so it cannot outlive ack_wait while it waits.
	Prefetch int
	// MaxPrefetch, when above Prefetch, is how far the fetcher may pull
	// ahead while the handlers keep up: up to queueHorizon of their work
	// (see depth). The daemon sets it to max_ack_pending - workers.
	MaxPrefetch int
	// MaxHeldBytes bounds the bytes of the messages the workers hold
	// (queued or being handled): pull requests ask for no more than what
	// is left of it (0: DefaultMaxHeldBytes). It is raised to two messages
	// of the server's max_payload, so that one always fits.
	MaxHeldBytes int
}

// DefaultMaxHeldBytes is ConsumerOptions.MaxHeldBytes when unset. Without
// a bound the workers held as many messages as their places allow
// whatever their size: an edge forwarding 400 messages of 900 KB after a
// hub outage went to 1.06 GB of RSS.
const DefaultMaxHeldBytes = 64 << 20

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
	lastFailure   atomic.Pointer[Failure]
	settledSeqs   settledSeqs
	// delayed are the retries given back with a delay and not due yet:
	// kept with the counters, so that the workers a reload starts know
	// the retries the previous ones delayed (a Retry-After longer than
	// stall_timeout is waiting, not a stall).
	delayed retryBook
}

// Failure is a handler's verdict other than success on one message: the
// last one of a consumer is in its status, so that an operator sees why
// its messages are retried or dead-lettered without reading the log.
type Failure struct {
	Time     time.Time `json:"time"`
	Seq      uint64    `json:"stream_seq"`
	Subject  string    `json:"subject"`
	Delivery uint64    `json:"delivery"`
	Reason   string    `json:"reason"`
	// DeadLettered: the verdict sends the message to the dead letters
	// (or terminates it) rather than retrying it.
	DeadLettered bool `json:"dead_lettered"`
}

// LastFailure is the latest handler failure of the consumer, nil when its
// handlers never failed since holdfast started.
func (s *Stats) LastFailure() *Failure { return s.lastFailure.Load() }

// noteFailure records a handler's failure on m as the latest.
func (s *Stats) noteFailure(m *handler.Message, reason string, deadLettered bool) {
	s.lastFailure.Store(&Failure{Time: time.Now(), Seq: m.Sequence, Subject: m.Subject, Delivery: m.Delivery,
		Reason: reason, DeadLettered: deadLettered})
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
	// PullFailGrace is how long pull requests may fail before it is
	// logged as a warning; DefaultPullFailGrace when zero.
	PullFailGrace time.Duration

	advisory *nats.Subscription
	replay   *nats.Subscription
	domain   string     // the local JetStream domain, which advisories must carry
	bg       background // dead-letter retries, advisories and replays being handled

	queue       chan delivery // received messages waiting for a worker
	slots       chan int      // the free places in held
	held        []heldMsg     // every message received and not yet settled
	fetcherDone chan struct{}
	heldBytes   atomic.Int64  // the bytes of the messages in held (see MaxHeldBytes)
	aliveStop   chan struct{} // closed when the workers stopped
	aliveDone   chan struct{} // closed when the in-progress ticker stopped
	// ackWait is the consumer's ack_wait in nanoseconds (see AckWait);
	// ackWaitChanged wakes the in-progress ticker when it changed.
	ackWait        atomic.Int64
	ackWaitChanged chan struct{}
	acks           *acker
	puller         *puller
	// ackConfirmTimeout bounds the wait for the server to confirm a
	// batch of acks (defaultAckConfirmTimeout; shorter in tests).
	ackConfirmTimeout time.Duration

	stopping      atomic.Bool
	alive         atomic.Int32 // worker goroutines running
	runCtx        context.Context
	cancelRun     context.CancelFunc
	handlerCtx    context.Context
	cancelHandler context.CancelFunc
	wg            sync.WaitGroup
	closeOnce     sync.Once

	activity activity // read by the Monitor through Activity

	// handlerNanos is a moving average of the handlers' durations (0:
	// none finished yet), for depth.
	handlerNanos atomic.Int64
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
	w := &Workers{
		stats:           stats,
		js:              js,
		nc:              nc,
		opts:            opts,
		log:             log.With("component", "workers", "consumer", opts.Consumer, "stream", opts.Stream),
		ShutdownTimeout: 20 * time.Second,

		ackConfirmTimeout: defaultAckConfirmTimeout,
	}
	w.activity.running = make([]atomic.Int64, opts.Workers)
	w.activity.retryBook = &stats.delayed
	w.ackWait.Store(int64(opts.AckWait))
	w.ackWaitChanged = make(chan struct{}, 1)
	return w
}

// Stats returns the live counters.
func (w *Workers) Stats() *Stats { return w.stats }

// Draining reports whether Close has begun: the workers take no new
// message and wait for the handlers still running.
func (w *Workers) Draining() bool { return w.stopping.Load() }

// Running reports whether every worker goroutine and the fetcher are
// alive and the workers are not shutting down.
func (w *Workers) Running() bool {
	if w.stopping.Load() || int(w.alive.Load()) != w.opts.Workers || w.fetcherDone == nil {
		return false
	}
	select {
	case <-w.fetcherDone:
		return false
	default:
		return true
	}
}

// Options returns the options the workers run with.
func (w *Workers) Options() ConsumerOptions { return w.opts }

// Open looks up the durable consumer, subscribes to its max-deliveries
// advisories and starts the fetcher and the workers.
func (w *Workers) Open(ctx context.Context) error {
	if w.opts.Handler == nil {
		return fmt.Errorf("consumer %s: no handler", w.opts.Consumer)
	}
	// The pulls name the consumer by its subject; it must exist now.
	if err := w.lookUpConsumer(ctx); err != nil {
		return err
	}
	w.runCtx, w.cancelRun = context.WithCancel(context.Background())
	w.handlerCtx, w.cancelHandler = context.WithCancel(context.Background())
	// Advisories first: one about a message pulled from now on is not missed.
	if err := w.subscribeDeadLetters(ctx); err != nil {
		w.cancelRun()
		w.cancelHandler()
		return err
	}
	capacity := w.capacity()
	var err error
	w.puller, err = newPuller(w.js, w.opts.Stream, w.opts.Consumer, capacity+16)
	if err != nil {
		w.cancelRun()
		w.cancelHandler()
		return err
	}
	w.queue = make(chan delivery, capacity)
	w.slots = make(chan int, capacity)
	w.held = make([]heldMsg, capacity)
	for i := range capacity {
		w.slots <- i
	}
	w.acks = newAcker(w, capacity)
	w.aliveStop, w.aliveDone = make(chan struct{}), make(chan struct{})
	go w.keepHeldAlive()
	w.fetcherDone = make(chan struct{})
	go w.fetch()
	// Messages whose last delivery a previous stop interrupted (Close
	// waits for it like for the other background work).
	w.spawn(w.resumeInterrupted)
	for i := 0; i < w.opts.Workers; i++ {
		w.wg.Add(1)
		w.alive.Add(1)
		go w.work(i)
	}
	w.log.Info("workers started", "workers", w.opts.Workers, "prefetch", w.opts.Prefetch, "max_prefetch", max(w.opts.Prefetch, w.opts.MaxPrefetch), "dead_letter", w.opts.DeadLetter)
	return nil
}

// lookUpConsumer checks that the consumer exists. A server busy with a
// slow disk, or a clustered consumer electing its leader right after the
// bootstrap created it, may answer after the client's timeout (seen under
// load: "consumer WORKER1 on stream ORDERS: context deadline exceeded",
// and holdfast run stopped at start-up): that is asked again
// (settle.Retry); any other error fails at once.
func (w *Workers) lookUpConsumer(ctx context.Context) error {
	err := settle.Retry(ctx, settle.Late, func(attempt int, err error) {
		w.log.Warn("the consumer's info did not come in time: asking again", "consumer", w.opts.Consumer, "attempt", attempt, "err", err)
	}, func() error {
		_, err := w.js.Consumer(ctx, w.opts.Stream, w.opts.Consumer)
		return err
	})
	if err != nil {
		return fmt.Errorf("consumer %s on stream %s: %w", w.opts.Consumer, w.opts.Stream, err)
	}
	return nil
}

// fetchWait bounds each pull request: an idle consumer sends one such
// request per fetchWait, and Close waits at most that long for the last
// one to end.
const fetchWait = time.Second

// capacity is how many messages the workers may hold at once: one per
// worker plus the deepest prefetch. Every one of them has its ack-wait
// clock covered from the moment it is received (see fetch).
func (w *Workers) capacity() int {
	return w.opts.Workers + max(w.opts.Prefetch, w.opts.MaxPrefetch, 0)
}

// queueHorizon is how much of the handlers' work the fetcher may hold
// queued beyond Prefetch: with handlers that keep up, a pull request is
// for as many messages as they handle in this time (up to MaxPrefetch).
// Each pull request costs a round trip during which the server delivers
// nothing, so fast handlers drain faster with fewer, larger ones; slow
// ones keep Prefetch, so that a node does not hoard what other nodes'
// workers could take.
const queueHorizon = 100 * time.Millisecond

// depth is how many messages the fetcher may hold now: one per worker plus
// Prefetch, or more while the handlers take on average so little that
// queueHorizon of their work is more (at most MaxPrefetch).
func (w *Workers) depth() int {
	ahead := max(w.opts.Prefetch, 0)
	if avg := w.handlerNanos.Load(); avg > 0 && w.opts.MaxPrefetch > ahead {
		ahead = max(ahead, int(min(int64(w.opts.MaxPrefetch), int64(queueHorizon)*int64(w.opts.Workers)/avg)))
	}
	return w.opts.Workers + ahead
}

// noteHandlerTime adds one handler's duration to the moving average depth
// uses (an update lost to a concurrent one does not matter).
func (w *Workers) noteHandlerTime(took time.Duration) {
	took = max(took, 1)
	avg := w.handlerNanos.Load()
	if avg == 0 {
		w.handlerNanos.Store(int64(took))
		return
	}
	w.handlerNanos.Store(avg + (int64(took)-avg)/16)
}

// delivery is a message received from the server and its place in held.
type delivery struct {
	msg  jetstream.Msg
	slot int
	size int // counted in heldBytes
}

// heldMsg is a message in holdfast's hands (queued or being handled) and
// when the server last heard that it is: received or in progress.
type heldMsg struct {
	mu    sync.Mutex
	msg   jetstream.Msg // nil when the place is free
	alive time.Time
}

func (h *heldMsg) set(msg jetstream.Msg, now time.Time) {
	h.mu.Lock()
	h.msg, h.alive = msg, now
	h.mu.Unlock()
}

func (h *heldMsg) clear() {
	h.mu.Lock()
	h.msg = nil
	h.mu.Unlock()
}

// due returns the held message when its last sign of life is older than
// after, and notes now as its new one.
func (h *heldMsg) due(now time.Time, after time.Duration) jetstream.Msg {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.msg == nil || now.Sub(h.alive) < after {
		return nil
	}
	h.alive = now
	return h.msg
}

// keepHeldAlive is one ticker for every message the workers hold: each
// ack_wait/4 it sends an in-progress ack for every message whose last sign
// of life (its receipt, or the last in-progress ack) is ack_wait/2 old, so
// none goes ack_wait without one (at most 3/4 of it) — whether it waits in
// the queue behind slow handlers or is being handled. A message handled
// well within ack_wait/2 costs nothing here but two stores.
//
// The pace follows the consumer's ack_wait as the server has it now (see
// SetAckWait), not only the one the workers started with.
func (w *Workers) keepHeldAlive() {
	defer close(w.aliveDone)
	every := w.inProgressInterval()
	t := time.NewTicker(every / 2)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-w.ackWaitChanged:
			every = w.inProgressInterval()
			t.Reset(every / 2)
			continue
		case <-w.aliveStop:
			return
		}
		w.sendInProgress(time.Now(), every)
	}
}

// sendInProgress sends an in-progress ack for every held message whose
// last sign of life (receipt or in-progress ack) was at least after
// before now.
func (w *Workers) sendInProgress(now time.Time, after time.Duration) {
	for i := range w.held {
		msg := w.held[i].due(now, after)
		if msg == nil {
			continue
		}
		// Already acked: it was settled since; nothing to keep alive.
		if err := msg.InProgress(); err != nil && !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
			w.log.Warn("in-progress ack failed", "subject", msg.Subject(), "err", err)
		}
	}
}

// fetch pulls as many messages as there are free places, and keeps each
// message alive from the moment it is received (keepHeldAlive) — whether
// a handler takes it at once or it waits in the queue behind slow
// handlers — so that no message can outlive ack_wait in holdfast's hands
// and be delivered a second time while the first is still being handled.
// Pull requests are for free places only: nothing is buffered where
// holdfast cannot see it.
//
// How many it holds at once follows the handlers (depth): the free places
// beyond that stay with the fetcher until the handlers free more.
func (w *Workers) fetch() {
	defer close(w.fetcherDone)
	defer close(w.queue)
	var fails pullFailures
	capacity := cap(w.slots)
	free := make([]int, 0, capacity) // free places the fetcher took
	for {
		if w.paused() {
			select {
			case <-w.runCtx.Done():
				return
			case <-time.After(pausePoll):
			}
			continue
		}
	more:
		for len(free) < capacity {
			select {
			case i := <-w.slots:
				free = append(free, i)
			default:
				break more
			}
		}
		n := min(len(free), w.depth()-(capacity-len(free)))
		room, fits := w.roomForBytes()
		if n <= 0 || !fits {
			// Nothing free, as many messages held as the handlers should
			// have, or as many bytes as allowed (MaxHeldBytes): wait for a
			// worker to free a place.
			select {
			case i := <-w.slots:
				free = append(free, i)
			case <-w.runCtx.Done():
				return
			}
			continue
		}
		if w.runCtx.Err() != nil {
			// No pull request after the drain began (see giveBack).
			return
		}
		got, err := w.fetchBatch(free[:n], room)
		free = append(free[:0], free[got:]...)
		if w.runCtx.Err() != nil {
			return
		}
		w.logPull(&fails, err)
		if err == nil {
			continue
		}
		select {
		case <-w.runCtx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// DefaultPullFailGrace is how long pulls may fail before a warning: while
// a consumer's leader is elected (at a cluster's start, after a node is
// lost: nats-server's election timeout is 4 to 9 s) its pull requests get
// no responders (503), and that is no fault.
const DefaultPullFailGrace = 20 * time.Second

// pullFailures are the failed pull requests in a row.
type pullFailures struct {
	n      int
	since  time.Time
	warned bool
}

// logPull logs the outcome of a pull request that ended with err: a
// failure at debug level until failures have lasted PullFailGrace, then
// as a warning (again every 60 failures), and the end of the failures
// that were warned of.
func (w *Workers) logPull(f *pullFailures, err error) {
	if err == nil {
		if f.warned {
			w.log.Info("pulling messages again", "after", time.Since(f.since).Round(time.Second))
		}
		*f = pullFailures{}
		return
	}
	if f.n++; f.n == 1 {
		f.since = time.Now()
	}
	grace := w.PullFailGrace
	if grace <= 0 {
		grace = DefaultPullFailGrace
	}
	switch failing := time.Since(f.since); {
	case failing < grace:
		w.log.Debug("cannot pull messages yet (the consumer's leader may be being elected); trying again", "err", err, "attempts", f.n)
	case !f.warned || f.n%60 == 0:
		f.warned = true
		w.log.Warn("cannot pull messages: workers idle until the consumer answers again", "err", err, "attempts", f.n, "for", failing.Round(time.Second))
	}
}

// fetchBatch sends one pull request for len(free) messages and queues
// what arrives, in the places free names in order; it returns how many it
// queued.
//
// The request runs to its end even when the workers stop (at most
// fetchWait); what arrives after the drain began is given back when the
// request has ended, not before: a message given back while the request
// is open is delivered to it again at once, and again, each time spending
// a delivery of max_deliver (see giveBack).
func (w *Workers) fetchBatch(free []int, maxBytes int) (int, error) {
	got := 0
	var late []jetstream.Msg
	// Every message of the request counts as received when the request
	// was sent: no later than the server's ack-wait clock started, so its
	// keep-alive comes early rather than late, for one clock read per
	// request instead of one per message.
	sent := time.Now()
	_, err := w.puller.pull(context.Background(), len(free), maxBytes, fetchWait, func(msg jetstream.Msg) {
		if w.stopping.Load() {
			late = append(late, msg)
			return
		}
		slot := free[got]
		w.held[slot].set(msg, sent)
		got++
		size := msgSize(msg)
		w.heldBytes.Add(int64(size))
		w.queue <- delivery{msg: msg, slot: slot, size: size} // never blocks: a place was taken for it
	})
	for _, msg := range late {
		w.giveBack(msg)
	}
	return got, err
}

// roomForBytes returns how many bytes a pull request may ask for now, and
// whether that is enough for any one message (the server's max_payload
// and what it adds to a delivered message): a request for less could be
// ended at once by a large message, again and again.
func (w *Workers) roomForBytes() (int, bool) {
	one := int(w.nc.MaxPayload()) + heldOverhead
	budget := max(cmp.Or(w.opts.MaxHeldBytes, DefaultMaxHeldBytes), 2*one)
	room := budget - int(w.heldBytes.Load())
	return room, room >= one
}

// heldOverhead is what a delivered message adds to its payload at most:
// subject (bounded by the control line), ack reply and the headers the
// server adds.
const heldOverhead = 8 << 10

// msgSize is a received message's size as the server counts it against a
// pull request's max_bytes.
func msgSize(msg jetstream.Msg) int {
	if p, ok := msg.(*pulledMsg); ok {
		return p.msg.Size()
	}
	return len(msg.Subject()) + len(msg.Reply()) + len(msg.Data())
}

// pausePoll is how often paused workers ask whether to go on.
const pausePoll = 100 * time.Millisecond

func (w *Workers) paused() bool { return w.opts.Paused != nil && w.opts.Paused() }

// work is worker i: it handles queued messages until the queue closes.
func (w *Workers) work(i int) {
	defer w.alive.Add(-1)
	defer w.wg.Done()
	bh, batching := w.opts.Handler.(handler.BatchHandler)
	batching = batching && w.opts.Workers == 1
	for d := range w.queue {
		if batching && !w.stopping.Load() {
			batch := w.gather(d)
			w.processBatch(i, bh, batch)
			for _, d := range batch {
				w.held[d.slot].clear()
				w.heldBytes.Add(-int64(d.size))
				w.slots <- d.slot
			}
			continue
		}
		if w.stopping.Load() {
			// Queued when the drain began: give it back once the last
			// pull request has ended (see giveBack).
			<-w.fetcherDone
			w.giveBack(d.msg)
		} else {
			w.process(i, d.msg)
		}
		w.held[d.slot].clear()
		w.heldBytes.Add(-int64(d.size))
		w.slots <- d.slot
	}
}

// gather is d and what else is queued now, in order, up to
// handler.MaxBatch: what a BatchHandler gets at once.
func (w *Workers) gather(d delivery) []delivery {
	batch := []delivery{d}
	for len(batch) < handler.MaxBatch {
		select {
		case next, ok := <-w.queue:
			if !ok {
				return batch
			}
			batch = append(batch, next)
		default:
			return batch
		}
	}
	return batch
}

// processBatch runs a BatchHandler on the messages of batch in worker i
// and settles each by its result as the handler gives it, as process does
// for one. A drain that began meanwhile gives them back unhandled.
func (w *Workers) processBatch(i int, bh handler.BatchHandler, batch []delivery) {
	if w.stopping.Load() {
		<-w.fetcherDone
		for _, d := range batch {
			w.giveBack(d.msg)
		}
		return
	}
	msgs := make([]jetstream.Msg, 0, len(batch))
	ms := make([]*handler.Message, 0, len(batch))
	for _, d := range batch {
		md, err := d.msg.Metadata()
		if err != nil {
			w.log.Error("message without JetStream metadata: terminated", "subject", d.msg.Subject(), "err", err)
			_ = d.msg.Term()
			continue
		}
		msgs = append(msgs, d.msg)
		ms = append(ms, w.messageOf(d.msg, md))
	}
	if len(ms) == 0 {
		return
	}
	w.stats.InFlight.Add(int64(len(ms)))
	start := time.Now()
	w.activity.begin(i, ms[0].Sequence, start)
	settled := make([]bool, len(ms))
	done := func(k int, res handler.Result) {
		if k < 0 || k >= len(ms) || settled[k] {
			w.log.Error("batch handler gave a result twice or for no message: ignored", "index", k)
			return
		}
		settled[k] = true
		res.Reason = handler.OneLine(res.Reason, maxReason)
		took := time.Since(start)
		w.noteHandlerTime(took / time.Duration(len(ms)))
		w.stats.InFlight.Add(-1)
		w.stats.Processed.Add(1)
		if w.opts.OnResult != nil {
			w.opts.OnResult(w.opts.Consumer, res, took)
		}
		w.settle(msgs[k], ms[k], res)
	}
	reason := w.handleBatch(bh, ms, done)
	w.activity.end(i)
	for k := range ms {
		if !settled[k] {
			done(k, handler.RetryLater(reason))
		}
	}
}

// handleBatch calls the BatchHandler; it returns the reason of the retry
// for the messages it gave no result (a panic, or none given).
func (w *Workers) handleBatch(bh handler.BatchHandler, ms []*handler.Message, done func(int, handler.Result)) (reason string) {
	defer func() {
		if r := recover(); r != nil {
			w.log.Error("handler panicked", "seq", ms[0].Sequence, "msgs", len(ms), "panic", r, "stack", string(debug.Stack()))
			reason = fmt.Sprintf("handler panicked: %v", r)
		}
	}()
	bh.HandleBatch(w.handlerCtx, ms, done)
	return "the handler gave no result for this message"
}

// process runs the handler on one message in worker i and settles it.
func (w *Workers) process(i int, msg jetstream.Msg) {
	md, err := msg.Metadata()
	if err != nil {
		w.log.Error("message without JetStream metadata: terminated", "subject", msg.Subject(), "err", err)
		_ = msg.Term()
		return
	}
	m := w.messageOf(msg, md)

	w.stats.InFlight.Add(1)
	start := time.Now()
	w.activity.begin(i, m.Sequence, start)
	res := w.handle(msg, m)
	took := time.Since(start)
	w.noteHandlerTime(took)
	w.activity.end(i)
	w.stats.InFlight.Add(-1)
	w.stats.Processed.Add(1)
	if w.opts.OnResult != nil {
		w.opts.OnResult(w.opts.Consumer, res, took)
	}
	w.settle(msg, m, res)
}

// handle calls the handler, turning a panic into a retry. The message is
// kept alive with in-progress acks from its receipt until it is settled
// (see fetch).
func (w *Workers) handle(msg jetstream.Msg, m *handler.Message) (res handler.Result) {
	defer func() {
		if r := recover(); r != nil {
			w.log.Error("handler panicked", "seq", m.Sequence, "panic", r, "stack", string(debug.Stack()))
			res = handler.RetryLater(fmt.Sprintf("handler panicked: %v", r))
		}
		res.Reason = handler.OneLine(res.Reason, maxReason)
	}()
	return w.opts.Handler.Handle(w.handlerCtx, m)
}

// maxReason bounds a handler's Reason (cut, on one line) before it is
// logged or becomes a dead letter's Holdfast-Error header: the server
// accepts embedded.DeadLetterHeadroom (8 KiB) beyond max_payload for
// the headers a dead letter adds, the original subject (up to 4,000
// bytes) among them. A longer reason (a Go handler's error chain, an
// endpoint's redirect to a huge URL) made the dead letter of a large
// message too large to store, at every attempt.
const maxReason = 1024

// settle acks, naks or dead-letters a handled message.
func (w *Workers) settle(msg jetstream.Msg, m *handler.Message, res handler.Result) {
	if w.handlerCtx.Err() != nil && res.Outcome != handler.Success {
		// Cancelled by shutdown: hand it back for the next start, once
		// the last pull request has ended (see giveBack).
		w.log.Info("handler interrupted by shutdown: message returned", "seq", m.Sequence)
		<-w.fetcherDone
		w.giveBack(msg)
		return
	}
	switch res.Outcome {
	case handler.Success:
		// Acked off the worker's path, confirmed by batch (see acker): a
		// lost ack is seen and counted, and the message comes back.
		w.acks.add(msg, m.Sequence)
	case handler.Retry:
		if w.opts.MaxDeliver > 0 && m.Delivery >= uint64(w.opts.MaxDeliver) {
			reason := fmt.Sprintf("gave up after %d deliveries: %s", m.Delivery, res.Reason)
			w.stats.noteFailure(m, reason, true)
			w.deadLetter(msg, m, reason, true)
			return
		}
		w.stats.noteFailure(m, res.Reason, false)
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
		w.activity.delayed(m.Sequence, time.Now().Add(delay), res.Reason)
		w.log.Warn("handler failed: will retry", "seq", m.Sequence, "subject", m.Subject,
			"delivery", m.Delivery, "max_deliver", w.opts.MaxDeliver, "retry_in", delay, "reason", res.Reason)
	case handler.Permanent:
		w.stats.noteFailure(m, res.Reason, true)
		w.deadLetter(msg, m, res.Reason, m.Delivery >= uint64(w.opts.MaxDeliver))
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
		if w.paused() {
			// Paused handlers wait (for a hub), they do not work: give
			// their messages back now rather than after ShutdownTimeout.
			w.cancelHandler()
		}
		done := make(chan struct{})
		// Advisories and replays are taken until the workers stopped; a
		// message kept for its dead letter is held until the timeout.
		go func() {
			w.wg.Wait()
			<-w.fetcherDone
			close(w.aliveStop)
			<-w.aliveDone
			w.acks.close() // the last acks sent and confirmed
			w.puller.close()
			w.closeDeadLetters()
			close(done)
		}()
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
		// A reload replaces the handler: its keep-alive connections would
		// stay open, idle, until the endpoint or the idle timeout (90s)
		// closed them — one per worker at each reload.
		if c, ok := w.opts.Handler.(interface{ CloseIdleConnections() }); ok {
			c.CloseIdleConnections()
		}
		w.log.Info("workers stopped", "processed", w.stats.Processed.Load(), "acked", w.stats.Acked.Load(),
			"retried", w.stats.Retried.Load(), "dead_lettered", w.stats.DeadLettered.Load())
	})
	return nil
}

// Activity is what a consumer's workers are doing now, read by the
// Monitor to tell a consumer that waits on purpose (a handler still
// running, a retry delayed by the backoff or a Retry-After) from one that
// is stuck.
type Activity struct {
	// Running holds the start time of each handler running now, oldest
	// first.
	Running []time.Time
	// DelayedRetries counts the messages given back with a delay
	// (NakWithDelay) whose redelivery is not due yet; RetryDue is when the
	// last of them is due.
	DelayedRetries int
	RetryDue       time.Time
	// Paused: the workers wait on purpose (ConsumerOptions.Paused).
	Paused bool
}

// Activity returns what the workers are doing at now. It is cheap and
// only reads.
func (w *Workers) Activity(now time.Time) Activity {
	act := w.activity.snapshot(now)
	act.Paused = w.paused()
	return act
}

// activity records the handlers running and the retries delayed on
// purpose, for Activity. A handler's start and end are two atomic stores;
// the lock is taken only while delayed retries are known.
type activity struct {
	running []atomic.Int64 // per worker: when its handler started (Unix ns), 0 when idle
	*retryBook
}

// retryBook records the retries delayed on purpose, by stream sequence
// (see Stats.delayed).
type retryBook struct {
	nRetries atomic.Int64 // len(retries)

	mu      sync.Mutex
	retries map[uint64]delayedRetry // stream sequence -> the retry asked for
}

// delayedRetry is a message given back to be redelivered at due, because
// the handler asked for a retry for reason.
type delayedRetry struct {
	due    time.Time
	reason string
}

// begin notes worker i starting a handler at at on the message with
// stream sequence seq (a delayed retry of it has arrived).
func (a *activity) begin(i int, seq uint64, at time.Time) {
	a.running[i].Store(at.UnixNano())
	if a.nRetries.Load() == 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.retries, seq)
	a.nRetries.Store(int64(len(a.retries)))
}

// end notes worker i's handler returning.
func (a *activity) end(i int) { a.running[i].Store(0) }

// retryForget is how long after its due time a delayed retry that never
// came back (removed from the stream, taken by another client) is
// forgotten.
const retryForget = time.Minute

// delayed notes that the message with stream sequence seq was given back
// to be redelivered at due, the handler having asked for a retry for
// reason.
func (a *activity) delayed(seq uint64, due time.Time, reason string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.retries == nil {
		a.retries = map[uint64]delayedRetry{}
	}
	a.retries[seq] = delayedRetry{due: due, reason: reason}
	a.nRetries.Store(int64(len(a.retries)))
}

// retryReason is the reason of the retry the message with stream sequence
// seq waits for, if these workers gave it back for one.
func (a *activity) retryReason(seq uint64) (string, bool) {
	if a.nRetries.Load() == 0 {
		return "", false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	r, ok := a.retries[seq]
	return r.reason, ok
}

func (a *activity) snapshot(now time.Time) Activity {
	a.mu.Lock()
	defer a.mu.Unlock()
	var act Activity
	for i := range a.running {
		if at := a.running[i].Load(); at != 0 {
			act.Running = append(act.Running, time.Unix(0, at))
		}
	}
	for seq, r := range a.retries {
		due := r.due
		switch {
		case due.After(now):
			act.DelayedRetries++
			if due.After(act.RetryDue) {
				act.RetryDue = due
			}
		case now.Sub(due) > retryForget:
			delete(a.retries, seq)
		}
	}
	a.nRetries.Store(int64(len(a.retries)))
	slices.SortFunc(act.Running, func(x, y time.Time) int { return x.Compare(y) })
	return act
}
