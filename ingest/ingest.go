// Package ingest is holdfast's group commit: it answers the JetStream
// publishes on a stream's subjects, stores them in atomic batches — one
// flush for many messages under sync = "always" — and gives each client
// the PubAck the server would have given, once the batch holding its
// message is committed.
//
// The stored stream listens on the configured subjects behind
// subjects.GroupCommitPrefix (clients may not publish there) and maps them
// back with a subject transform, so consumers see the configured subjects.
//
// Batches form leader/follower style: a message that arrives while nothing
// is in flight is published at once, alone (a lone publisher waits for one
// flush, as without group commit); whatever arrives while a commit is in
// flight joins the next batch. Everything goes out in arrival order on one
// connection, and the stream applies its inbound messages and batch commits
// one at a time in that order, so several batches may be in flight and
// still be stored in the order they were sent (see
// embedded/natsassume_test.go).
package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/internal/settle"
	"github.com/holdfast-io/holdfast/internal/subjects"
)

// How batches are cut (docs/group-commit.md documents these figures).
const (
	// maxBatch is nats-server's default maximum atomic batch size (see
	// embedded/natsassume_test.go).
	maxBatch = 1000
	// maxBatchBytes bounds the bytes of one batch.
	maxBatchBytes = 8 << 20
	// maxInflight is how many batches one stream may have in flight (the
	// server allows 50 per stream, 1000 per server).
	maxInflight = 4
	// minBatch is the smallest batch: fewer messages are published one by
	// one (pipelined), because an atomic batch has a fixed cost (the
	// server stages it in a store of its own) of about a dozen single
	// flushed messages.
	minBatch = 16
	// answerTimeout is how long a batch may go unanswered before its
	// clients are given up on (they see their own publish timeout).
	answerTimeout = 30 * time.Second
	// stallAfter is how long a unit may go unanswered before dispatch
	// stops holding later messages back for it. A stream deleted with
	// messages still queued (nats-server drops them) answers none of them:
	// waiting answerTimeout for that unit would leave every publisher
	// after it without an answer for longer than its own timeout (nats.go:
	// 5 s), where without group commit only the dropped messages' clients
	// would time out. A commit takes milliseconds; a unit that was only
	// slow still has its clients answered when its answer comes.
	stallAfter = 2 * time.Second
)

// Options configure a Committer.
type Options struct {
	// Stream is the configured stream name (the stored stream has it too).
	Stream string
	// Subjects are the configured subjects the clients publish to.
	Subjects []string
	// MaxMsgSize is the stream's max_msg_size: a message that would
	// exceed it in a batch (data and header block with the batch headers
	// added) is published alone, so that the server stores it, or refuses
	// it with its own error, instead of failing a batch. 0: no limit.
	MaxMsgSize int
	// DuplicateWindow is the stream's duplicate window: a Nats-Msg-Id sent
	// within it goes alone next time (the server answers "duplicate"
	// instead of refusing a whole batch for it).
	DuplicateWindow time.Duration
	// DiscardNew: the stream refuses publishes when full (discard new).
	// A batch it refuses must be published again in place, or later
	// messages would be stored after the refused ones: each batch is
	// followed by nothing until it is answered, however long that takes
	// (up to answerTimeout).
	DiscardNew bool
	// AllowAtomic: the configured stream takes clients' own atomic
	// batches (a hub's stream of edge messages). Otherwise a message
	// with Nats-Batch-Id is refused as the stream without group commit
	// refuses it.
	AllowAtomic bool
	// Metrics, when set, observes each commit.
	Metrics *Metrics
	// stall replaces the constant stallAfter when set (tests).
	stall time.Duration
	// MaxWaitingBytes and MaxWaitingMsgs bound the messages taken and
	// not yet sent (0: DefaultMaxWaitingBytes, DefaultMaxWaitingMsgs);
	// past either, a publish gets the server's own "too many requests"
	// (code 429) at once, as from a stream whose inbound queue is full.
	MaxWaitingBytes int
	MaxWaitingMsgs  int
	// Flush, when set, makes durable what the stream stored before the
	// call (jetstream.commit_window: the server does not flush itself).
	// Every answer to a client then waits for a Flush after the stream
	// answered: the publishes that went with the clients' replies go with
	// this committer's instead, and their answers are relayed.
	Flush func() error
}

// DefaultMaxWaitingBytes and DefaultMaxWaitingMsgs are the server's
// default limits of a stream's inbound queue, beyond which it answers
// publishes with "too many requests": group commit queues them in its
// stead.
const (
	DefaultMaxWaitingBytes = 128 << 20
	DefaultMaxWaitingMsgs  = 100_000
)

// inChanLen is the capacity of the channel the subscriptions deliver
// into; the NATS client drops a message that finds it full, and its
// publisher gets no answer at all. Only the intake goroutine reads it,
// taking each message off in constant time (queued or refused with 429),
// so that it never waits for the committing (see intake).
const inChanLen = 1 << 16

// OptionsFor returns the Options of stream name's ingest under cfg: what
// a change of, on reload, means starting the ingest again.
func OptionsFor(cfg *config.Config, name string) Options {
	sc := cfg.Streams[name]
	subjs := slices.Clone(sc.Subjects)
	if cfg.TakesBarrier(name) {
		// The MQTT gate's barriers arrive on the same channel as the
		// devices' messages, so in their order, and go to the stream
		// alone (a Nats-* header) after them (embedded/mqtt).
		subjs = append(subjs, subjects.Barrier(cfg.Server.Name, name))
	}
	return Options{Stream: name, Subjects: subjs, MaxMsgSize: int(cfg.StreamMaxMsgSize(name)),
		DuplicateWindow: sc.DuplicateWindow.Duration, DiscardNew: sc.Discard == "new", AllowAtomic: cfg.TakesEdgeMessages(name)}
}

