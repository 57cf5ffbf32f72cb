package monitor

// Retention-loss detection.
//
// With limits retention, max_msgs, max_bytes and max_age remove the oldest
// messages whether or not a consumer has acknowledged them (discard =
// "old"). A message a consumer had not acknowledged when it was removed is
// lost for that consumer. There are two kinds:
//
//   - delivered and unacknowledged (ack pending): the server terminates the
//     delivery and says so in a MSG_TERMINATED advisory with the reason
//     "Unacknowledged message was deleted". The Monitor counts those
//     advisories, one per message, with its sequence.
//   - not delivered yet: nothing tells. The Monitor compares, at every
//     check, the stream's first sequence with the consumer's delivered
//     position. Sequences the stream dropped that the consumer had not
//     reached are lost. For a consumer that reads every subject of its
//     stream, the count is sequence arithmetic; when the consumer moved
//     past removed sequences during the same check interval, the
//     deliveries it made in that interval (from the consumer's delivered
//     counter) tell how many it received and how many it skipped. That is
//     exact unless the interval also had redeliveries, which would make it
//     a lower bound. For a consumer with a filter narrower than its stream,
//     the filter's messages are counted from the durable consumer's own
//     pending count when the stream stored nothing for a second (it trails
//     new messages), and with short-lived probe consumers otherwise, so an
//     idle appliance creates none: pending before, plus messages stored for the filter since, minus
//     pending now, minus deliveries. Messages stored and
//     removed between two checks (a burst of more than max_msgs within
//     one check interval) cannot be seen that way: the count is then a
//     lower bound, and the log line says "at least".
//
// A removal the server did not cause (`nats stream rmm`, a purge) counts
// the same way: the message is gone before it was acknowledged.

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/internal/subjects"
	"github.com/holdfast-io/holdfast/pipeline"
)

// consumerTracker is the Monitor's memory of one consumer between checks.
type consumerTracker struct {
	mc Consumer

	// The baseline belongs to this consumer and stream (an operator may
	// delete and recreate either).
	init            bool
	consumerCreated time.Time
	streamCreated   time.Time
	filtered        bool

	// Every-subject consumers: sequences below w are accounted for;
	// dseq is the consumer's delivery counter at the last check.
	w    uint64
	dseq uint64

	// Filtered consumers: pending count, stream last sequence, delivered
	// position and delivery counter at the last consistent check.
	base   filteredBase
	baseOK bool

	// Guarded by Monitor.mu (the advisory handler updates them).
	lost     uint64
	unlogged lossRange
	lastLoss *LossEvent

	last     *jetstream.ConsumerInfo
	lastSI   *jetstream.StreamInfo
	ratios   map[string]float64
	warnings map[string]string

	oldestSeq     uint64
	oldestTime    time.Time
	oldestChecked time.Time

	progressKey  [3]uint64
	lastProgress time.Time
	// expect is why the consumer should be making progress at the last
	// check (see expecting); expectNone when it waits on purpose.
	expect expectation
	grace  time.Duration
}

type filteredBase struct {
	pending, lastSeq, sseq, dseq uint64
}

// lossRange accumulates lost messages until they are logged.
type lossRange struct {
	count, first, last uint64
	// atLeast: more may have been lost than counted (filtered consumers).
	atLeast bool
}

func (r *lossRange) add(first, last, n uint64) {
	if n == 0 {
		return
	}
	if r.count == 0 || first < r.first {
		r.first = first
	}
	if last > r.last {
		r.last = last
	}
	r.count += n
}

// observation is one consistent reading of a consumer and its stream.
type observation struct {
	si *jetstream.StreamInfo
	ci *jetstream.ConsumerInfo
	// consistent: no message was stored between si and ci, so si's last
	// sequence is the one ci's pending count refers to.
	consistent bool
	filtered   bool
	// probed: newMatching counts the filter's messages after the
	// baseline's last sequence, at si's last sequence.
	probed      bool
	newMatching uint64
	// pending counts the filter's messages from the consumer's delivered
	// position on, at si's last sequence (when consistent).
	pending uint64
}

