package pipeline

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Headers added to a dead letter.
const (
	HeaderError           = "Holdfast-Error"
	HeaderOriginalSubject = "Holdfast-Original-Subject"
	HeaderOriginalSeq     = "Holdfast-Original-Seq"
	HeaderOriginalStream  = "Holdfast-Original-Stream"
	HeaderOriginalMsgID   = "Holdfast-Original-Msg-Id"
	HeaderDeliveries      = "Holdfast-Deliveries"
	HeaderFailedAt        = "Holdfast-Failed-At"
)

// DeadLetterSubject is where a consumer's dead letter for subject goes.
func DeadLetterSubject(consumer, subject string) string {
	return "dlq." + consumer + "." + subject
}

// DeadLetterMsgID is the Nats-Msg-Id of a dead letter: the same for every
// attempt, so a crash between publish and terminate cannot duplicate it.
func DeadLetterMsgID(stream, consumer string, seq uint64) string {
	return stream + ":" + consumer + ":" + strconv.FormatUint(seq, 10)
}

// NewDeadLetter builds the dead letter for a message: payload and headers
// kept, the original's Nats-Msg-Id moved to Holdfast-Original-Msg-Id, and
// the failure described in Holdfast-* headers.
func NewDeadLetter(consumer string, m *Message, reason string, failedAt time.Time) *nats.Msg {
	out := nats.NewMsg(DeadLetterSubject(consumer, m.Subject))
	for k, vs := range m.Header {
		for _, v := range vs {
			out.Header.Add(k, v)
		}
	}
	if id := out.Header.Get(nats.MsgIdHdr); id != "" {
		out.Header.Set(HeaderOriginalMsgID, id)
	}
	// Server-set headers of the original must not steer the new publish.
	for _, h := range []string{nats.ExpectedStreamHdr, nats.ExpectedLastSeqHdr, nats.ExpectedLastSubjSeqHdr, nats.ExpectedLastMsgIdHdr, "Nats-TTL"} {
		out.Header.Del(h)
	}
	out.Header.Set(nats.MsgIdHdr, DeadLetterMsgID(m.Stream, consumer, m.Sequence))
	out.Header.Set(HeaderError, reason)
	out.Header.Set(HeaderOriginalSubject, m.Subject)
	out.Header.Set(HeaderOriginalStream, m.Stream)
	out.Header.Set(HeaderOriginalSeq, strconv.FormatUint(m.Sequence, 10))
	out.Header.Set(HeaderDeliveries, strconv.FormatUint(m.Delivery, 10))
	out.Header.Set(HeaderFailedAt, failedAt.UTC().Format(time.RFC3339Nano))
	out.Data = m.Data
	return out
}

// publishDeadLetter stores a dead letter with PubAck in the dead-letter
// stream.
func (w *Workers) publishDeadLetter(ctx context.Context, m *Message, reason string) error {
	dl := NewDeadLetter(w.opts.Consumer, m, reason, time.Now())
	ack, err := w.js.PublishMsg(ctx, dl)
	if err != nil {
		return err
	}
	if ack.Stream != w.opts.DeadLetter {
		return fmt.Errorf("dead letter stored in stream %s, not in %s: check that no other stream takes subject %s", ack.Stream, w.opts.DeadLetter, dl.Subject)
	}
	return nil
}