// Stats are a Committer's counters since Open.
type Stats struct {
	// Batches and BatchedMsgs count the atomic batches committed and the
	// messages in them.
	Batches     uint64 `json:"batches"`
	BatchedMsgs uint64 `json:"batched_msgs"`
	// Alone counts messages published alone because fewer than minBatch
	// waited (the server answers their clients directly).
	Alone uint64 `json:"alone"`
	// Forwarded counts messages published with the client's own reply
	// (a Nats-* header other than Nats-Msg-Id, too large, and the
	// messages of a refused batch published one by one).
	Forwarded uint64 `json:"forwarded"`
	// Refused counts batches the server refused.
	Refused uint64 `json:"refused"`
	// Throttled counts publishes refused with "too many requests"
	// because too many waited (Options.MaxWaitingBytes).
	Throttled uint64 `json:"throttled"`
	// BatchTime is the time from sending to the answer, summed over the
	// committed batches (nanoseconds in JSON).
	BatchTime time.Duration `json:"batch_time_ns"`
}

// Committer is the group commit of one stream.
type Committer struct {
	nc   *nats.Conn
	opts Options
	log  *slog.Logger

	in      chan *nats.Msg
	replies chan *nats.Msg
	// intakeDone is closed when intake has taken everything from in.
	intakeDone chan struct{}
	// queue holds what intake took and run has not: run is told on
	// queued. waitingMsgs and waitingBytes count queue and pend together
	// (the limits of Options); throttling is set while publishes are
	// refused for them. All four are under qmu.
	qmu          sync.Mutex
	queue        []item
	queued       chan struct{}
	waitingMsgs  int
	waitingBytes int
	throttling   bool
	// tooMany is the answer to a publish refused for the waiting limits.
	tooMany []byte
	// hold, when set, runs before each step of the run goroutine (tests
	// hold it up with it, as a busy goroutine would be).
	hold    func()
	subs    []*nats.Subscription
	rsub    *nats.Subscription
	inbox   string
	closing chan struct{}
	done    chan struct{}
	cancel  context.CancelFunc
	once    sync.Once
	opened  bool

	batches, batchedMsgs, alone, forwarded, refused, throttled, batchNanos atomic.Uint64

	// With Options.Flush: the clients' replies of what went out with a
	// relay reply (by its last token), the subscription that takes the
	// stream's answers to them, and the answers waiting for a flush.
	relayMu    sync.Mutex
	relays     map[string]relay
	relayNext  uint64
	relayInbox string
	relaySub   *nats.Subscription
	answers    chan *nats.Msg
	flushStop  chan struct{}
	flushDone  chan struct{}

	// Owned by the run goroutine.
	pend     []item
	pendSize int // the sizes of pend's items, summed
	inflight map[string]*unit
	live     int    // units in flight not stalled (see stallAfter)
	risky    int    // units in flight that must not be followed (see dispatch)
	sent     uint64 // units and forwards sent, in order
	nextID   uint64
	ids      map[string]struct{} // Nats-Msg-Ids sent within the duplicate window
	idOrder  []sentID            // the same ids with their time, oldest first
	// unflushed is the target of the last message published with its
	// client's reply since the last unit went out, or "": the stream may
	// not have applied it yet (see dispatch). fwd are those messages.
	unflushed string
	fwd       []item
}

// relay is a client's reply a publish went out in place of.
type relay struct {
	reply string
	at    time.Time
}

// maxKnownIDs bounds the Nats-Msg-Ids remembered; past it the oldest half
// is forgotten (a forgotten duplicate costs one refused batch).
const maxKnownIDs = 1 << 18

type sentID struct {
	id string
	at time.Time
}

type item struct {
	m     *nats.Msg
	size  int
	msgID string
	alone bool // forwarded with the client's reply
}

type unit struct {
	msgs  []item
	order uint64 // value of sent when this unit went out
	start time.Time
	risky bool
	// stalled: unanswered for stallAfter; nothing waits for it any more.
	stalled bool
	// marker: msgs went out alone with the clients' replies, followed by
	// a marker the stream answers after them (see sendSingles).
	marker bool
	// before are the messages published with their clients' replies
	// just before this unit: if the stream is missing, the server's
	// "no responders" for them came to this connection, not to them.
	before []item
}

// New returns a Committer for one stream on nc (an in-process connection
// allowed to subscribe to the stream's subjects and to publish under
// subjects.GroupCommitPrefix). Open starts it.
func New(nc *nats.Conn, opts Options, log *slog.Logger) *Committer {
	if opts.MaxWaitingBytes <= 0 {
		opts.MaxWaitingBytes = DefaultMaxWaitingBytes
	}
	if opts.MaxWaitingMsgs <= 0 {
		opts.MaxWaitingMsgs = DefaultMaxWaitingMsgs
	}
	tooMany, _ := json.Marshal(pubAck{Stream: opts.Stream, Error: &apiError{Code: 429, ErrCode: errTooManyRequests, Description: "too many requests"}})
	return &Committer{nc: nc, opts: opts, tooMany: tooMany, log: log.With("component", "ingest", "stream", opts.Stream)}
}

// queueGroup is the queue group of the subscriptions on the stream's
// subjects: with several holdfast nodes, each publish is answered once.
func queueGroup(stream string) string { return subjects.GroupCommitQueue(stream) }

