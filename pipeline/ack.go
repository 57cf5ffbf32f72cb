package pipeline

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ackBatchMax is how many acks may be outstanding before one of them is
// confirmed: the acker sends plain acks and a confirmed ack (AckSync) on
// the last of at most this many.
const ackBatchMax = 256

// defaultAckConfirmTimeout bounds the wait for the server to confirm a
// batch (Workers.ackConfirmTimeout).
const defaultAckConfirmTimeout = 5 * time.Second

// ackRetryWait is the pause before a batch that was not confirmed is sent
// again (for up to the consumer's ack_wait).
const ackRetryWait = 500 * time.Millisecond

// ackPayload is a plain ack, as nats.go sends it.
var ackPayload = []byte("+ACK")

// acker acknowledges the messages the handlers succeeded with, off the
// workers' path: a worker hands its message over and takes the next one.
//
// One confirmation covers a whole batch. The acker sends a plain ack for
// each message but the last, then a confirmed ack (AckSync, a request) for
// the last, all on the one connection the messages came from. The server
// queues a connection's acks to a consumer in the order they were sent,
// applies them one at a time, and answers an AckSync only after applying
// it (TestAssumeAcksOfOneConnectionInOrder in embedded/natsassume_test.go).
// So the confirmation of the last ack means the server has handled every
// earlier one — the same consumer leader. Plain acks sent while a
// confirmation was failing (no leader, in a cluster) are sent again
// before their batch's confirmation, which a new leader may answer. A
// batch that is not confirmed (no answer within Workers.ackConfirmTimeout, a
// closed connection) counts every message in it as a Failure; the
// messages whose acks did not arrive are delivered again after ack_wait —
// never lost.
//
// The confirmation is waited for off the acker's path too: while one
// batch's confirmation is out (a round trip, answered after the server
// applied every ack before it), the acker sends the next batch's plain
// acks and queues its confirmation; a third batch waits. Acks flow to the
// server without a pause, and a confirmation still covers exactly the
// acks sent before it.
type acker struct {
	w    *Workers
	in   chan ackItem
	done chan struct{}
	// confirm takes each sent batch to the confirmer; one may wait there
	// while the confirmer waits for the one before.
	confirm   chan sentBatch
	confirmed chan struct{}
	// doubts counts the confirmations that failed; inDoubt is set from
	// a failed confirmation to the next one that succeeded. Acks sent
	// meanwhile may have met no consumer leader.
	doubts  atomic.Uint64
	inDoubt atomic.Bool
}

// sentBatch is a batch whose plain acks were sent (sent; failed acks were
// not), and its last message, whose ack asks for the confirmation.
type sentBatch struct {
	sent   []ackItem
	last   ackItem
	failed int
	// doubts and inDoubt are the acker's as the plain acks went out.
	doubts  uint64
	inDoubt bool
}

// ackItem is a message to acknowledge.
type ackItem struct {
	msg jetstream.Msg
	seq uint64
}

func newAcker(w *Workers, capacity int) *acker {
	a := &acker{w: w, in: make(chan ackItem, max(capacity, ackBatchMax)), done: make(chan struct{}),
		confirm: make(chan sentBatch, 1), confirmed: make(chan struct{})}
	go a.run()
	go a.confirmer()
	return a
}

// add queues msg (stream sequence seq) for its ack.
func (a *acker) add(msg jetstream.Msg, seq uint64) { a.in <- ackItem{msg: msg, seq: seq} }

// close sends what is queued, waits for its confirmation and stops.
func (a *acker) close() {
	close(a.in)
	<-a.done
}

func (a *acker) run() {
	defer close(a.done)
	defer func() {
		close(a.confirm)
		<-a.confirmed
	}()
	for it := range a.in {
		// A fresh slice per batch: the confirmer holds the one before.
		batch := make([]ackItem, 1, ackBatchMax)
		batch[0] = it
	fill:
		for len(batch) < ackBatchMax {
			select {
			case it, ok := <-a.in:
				if !ok {
					break fill
				}
				batch = append(batch, it)
			default:
				break fill
			}
		}
		a.confirm <- a.send(batch)
	}
}

