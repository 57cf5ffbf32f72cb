package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
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

// HeaderReplayedFrom marks a message republished from a dead-letter
// stream: "STREAM:seq" of the dead letter.
const HeaderReplayedFrom = "Holdfast-Replayed-From"

// DeadLetter is a stored dead letter, read back for inspection or replay.
type DeadLetter struct {
	Stream          string // the dead-letter stream
	Seq             uint64 // its sequence there
	Subject         string // dlq.<CONSUMER>.<original subject>
	Consumer        string
	OriginalSubject string
	OriginalStream  string
	OriginalSeq     uint64
	Deliveries      uint64
	FailedAt        time.Time
	Error           string
	Header          nats.Header
	Data            []byte
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
	return dl
}

// ListDeadLetters calls fn for every dead letter in stream, oldest first,
// or only those of consumer when it is not "". It reads with an ordered
// consumer, which leaves no state on the server.
func ListDeadLetters(ctx context.Context, js jetstream.JetStream, stream, consumer string, fn func(DeadLetter) error) error {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("dead-letter stream %s: %w", stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return err
	}
	if info.State.Msgs == 0 {
		return nil
	}
	occ := jetstream.OrderedConsumerConfig{}
	if consumer != "" {
		occ.FilterSubjects = []string{"dlq." + consumer + ".>"}
	}
	oc, err := s.OrderedConsumer(ctx, occ)
	if err != nil {
		return err
	}
	for {
		msg, err := oc.Next(jetstream.FetchMaxWait(2 * time.Second))
		if errors.Is(err, jetstream.ErrNoMessages) || errors.Is(err, nats.ErrTimeout) {
			return nil
		}
		if err != nil {
			return err
		}
		md, err := msg.Metadata()
		if err != nil {
			return err
		}
		raw := &jetstream.RawStreamMsg{Subject: msg.Subject(), Sequence: md.Sequence.Stream, Header: msg.Headers(), Data: msg.Data(), Time: md.Timestamp}
		if err := fn(ParseDeadLetter(stream, raw)); err != nil {
			return err
		}
		if md.NumPending == 0 {
			return nil
		}
	}
}

// GetDeadLetter reads one dead letter by sequence.
func GetDeadLetter(ctx context.Context, js jetstream.JetStream, stream string, seq uint64) (DeadLetter, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return DeadLetter{}, fmt.Errorf("dead-letter stream %s: %w", stream, err)
	}
	raw, err := s.GetMsg(ctx, seq)
	if err != nil {
		return DeadLetter{}, fmt.Errorf("dead letter %s #%d: %w", stream, seq, err)
	}
	return ParseDeadLetter(stream, raw), nil
}

// Replay republishes a dead letter to its original subject with PubAck,
// and only then deletes it from the dead-letter stream. The replayed
// message carries the original headers (minus Holdfast-*), a new
// Nats-Msg-Id "DLQSTREAM:seq:replay" (so replaying twice within the
// duplicate window stores it once) and Holdfast-Replayed-From.
func Replay(ctx context.Context, js jetstream.JetStream, dl DeadLetter) (*jetstream.PubAck, error) {
	if dl.OriginalSubject == "" {
		return nil, fmt.Errorf("dead letter %s #%d has no %s header: not a holdfast dead letter", dl.Stream, dl.Seq, HeaderOriginalSubject)
	}
	out := nats.NewMsg(dl.OriginalSubject)
	for k, vs := range dl.Header {
		if strings.HasPrefix(k, "Holdfast-") || strings.HasPrefix(k, "Nats-") {
			continue
		}
		out.Header[k] = vs
	}
	if id := dl.Header.Get(HeaderOriginalMsgID); id != "" {
		out.Header.Set(HeaderOriginalMsgID, id)
	}
	from := dl.Stream + ":" + strconv.FormatUint(dl.Seq, 10)
	out.Header.Set(HeaderReplayedFrom, from)
	out.Header.Set(nats.MsgIdHdr, from+":replay")
	out.Data = dl.Data
	ack, err := js.PublishMsg(ctx, out)
	if err != nil {
		return nil, fmt.Errorf("replay %s to %s: %w", from, dl.OriginalSubject, err)
	}
	if dl.OriginalStream != "" && ack.Stream != dl.OriginalStream {
		return ack, fmt.Errorf("replay %s: stored in stream %s, not in the original %s; the dead letter is kept", from, ack.Stream, dl.OriginalStream)
	}
	s, err := js.Stream(ctx, dl.Stream)
	if err != nil {
		return ack, err
	}
	if err := s.DeleteMsg(ctx, dl.Seq); err != nil {
		return ack, fmt.Errorf("replayed %s but could not delete the dead letter: %w", from, err)
	}
	return ack, nil
}