// Open subscribes to the stream's subjects and starts committing. When it
// fails, nothing is left subscribed and Close has nothing to do.
func (c *Committer) Open(ctx context.Context) error {
	if c.opened {
		return errors.New("ingest already open")
	}
	if c.opts.Stream == "" || len(c.opts.Subjects) == 0 {
		return errors.New("ingest: stream and subjects are required")
	}
	if err := c.subscribe(ctx); err != nil {
		c.unsubscribe()
		return fmt.Errorf("ingest %s: %w", c.opts.Stream, err)
	}
	c.closing = make(chan struct{})
	c.done = make(chan struct{})
	c.intakeDone = make(chan struct{})
	c.queued = make(chan struct{}, 1)
	c.inflight = make(map[string]*unit)
	c.ids = make(map[string]struct{})
	rctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	c.opened = true
	if c.opts.Flush != nil {
		c.flushStop = make(chan struct{})
		c.flushDone = make(chan struct{})
		go c.flusher()
	}
	go c.intake(rctx)
	go c.run(rctx)
	c.log.Info("group commit on", "subjects", c.opts.Subjects, "stored_as", subjects.GroupCommitSubjects(c.opts.Stream, c.opts.Subjects))
	return nil
}

// subscribe subscribes to the replies and the stream's subjects and waits
// until the server has the subscriptions.
func (c *Committer) subscribe(ctx context.Context) error {
	c.in = make(chan *nats.Msg, inChanLen)
	c.replies = make(chan *nats.Msg, 1<<12)
	c.inbox = c.nc.NewInbox()
	var err error
	if c.rsub, err = c.nc.ChanSubscribe(c.inbox+".*", c.replies); err != nil {
		return fmt.Errorf("cannot subscribe to its replies: %w", err)
	}
	if c.opts.Flush != nil {
		c.relays = map[string]relay{}
		c.answers = make(chan *nats.Msg, inChanLen)
		c.relayInbox = c.nc.NewInbox()
		if c.relaySub, err = c.nc.Subscribe(c.relayInbox+".*", c.relayed); err != nil {
			return fmt.Errorf("cannot subscribe to the answers it relays: %w", err)
		}
	}
	// One channel for all subjects keeps the arrival order across them
	// (a publisher's messages to orders.a and orders.b stay in order).
	for _, subj := range c.opts.Subjects {
		sub, err := c.nc.ChanQueueSubscribe(subj, queueGroup(c.opts.Stream), c.in)
		if err != nil {
			return fmt.Errorf("cannot subscribe to %s: %w", subj, err)
		}
		c.subs = append(c.subs, sub)
	}
	fctx, fcancel := context.WithTimeout(ctx, 10*time.Second)
	defer fcancel()
	return c.nc.FlushWithContext(fctx)
}

// unsubscribe drops the subscriptions a failed Open made.
func (c *Committer) unsubscribe() {
	for _, s := range c.subs {
		_ = s.Unsubscribe()
	}
	c.subs = nil
	if c.rsub != nil {
		_ = c.rsub.Unsubscribe()
		c.rsub = nil
	}
	if c.relaySub != nil {
		_ = c.relaySub.Unsubscribe()
		c.relaySub = nil
	}
}

// drainSubs stops the subscriptions on the stream's subjects such that
// every message the server routed here before is still taken (an
// Unsubscribe would drop those in the pipe, leaving their clients with no
// answer at all).
func (c *Committer) drainSubs(ctx context.Context) {
	for _, s := range c.subs {
		if err := s.Drain(); err != nil {
			_ = s.Unsubscribe()
		}
	}
	for _, s := range c.subs {
		for s.IsValid() && ctx.Err() == nil {
			time.Sleep(time.Millisecond)
		}
	}
	c.subs = nil
}

// Close stops taking publishes, commits what was taken and waits for the
// answers until ctx ends. It is idempotent.
func (c *Committer) Close(ctx context.Context) error {
	if !c.opened {
		return nil
	}
	var err error
	c.once.Do(func() {
		c.drainSubs(ctx)
		close(c.closing)
		select {
		case <-c.done:
		case <-ctx.Done():
			err = fmt.Errorf("ingest %s: closed before every batch was answered: %w", c.opts.Stream, ctx.Err())
			c.cancel()
			<-c.done
		}
		c.cancel()
		_ = c.rsub.Unsubscribe()
		if c.opts.Flush != nil {
			// The stream's answers to relayed publishes came before the
			// answers that ended run: relayed, flushed, sent.
			if c.relaySub.Drain() == nil {
				for c.relaySub.IsValid() && ctx.Err() == nil {
					time.Sleep(5 * time.Millisecond)
				}
			}
			<-c.intakeDone
			close(c.flushStop)
			<-c.flushDone
		}
	})
	return err
}

// Stats returns the counters since Open.
func (c *Committer) Stats() Stats {
	return Stats{Batches: c.batches.Load(), BatchedMsgs: c.batchedMsgs.Load(), Alone: c.alone.Load(),
		Forwarded: c.forwarded.Load(), Refused: c.refused.Load(), Throttled: c.throttled.Load(), BatchTime: time.Duration(c.batchNanos.Load())}
}

func (c *Committer) run(ctx context.Context) {
	defer close(c.done)
	tick := time.NewTicker(c.stallLimit() / 8)
	defer tick.Stop()
	closing := c.closing
	for {
		if c.hold != nil {
			c.hold()
		}
		select {
		case <-c.queued:
			c.takeQueued()
		case r := <-c.replies:
			c.answer(r)
		case <-tick.C:
			c.expire()
			c.forgetIDs(c.opts.DuplicateWindow)
		case <-closing:
			closing = nil
			select {
			case <-c.intakeDone:
			case <-ctx.Done():
				return
			}
			c.takeQueued()
		case <-ctx.Done():
			return
		}
		c.dispatch()
		// What went out with the clients' replies is answered by the
		// stream itself: dispatch follows it with a marker, in flight
		// until the stream applied all of it. Without that, a reload that
		// turns group commit off could remove the transform while the
		// stream still held some of them, and store them under the
		// prefixed subjects.
		if closing == nil && len(c.pend) == 0 && len(c.inflight) == 0 && c.queueEmpty() {
			return
		}
	}
}