// filtered reports whether a consumer reads only some of its stream's
// messages. A barrier subject (subjects.Barrier) holds none.
func filtered(streamSubjects []string, cc jetstream.ConsumerConfig) bool {
	filters := cc.FilterSubjects
	if cc.FilterSubject != "" {
		filters = append(filters, cc.FilterSubject)
	}
	if len(filters) == 0 {
		return false
	}
	for _, f := range filters {
		if f == ">" {
			return false
		}
	}
	a := StoredSubjects(streamSubjects)
	b := append([]string(nil), filters...)
	sort.Strings(a)
	sort.Strings(b)
	return strings.Join(a, "\x00") != strings.Join(b, "\x00")
}

// StoredSubjects is subjs without the barrier subjects holdfast adds to a
// stream for the MQTT gate: they never hold a message.
func StoredSubjects(subjs []string) []string {
	return slices.DeleteFunc(slices.Clone(subjs), func(s string) bool { return strings.HasPrefix(s, subjects.BarrierPrefix) })
}

func consumerFilters(cc jetstream.ConsumerConfig) []string {
	if cc.FilterSubject != "" {
		return []string{cc.FilterSubject}
	}
	return cc.FilterSubjects
}

// observeFiltered reads a filtered consumer so that its pending count and
// the stream's last sequence belong together, and, when messages may have
// been lost since the baseline, counts the filter's new messages.
func (m *Monitor) observeFiltered(ctx context.Context, s jetstream.Stream, si *jetstream.StreamInfo, ci *jetstream.ConsumerInfo, t *consumerTracker) (observation, error) {
	obs := observation{si: si, ci: ci, filtered: true}
	sameIdentity := t.init && t.filtered && t.consumerCreated.Equal(ci.Created) && t.streamCreated.Equal(si.Created)
	gated := sameIdentity && t.baseOK && si.State.FirstSeq > t.base.sseq
	for try := 0; try < 3; try++ {
		if try > 0 {
			var err error
			if si, err = s.Info(ctx); err != nil {
				return obs, err
			}
			c, err := s.Consumer(ctx, t.mc.Consumer)
			if err != nil {
				return obs, err
			}
			ci = c.CachedInfo()
			obs.si, obs.ci = si, ci
		}
		// The consumer's own pending count trails new messages (the
		// server counts them on another goroutine after storing them), so
		// it is used only when no message was stored for a while; on a
		// busy stream a probe counts afresh.
		var pending uint64
		if quietStream(si, time.Now()) {
			pending = ci.NumPending
		} else {
			var err error
			if pending, err = countFrom(ctx, s, consumerFilters(ci.Config), ci.Delivered.Stream+1); err != nil {
				return obs, err
			}
		}
		var n uint64
		var err error
		if gated {
			if n, err = countFrom(ctx, s, consumerFilters(ci.Config), t.base.lastSeq+1); err != nil {
				return obs, err
			}
		}
		after, err := s.Info(ctx)
		if err != nil {
			return obs, err
		}
		if after.State.LastSeq == si.State.LastSeq {
			obs.consistent, obs.probed, obs.newMatching, obs.pending = true, gated, n, pending
			return obs, nil
		}
	}
	return obs, nil
}

// quietAfter is how long a stream must have stored nothing for the
// server's pending count of a consumer to have caught up with it.
const quietAfter = time.Second

// quietStream reports whether si's stream stored no message for
// quietAfter before now: an idle stream is read without probes.
func quietStream(si *jetstream.StreamInfo, now time.Time) bool {
	return si.State.LastSeq == 0 || (!si.State.LastTime.IsZero() && now.Sub(si.State.LastTime) >= quietAfter)
}

