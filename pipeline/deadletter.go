package pipeline

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/holdfast-io/holdfast/internal/settle"
	"github.com/holdfast-io/holdfast/internal/subjects"
	"github.com/holdfast-io/holdfast/pipeline/handler"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Headers added to a dead letter.
const (
	HeaderError           = "Holdfast-Error"
	HeaderOriginalSubject = "Holdfast-Original-Subject"
	HeaderOriginalSeq     = "Holdfast-Original-Seq"
	HeaderOriginalStream  = "Holdfast-Original-Stream"
	// HeaderOriginalStreamCreated is when the original's stream was
	// created (RFC 3339): which incarnation of the stream Holdfast-Original-Seq
	// counts in.
	HeaderOriginalStreamCreated = "Holdfast-Original-Stream-Created"
	HeaderOriginalMsgID         = "Holdfast-Original-Msg-Id"
	HeaderDeliveries            = "Holdfast-Deliveries"
	HeaderFailedAt              = "Holdfast-Failed-At"
	// HeaderOriginalTime is when the original was stored in its stream
	// (RFC 3339): a replay hands the handler that time, as its first
	// deliveries did (a forward handler's message id holds it).
	HeaderOriginalTime = "Holdfast-Original-Time"
)

// deadLetterHeaders are the headers holdfast sets on a dead letter and
// reads back from it (with HeaderInterrupted and HeaderReplayedFrom):
// a message carrying any of them from its publisher (a dead letter
// republished by hand) must not have them steer its own dead letter or
// replay, so they are dropped from the original's headers.
var deadLetterHeaders = []string{HeaderError, HeaderOriginalSubject, HeaderOriginalSeq, HeaderOriginalStream,
	HeaderOriginalStreamCreated, HeaderOriginalMsgID, HeaderOriginalTime, HeaderDeliveries, HeaderFailedAt,
	HeaderInterrupted, HeaderReplayedFrom}

// isDeadLetterHeader says whether k is one of deadLetterHeaders, in any
// case (a header's name reaches holdfast as its publisher wrote it).
func isDeadLetterHeader(k string) bool {
	return slices.ContainsFunc(deadLetterHeaders, func(h string) bool { return strings.EqualFold(h, k) })
}

// DeadLetterSubject is where a consumer's dead letter for subject goes.
//
// A subject too long to be published with that prefix (see
// subjects.ControlLineBudget) becomes dlq.<CONSUMER>.long-subject.<hash>,
// the first 16 bytes of its SHA-256 in hex; the dead letter keeps the
// original subject in its Holdfast-Original-Subject header either way.
func DeadLetterSubject(consumer, subject string) string {
	s := "dlq." + consumer + "." + subject
	if len(s) <= handler.MaxPublishSubject {
		return s
	}
	sum := sha256.Sum256([]byte(subject))
	return "dlq." + consumer + ".long-subject." + hex.EncodeToString(sum[:16])
}

// DeadLetterMsgID is the Nats-Msg-Id of a dead letter,
// "STREAM:CONSUMER:seq:created" with the stream's creation time in Unix
// nanoseconds: the same for every attempt, so a crash between publish and
// terminate cannot duplicate it, and different for a stream that was
// deleted and created again, whose sequences start at 1 again.
func DeadLetterMsgID(stream, consumer string, seq uint64, streamCreated time.Time) string {
	return stream + ":" + consumer + ":" + strconv.FormatUint(seq, 10) + ":" + strconv.FormatInt(streamCreated.UnixNano(), 10)
}

// NewDeadLetter builds the dead letter for a message of the stream
// incarnation created at streamCreated: payload and headers kept, the
// original's Nats-Msg-Id moved to Holdfast-Original-Msg-Id, and the failure
// described in Holdfast-* headers.
func NewDeadLetter(consumer string, m *handler.Message, streamCreated time.Time, reason string, failedAt time.Time) *nats.Msg {
	out := nats.NewMsg(DeadLetterSubject(consumer, m.Subject))
	for k, vs := range m.Header {
		if isDeadLetterHeader(k) {
			continue
		}
		for _, v := range vs {
			handler.AddHeader(out.Header, k, v)
		}
	}
	if id := out.Header.Get(nats.MsgIdHdr); id != "" {
		out.Header.Set(HeaderOriginalMsgID, id)
	}
	// Server-set headers of the original must not steer the new publish:
	// its expected-state checks, its TTL, and the Nats-Batch-* headers the
	// server keeps on every message of an atomic batch (group commit
	// stores through them), which would make the dead letter's publish an
	// atomic batch message the dead-letter stream refuses. The server
	// drops the same prefixes when it sources a message. A message a
	// stream sourced carries Nats-Stream-Source, which the server refuses
	// on any publish but its own sourcing.
	for k := range out.Header {
		if l := strings.ToLower(k); strings.HasPrefix(l, "nats-expected-") || strings.HasPrefix(l, "nats-batch-") || l == "nats-ttl" || l == "nats-stream-source" {
			delete(out.Header, k)
		}
	}
	out.Header.Set(nats.MsgIdHdr, DeadLetterMsgID(m.Stream, consumer, m.Sequence, streamCreated))
	out.Header.Set(HeaderError, reason)
	out.Header.Set(HeaderOriginalSubject, m.Subject)
	out.Header.Set(HeaderOriginalStream, m.Stream)
	out.Header.Set(HeaderOriginalStreamCreated, streamCreated.UTC().Format(time.RFC3339Nano))
	out.Header.Set(HeaderOriginalSeq, strconv.FormatUint(m.Sequence, 10))
	out.Header.Set(HeaderDeliveries, strconv.FormatUint(m.Delivery, 10))
	out.Header.Set(HeaderFailedAt, failedAt.UTC().Format(time.RFC3339Nano))
	if !m.Published.IsZero() {
		out.Header.Set(HeaderOriginalTime, m.Published.UTC().Format(time.RFC3339Nano))
	}
	out.Data = m.Data
	return out
}