// intake takes what the subscriptions deliver as it comes: past the
// waiting limits each publish is refused with "too many requests" here,
// at once, whatever the run goroutine is doing; the others go to queue.
// When closing, it takes what is left in c.in and ends.
func (c *Committer) intake(ctx context.Context) {
	defer close(c.intakeDone)
	for {
		select {
		case m := <-c.in:
			c.admit(m)
		case <-c.closing:
			for {
				select {
				case m := <-c.in:
					c.admit(m)
				default:
					return
				}
			}
		case <-ctx.Done():
			return
		}
	}
}

// admit queues m for run, or refuses it when the waiting limits are
// reached. A burst larger than the stream's inbound queue is refused in
// part by the server ("too many requests"); held here without a bound, it
// would take twice its size in memory, and the server would close the
// ingest connection as a slow consumer, leaving what is in flight
// unanswered.
func (c *Committer) admit(m *nats.Msg) {
	it := item{m: m, size: c.size(m)}
	c.qmu.Lock()
	if c.waitingMsgs >= c.opts.MaxWaitingMsgs || (c.waitingMsgs > 0 && c.waitingBytes+it.size > c.opts.MaxWaitingBytes) {
		first := !c.throttling
		c.throttling = true
		msgs, bytes := c.waitingMsgs, c.waitingBytes
		c.qmu.Unlock()
		c.throttled.Add(1)
		if first {
			c.log.Warn("too many publishes waiting: refusing more with \"too many requests\", as the server does for a stream's full inbound queue",
				"waiting_msgs", msgs, "waiting_bytes", bytes)
		}
		c.reply(item{m: m}, c.tooMany)
		return
	}
	c.queue = append(c.queue, it)
	c.waitingMsgs++
	c.waitingBytes += it.size
	c.qmu.Unlock()
	select {
	case c.queued <- struct{}{}:
	default:
	}
}

// size is what m counts against Options.MaxWaitingBytes and a batch's
// bytes: its data, subject and headers with what group commit adds.
func (c *Committer) size(m *nats.Msg) int {
	n := len(m.Data) + len(m.Subject) + len(subjects.GroupCommitPrefix) + len(c.opts.Stream) + 64
	for k, vs := range m.Header {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}

// takeQueued adds everything intake queued to pend.
func (c *Committer) takeQueued() {
	c.qmu.Lock()
	q := c.queue
	c.queue = nil
	c.qmu.Unlock()
	for _, it := range q {
		c.add(it)
	}
}

func (c *Committer) queueEmpty() bool {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	return len(c.queue) == 0
}

// release takes items of size bytes off the waiting counts.
func (c *Committer) release(n, bytes int) {
	c.qmu.Lock()
	c.waitingMsgs -= n
	c.waitingBytes -= bytes
	if c.throttling && c.waitingBytes < c.opts.MaxWaitingBytes/2 && c.waitingMsgs < c.opts.MaxWaitingMsgs/2 {
		c.throttling = false
	}
	c.qmu.Unlock()
}

func (c *Committer) add(it item) {
	m := it.m
	// What this connection publishes must fit the server's control line,
	// or the server closes it and group commit stops answering.
	if !subjects.GroupCommitFits(c.opts.Stream, m.Subject, len(m.Reply)) {
		c.log.Warn("publish refused: its subject and reply are too long for group commit", "subject_bytes", len(m.Subject), "reply_bytes", len(m.Reply))
		c.release(1, it.size)
		n := len(c.target(m)) + max(len(m.Reply), subjects.GroupCommitReplyBytes)
		c.refuseOne(m, &apiError{Code: 400,
			Description: fmt.Sprintf("subject and reply too long: %d bytes with group commit's prefix %s, at most %d", n, subjects.GroupCommit(c.opts.Stream, ""), subjects.ControlLineBudget)})
		return
	}
	// The stream's transform maps literal subjects only: one with a
	// wildcard token would be stored under the prefixed subject, out of
	// sight of the consumers filtered on the configured subjects.
	if !server.IsValidLiteralSubject(m.Subject) {
		c.log.Warn("publish refused: its subject is not literal", "subject", m.Subject)
		c.release(1, it.size)
		c.refuseOne(m, &apiError{Code: 400,
			Description: fmt.Sprintf("subject %q is not literal (a wildcard token * or >, or an empty one): publish to a literal subject", m.Subject)})
		return
	}
	// What the NATS client cannot publish again would be lost on the way:
	// alone, its client got no answer; in a batch, the server abandoned
	// the whole batch for the missing message.
	if why := unsendableHeader(m); why != "" {
		c.log.Warn("publish refused: group commit cannot pass its headers on", "subject", m.Subject, "why", why)
		c.release(1, it.size)
		c.refuseOne(m, &apiError{Code: 400, Description: "group commit cannot pass this message on: " + why})
		return
	}
	// The stream allows atomic batches for this committer's own: a
	// client's batch message is refused as the configured stream refuses
	// it, or it would open a batch there, and batches a client leaves
	// open take the stream's (50 at most) from the committer, failing
	// other clients' publishes. The server checks the message's size
	// first: one too large goes to it alone and gets that error. An
	// empty id (the first value counts) is none to the server.
	if ids := m.Header[batchIDHeader]; len(ids) > 0 && ids[0] != "" && !c.opts.AllowAtomic &&
		(c.opts.MaxMsgSize <= 0 || msgSize(m, false) <= c.opts.MaxMsgSize) {
		c.release(1, it.size)
		c.refuseOne(m, &apiError{Code: 400, ErrCode: errAtomicPublishDisabled, Description: "atomic publish is disabled"})
		return
	}
	for k, vs := range m.Header {
		if len(k) < len("Nats-") || !strings.EqualFold(k[:len("Nats-")], "Nats-") {
			continue
		}
		if strings.EqualFold(k, "Nats-Msg-Id") {
			if len(vs) > 0 {
				it.msgID = vs[0]
			}
			continue
		}
		// Every other Nats-* header is the server's to act on, for this
		// message alone: an expected sequence is checked against the
		// stream as it is when the message is applied (arrival order
		// keeps it), a client's own batch stays its own, and one the
		// stream refuses (Nats-TTL without allow_msg_ttl, a rollup
		// without allow_rollup_hdrs, ...) must not fail a whole batch.
		it.alone = true
	}
	// The stream's max_msg_size counts the header block, and in a batch
	// that holds the batch headers too: a message the server would store
	// alone may be too large inside a batch, where it would fail the
	// whole batch.
	if (c.opts.MaxMsgSize > 0 && msgSize(m, true) > c.opts.MaxMsgSize) || it.size > maxBatchBytes {
		it.alone = true
	}
	c.pend = append(c.pend, it)
	c.pendSize += it.size
}

// took removes the first n messages of pend, sent.
func (c *Committer) took(n int) {
	bytes := 0
	for _, it := range c.pend[:n] {
		bytes += it.size
	}
	c.pend = c.pend[n:]
	c.pendSize -= bytes
	c.release(n, bytes)
}

// refuseOne answers a publish group commit does not take with the
// server's kind of error, in a PubAck.
func (c *Committer) refuseOne(m *nats.Msg, e *apiError) {
	b, _ := json.Marshal(pubAck{Stream: c.opts.Stream, Error: e})
	c.reply(item{m: m}, b)
}

// batchHeaderBytes is what sendBatch adds to a message's header block at
// most: Nats-Batch-Id (a nuid), Nats-Batch-Sequence (up to maxBatch) and
// Nats-Batch-Commit, each "Key: value\r\n".
var batchHeaderBytes = len("Nats-Batch-Id: \r\n") + len(nuid.Next()) +
	len("Nats-Batch-Sequence: \r\n") + len(strconv.Itoa(maxBatch)) + len("Nats-Batch-Commit: 1\r\n")

// batchedHeaderBytes is the size of h's header block as sendBatch sends
// it (encoded as nats.go does: "NATS/1.0\r\n", "Key: value\r\n" per value
// with the value trimmed, "\r\n"), batch headers included.
func batchedHeaderBytes(h nats.Header) int {
	n := len("NATS/1.0\r\n\r\n") + batchHeaderBytes
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(": ") + len(textproto.TrimString(v)) + len("\r\n")
		}
	}
	return n
}