// countFrom counts the messages of the stream on the given subjects with
// a sequence of at least seq, with a short-lived consumer that is deleted
// at once.
func countFrom(ctx context.Context, s jetstream.Stream, subjects []string, seq uint64) (uint64, error) {
	cc := jetstream.ConsumerConfig{
		Description:       "holdfast retention probe",
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       seq,
		AckPolicy:         jetstream.AckNonePolicy,
		MemoryStorage:     true,
		InactiveThreshold: time.Minute,
	}
	if len(subjects) == 1 {
		cc.FilterSubject = subjects[0]
	} else {
		cc.FilterSubjects = subjects
	}
	c, err := s.CreateConsumer(ctx, cc)
	if err != nil {
		return 0, fmt.Errorf("retention probe: %w", err)
	}
	info := c.CachedInfo()
	_ = s.DeleteConsumer(ctx, info.Name)
	return info.NumPending, nil
}

// invalidate forgets the baseline: the consumer or its stream is gone.
func (t *consumerTracker) invalidate() {
	t.init = false
	t.baseOK = false
	t.last = nil
}

// account updates the loss count with one observation. Monitor.mu is held.
func (m *Monitor) account(t *consumerTracker, obs observation, now time.Time) {
	si, ci := obs.si, obs.ci
	first := si.State.FirstSeq
	sseq := ci.Delivered.Stream + 1
	dseq := ci.Delivered.Consumer
	prev := t.lastSI
	t.last, t.lastSI = ci, si

	if !t.init || t.filtered != obs.filtered || !t.consumerCreated.Equal(ci.Created) || !t.streamCreated.Equal(si.Created) {
		m.start(t, obs)
		m.logLoss(t, nil, si, now)
		return
	}

	if !obs.filtered {
		if first > t.w {
			var lost uint64
			// Never reached by the consumer: certainly lost.
			if from := max(t.w, sseq); first > from {
				lost += first - from
			}
			// Passed by the consumer during the interval and gone now:
			// delivered, or skipped because they were already removed.
			if end := min(first, sseq); end > t.w {
				passed := sseq - t.w
				delivered := dseq - min(dseq, t.dseq)
				skipped := passed - min(passed, delivered)
				lost += min(skipped, end-t.w)
			}
			if lost > 0 {
				t.lost += lost
				t.unlogged.add(t.w, first-1, lost)
			}
		}
		t.w = max(t.w, first, sseq)
		t.dseq = dseq
	} else {
		gated := t.baseOK && first > t.base.sseq
		switch {
		case gated && obs.consistent && obs.probed:
			delivered := dseq - min(dseq, t.base.dseq)
			in := t.base.pending + obs.newMatching
			out := obs.pending + delivered
			if in > out {
				lost := in - out
				t.lost += lost
				t.unlogged.add(t.base.sseq, first-1, lost)
			}
			if first > t.base.lastSeq+1 {
				// Messages stored after the last check are gone already.
				t.unlogged.atLeast = true
				if t.unlogged.count == 0 {
					t.unlogged.first, t.unlogged.last = t.base.lastSeq+1, first-1
				}
			}
			t.base = filteredBase{obs.pending, si.State.LastSeq, sseq, dseq}
		case gated:
			// Keep the older baseline until a consistent reading.
		case obs.consistent:
			t.base = filteredBase{obs.pending, si.State.LastSeq, sseq, dseq}
			t.baseOK = true
		}
	}
	m.logLoss(t, prev, si, now)
}

// start sets the baseline at the first observation of a consumer, and
// reports messages that left the stream before holdfast was watching.
func (m *Monitor) start(t *consumerTracker, obs observation) {
	si, ci := obs.si, obs.ci
	first := si.State.FirstSeq
	sseq := ci.Delivered.Stream + 1
	t.init = true
	t.filtered = obs.filtered
	t.consumerCreated = ci.Created
	t.streamCreated = si.Created
	t.w = max(first, sseq)
	t.dseq = ci.Delivered.Consumer
	t.baseOK = false
	if obs.filtered && obs.consistent {
		t.base = filteredBase{obs.pending, si.State.LastSeq, sseq, ci.Delivered.Consumer}
		t.baseOK = true
	}
	if obs.filtered {
		return
	}
	if sseq < first {
		m.log.Warn("consumer is behind its stream's first message: messages were removed before it received them (found at start-up, not counted)",
			"stream", t.mc.Stream, "consumer", t.mc.Consumer, "removed", first-sseq, "seq_from", sseq, "seq_to", first-1)
	}
	if af := ci.AckFloor.Stream; af+1 < min(first, sseq) {
		m.log.Warn("messages delivered to the consumer were removed from the stream before they were acknowledged (found at start-up, not counted)",
			"stream", t.mc.Stream, "consumer", t.mc.Consumer, "at_most", min(first, sseq)-af-1, "seq_from", af+1, "seq_to", min(first, sseq)-1)
	}
}