// streamCreated is the creation time of the current incarnation of stream.
func (w *Workers) streamCreated(ctx context.Context, stream string) (time.Time, error) {
	s, err := w.js.Stream(ctx, stream)
	if err != nil {
		return time.Time{}, fmt.Errorf("stream %s: %w", stream, err)
	}
	return s.CachedInfo().Created, nil
}

// publishDeadLetter stores a dead letter with PubAck in the dead-letter
// stream. A PubAck proves the dead letter stored only when it stored this
// message: a "duplicate" answer is checked against what the dead-letter
// stream holds under that sequence.
func (w *Workers) publishDeadLetter(ctx context.Context, m *handler.Message, streamCreated time.Time, reason string) error {
	return w.storeDeadLetter(ctx, NewDeadLetter(w.opts.Consumer, m, streamCreated, reason, time.Now()))
}

// storeDeadLetter publishes dl to the dead-letter stream with PubAck; a
// "duplicate" answer must point at this very message.
func (w *Workers) storeDeadLetter(ctx context.Context, dl *nats.Msg) error {
	// A missing stream is left to the publish, which then fails.
	s, err := w.js.Stream(ctx, w.opts.DeadLetter)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
	case err != nil:
		return fmt.Errorf("dead-letter stream %s: %w", w.opts.DeadLetter, err)
	case dropsDeadLetters(s.CachedInfo().Config) != "":
		return fmt.Errorf("the dead-letter stream %s has %s, which would remove dead letters nobody handled: nothing is stored there until it is set back (a reload of holdfast, SIGHUP, does it, or nats stream edit %s)",
			w.opts.DeadLetter, dropsDeadLetters(s.CachedInfo().Config), w.opts.DeadLetter)
	}
	ack, err := w.js.PublishMsg(ctx, dl)
	if err != nil {
		return err
	}
	if f := w.opts.FlushDeadLetters; f != nil {
		if err := f(); err != nil {
			return fmt.Errorf("dead letter stored but not flushed to disk: %w", err)
		}
	}
	if ack.Stream != w.opts.DeadLetter {
		return fmt.Errorf("dead letter stored in stream %s, not in %s: check that no other stream takes subject %s", ack.Stream, w.opts.DeadLetter, dl.Subject)
	}
	if !ack.Duplicate {
		return nil
	}
	id := dl.Header.Get(nats.MsgIdHdr)
	if err := w.sameDeadLetter(ctx, ack.Sequence, dl); err != nil {
		return fmt.Errorf("the dead-letter stream %s answered that Nats-Msg-Id %s is a duplicate of #%d, but %w: the original is kept, not terminated",
			w.opts.DeadLetter, id, ack.Sequence, err)
	}
	w.log.Info("dead letter already stored by an earlier attempt", "seq", dl.Header.Get(HeaderOriginalSeq), "dead_letter", w.opts.DeadLetter, "dead_letter_seq", ack.Sequence)
	return nil
}

// dropsDeadLetters names what in a dead-letter stream's configuration
// removes messages by itself (holdfast creates it with none of it, but a
// nats stream edit can set it while holdfast runs): a retention other than
// limits, a max_age, a limit with discard "old", a per-subject limit that
// removes the oldest. "" when there is none.
func dropsDeadLetters(c jetstream.StreamConfig) string {
	var why []string
	if c.Retention != jetstream.LimitsPolicy {
		why = append(why, "retention "+c.Retention.String())
	}
	if c.MaxAge > 0 {
		why = append(why, "max_age "+c.MaxAge.String())
	}
	if c.Discard == jetstream.DiscardOld {
		if c.MaxMsgs > 0 {
			why = append(why, fmt.Sprintf("max_msgs %d with discard old", c.MaxMsgs))
		}
		if c.MaxBytes > 0 {
			why = append(why, fmt.Sprintf("max_bytes %d with discard old", c.MaxBytes))
		}
	}
	if c.MaxMsgsPerSubject > 0 && (c.Discard == jetstream.DiscardOld || !c.DiscardNewPerSubject) {
		why = append(why, fmt.Sprintf("max_msgs_per_subject %d", c.MaxMsgsPerSubject))
	}
	if c.Storage == jetstream.MemoryStorage {
		why = append(why, "memory storage")
	}
	return strings.Join(why, ", ")
}

