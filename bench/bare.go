package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/embedded"
)

// bareConsumer drains the same messages as "consume (noop)" without
// holdfast's pipeline.
const bareConsumer = "BENCH_BARE"

// bareConsume drains the messages "publish async" stored with a bare
// nats.go client in this process: jetstream Consume, batch 500, a callback
// that acks (fire and forget) — stock `nats bench js consume`'s loop
// without its loopback TCP hop, and nothing of holdfast's workers (no
// queue, no held-message bookkeeping, no confirmation of acks). It is
// what an in-process worker built on nats.go can at most reach on this
// server: the ceiling of "consume (noop)". Like nats bench the clock runs
// from the first message; it stops when the server has read the last ack
// (a flush of the connection after it). The consumer's ack floor must then
// reach the end, outside the clock: a lost ack fails the figure.
func (b *Bencher) bareConsume(ctx context.Context, srv *embedded.Server) (Figure, error) {
	n := b.Params.Msgs
	cons, err := srv.JetStream().Consumer(ctx, benchStream, bareConsumer)
	if err != nil {
		return Figure{}, err
	}
	var seen atomic.Int64
	var first time.Time
	done := make(chan struct{})
	// The callback runs on one goroutine, message after message.
	cc, err := cons.Consume(func(m jetstream.Msg) {
		k := seen.Add(1)
		if k == 1 {
			first = time.Now()
		}
		_ = m.Ack()
		if k == int64(n) {
			close(done)
		}
	}, jetstream.PullMaxMessages(500))
	if err != nil {
		return Figure{}, err
	}
	defer cc.Stop()
	b.progress.set("consume (bare nats.go)", seen.Load, n)
	select {
	case <-done:
	case <-time.After(time.Minute):
		return Figure{}, fmt.Errorf("bare nats.go consumer: not all %d messages within a minute", n)
	case <-ctx.Done():
		return Figure{}, ctx.Err()
	}
	if err := srv.Conn().FlushTimeout(10 * time.Second); err != nil {
		return Figure{}, err
	}
	elapsed := time.Since(first)
	deadline := time.Now().Add(time.Minute)
	for {
		ci, err := cons.Info(ctx)
		if err == nil && ci.NumAckPending == 0 && ci.NumPending == 0 && ci.AckFloor.Consumer >= uint64(n) {
			break
		}
		if time.Now().After(deadline) {
			return Figure{}, fmt.Errorf("bare nats.go consumer: acks of %d messages not applied after a minute (%v)", n, err)
		}
		time.Sleep(time.Millisecond)
	}
	return newFigure("consume (bare nats.go)", n, b.Params.Size, elapsed, nil), nil
}