// logLoss logs what was lost since the last log line, once per check;
// prev is the stream as the check before saw it (nil at the first).
// Monitor.mu is held.
func (m *Monitor) logLoss(t *consumerTracker, prev, si *jetstream.StreamInfo, now time.Time) {
	r := t.unlogged
	if r.count == 0 && !r.atLeast {
		return
	}
	t.unlogged = lossRange{}
	cause := lossCause(prev, si, now)
	fix := "process faster (more workers), raise the stream's limits, or set discard = \"new\" so publishers are refused instead"
	if cause == causeDeleted {
		fix = "a client deleted or purged them (nats stream purge, nats stream rmm, a rollup): process them before removing them"
	}
	if r.count == 0 {
		m.log.Warn("messages were stored and removed between two checks: the consumer may have lost some of them, which holdfast cannot count for a consumer with a filter",
			"stream", t.mc.Stream, "consumer", t.mc.Consumer, "seq_from", r.first, "seq_to", r.last, "cause", cause,
			"fix", "raise the stream's limits far above what arrives per second, or set discard = \"new\"")
		return
	}
	t.lastLoss = &LossEvent{Time: now, Count: r.count, AtLeast: r.atLeast, FirstSeq: r.first, LastSeq: r.last, Cause: cause}
	m.log.Warn("messages removed from the stream before the consumer acknowledged them",
		"stream", t.mc.Stream, "consumer", t.mc.Consumer, "lost", r.count, "at_least", r.atLeast, "seq_from", r.first, "seq_to", r.last,
		"lost_total", t.lost, "cause", cause, "discard", discardName(si.Config),
		"fix", fix)
}

// causeDeleted is lossCause's answer when no limit removed the messages.
const causeDeleted = "deleted"

// lossCause names the limit most likely to have removed messages; prev
// is the stream at the check before (nil when unknown). max_age is named
// only when a message the stream held then could have reached it by now:
// what a client purged or deleted from a stream far below its max_age
// was not removed by it.
func lossCause(prev, si *jetstream.StreamInfo, now time.Time) string {
	c, st := si.Config, si.State
	switch {
	case c.MaxMsgs > 0 && float64(st.Msgs) >= 0.99*float64(c.MaxMsgs):
		return "max_msgs"
	case c.MaxBytes > 0 && float64(st.Bytes) >= 0.9*float64(c.MaxBytes):
		return "max_bytes"
	case c.MaxAge > 0 && !tooYoungToExpire(prev, c.MaxAge, now):
		return "max_age"
	}
	return causeDeleted
}

// tooYoungToExpire reports whether every message removed since prev was
// stored too recently to have reached maxAge by now: they are the ones
// prev held, from its first message on, and any stored after it.
func tooYoungToExpire(prev *jetstream.StreamInfo, maxAge time.Duration, now time.Time) bool {
	if prev == nil {
		return false
	}
	oldest := prev.State.FirstTime
	if prev.State.Msgs == 0 {
		oldest = prev.State.LastTime // what came since is younger still
	}
	return !oldest.IsZero() && oldest.Add(maxAge).After(now)
}