// sameDeadLetter checks that the dead letter stored at seq is dl: same
// subject, id, original stream, incarnation and sequence, and payload.
func (w *Workers) sameDeadLetter(ctx context.Context, seq uint64, dl *nats.Msg) error {
	s, err := w.js.Stream(ctx, w.opts.DeadLetter)
	if err != nil {
		return fmt.Errorf("the stored one cannot be read: %w", err)
	}
	stored, err := s.GetMsg(ctx, seq)
	if err != nil {
		return fmt.Errorf("the stored one cannot be read: %w", err)
	}
	if !sameSubject(stored.Subject, dl.Subject) {
		return fmt.Errorf("the stored one is on %q, not %q", stored.Subject, dl.Subject)
	}
	for _, h := range []string{nats.MsgIdHdr, HeaderOriginalSubject, HeaderOriginalStream, HeaderOriginalStreamCreated, HeaderOriginalSeq} {
		if got, want := stored.Header.Get(h), dl.Header.Get(h); got != want {
			return fmt.Errorf("the stored one has %s %q, not %q", h, got, want)
		}
	}
	if !bytes.Equal(stored.Data, dl.Data) {
		return errors.New("the stored one has another payload")
	}
	return nil
}

// sameSubject reports whether got, a subject as the stream's message get
// returns it, is published: the get answers in JSON, in which each byte
// of a subject that is not UTF-8 becomes U+FFFD (the original subject,
// in a header, comes back exact).
func sameSubject(got, published string) bool {
	if got == published || utf8.ValidString(published) {
		return got == published
	}
	var b strings.Builder
	for _, r := range published { // an invalid byte ranges as U+FFFD
		b.WriteRune(r)
	}
	return got == b.String()
}

// deadLetterTimeout bounds the first attempt to store a dead letter.
const deadLetterTimeout = 10 * time.Second

// deadLetter moves a failed message to the dead-letter stream and only
// then terminates it. If the publish fails, the message is not terminated:
// before its last delivery it is redelivered; on its last delivery it is
// kept (in-progress acks) and the publish is retried until it succeeds.
func (w *Workers) deadLetter(msg jetstream.Msg, m *handler.Message, reason string, lastDelivery bool) {
	if w.opts.DeadLetter == "" {
		if err := msg.TermWithReason(reason); err != nil {
			w.stats.Failures.Add(1)
			w.log.Error("terminate failed", "seq", m.Sequence, "err", err)
			return
		}
		w.stats.noteSettled(m.Sequence)
		w.stats.DeadLettered.Add(1)
		w.log.Error("message failed and dead-lettering is disabled: terminated", "seq", m.Sequence,
			"subject", m.Subject, "delivery", m.Delivery, "reason", reason)
		return
	}
	store := func(ctx context.Context) error {
		created, err := w.streamCreated(ctx, m.Stream)
		if err != nil {
			return err
		}
		return w.publishDeadLetter(ctx, m, created, reason)
	}
	// On the last delivery the server gives the message up after ack_wait:
	// hold it from now on, for as long as its dead letter takes.
	release := func() {}
	if lastDelivery {
		release = w.keepInHand(msg, m.Sequence)
	}
	ctx, cancel := context.WithTimeout(context.Background(), deadLetterTimeout)
	defer cancel()
	if err := store(ctx); err != nil {
		w.stats.Failures.Add(1)
		if !lastDelivery {
			delay := w.retryDelay(m.Delivery)
			w.log.Error("dead-letter publish failed: the message is redelivered instead", "seq", m.Sequence,
				"dead_letter", w.opts.DeadLetter, "retry_in", delay, "err", err)
			_ = msg.NakWithDelay(delay)
			return
		}
		// The server will not deliver it again: keep it in hand until its
		// dead letter is stored.
		w.stats.deadLetterFailed(err)
		w.log.Error("dead-letter publish failed on the last delivery: the message is kept and the publish retried",
			"seq", m.Sequence, "subject", m.Subject, "dead_letter", w.opts.DeadLetter, "err", err, "reason", reason)
		hold := func() {
			defer release()
			if !w.retryDeadLetter(m.Sequence, store) {
				w.log.Error("shutting down before the dead letter was stored: the message is left unacknowledged; the server reports it in a max-deliveries advisory after ack_wait, which the next start dead-letters if it runs by then",
					"seq", m.Sequence, "dead_letter", w.opts.DeadLetter)
				return
			}
			w.terminateDeadLettered(msg, m, reason)
		}
		if !w.spawn(hold) {
			hold()
		}
		return
	}
	release()
	w.terminateDeadLettered(msg, m, reason)
}

// keepInHand sends an in-progress ack for msg now and every half ack_wait
// until the returned release is called.
func (w *Workers) keepInHand(msg jetstream.Msg, seq uint64) (release func()) {
	onErr := func(err error) {
		w.log.Warn("in-progress ack of a message waiting for its dead letter failed", "seq", seq, "err", err)
	}
	if err := msg.InProgress(); err != nil {
		onErr(err)
	}
	return keepAlive(msg, w.inProgressInterval, onErr)
}

// terminateDeadLettered terminates a message whose dead letter is stored.
func (w *Workers) terminateDeadLettered(msg jetstream.Msg, m *handler.Message, reason string) {
	if err := msg.TermWithReason(reason); err != nil {
		// Already in the dead-letter stream; a redelivery is deduplicated
		// there by its Nats-Msg-Id.
		w.stats.Failures.Add(1)
		w.log.Error("dead letter stored but terminate failed: the message may be delivered again", "seq", m.Sequence, "err", err)
	} else {
		w.stats.noteSettled(m.Sequence)
	}
	w.stats.DeadLettered.Add(1)
	w.log.Error("message dead-lettered", "seq", m.Sequence, "subject", m.Subject, "delivery", m.Delivery,
		"dead_letter", w.opts.DeadLetter, "reason", reason)
}

// defaultAckWait is nats-server's ack wait of a consumer created without
// one.
const defaultAckWait = 30 * time.Second