// msgSize is what a stream's max_msg_size counts of m: its data and its
// header block as this committer sends it, alone or (batched) in a batch.
func msgSize(m *nats.Msg, batched bool) int {
	n := len(m.Data) + batchedHeaderBytes(m.Header)
	if !batched {
		n -= batchHeaderBytes
	}
	return n
}

// unsendableHeader says why the NATS client could not publish m's
// headers again, or "". The server stores any header block a client
// writes, but the client library decodes it into a map (a block it cannot
// decode arrives as none, Msg.Size still counting it) and publishes only
// names of printable ASCII without any of "()/,:;<=>?@[\]{} and the
// double quote (nats.go isHeaderKeyValid; PublishMsg fails otherwise).
func unsendableHeader(m *nats.Msg) string {
	if m.Header == nil && m.Size() > len(m.Subject)+len(m.Reply)+len(m.Data) {
		return "its header block is not one the NATS client can read"
	}
	for k := range m.Header {
		if k == "" || strings.IndexFunc(k, func(r rune) bool { return r < 33 || r > 126 || strings.ContainsRune(`"()/,:;<=>?@[\]{}`, r) }) >= 0 {
			return fmt.Sprintf("header name %q is not one the NATS client can publish", k)
		}
	}
	return ""
}

// dispatch sends what may go now. When nothing is in flight, what waits
// goes at once: as one batch if at least minBatch messages wait, else one
// by one. While something is in flight (and not stalled, see
// stallAfter), arrivals wait for it and form the next batch — except a
// full batch (count or bytes), which cannot grow and
// goes at once, up to maxInflight.
//
// Order rules: everything goes out in arrival order on one connection; a
// refused batch is published again message by message only when nothing
// was sent after it (else its clients get the server's error), and a
// batch that holds a Nats-Msg-Id (refused whole for one duplicate against
// the stream's window) is "risky": it is sent only when nothing is in
// flight and nothing follows it until it is answered, so that its messages
// can always be published again in place. So is every batch to a stream
// with discard new (refused whole when full).
func (c *Committer) dispatch() {
	for len(c.pend) > 0 && c.risky == 0 {
		if c.pend[0].alone || c.known(c.pend[0].msgID) {
			c.forward(c.pend[0])
			c.took(1)
			continue
		}
		// Nothing can go while the most units are in flight, nor, while
		// any is, when no batch waiting can be full: return before
		// nextBatch scans up to maxBatch messages to say so.
		if c.live >= maxInflight || (c.live > 0 && len(c.pend) < maxBatch && c.pendSize <= maxBatchBytes) {
			return
		}
		n, risky, full := c.nextBatch()
		// A stream with discard new refuses a batch when full: it must
		// be the last sent then, to go again one by one in place.
		risky = risky || c.opts.DiscardNew
		if c.live > 0 && (!full || risky) {
			return
		}
		msgs := c.pend[:n:n]
		c.took(n)
		if n < minBatch {
			c.sendSingles(msgs)
		} else {
			c.sendBatch(msgs, risky)
		}
	}
	if len(c.pend) == 0 {
		c.pend = nil // let the backing array go
	}
	// A marker after what went out with the clients' replies: its
	// answer says whether the stream was there for them (see answer).
	if c.unflushed != "" && c.risky == 0 && !c.nc.IsClosed() {
		c.sendMarker(c.unflushed, nil)
	}
}

