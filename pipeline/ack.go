package pipeline

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ackBatchMax is how many acks may be outstanding before one of them is
// confirmed: the acker sends plain acks and a confirmed ack (AckSync) on
// the last of at most this many.
const ackBatchMax = 256

// ackConfirmTimeout bounds the wait for the server to confirm a batch.
const ackConfirmTimeout = 5 * time.Second

// acker acknowledges the messages the handlers succeeded with, off the
// workers' path: a worker hands its message over and takes the next one.
//
// One confirmation covers a whole batch. The acker sends a plain ack for
// each message but the last, then a confirmed ack (AckSync, a request) for
// the last, all on the one connection the messages came from. The server
// handles a connection's acks to a consumer in the order they were sent,
// and answers the AckSync only after it handled it (nats-server v2.15.2:
// client.deliverMsg calls the consumer's internal subscription callback
// inline in the connection's read loop, server/client.go; that callback,
// consumer.pushAck, appends the ack to the consumer's FIFO queue ackMsgs;
// one goroutine, consumer.processInboundAcks, takes them in order and
// consumer.processAck sends the reply of an AckSync after applying it,
// server/consumer.go). So the confirmation of the last ack means the
// server has handled every earlier one. A batch that is not confirmed (no
// answer within ackConfirmTimeout, a closed connection) counts every
// message in it as a Failure; the messages whose acks did not arrive are
// delivered again after ack_wait — never lost.
type acker struct {
	w    *Workers
	in   chan ackItem
	done chan struct{}
}

// ackItem is a message to acknowledge.
type ackItem struct {
	msg jetstream.Msg
	seq uint64
}

func newAcker(w *Workers, capacity int) *acker {
	a := &acker{w: w, in: make(chan ackItem, max(capacity, ackBatchMax)), done: make(chan struct{})}
	go a.run()
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
	batch := make([]ackItem, 0, ackBatchMax)
	for it := range a.in {
		batch = append(batch[:0], it)
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
		a.flush(batch)
		clear(batch) // drop the messages for the GC
	}
}

// flush acknowledges batch: plain acks, then a confirmed ack on the last.
func (a *acker) flush(batch []ackItem) {
	st := a.w.stats
	first := batch[0].seq
	sent := batch[:0] // filtered in place: the acks sent
	failed := 0
	for _, it := range batch[:len(batch)-1] {
		if err := it.msg.Ack(); err != nil && !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
			failed++
			a.w.log.Error("ack failed: the message will be redelivered", "seq", it.seq, "err", err)
			continue
		}
		sent = append(sent, it)
	}
	last := batch[len(batch)-1]
	ctx, cancel := context.WithTimeout(context.Background(), ackConfirmTimeout)
	err := last.msg.DoubleAck(ctx)
	cancel()
	if err != nil {
		failed += len(sent) + 1
		st.Failures.Add(uint64(failed))
		a.w.log.Error("acks not confirmed: the messages whose acks did not arrive will be redelivered",
			"messages", len(sent)+1, "first_seq", first, "last_seq", last.seq, "err", err)
		return
	}
	if failed > 0 {
		st.Failures.Add(uint64(failed))
	}
	st.Acked.Add(uint64(len(sent) + 1))
	st.noteSettledAll(sent)
	st.noteSettled(last.seq)
}