// inProgressInterval is how long a message in hand may go without an
// in-progress ack: half of the consumer's ack_wait (see AckWait). Both the
// held messages (keepHeldAlive) and a message kept for its dead letter
// (keepInHand) use it.
func (w *Workers) inProgressInterval() time.Duration {
	return w.AckWait() / 2
}

// AckWait is the consumer's ack_wait the workers keep their messages
// alive for: ConsumerOptions.AckWait (the server's default, 30s, when
// zero) until SetAckWait tells them another.
func (w *Workers) AckWait() time.Duration {
	if d := time.Duration(w.ackWait.Load()); d > 0 {
		return d
	}
	return defaultAckWait
}

// SetAckWait tells the workers the consumer's ack_wait as the server has
// it now, when it may have changed while they run: a reload that changes
// it (before the server applies it), nats consumer edit, another cluster
// node's config (the Monitor passes on what it reads). Their in-progress
// acks follow it. A shorter one takes effect before SetAckWait returns:
// every message they hold whose last in-progress ack is older than half of
// it gets one at once — else the server, which applies a new ack_wait to
// the messages already delivered, would deliver them again while their
// handlers still run. A zero or negative d is ignored.
func (w *Workers) SetAckWait(d time.Duration) {
	if d <= 0 {
		return
	}
	old := time.Duration(w.ackWait.Swap(int64(d)))
	if old == d || w.held == nil {
		return
	}
	if old <= 0 || d < old {
		w.sendInProgress(time.Now(), d/2)
	}
	select {
	case w.ackWaitChanged <- struct{}{}:
	default:
	}
}

// keepAlive sends an in-progress ack every interval() until the returned
// stop is called: one timer for a message that left the workers' hands
// (keepHeldAlive covers those) while its dead letter is retried.
func keepAlive(msg jetstream.Msg, interval func() time.Duration, onErr func(error)) (stop func()) {
	var mu sync.Mutex
	stopped := false
	var t *time.Timer
	mu.Lock()
	defer mu.Unlock()
	t = time.AfterFunc(interval(), func() {
		if err := msg.InProgress(); err != nil {
			onErr(err)
		}
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			t.Reset(interval())
		}
	})
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		t.Stop()
	}
}

// Retrying a dead letter that cannot be stored: from the first backoff
// delay (at least deadLetterRetryMin), doubling, at most deadLetterRetryMax.
const (
	deadLetterRetryMin = 100 * time.Millisecond
	deadLetterRetryMax = time.Minute
)

// retryDeadLetter calls store (after a first attempt failed) with a capped
// exponential backoff until it succeeds, and reports true; it gives up only
// when the workers shut down (their handler context ends), and reports
// false. Meanwhile the message counts in Stats.DeadLetterFailing.
func (w *Workers) retryDeadLetter(seq uint64, store func(context.Context) error) bool {
	w.stats.DeadLetterFailing.Add(1)
	defer w.stats.DeadLetterFailing.Add(-1)
	ctx := w.handlerCtx
	delay := max(w.retryDelay(1), deadLetterRetryMin)
	for attempt := 2; ; attempt++ {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(delay):
		}
		delay = min(2*delay, deadLetterRetryMax)
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := store(actx)
		cancel()
		if err == nil {
			w.log.Info("dead letter stored after retrying", "seq", seq, "attempts", attempt, "dead_letter", w.opts.DeadLetter)
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		w.stats.Failures.Add(1)
		w.stats.deadLetterFailed(err)
		if attempt <= 5 || attempt%10 == 0 {
			w.log.Error("dead letter still cannot be stored: retrying", "seq", seq, "attempt", attempt, "retry_in", delay,
				"dead_letter", w.opts.DeadLetter, "err", err)
		}
	}
}

// maxBackground bounds the goroutines one consumer's workers run beside
// the handlers: messages kept until their dead letter is stored, max-
// deliveries advisories and replays being handled. When they are all busy,
// the caller does the work itself (a worker, or the subscription), which
// slows intake instead of piling up goroutines.
const maxBackground = 64

// background tracks the goroutines of spawn, so that Close waits for them.
type background struct {
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
	n      int
}

// spawn runs fn in a tracked goroutine and reports true, or reports false
// (and does not run fn) when maxBackground are running or Close is waiting
// for them: the caller then runs fn itself.
func (w *Workers) spawn(fn func()) bool {
	b := &w.bg
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || b.n >= maxBackground {
		return false
	}
	b.n++
	b.wg.Add(1)
	go func() {
		defer func() {
			b.mu.Lock()
			b.n--
			b.mu.Unlock()
			b.wg.Done()
		}()
		fn()
	}()
	return true
}

// subscribeDeadLetters subscribes to the consumer's max-deliveries
// advisories and replay requests. Open calls it before pulling, so that no
// advisory of a message it pulls can be missed.
func (w *Workers) subscribeDeadLetters(ctx context.Context) error {
	ai, err := w.js.AccountInfo(ctx)
	if err != nil {
		return fmt.Errorf("consumer %s: cannot read the JetStream account: %w", w.opts.Consumer, err)
	}
	w.domain = ai.Domain
	// A queue group: in a cluster every node's workers of the consumer
	// subscribe, and one of them acts on each advisory (the dead letter's
	// Nats-Msg-Id keeps a second one harmless all the same).
	w.advisory, err = w.nc.QueueSubscribe(maxDeliveriesSubject(w.opts.Stream, w.opts.Consumer), maxDeliveriesQueue, w.onMaxDeliveries)
	if err != nil {
		return fmt.Errorf("consumer %s: cannot subscribe to max-deliveries advisories: %w", w.opts.Consumer, err)
	}
	// An advisory dropped by a full subscription buffer would be a message
	// neither redelivered nor dead-lettered.
	_ = w.advisory.SetPendingLimits(-1, -1)
	if w.replay, err = w.subscribeReplay(); err != nil {
		_ = w.advisory.Unsubscribe()
		return err
	}
	return nil
}