// deadLetter moves a failed message to the dead-letter stream and only
// then terminates it. If the publish fails, the message is not terminated:
// it is redelivered (or, on its last delivery, kept in the stream and
// logged for the operator).
func (w *Workers) deadLetter(ctx context.Context, msg jetstream.Msg, m *Message, reason string, lastDelivery bool) {
	if w.opts.DeadLetter == "" {
		if err := msg.TermWithReason(reason); err != nil {
			w.stats.Failures.Add(1)
			w.log.Error("terminate failed", "seq", m.Sequence, "err", err)
			return
		}
		w.stats.DeadLettered.Add(1)
		w.log.Error("message failed and dead-lettering is disabled: terminated", "seq", m.Sequence,
			"subject", m.Subject, "delivery", m.Delivery, "reason", reason)
		return
	}
	if err := w.publishDeadLetter(ctx, m, reason); err != nil {
		w.stats.Failures.Add(1)
		if lastDelivery {
			w.log.Error("dead-letter publish failed on the last delivery: retrying from the max-deliveries advisory",
				"seq", m.Sequence, "subject", m.Subject, "dead_letter", w.opts.DeadLetter, "err", err, "reason", reason)
			_ = msg.NakWithDelay(w.retryDelay(m.Delivery))
			return
		}
		delay := w.retryDelay(m.Delivery)
		w.log.Error("dead-letter publish failed: the message is redelivered instead", "seq", m.Sequence,
			"dead_letter", w.opts.DeadLetter, "retry_in", delay, "err", err)
		_ = msg.NakWithDelay(delay)
		return
	}
	if err := msg.TermWithReason(reason); err != nil {
		// Already in the dead-letter stream; a redelivery is deduplicated
		// there by its Nats-Msg-Id.
		w.stats.Failures.Add(1)
		w.log.Error("dead letter stored but terminate failed: the message may be delivered again", "seq", m.Sequence, "err", err)
	}
	w.stats.DeadLettered.Add(1)
	w.log.Error("message dead-lettered", "seq", m.Sequence, "subject", m.Subject, "delivery", m.Delivery,
		"dead_letter", w.opts.DeadLetter, "reason", reason)
}

// maxDeliveriesAdvisory is the server's
// $JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES payload.
type maxDeliveriesAdvisory struct {
	Stream     string `json:"stream"`
	Consumer   string `json:"consumer"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
}

// onMaxDeliveries dead-letters a message the server stopped delivering
// because it reached max_deliver without a verdict (a worker died or hung
// past ack_wait on its last delivery). It reads the original by sequence.
func (w *Workers) onMaxDeliveries(nm *nats.Msg) {
	var adv maxDeliveriesAdvisory
	if err := json.Unmarshal(nm.Data, &adv); err != nil {
		w.log.Error("unreadable max-deliveries advisory", "err", err)
		return
	}
	go w.deadLetterBySeq(adv)
}

func (w *Workers) deadLetterBySeq(adv maxDeliveriesAdvisory) {
	reason := fmt.Sprintf("reached max_deliver (%d deliveries) without a verdict: the handler did not finish within ack_wait", adv.Deliveries)
	if w.opts.DeadLetter == "" {
		w.stats.DeadLettered.Add(1)
		w.log.Error("message reached max_deliver without a verdict; dead-lettering is disabled, the server will not deliver it again",
			"seq", adv.StreamSeq, "deliveries", adv.Deliveries)
		return
	}
	for attempt := 1; ; attempt++ {
		err := w.deadLetterSeqOnce(adv, reason)
		if err == nil {
			return
		}
		w.stats.Failures.Add(1)
		if w.runCtx.Err() != nil || attempt >= 10 {
			w.log.Error("cannot dead-letter a message that reached max_deliver: it stays in its stream; replay it by hand",
				"seq", adv.StreamSeq, "err", err)
			return
		}
		w.log.Warn("dead-lettering a message that reached max_deliver failed: retrying", "seq", adv.StreamSeq, "attempt", attempt, "err", err)
		select {
		case <-w.runCtx.Done():
		case <-time.After(w.retryDelay(uint64(attempt))):
		}
	}
}

func (w *Workers) deadLetterSeqOnce(adv maxDeliveriesAdvisory, reason string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := w.js.Stream(ctx, w.opts.Stream)
	if err != nil {
		return err
	}
	raw, err := s.GetMsg(ctx, adv.StreamSeq)
	if err != nil {
		return fmt.Errorf("read message %d: %w", adv.StreamSeq, err)
	}
	m := &Message{
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
	if err := w.publishDeadLetter(ctx, m, reason); err != nil {
		return err
	}
	w.stats.DeadLettered.Add(1)
	w.log.Error("message dead-lettered after max_deliver without a verdict", "seq", m.Sequence, "subject", m.Subject,
		"deliveries", adv.Deliveries, "dead_letter", w.opts.DeadLetter)
	return nil
}