// warn computes how close the consumer's backlog is to each stream limit
// and logs when a warning starts or ends.
func (m *Monitor) warn(t *consumerTracker, si *jetstream.StreamInfo, ci *jetstream.ConsumerInfo, oldest time.Time, now time.Time) {
	ratios := map[string]float64{}
	c, st := si.Config, si.State
	backlog := ci.NumPending + uint64(max(ci.NumAckPending, 0))
	// The span from the consumer's oldest unacknowledged message to the
	// newest message is what a limit has to remove before a loss.
	var span uint64
	if backlog > 0 {
		from := max(ci.AckFloor.Stream+1, st.FirstSeq)
		if st.LastSeq >= from {
			span = st.LastSeq - from + 1
		}
		span = min(span, st.Msgs)
	}
	if c.MaxMsgs > 0 {
		ratios["max_msgs"] = float64(span) / float64(c.MaxMsgs)
	}
	if c.MaxBytes > 0 && st.Msgs > 0 {
		ratios["max_bytes"] = float64(span) * float64(st.Bytes) / float64(st.Msgs) / float64(c.MaxBytes)
	}
	if c.MaxAge > 0 {
		r := 0.0
		if backlog > 0 && !oldest.IsZero() {
			r = float64(now.Sub(oldest)) / float64(c.MaxAge)
		}
		ratios["max_age"] = math.Max(r, 0)
	}
	t.ratios = ratios

	active := map[string]string{}
	full := "the oldest unprocessed messages will be removed (discard = old)"
	if c.Discard == jetstream.DiscardNew {
		full = "publishes will be refused when the stream is full (discard = new)"
	}
	pct := func(r float64) string { return fmt.Sprintf("%.0f%%", 100*r) }
	if r, ok := ratios["max_msgs"]; ok && r >= m.opts.WarnRatio {
		active["max_msgs"] = fmt.Sprintf("consumer %s: backlog spans %d messages, %s of stream %s's max_msgs (%d): %s",
			t.mc.Consumer, span, pct(r), t.mc.Stream, c.MaxMsgs, full)
	}
	if r, ok := ratios["max_bytes"]; ok && r >= m.opts.WarnRatio {
		active["max_bytes"] = fmt.Sprintf("consumer %s: backlog holds about %s of stream %s's max_bytes (%d): %s",
			t.mc.Consumer, pct(r), t.mc.Stream, c.MaxBytes, full)
	}
	if r, ok := ratios["max_age"]; ok && r >= m.opts.WarnRatio {
		active["max_age"] = fmt.Sprintf("consumer %s: oldest unacknowledged message is %s old, %s of stream %s's max_age (%s): it will expire unprocessed",
			t.mc.Consumer, now.Sub(oldest).Round(time.Second), pct(r), t.mc.Stream, c.MaxAge)
	}
	for kind, text := range active {
		if _, was := t.warnings[kind]; !was {
			m.log.Warn("consumer backlog close to a stream limit: messages will be lost unless it catches up",
				"stream", t.mc.Stream, "consumer", t.mc.Consumer, "limit", kind, "ratio", math.Round(ratios[kind]*100)/100, "detail", text)
		}
	}
	for kind := range t.warnings {
		if _, is := active[kind]; !is {
			m.log.Info("consumer backlog back below the warning level", "stream", t.mc.Stream, "consumer", t.mc.Consumer, "limit", kind)
		}
	}
	t.warnings = active
}

// oldestUnacked returns when the consumer's oldest unacknowledged
// message was stored (zero without a backlog), reading it at most every
// few seconds: for the max_age ratio and the backlog's age.
func (m *Monitor) oldestUnacked(ctx context.Context, s jetstream.Stream, si *jetstream.StreamInfo, ci *jetstream.ConsumerInfo, t *consumerTracker, now time.Time) time.Time {
	if ci.NumPending+uint64(max(ci.NumAckPending, 0)) == 0 {
		return time.Time{}
	}
	seq := max(ci.AckFloor.Stream+1, si.State.FirstSeq)
	filters := consumerFilters(ci.Config)
	if seq == si.State.FirstSeq && !filtered(si.Config.Subjects, ci.Config) {
		return si.State.FirstTime
	}
	if seq == t.oldestSeq || now.Sub(t.oldestChecked) < 5*time.Second {
		return t.oldestTime
	}
	subject := ">"
	if len(filters) == 1 {
		subject = filters[0]
	}
	msg, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
	t.oldestChecked = now
	if err != nil {
		return t.oldestTime
	}
	t.oldestSeq, t.oldestTime = seq, msg.Time
	return msg.Time
}