// maxDeliveriesQueue is the queue group of the max-deliveries advisory
// subscriptions.
const maxDeliveriesQueue = subjects.MaxDeliveriesQueue

// closeDeadLetters ends the subscriptions and waits for the background
// goroutines. Close calls it after the workers stopped, so that an
// advisory for a message they returned is still handled.
func (w *Workers) closeDeadLetters() {
	for _, sub := range []*nats.Subscription{w.advisory, w.replay} {
		if sub != nil {
			_ = sub.Unsubscribe()
		}
	}
	w.bg.mu.Lock()
	w.bg.closed = true
	w.bg.mu.Unlock()
	w.bg.wg.Wait()
}

func maxDeliveriesSubject(stream, consumer string) string {
	return "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + stream + "." + consumer
}

// maxDeliveriesAdvisory is the server's
// $JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES payload
// (server.JSConsumerDeliveryExceededAdvisory).
type maxDeliveriesAdvisory struct {
	Type       string `json:"type"`
	Stream     string `json:"stream"`
	Consumer   string `json:"consumer"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
	Domain     string `json:"domain"`
}

// maxDeliveriesType is the advisory's schema type.
const maxDeliveriesType = "io.nats.jetstream.advisory.v1.max_deliver"

// CheckAdvisoryScope reports why an advisory is not one the local
// JetStream (domain localDomain) sent about stream/consumer, or "" when it
// is. Advisories carry the domain of the server that sent them; a hub's
// advisories that cross a leafnode carry the hub's domain.
func CheckAdvisoryScope(typ, gotType, stream, consumer, domain, wantStream, wantConsumer, localDomain string) string {
	switch {
	case gotType != typ:
		return fmt.Sprintf("type %q, not %q", gotType, typ)
	case stream != wantStream || consumer != wantConsumer:
		return fmt.Sprintf("it names %s/%s, not %s/%s", stream, consumer, wantStream, wantConsumer)
	case domain != localDomain:
		return fmt.Sprintf("it comes from JetStream domain %q, not from the local one %q", domain, localDomain)
	}
	return ""
}

// onMaxDeliveries dead-letters a message the server stopped delivering
// because it reached max_deliver without a verdict (a worker died or hung
// past ack_wait on its last delivery), after checking the advisory
// against the consumer's state. It reads the original by sequence.
func (w *Workers) onMaxDeliveries(nm *nats.Msg) {
	var adv maxDeliveriesAdvisory
	if err := json.Unmarshal(nm.Data, &adv); err != nil {
		w.log.Error("unreadable max-deliveries advisory: ignored", "err", err)
		return
	}
	if why := CheckAdvisoryScope(maxDeliveriesType, adv.Type, adv.Stream, adv.Consumer, adv.Domain, w.opts.Stream, w.opts.Consumer, w.domain); why != "" {
		w.log.Warn("max-deliveries advisory not from this server's JetStream: ignored", "seq", adv.StreamSeq, "why", why)
		return
	}
	run := func() { w.deadLetterBySeq(adv) }
	if !w.spawn(run) {
		run()
	}
}

// errNotMaxDelivered means an advisory does not match the consumer's
// state: nothing to dead-letter.
var errNotMaxDelivered = errors.New("advisory does not match the consumer's state")

// verifyMaxDeliveries checks an advisory against the server's state of the
// consumer, as far as the JetStream API shows it: the consumer delivered
// the message, its max_deliver is what the advisory reports, it holds at
// least one message past a redelivery without an ack (the server keeps the
// delivery count of a max-delivered message until it leaves the stream,
// and drops it on an ack; it shows no such count for max_deliver 1), and
// these workers did not acknowledge or
// terminate the message themselves. The ack floor proves nothing: the
// server moves it past a message that reached max_deliver.
func (w *Workers) verifyMaxDeliveries(ctx context.Context, adv maxDeliveriesAdvisory) error {
	c, err := w.js.Consumer(ctx, w.opts.Stream, w.opts.Consumer)
	if err != nil {
		return err
	}
	ci, err := c.Info(ctx)
	if err != nil {
		return err
	}
	switch {
	case ci.Config.MaxDeliver <= 0:
		return fmt.Errorf("%w: the consumer has no max_deliver", errNotMaxDelivered)
	case adv.Deliveries < uint64(ci.Config.MaxDeliver):
		return fmt.Errorf("%w: %d deliveries, below max_deliver %d", errNotMaxDelivered, adv.Deliveries, ci.Config.MaxDeliver)
	case adv.StreamSeq == 0 || adv.StreamSeq > ci.Delivered.Stream:
		return fmt.Errorf("%w: seq %d was never delivered (delivered up to %d)", errNotMaxDelivered, adv.StreamSeq, ci.Delivered.Stream)
	case ci.NumRedelivered == 0 && ci.Config.MaxDeliver > 1: // the server reports 0 for max_deliver 1
		return fmt.Errorf("%w: the consumer holds no unacknowledged redelivered message", errNotMaxDelivered)
	case w.stats.settled(adv.StreamSeq):
		return fmt.Errorf("%w: these workers acknowledged or terminated seq %d", errNotMaxDelivered, adv.StreamSeq)
	}
	return nil
}

// deadLetterBySeq verifies a max-deliveries advisory and dead-letters its
// message, retrying until it is stored or the workers shut down.
func (w *Workers) deadLetterBySeq(adv maxDeliveriesAdvisory) {
	reason := fmt.Sprintf("reached max_deliver (%d deliveries) without a verdict: the handler did not finish within ack_wait", adv.Deliveries)
	verdict := "without a verdict"
	if last, ok := w.activity.retryReason(adv.StreamSeq); ok {
		// Given back for a retry that max_deliver, lowered since (a
		// reload, nats consumer edit), no longer allows.
		reason = fmt.Sprintf("gave up after %d deliveries (max_deliver was lowered while a retry waited): %s", adv.Deliveries, last)
		verdict = "after the handler asked for a retry"
	}
	var raw *jetstream.RawStreamMsg
	var created time.Time
	prepare := func(ctx context.Context) error {
		if err := w.verifyMaxDeliveries(ctx, adv); err != nil {
			return err
		}
		s, err := w.js.Stream(ctx, w.opts.Stream)
		if err != nil {
			return err
		}
		if raw, err = s.GetMsg(ctx, adv.StreamSeq); err != nil {
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				return fmt.Errorf("%w: seq %d is no longer in stream %s", errNotMaxDelivered, adv.StreamSeq, w.opts.Stream)
			}
			return fmt.Errorf("read message %d: %w", adv.StreamSeq, err)
		}
		created = s.CachedInfo().Created
		return nil
	}
	store := func(ctx context.Context) error {
		if raw == nil {
			if err := prepare(ctx); err != nil {
				return err
			}
		}
		if w.opts.DeadLetter == "" {
			return nil
		}
		m := &handler.Message{
			Subject:   raw.Subject,
			Stream:    w.opts.Stream,
			Consumer:  w.opts.Consumer,
			Sequence:  raw.Sequence,
			Delivery:  adv.Deliveries,
			Header:    raw.Header,
			Data:      raw.Data,
			Published: raw.Time,
		}
		if m.Header == nil {
			m.Header = nats.Header{}
		}
		return w.publishDeadLetter(ctx, m, created, reason)
	}
	ctx, cancel := context.WithTimeout(w.handlerCtx, 10*time.Second)
	err := store(ctx)
	cancel()
	if errors.Is(err, errNotMaxDelivered) {
		w.log.Warn("max-deliveries advisory does not match the consumer's state: ignored", "seq", adv.StreamSeq, "why", err)
		return
	}
	if err != nil {
		w.stats.Failures.Add(1)
		w.stats.deadLetterFailed(err)
		w.log.Error("cannot dead-letter a message that reached max_deliver: retrying until it is stored",
			"seq", adv.StreamSeq, "dead_letter", w.opts.DeadLetter, "err", err)
		var ignored error
		ok := w.retryDeadLetter(adv.StreamSeq, func(ctx context.Context) error {
			err := store(ctx)
			if errors.Is(err, errNotMaxDelivered) {
				ignored = err
				return nil
			}
			return err
		})
		if !ok {
			w.log.Error("shutting down before the dead letter of a message that reached max_deliver was stored: it stays in its stream, not delivered again; republish it by hand",
				"stream", w.opts.Stream, "seq", adv.StreamSeq, "dead_letter", w.opts.DeadLetter)
			return
		}
		if ignored != nil {
			w.log.Warn("max-deliveries advisory does not match the consumer's state: ignored", "seq", adv.StreamSeq, "why", ignored)
			return
		}
	}
	w.stats.noteSettled(adv.StreamSeq)
	w.stats.DeadLettered.Add(1)
	if w.opts.DeadLetter == "" {
		w.log.Error("message reached max_deliver "+verdict+"; dead-lettering is disabled, the server will not deliver it again",
			"seq", adv.StreamSeq, "deliveries", adv.Deliveries, "reason", reason)
		return
	}
	w.log.Error("message dead-lettered after max_deliver "+verdict, "seq", adv.StreamSeq, "subject", raw.Subject,
		"deliveries", adv.Deliveries, "dead_letter", w.opts.DeadLetter, "reason", reason)
}

// DeadLetter is a stored dead letter, read back for inspection or replay.
type DeadLetter struct {
	Stream          string // the dead-letter stream
	Seq             uint64 // its sequence there
	Subject         string // dlq.<CONSUMER>.<original subject>
	Consumer        string
	OriginalSubject string
	OriginalStream  string
	// OriginalStreamCreated is when the original's stream was created
	// (zero for dead letters of holdfast versions before it was recorded).
	OriginalStreamCreated time.Time
	OriginalSeq           uint64
	// OriginalTime is when the original was stored in its stream (zero
	// for dead letters of holdfast versions before it was recorded).
	OriginalTime time.Time
	Deliveries   uint64
	FailedAt     time.Time
	Error        string
	Header       nats.Header
	Data         []byte
}

// ReplayRef is dl as a replay request (RequestReplay) names it: its
// stream, sequence, subject, consumer and Nats-Msg-Id, without its
// payload and other headers, so that a list of many dead letters to
// replay one by one does not hold them all in memory.
func (dl DeadLetter) ReplayRef() DeadLetter {
	return DeadLetter{Stream: dl.Stream, Seq: dl.Seq, Subject: dl.Subject, Consumer: dl.Consumer,
		Header: nats.Header{nats.MsgIdHdr: dl.Header.Values(nats.MsgIdHdr)}}
}

// ParseDeadLetter reads the Holdfast-* headers of a stored dead letter.
func ParseDeadLetter(stream string, raw *jetstream.RawStreamMsg) DeadLetter {
	h := raw.Header
	if h == nil {
		h = nats.Header{}
	}
	dl := DeadLetter{
		Stream:          stream,
		Seq:             raw.Sequence,
		Subject:         raw.Subject,
		OriginalSubject: h.Get(HeaderOriginalSubject),
		OriginalStream:  h.Get(HeaderOriginalStream),
		Error:           h.Get(HeaderError),
		Header:          h,
		Data:            raw.Data,
	}
	if rest, ok := strings.CutPrefix(raw.Subject, "dlq."); ok {
		dl.Consumer, _, _ = strings.Cut(rest, ".")
	}
	dl.OriginalSeq, _ = strconv.ParseUint(h.Get(HeaderOriginalSeq), 10, 64)
	dl.Deliveries, _ = strconv.ParseUint(h.Get(HeaderDeliveries), 10, 64)
	dl.FailedAt, _ = time.Parse(time.RFC3339Nano, h.Get(HeaderFailedAt))
	dl.OriginalStreamCreated, _ = time.Parse(time.RFC3339Nano, h.Get(HeaderOriginalStreamCreated))
	dl.OriginalTime, _ = time.Parse(time.RFC3339Nano, h.Get(HeaderOriginalTime))
	return dl
}

// ListDeadLetters calls fn for every dead letter in stream, oldest first,
// or only those of consumer when it is not "", up to the last one stored
// when it was called. It reads them one at a time with the stream's
// message get, asking for the next one at or after a sequence on the
// consumer's dead-letter subjects: no consumer is created, so none is
// left behind in nats consumer ls, in a backup taken meanwhile, or on the
// server after the process exits. (An ordered consumer makes a new server
// consumer for each Next and deletes the old one in the background, which
// an exiting holdfast dlq never waits for.)
//
// A request nobody answers in time (in a cluster, while the stream's
// leader changes) is asked again, each attempt bounded by
// listRequestTimeout, for up to listRetryFor.
func ListDeadLetters(ctx context.Context, js jetstream.JetStream, stream, consumer string, fn func(DeadLetter) error) error {
	var s jetstream.Stream
	var info *jetstream.StreamInfo
	err := listRequest(ctx, js, func(ctx context.Context) (err error) {
		if s, err = js.Stream(ctx, stream); err != nil {
			return err
		}
		info, err = s.Info(ctx)
		return err
	})
	if err != nil {
		return fmt.Errorf("dead-letter stream %s: %w", stream, err)
	}
	if info.State.Msgs == 0 {
		return nil
	}
	r := deadLetterReader{ctx: ctx, js: js, s: s, stream: stream, filter: deadLetterFilter(consumer)}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		dl, ok, err := r.next(seq, info.State.LastSeq)
		if err != nil || !ok {
			return err
		}
		if err := fn(dl); err != nil {
			return err
		}
		seq = dl.Seq
	}
	return nil
}

// deadLetterReader reads the dead letters of one filter in a stream.
type deadLetterReader struct {
	ctx    context.Context
	js     jetstream.JetStream
	s      jetstream.Stream
	stream string
	filter string
}

// next reads the first dead letter at or after sequence seq, up to hi;
// ok is false when there is none.
func (r *deadLetterReader) next(seq, hi uint64) (dl DeadLetter, ok bool, err error) {
	var raw *jetstream.RawStreamMsg
	err = listRequest(r.ctx, r.js, func(ctx context.Context) (err error) {
		raw, err = r.s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(r.filter))
		return err
	})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return dl, false, nil
	}
	if err != nil {
		return dl, false, fmt.Errorf("dead-letter stream %s at sequence %d: %w", r.stream, seq, err)
	}
	if raw.Sequence > hi {
		return dl, false, nil
	}
	return ParseDeadLetter(r.stream, raw), true, nil
}

// deadLetterFilter is the subject filter of consumer's dead letters, or
// of every message when consumer is "".
func deadLetterFilter(consumer string) string {
	if consumer == "" {
		return ">"
	}
	return subjects.DeadLetters(consumer)
}

// NewestDeadLetters returns the newest n dead letters in stream, newest
// first, only consumer's when it is not "". A shared dead-letter stream
// can hold any number of other consumers' dead letters after consumer's
// newest, so it looks back in windows that double, from the stream's
// last sequence, and reads each with the get for the next message on
// consumer's subjects (the server skips the others); a window that
// holds more than it needs is halved until its newest are found. It
// reads about n messages for a consumer whose dead letters are the
// newest, and at most about 2n per halving otherwise.
func NewestDeadLetters(ctx context.Context, js jetstream.JetStream, stream, consumer string, n int) ([]DeadLetter, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, fmt.Errorf("dead-letter stream %s: %w", stream, err)
	}
	st := s.CachedInfo().State
	if st.Msgs == 0 || n <= 0 {
		return nil, nil
	}
	r := deadLetterReader{ctx: ctx, js: js, s: s, stream: stream, filter: deadLetterFilter(consumer)}
	var out []DeadLetter
	lo, hi, window := st.FirstSeq, st.LastSeq, uint64(n)
	for len(out) < n {
		from := lo
		if hi-lo >= window {
			from = hi - window + 1
		}
		got, err := r.newest(from, hi, n-len(out))
		if err != nil {
			return nil, err
		}
		out = append(out, got...)
		if from == lo {
			break
		}
		hi, window = from-1, window*2
	}
	return out, nil
}

// newest returns the newest n dead letters in sequences lo to hi, newest
// first.
func (r *deadLetterReader) newest(lo, hi uint64, n int) ([]DeadLetter, error) {
	got, err := r.forward(lo, hi, n+1)
	if err != nil || len(got) <= n {
		slices.Reverse(got)
		return got, err
	}
	mid := lo + (hi-lo)/2 + 1
	upper, err := r.newest(mid, hi, n)
	if err != nil || len(upper) == n {
		return upper, err
	}
	lower, err := r.newest(lo, mid-1, n-len(upper))
	return append(upper, lower...), err
}

// forward returns the first n dead letters in sequences lo to hi, oldest
// first.
func (r *deadLetterReader) forward(lo, hi uint64, n int) ([]DeadLetter, error) {
	var out []DeadLetter
	for seq := lo; seq <= hi && len(out) < n; seq++ {
		dl, ok, err := r.next(seq, hi)
		if err != nil || !ok {
			return out, err
		}
		out = append(out, dl)
		seq = dl.Seq
	}
	return out, nil
}

// listRequestTimeout bounds one request of ListDeadLetters: one that is
// lost (sent to a stream leader that just stepped down) is asked again
// after it, instead of using up the caller's whole deadline. listRetryFor
// bounds the attempts of one request: a leader election takes seconds,
// and an operator waiting for holdfast dlq ls gets the error then.
const (
	listRequestTimeout = 5 * time.Second
	listRetryFor       = 30 * time.Second
)

// listRequest runs the read-only request f, each attempt with its own
// timeout, again while it fails in a way that passes (settle.Transient).
func listRequest(ctx context.Context, js jetstream.JetStream, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, listRetryFor)
	defer cancel()
	clustered := js.Conn().ConnectedClusterName() != ""
	return settle.Retry(ctx, func(err error) bool { return settle.Transient(err, clustered) }, nil, func() error {
		actx, cancel := context.WithTimeout(ctx, listRequestTimeout)
		defer cancel()
		return f(actx)
	})
}

// GetDeadLetter reads one dead letter by sequence.
func GetDeadLetter(ctx context.Context, js jetstream.JetStream, stream string, seq uint64) (DeadLetter, error) {
	s, err := js.Stream(ctx, stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return DeadLetter{}, fmt.Errorf("dead-letter stream %s does not exist: is holdfast running with this config? (%w)", stream, err)
	}
	if err != nil {
		return DeadLetter{}, fmt.Errorf("dead-letter stream %s: %w", stream, err)
	}
	raw, err := s.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return DeadLetter{}, fmt.Errorf("there is no dead letter #%d in %s (replayed or purged already, or never there): list them with holdfast dlq ls", seq, stream)
	}
	if err != nil {
		return DeadLetter{}, fmt.Errorf("dead letter %s #%d: %w", stream, seq, err)
	}
	return ParseDeadLetter(stream, raw), nil
}

// settledWindow is how many sequences Stats remembers as acknowledged or
// terminated by the workers, to refuse a max-deliveries advisory for one.
const settledWindow = 16384

// settledSeqs remembers the sequences the workers acknowledged or
// terminated, one per residue modulo settledWindow: a sequence is
// forgotten once one settledWindow (or a multiple) above it is settled.
// A consumer settles its sequences roughly in order, so that is the
// latest settledWindow of them, kept without a map (the ack path notes
// every one).
type settledSeqs struct {
	mu   sync.Mutex
	seqs []uint64 // seqs[seq%settledWindow] == seq: settled
}

func (s *Stats) noteSettled(seq uint64) {
	r := &s.settledSeqs
	r.mu.Lock()
	defer r.mu.Unlock()
	r.add(seq)
}

// noteSettledAll is noteSettled for every sequence of items, under one lock.
func (s *Stats) noteSettledAll(items []ackItem) {
	r := &s.settledSeqs
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, it := range items {
		r.add(it.seq)
	}
}

// add remembers seq; r.mu is held.
func (r *settledSeqs) add(seq uint64) {
	if r.seqs == nil {
		r.seqs = make([]uint64, settledWindow)
	}
	r.seqs[seq%settledWindow] = seq
}

func (s *Stats) settled(seq uint64) bool {
	r := &s.settledSeqs
	r.mu.Lock()
	defer r.mu.Unlock()
	return seq != 0 && r.seqs != nil && r.seqs[seq%settledWindow] == seq
}

func (s *Stats) deadLetterFailed(err error) {
	msg := err.Error()
	s.deadLetterErr.Store(&msg)
}

// DeadLetterError is the latest error of a dead-letter publish, or "";
// it matters while DeadLetterFailing is above zero.
func (s *Stats) DeadLetterError() string {
	if p := s.deadLetterErr.Load(); p != nil {
		return *p
	}
	return ""
}