// nextBatch returns how many messages at the front of pend form the next
// batch, whether any carries a Nats-Msg-Id, and whether it is full. A
// batch ends before a message that goes alone, before a Nats-Msg-Id
// already in the batch or sent within the duplicate window (the server
// would refuse the whole batch), and at the count and byte bounds (full).
func (c *Committer) nextBatch() (n int, risky, full bool) {
	var (
		bytes int
		ids   map[string]bool
	)
	for n < len(c.pend) {
		if n == maxBatch {
			return n, risky, true
		}
		it := c.pend[n]
		if it.alone {
			break
		}
		if n > 0 && bytes+it.size > maxBatchBytes {
			return n, risky, true
		}
		if it.msgID != "" {
			if ids[it.msgID] || c.known(it.msgID) {
				break
			}
			if ids == nil {
				ids = make(map[string]bool)
			}
			ids[it.msgID] = true
			risky = true
		}
		bytes += it.size
		n++
	}
	return n, risky, false
}

func (c *Committer) target(m *nats.Msg) string {
	return subjects.GroupCommit(c.opts.Stream, m.Subject)
}

// forward publishes a message as the client would, with the client's
// reply (clientReply): the server answers the client itself, or with
// Options.Flush this committer after the flush.
func (c *Committer) forward(it item) {
	c.remember(it)
	c.sent++
	c.forwarded.Add(1)
	c.unflushed = c.target(it.m)
	c.fwd = append(c.fwd, it)
	if err := c.nc.PublishMsg(&nats.Msg{Subject: c.unflushed, Reply: c.clientReply(it.m), Header: it.m.Header, Data: it.m.Data}); err != nil {
		c.log.Warn("cannot publish a message", "subject", it.m.Subject, "err", err)
	}
}

func (c *Committer) newUnit(msgs []item, risky bool) (string, *unit) {
	c.sent++
	c.nextID++
	id := strconv.FormatUint(c.nextID, 36)
	for _, it := range msgs {
		c.remember(it)
	}
	u := &unit{msgs: msgs, order: c.sent, start: time.Now(), risky: risky}
	c.inflight[id] = u
	c.live++
	// The stream answers u after what went before it.
	u.before, c.fwd, c.unflushed = c.fwd, nil, ""
	if risky {
		c.risky++
	}
	return c.inbox + "." + id, u
}

// markerStream is never a stream's name (names have no spaces): a
// message expecting it is answered at once with an error and not stored.
const markerStream = "holdfast marker"

// sendSingles publishes msgs one by one with the clients' own replies
// (clientReply), so that the server answers each client directly (no
// extra hop on the way back; with Options.Flush the answers are relayed
// after the flush), then a marker with this committer's reply: the stream applies its
// inbound messages one at a time in order, so the marker's answer (an
// "expected stream" error, nothing stored, nothing flushed) says that the
// messages before it are done and the stream is idle again.
func (c *Committer) sendSingles(msgs []item) {
	for _, it := range msgs {
		c.alone.Add(1)
		if err := c.nc.PublishMsg(&nats.Msg{Subject: c.target(it.m), Reply: c.clientReply(it.m), Header: it.m.Header, Data: it.m.Data}); err != nil {
			c.log.Warn("cannot publish a message", "subject", it.m.Subject, "err", err)
		}
	}
	c.sendMarker(c.target(msgs[len(msgs)-1].m), msgs)
}

// sendMarker publishes a marker to target (a subject of the stream) as
// the unit of msgs, which went out before it with their clients' replies.
func (c *Committer) sendMarker(target string, msgs []item) {
	reply, u := c.newUnit(msgs, false)
	u.marker = true
	h := nats.Header{}
	h.Set("Nats-Expected-Stream", markerStream)
	if err := c.nc.PublishMsg(&nats.Msg{Subject: target, Reply: reply, Header: h}); err != nil {
		c.log.Warn("cannot publish a marker", "err", err)
	}
}

func (c *Committer) sendBatch(msgs []item, risky bool) {
	reply, _ := c.newUnit(msgs, risky)
	batchID := nuid.Next()
	last := len(msgs) - 1
	for i, it := range msgs {
		h := make(nats.Header, len(it.m.Header)+3)
		maps.Copy(h, it.m.Header)
		h.Set(batchIDHeader, batchID)
		h.Set("Nats-Batch-Sequence", strconv.Itoa(i+1))
		out := &nats.Msg{Subject: c.target(it.m), Header: h, Data: it.m.Data}
		if i == last {
			h.Set("Nats-Batch-Commit", "1")
			out.Reply = reply
		}
		if err := c.nc.PublishMsg(out); err != nil {
			// The batch stays incomplete; the server abandons it and the
			// commit (or its absence) answers the clients.
			c.log.Warn("cannot publish a batch message", "subject", it.m.Subject, "err", err)
		}
	}
}

// pubAck is the server's answer to a publish (a commit adds batch and count).
type pubAck struct {
	Stream    string    `json:"stream"`
	Domain    string    `json:"domain,omitempty"`
	Seq       uint64    `json:"seq"`
	Duplicate bool      `json:"duplicate,omitempty"`
	Count     int       `json:"count,omitempty"`
	Error     *apiError `json:"error,omitempty"`
}

type apiError struct {
	Code        int    `json:"code"`
	ErrCode     uint16 `json:"err_code,omitempty"`
	Description string `json:"description,omitempty"`
}

// errDuplicateInBatch is the server's err_code for a batch holding a
// Nats-Msg-Id that is a duplicate (JSAtomicPublishContainsDuplicateMessageErr).
const errDuplicateInBatch = 10201