// expectation is why a consumer's workers should be making progress.
type expectation int

const (
	expectNone expectation = iota
	// expectPull: a worker is idle while the consumer has messages it may
	// deliver (pending, and max_ack_pending not reached).
	expectPull
	// expectReturn: messages await an acknowledgement that no running
	// handler and no delayed retry accounts for; the server redelivers
	// them when their ack_wait (or the consumer's backoff) runs out.
	expectReturn
	// expectOthers: a consumer without in-process workers has
	// max_ack_pending messages out to other clients.
	expectOthers
)

// expecting tells whether the consumer should be making progress now, and
// how long beyond the stall timeout it may take (the ack_wait, for
// messages the server has to time out first). Holdfast's own workers are
// expected to progress only when they could: a handler still running
// within its time and a message waiting for a delayed retry (backoff,
// Retry-After) are waits on purpose, not stalls.
func (t *consumerTracker) expecting(ci *jetstream.ConsumerInfo, act pipeline.Activity) (expectation, time.Duration) {
	ackPending := uint64(max(ci.NumAckPending, 0))
	pinned := ci.Config.MaxAckPending > 0 && ci.NumAckPending >= ci.Config.MaxAckPending
	if t.mc.Workers == nil || t.mc.WantWorkers == 0 {
		if t.mc.WantWorkers == 0 && pinned {
			return expectOthers, redeliveryGrace(ci)
		}
		return expectNone, 0
	}
	if act.Paused {
		return expectNone, 0
	}
	if ci.NumPending > 0 && !pinned && len(act.Running) < t.mc.WantWorkers {
		return expectPull, 0
	}
	if held := uint64(len(act.Running) + act.DelayedRetries); ackPending > held {
		// A message given back with a delay by earlier workers (before a
		// reload or a restart), which these did not see, returns only
		// after that delay: up to the longest backoff.
		return expectReturn, max(redeliveryGrace(ci), longestBackoff(t.mc.Workers.Options().Backoff))
	}
	return expectNone, 0
}

// longestBackoff is the longest delay the workers give a retry back with
// (DefaultRetryDelay without a backoff).
func longestBackoff(backoff []time.Duration) time.Duration {
	if len(backoff) == 0 {
		return pipeline.DefaultRetryDelay
	}
	return slices.Max(backoff)
}

// redeliveryGrace is how long the server may take to hand back a message
// nobody acknowledges: its ack_wait, or the consumer's longest backoff.
func redeliveryGrace(ci *jetstream.ConsumerInfo) time.Duration {
	g := ci.Config.AckWait
	for _, b := range ci.Config.BackOff {
		g = max(g, b)
	}
	return g
}

// progress notes whether the consumer moved since the last check. The
// stall clock runs only while the consumer is expected to progress.
func (t *consumerTracker) progress(ci *jetstream.ConsumerInfo, act pipeline.Activity, now time.Time) {
	var processed uint64
	if t.mc.Workers != nil {
		processed = t.mc.Workers.Stats().Processed.Load()
	}
	key := [3]uint64{ci.Delivered.Consumer, ci.AckFloor.Consumer, processed}
	t.expect, t.grace = t.expecting(ci, act)
	if key != t.progressKey || t.expect == expectNone || t.lastProgress.IsZero() {
		t.progressKey = key
		t.lastProgress = now
	}
}

