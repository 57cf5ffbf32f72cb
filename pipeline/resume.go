package pipeline

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/internal/settle"
	"github.com/holdfast-io/holdfast/pipeline/handler"
)

// An attempt interrupted by a shutdown or a reload is not a failed one.
// The server cannot be told so: every delivery counts towards
// max_deliver, and a message given back (Nak) on its last allowed
// delivery is never delivered again — the max-deliveries advisory would
// have it dead-lettered without a verdict. So a message the workers give
// back on its last allowed delivery is parked instead: stored in the
// dead-letter stream marked HeaderInterrupted (with PubAck), then
// terminated. When the consumer's workers start again they hand every
// parked message to the handler, with its original idempotency key: on
// success the parked copy is removed; on failure it becomes an ordinary
// dead letter with the handler's reason.

// HeaderInterrupted marks a message parked in the dead-letter stream
// because its last allowed delivery was interrupted by a shutdown or
// reload; its workers resume it when they start.
const HeaderInterrupted = "Holdfast-Interrupted"

// reasonInterrupted is the Holdfast-Error of a parked message.
const reasonInterrupted = "interrupted by a shutdown or reload on its last allowed delivery (not a handler failure): handed to the handler again when the workers start"

// messageOf is the Message a handler sees for msg.
func (w *Workers) messageOf(msg jetstream.Msg, md *jetstream.MsgMetadata) *handler.Message {
	m := &handler.Message{
		Subject:   msg.Subject(),
		Stream:    md.Stream,
		Consumer:  w.opts.Consumer,
		Sequence:  md.Sequence.Stream,
		Delivery:  md.NumDelivered,
		Header:    msg.Headers(),
		Data:      msg.Data(),
		Published: md.Timestamp,
		Pending:   md.NumPending,
	}
	m.IdempotencyKey = m.Header.Get(nats.MsgIdHdr)
	if m.IdempotencyKey == "" {
		m.IdempotencyKey = m.Stream + ":" + strconv.FormatUint(m.Sequence, 10)
	}
	return m
}

// giveBack returns a message the workers hold but did not settle because
// they are stopping: a nak (redelivered at once, or at the next start
// when the server stops too), or — on its last allowed delivery, with a
// dead-letter stream — parked for the next start.
//
// The nak carries a delay of giveBackDelay: the server stores such a
// nak with the message's delivery and a plain one only in memory, so
// after a restart of the server a plainly naked message waited out its
// ack_wait (see embedded/natsassume_test.go).
//
// The workers call it only when no pull request of theirs is open any
// more: the server would deliver the message to that request again at
// once, the workers (stopping) would give it back again, and so on until
// the request's batch runs out — each round spending a delivery, so that
// a message published during a stop would reach max_deliver in
// milliseconds without a handler ever seeing it (parked, or with
// dead_letter = "" given up by the server).
func (w *Workers) giveBack(msg jetstream.Msg) {
	md, err := msg.Metadata()
	if err == nil && w.opts.MaxDeliver > 0 && md.NumDelivered >= uint64(w.opts.MaxDeliver) && w.opts.DeadLetter != "" {
		m := w.messageOf(msg, md)
		if err := w.park(msg, m); err != nil {
			w.log.Error("cannot park an interrupted message on its last delivery: given back; it will be dead-lettered without a verdict",
				"seq", m.Sequence, "err", err)
		} else {
			w.log.Info("interrupted on its last allowed delivery: parked for the next start", "seq", m.Sequence, "dead_letter", w.opts.DeadLetter)
			return
		}
	}
	if err := msg.NakWithDelay(giveBackDelay); err != nil {
		w.log.Warn("nak at shutdown failed; redelivered after ack_wait", "subject", msg.Subject(), "err", err)
	}
}

// giveBackDelay is the delay of a nak at a stop: the least there is.
const giveBackDelay = time.Nanosecond

// park stores m, marked interrupted, in the dead-letter stream and then
// terminates the original.
func (w *Workers) park(msg jetstream.Msg, m *handler.Message) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	created, err := w.streamCreated(ctx, m.Stream)
	if err != nil {
		return err
	}
	dl := NewDeadLetter(w.opts.Consumer, m, created, reasonInterrupted, time.Now())
	dl.Header.Set(HeaderInterrupted, "true")
	dl.Header.Set(nats.MsgIdHdr, dl.Header.Get(nats.MsgIdHdr)+":interrupted")
	if err := w.storeDeadLetter(ctx, dl); err != nil {
		return err
	}
	if err := msg.TermWithReason("parked: interrupted on its last delivery"); err != nil {
		// Stored twice at worst: the advisory path dead-letters the
		// original as well, and the parked copy is resumed.
		w.log.Warn("parked message could not be terminated", "seq", m.Sequence, "err", err)
	}
	return nil
}