// errAtomicPublishDisabled is the server's err_code for a batch message
// to a stream without atomic publish (JSAtomicPublishDisabledErr).
const errAtomicPublishDisabled = 10174

// batchIDHeader marks an atomic batch message (the server looks the name
// up as written).
const batchIDHeader = "Nats-Batch-Id"

// errTooManyRequests is the server's err_code for a publish its stream's
// full inbound queue refused (JSStreamTooManyRequests).
const errTooManyRequests = 10167

func (c *Committer) answer(r *nats.Msg) {
	id := r.Subject[strings.LastIndexByte(r.Subject, '.')+1:]
	u, ok := c.inflight[id]
	if !ok {
		return // given up on already
	}
	c.finish(id, u)
	if settle.NoResponders(r) {
		// No stream on the subject (deleted, not yet created again):
		// nothing of u is stored, and the server's "no responders" for
		// the messages that went out with their clients' replies came
		// here. Each client gets it, as without group commit (nats.go's
		// js.Publish retries it); publishing u's messages again would
		// reach no stream either.
		if !u.marker {
			c.refused.Add(1)
		}
		for _, it := range u.before {
			c.noResponders(it)
		}
		for _, it := range u.msgs {
			c.noResponders(it)
		}
		return
	}
	if u.marker {
		return // the server answered the clients itself
	}
	var ack pubAck
	if len(r.Data) == 0 || r.Header.Get("Status") != "" || json.Unmarshal(r.Data, &ack) != nil ||
		ack.Error != nil || ack.Count != len(u.msgs) {
		c.refuse(u, r, ack.Error)
		return
	}
	c.batches.Add(1)
	c.batchedMsgs.Add(uint64(len(u.msgs)))
	c.batchNanos.Add(uint64(time.Since(u.start)))
	first := ack.Seq - uint64(len(u.msgs)) + 1
	head := pubAckHead(ack.Stream, ack.Domain)
	for i, it := range u.msgs {
		if it.m.Reply == "" {
			continue
		}
		c.reply(it, seqPubAck(head, first+uint64(i)))
	}
}

// pubAckHead is the JSON of a PubAck from stream and domain up to its
// sequence number, the same for every message of a batch (one
// json.Marshal per batch, not per message).
func pubAckHead(stream, domain string) []byte {
	b, _ := json.Marshal(pubAck{Stream: stream, Domain: domain})
	return b[:len(b)-len(`0}`)] // seq is the last field json.Marshal writes
}

// seqPubAck is the PubAck of the message stored at seq: json.Marshal's
// output for pubAck{Stream, Domain, Seq}.
func seqPubAck(head []byte, seq uint64) []byte {
	b := make([]byte, 0, len(head)+21)
	return append(strconv.AppendUint(append(b, head...), seq, 10), '}')
}

func (c *Committer) finish(id string, u *unit) {
	delete(c.inflight, id)
	if !u.stalled {
		c.live--
	}
	if u.risky {
		c.risky--
	}
	if m := c.opts.Metrics; m != nil {
		if u.marker {
			for range u.msgs {
				m.observe(c.opts.Stream, 1, time.Since(u.start))
			}
		} else {
			m.observe(c.opts.Stream, len(u.msgs), time.Since(u.start))
		}
	}
}

// refuse handles a batch the server did not commit (nothing of it is
// stored). When nothing was sent after it, its messages are published
// again one by one in place, each answered by the server as if there had
// been no batch (a duplicate gets its duplicate PubAck, the others are
// stored); otherwise later messages may already be stored, and publishing
// these again would reorder them: each client gets the server's error.
func (c *Committer) refuse(u *unit, r *nats.Msg, e *apiError) {
	c.refused.Add(1)
	if u.order == c.sent {
		if e != nil && e.ErrCode != errDuplicateInBatch {
			c.log.Debug("batch refused, publishing its messages one by one", "msgs", len(u.msgs), "err", e.Description)
		}
		for _, it := range u.msgs {
			c.forward(it)
		}
		return
	}
	if e == nil {
		e = &apiError{Code: 503, Description: "no responders: stream not available"}
		if s := r.Header.Get("Status"); s != "" && s != "503" {
			e = &apiError{Code: 500, Description: "batch not committed: status " + s}
		}
	}
	b, _ := json.Marshal(pubAck{Stream: c.opts.Stream, Error: e})
	for _, it := range u.msgs {
		c.reply(it, b)
	}
}

// noResponders answers a client as the server does when nothing listens
// on the subject (nats.go reads the Status header as its status line).
func (c *Committer) noResponders(it item) {
	if it.m.Reply == "" {
		return
	}
	c.send(&nats.Msg{Subject: it.m.Reply, Header: nats.Header{"Status": {"503"}}})
}

// reply answers a client with a PubAck or an error (JSON, as the server
// sends them).
func (c *Committer) reply(it item, data []byte) {
	if it.m.Reply == "" {
		return
	}
	c.send(&nats.Msg{Subject: it.m.Reply, Data: data})
}

// send sends an answer to a client: at once, or with Options.Flush
// after the next flush.
func (c *Committer) send(a *nats.Msg) {
	if c.opts.Flush != nil {
		c.queueAnswer(a)
		return
	}
	if err := c.nc.PublishMsg(a); err != nil {
		c.log.Debug("cannot answer a publish", "reply", a.Subject, "err", err)
	}
}

// clientReply is the reply m goes to the stream with: the client's own,
// or with Options.Flush one this committer relays after a flush.
func (c *Committer) clientReply(m *nats.Msg) string {
	if c.opts.Flush == nil || m.Reply == "" {
		return m.Reply
	}
	c.relayMu.Lock()
	defer c.relayMu.Unlock()
	c.relayNext++
	id := strconv.FormatUint(c.relayNext, 36)
	c.relays[id] = relay{reply: m.Reply, at: time.Now()}
	return c.relayInbox + "." + id
}