// stalled reports whether holdfast's own workers should be making progress
// and are not — which a restart can cure — and why. A handler running
// longer than its timeout plus the stall timeout is stuck whatever the
// other workers do.
func (t *consumerTracker) stalled(ci *jetstream.ConsumerInfo, act pipeline.Activity, timeout time.Duration, now time.Time) (bool, string) {
	if t.mc.Workers != nil && len(act.Running) > 0 && !act.Paused {
		if ran := now.Sub(act.Running[0]); ran >= t.mc.HandlerTimeout+timeout {
			limit := "no timeout"
			if t.mc.HandlerTimeout > 0 {
				limit = "its timeout is " + t.mc.HandlerTimeout.String()
			}
			return true, fmt.Sprintf("a handler has been running for %s (%s): the worker is stuck", ran.Round(time.Second), limit)
		}
	}
	idle := now.Sub(t.lastProgress)
	switch t.expect {
	case expectPull:
		if idle >= timeout {
			return true, fmt.Sprintf("%d message(s) pending and %d of %d workers idle, but nothing delivered for %s",
				ci.NumPending, t.mc.WantWorkers-len(act.Running), t.mc.WantWorkers, idle.Round(time.Second))
		}
	case expectReturn:
		if idle >= timeout+t.grace {
			return true, fmt.Sprintf("%d message(s) awaiting acknowledgement that no handler holds, and no delivery or acknowledgement for %s",
				max(ci.NumAckPending, 0), idle.Round(time.Second))
		}
	}
	return false, ""
}

// blocked reports whether a consumer without in-process workers has
// max_ack_pending messages out to other clients and made no progress for
// the stall timeout (plus ack_wait): a client fetched messages and
// stopped acknowledging them. Holdfast cannot cure that by restarting.
func (t *consumerTracker) blocked(timeout time.Duration, now time.Time) bool {
	return t.expect == expectOthers && now.Sub(t.lastProgress) >= timeout+t.grace
}

// status is the consumer's part of a Report. Monitor.mu is held.
func (t *consumerTracker) status(now time.Time) ConsumerStatus {
	cs := ConsumerStatus{
		Stream:          t.mc.Stream,
		Name:            t.mc.Consumer,
		LostToRetention: t.lost,
		DeadLetter:      t.mc.DeadLetter,
		Handler:         t.mc.Handler,
		Workers:         workerStatus(t.mc),
	}
	if t.lastLoss != nil {
		ll := *t.lastLoss
		cs.LastLoss = &ll
	}
	if ci := t.last; ci != nil {
		cs.FilterSubject = strings.Join(consumerFilters(ci.Config), ",")
		cs.Pending = ci.NumPending
		cs.AckPending = uint64(max(ci.NumAckPending, 0))
		cs.Redelivered = uint64(max(ci.NumRedelivered, 0))
		cs.MaxAckPending = ci.Config.MaxAckPending
		cs.Waiting = ci.NumWaiting
		cs.DeliveredSeq = ci.Delivered.Stream
		cs.AckFloorSeq = ci.AckFloor.Stream
		if t.expect != expectNone && !t.lastProgress.IsZero() {
			cs.IdleFor = now.Sub(t.lastProgress)
		}
		if len(t.ratios) > 0 {
			cs.BacklogRatio = map[string]float64{}
			for k, v := range t.ratios {
				cs.BacklogRatio[k] = v
			}
		}
		for _, kind := range []string{"max_msgs", "max_bytes", "max_age"} {
			if w, ok := t.warnings[kind]; ok {
				cs.Warnings = append(cs.Warnings, w)
			}
		}
	}
	return cs
}

func workerStatus(mc Consumer) WorkerStatus {
	ws := WorkerStatus{Configured: mc.WantWorkers}
	if w := mc.Workers; w != nil {
		act := w.Activity(time.Now())
		ws.DelayedRetries = act.DelayedRetries
		ws.RetryDue = act.RetryDue
		if len(act.Running) > 0 {
			ws.OldestHandlerStart = act.Running[0]
		}
		st := w.Stats()
		ws.Running = w.Running()
		ws.Draining = w.Draining()
		ws.InFlight = st.InFlight.Load()
		ws.Processed = st.Processed.Load()
		ws.Acked = st.Acked.Load()
		ws.Retried = st.Retried.Load()
		ws.DeadLettered = st.DeadLettered.Load()
		ws.Failures = st.Failures.Load()
		ws.LastFailure = st.LastFailure()
		if ws.DeadLetterFailing = st.DeadLetterFailing.Load(); ws.DeadLetterFailing > 0 {
			ws.DeadLetterError = st.DeadLetterError()
		}
	}
	return ws
}

func discardName(c jetstream.StreamConfig) string {
	_, d, _ := StreamPolicies(c)
	return d
}