// send sends the plain acks of every message of batch but the last.
func (a *acker) send(batch []ackItem) sentBatch {
	b := sentBatch{sent: batch[:0], last: batch[len(batch)-1]} // sent: filtered in place
	b.doubts = a.doubts.Load()
	b.inDoubt = a.inDoubt.Load()
	for _, it := range batch[:len(batch)-1] {
		if err := it.msg.Ack(); err != nil && !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
			b.failed++
			a.w.log.Error("ack failed: the message will be redelivered", "seq", it.seq, "err", err)
			continue
		}
		b.sent = append(b.sent, it)
	}
	return b
}

// confirmer sends each batch's last ack as a confirmed ack (AckSync) and
// counts the batch once the server answered.
func (a *acker) confirmer() {
	defer close(a.confirmed)
	for b := range a.confirm {
		a.confirmBatch(b)
	}
}

func (a *acker) confirmBatch(b sentBatch) {
	st := a.w.stats
	if b.inDoubt || a.doubts.Load() != b.doubts {
		// Its plain acks went out while a confirmation was failing: they
		// may have met a consumer without a leader, which drops them,
		// and this confirmation may reach the leader elected since.
		a.resendPlain(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.w.ackConfirmTimeout)
	err := b.last.msg.DoubleAck(ctx)
	cancel()
	a.noteConfirmation(err)
	// A consumer whose leader is being elected (its node died, in a
	// cluster) drops acks and answers none: the messages were handled,
	// and until their ack_wait passes the new leader still holds them
	// pending, so the same acks are sent again until one is confirmed.
	// Without that each came back (a duplicate), and on its last allowed
	// delivery was dead-lettered as "the handler did not finish".
	// While the workers stop, once only: the stop must not wait for an
	// ack_wait that may be minutes.
	for retries, deadline := 0, time.Now().Add(a.w.AckWait()); err != nil && !errors.Is(err, nats.ErrConnectionClosed) &&
		time.Now().Before(deadline) && (retries == 0 || !a.w.stopping.Load()); retries++ {
		a.w.log.Warn("acks not confirmed: sending them again until the consumer answers (a consumer leader being elected?)",
			"messages", len(b.sent)+1, "last_seq", b.last.seq, "err", err)
		time.Sleep(ackRetryWait)
		a.resendPlain(b)
		ctx, cancel := context.WithTimeout(context.Background(), a.w.ackConfirmTimeout)
		err = b.last.msg.DoubleAck(ctx)
		cancel()
		a.noteConfirmation(err)
	}
	if err != nil {
		first := b.last.seq
		if len(b.sent) > 0 {
			first = b.sent[0].seq
		}
		st.Failures.Add(uint64(b.failed + len(b.sent) + 1))
		a.w.log.Error("acks not confirmed: the messages whose acks did not arrive will be redelivered",
			"messages", len(b.sent)+1, "first_seq", first, "last_seq", b.last.seq, "err", err)
		return
	}
	if b.failed > 0 {
		st.Failures.Add(uint64(b.failed))
	}
	st.Acked.Add(uint64(len(b.sent) + 1))
	st.noteSettledAll(b.sent)
	st.noteSettled(b.last.seq)
}

// resendPlain sends the plain acks of b again.
func (a *acker) resendPlain(b sentBatch) {
	for _, it := range b.sent {
		_ = a.w.nc.Publish(it.msg.Reply(), ackPayload)
	}
}

// noteConfirmation records whether a confirmation failed (err) or
// succeeded.
func (a *acker) noteConfirmation(err error) {
	if err == nil {
		a.inDoubt.Store(false)
		return
	}
	a.inDoubt.Store(true)
	a.doubts.Add(1)
}