// relayed takes the stream's answer to a relayed publish: its client gets
// it after the next flush.
func (c *Committer) relayed(r *nats.Msg) {
	id := r.Subject[strings.LastIndexByte(r.Subject, '.')+1:]
	c.relayMu.Lock()
	rl, ok := c.relays[id]
	delete(c.relays, id)
	c.relayMu.Unlock()
	if ok {
		c.queueAnswer(&nats.Msg{Subject: rl.reply, Header: r.Header, Data: r.Data})
	}
}

// queueAnswer hands a to the flusher; once the flusher ended (a Close
// that gave up waiting) a is dropped, and its client sees its own timeout.
func (c *Committer) queueAnswer(a *nats.Msg) {
	select {
	case c.answers <- a:
	case <-c.flushDone:
	}
}

// flusher sends the answers waiting in answers, each after a flush that
// began after the stream answered; a flush that failed turns them into
// errors (what the stream stored may not be on disk). Each lot of answers
// waits for its flush on its own: answers that come while a flush waits
// for its window join it, and answers that come while one runs wait for
// the next.
func (c *Committer) flusher() {
	var wg sync.WaitGroup
	defer close(c.flushDone)
	defer wg.Wait()
	for {
		var batch []*nats.Msg
		stop := false
		select {
		case a := <-c.answers:
			batch = append(batch, a)
		case <-c.flushStop:
			stop = true
		}
	more:
		for {
			select {
			case a := <-c.answers:
				batch = append(batch, a)
			default:
				break more
			}
		}
		if len(batch) > 0 {
			wg.Go(func() { c.flushAndSend(batch) })
		}
		if stop {
			return
		}
	}
}

// flushAndSend sends batch after a flush, or the flush's error instead.
func (c *Committer) flushAndSend(batch []*nats.Msg) {
	if err := c.opts.Flush(); err != nil {
		c.log.Error("cannot flush the stream to disk: its publishers get an error, and what it stored since the last flush may be lost at a power cut", "err", err)
		e, _ := json.Marshal(pubAck{Stream: c.opts.Stream, Error: &apiError{Code: 503, Description: "cannot flush to disk: " + err.Error()}})
		for i, a := range batch {
			batch[i] = &nats.Msg{Subject: a.Subject, Data: e}
		}
	}
	for _, a := range batch {
		if err := c.nc.PublishMsg(a); err != nil {
			c.log.Debug("cannot answer a publish", "reply", a.Subject, "err", err)
		}
	}
}

// known reports whether id was sent within the duplicate window.
func (c *Committer) known(id string) bool {
	if id == "" {
		return false
	}
	_, ok := c.ids[id]
	return ok
}

func (c *Committer) remember(it item) {
	if it.msgID == "" || c.opts.DuplicateWindow <= 0 {
		return
	}
	if len(c.ids) >= maxKnownIDs {
		c.forgetOldest(maxKnownIDs / 2)
	}
	n := len(c.ids)
	if c.ids[it.msgID] = struct{}{}; len(c.ids) == n {
		return // known: the server's window counts from the first one
	}
	c.idOrder = append(c.idOrder, sentID{it.msgID, time.Now()})
}

// forgetIDs drops the ids sent longer ago than age.
func (c *Committer) forgetIDs(age time.Duration) {
	cut := time.Now().Add(-age)
	n := 0
	for n < len(c.idOrder) && !c.idOrder[n].at.After(cut) {
		delete(c.ids, c.idOrder[n].id)
		n++
	}
	c.idOrder = c.idOrder[n:]
}

// forgetOldest drops the oldest ids until keep are left.
func (c *Committer) forgetOldest(keep int) {
	n := len(c.idOrder) - keep
	for _, e := range c.idOrder[:n] {
		delete(c.ids, e.id)
	}
	c.idOrder = c.idOrder[n:]
}

// stallLimit is how long a unit may go unanswered before dispatch stops
// holding later messages back for it: stallAfter, but in tests.
func (c *Committer) stallLimit() time.Duration {
	if c.opts.stall > 0 {
		return c.opts.stall
	}
	return stallAfter
}

// expire stops holding later messages back for units unanswered for
// stallAfter, and gives up on those unanswered for answerTimeout: their
// clients see their own publish timeout, as with a server that never
// answered.
//
// A stalled risky unit is risky no more: what follows it goes out, so if
// it is refused after all, for a duplicate, its clients get the server's
// error instead of their messages being published again in place (a
// client publishing again gets its duplicate PubAck). A batch to a
// stream with discard new never stalls: refused for a full stream after a
// later batch that fit went out, its clients would see their message
// refused and later ones stored (a batch of 1,000 took over 2 s in a
// loaded CI run).
func (c *Committer) expire() {
	if c.opts.Flush != nil {
		c.relayMu.Lock()
		for id, rl := range c.relays {
			if time.Since(rl.at) > answerTimeout {
				delete(c.relays, id)
			}
		}
		c.relayMu.Unlock()
	}
	for id, u := range c.inflight {
		age := time.Since(u.start)
		if age > c.stallLimit() && !u.stalled && !(u.risky && c.opts.DiscardNew) {
			u.stalled = true
			c.live--
			if u.risky {
				u.risky = false
				c.risky--
			}
			c.log.Warn("no answer from the stream yet: later publishes go on without waiting for it", "msgs", len(u.msgs), "after", c.stallLimit())
		}
		if age > answerTimeout {
			c.log.Warn("no answer from the stream: its clients get none either", "msgs", len(u.msgs), "after", answerTimeout)
			c.finish(id, u)
		}
	}
}