// resumeInterrupted hands every message parked for this consumer to the
// handler (see HeaderInterrupted). It runs once when the workers start,
// in the background, until it read every dead letter of the consumer or
// the workers stop: each request is bounded, not the whole scan, which
// reads every dead letter whole and in a large dead-letter stream takes
// minutes. Once the workers stop it starts no more handlers; what it did
// not resume stays parked for the next start.
func (w *Workers) resumeInterrupted() {
	if w.opts.DeadLetter == "" {
		return
	}
	var parked []DeadLetter
	err := ListDeadLetters(w.runCtx, w.js, w.opts.DeadLetter, w.opts.Consumer, func(dl DeadLetter) error {
		if dl.Header.Get(HeaderInterrupted) != "" {
			parked = append(parked, dl)
		}
		return nil
	})
	if w.runCtx.Err() != nil {
		return
	}
	if err != nil {
		w.log.Error("cannot look for interrupted messages to resume: they stay parked in the dead-letter stream until the next start",
			"dead_letter", w.opts.DeadLetter, "err", err)
		return
	}
	for _, dl := range parked {
		if w.runCtx.Err() != nil {
			return
		}
		w.resume1(dl)
	}
}

// deadLetterParked stores parked message dl, handled again as m and
// failed with reason, as an ordinary dead letter: its last attempt has a
// verdict now. The caller removes the parked copy after it. Its
// Nats-Msg-Id is the same whether the workers' resume or a replay stores
// it, so the stream keeps one should both get to it.
func (w *Workers) deadLetterParked(ctx context.Context, m *handler.Message, dl DeadLetter, reason string) error {
	final := NewDeadLetter(w.opts.Consumer, m, dl.OriginalStreamCreated, reason, time.Now())
	final.Header.Set(nats.MsgIdHdr, final.Header.Get(nats.MsgIdHdr)+":resumed")
	return w.storeDeadLetter(ctx, final)
}

// parkedGone reports whether the parked message dl is no longer in its
// dead-letter stream as it was listed (handled by a replay meanwhile).
func (w *Workers) parkedGone(dl DeadLetter) (bool, error) {
	ctx, cancel := context.WithTimeout(w.handlerCtx, 10*time.Second)
	defer cancel()
	s, err := w.js.Stream(ctx, dl.Stream)
	if err != nil {
		return false, err
	}
	raw, err := s.GetMsg(ctx, dl.Seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	return raw.Header.Get(nats.MsgIdHdr) != dl.Header.Get(nats.MsgIdHdr), nil
}

// resume1 runs the handler on one parked message, unless `holdfast dlq
// replay` is handling it (or has handled it) meanwhile, so that the
// handler does not run on it twice.
func (w *Workers) resume1(dl DeadLetter) {
	// A claim the cluster cannot take yet (a meta leader being elected
	// at a whole-cluster start) is asked again, once a second for a while.
	// claimReplay asks the server only of a clustered one.
	var release func()
	err := settle.Retry(w.handlerCtx, func(err error) bool { return settle.Transient(err, true) }, nil, func() (err error) {
		release, err = w.claimReplay(w.handlerCtx, dl.Stream, dl.Seq)
		return err
	})
	if errors.Is(err, errReplayBusy) {
		w.log.Info("parked message is being handled elsewhere (holdfast dlq replay, or another node's workers): not resumed here", "dead_letter", dl.Stream+":"+strconv.FormatUint(dl.Seq, 10))
		return
	}
	if err != nil {
		w.log.Error("parked message not resumed: it stays parked until the next start", "err", err)
		return
	}
	defer release()
	// Under the claim, the parked message must still be there, as
	// listed: a replay that held the claim before removed it once
	// handled. Unless that is known, it stays parked.
	if gone, err := w.parkedGone(dl); gone || err != nil {
		if err != nil {
			w.log.Error("parked message not resumed: cannot read it back to check that no replay handled it meanwhile; it stays parked until the next start",
				"dead_letter", dl.Stream+":"+strconv.FormatUint(dl.Seq, 10), "err", err)
		}
		return
	}
	m, err := ReplayMessage(dl)
	if err != nil {
		w.log.Error("parked message cannot be resumed", "dead_letter_seq", dl.Seq, "err", err)
		return
	}
	m.Consumer = w.opts.Consumer
	m.Header.Del(HeaderReplayedFrom)
	res := w.handleOutOfBand(m)
	if w.handlerCtx.Err() != nil && res.Outcome != handler.Success {
		return // interrupted again: it stays parked
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if res.Outcome != handler.Success {
		if err := w.deadLetterParked(ctx, m, dl, res.Reason); err != nil {
			w.log.Error("resumed message failed, and its dead letter could not be stored: it stays parked", "seq", m.Sequence, "err", err)
			return
		}
		w.stats.DeadLettered.Add(1)
		w.log.Error("message dead-lettered", "seq", m.Sequence, "subject", m.Subject, "delivery", m.Delivery,
			"dead_letter", w.opts.DeadLetter, "reason", res.Reason, "resumed", true)
	} else {
		w.stats.Acked.Add(1)
		w.log.Info("interrupted message handled after the restart", "seq", m.Sequence, "subject", m.Subject, "idempotency_key", m.IdempotencyKey)
	}
	s, err := w.js.Stream(ctx, w.opts.DeadLetter)
	if err == nil {
		_, err = deleteDeadLetter(ctx, s, dl.Seq)
	}
	if err != nil {
		w.log.Error("parked message handled, but its parked copy could not be removed: it is handled again at the next start",
			"dead_letter", w.opts.DeadLetter, "dead_letter_seq", dl.Seq, "err", err)
	}
}
