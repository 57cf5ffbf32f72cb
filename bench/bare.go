package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/embedded"
)

// The consumers a bare nats.go client drains, without holdfast's
// pipeline: the messages of "consume (noop)", and live ones end to end.
const (
	bareConsumer    = "BENCH_BARE"
	bareE2EConsumer = "BENCH_E2E_BARE"
	bareE2ESubject  = "bench.e2e.bare"
)

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
	var first time.Time
	last, err := b.bareDrain(ctx, srv, bareConsumer, "consume (bare nats.go)", n, func() { first = time.Now() }, nil)
	if err != nil {
		return Figure{}, err
	}
	return newFigure("consume (bare nats.go)", n, b.Params.Size, last.Sub(first), nil), nil
}

// bareEndToEnd is the same client live: it consumes while holdfast
// bench's publishers publish, the clock from the first publish to the
// server reading the last ack — the ceiling of "e2e noop".
func (b *Bencher) bareEndToEnd(ctx context.Context, srv *embedded.Server, url string) (Figure, error) {
	n := b.Params.Msgs
	var start time.Time
	last, err := b.bareDrain(ctx, srv, bareE2EConsumer, "e2e bare nats.go", n, nil, func() error {
		start = time.Now()
		_, err := b.publishAsync(ctx, url, bareE2ESubject, n, "e2e bare nats.go (publish)", nil)
		return err
	})
	if err != nil {
		return Figure{}, err
	}
	return newFigure("e2e bare nats.go", n, b.Params.Size, last.Sub(start), nil), nil
}

// bareDrain consumes n messages of consumer with Consume and acks, calling
// onFirst at the first one and publish (when set) once consuming; it
// returns when the server read the last ack, and checks afterwards that
// every ack was applied.
func (b *Bencher) bareDrain(ctx context.Context, srv *embedded.Server, consumer, label string, n int, onFirst func(), publish func() error) (time.Time, error) {
	cons, err := srv.JetStream().Consumer(ctx, benchStream, consumer)
	if err != nil {
		return time.Time{}, err
	}
	var seen atomic.Int64
	done := make(chan struct{})
	// The callback runs on one goroutine, message after message.
	cc, err := cons.Consume(func(m jetstream.Msg) {
		k := seen.Add(1)
		if k == 1 && onFirst != nil {
			onFirst()
		}
		_ = m.Ack()
		if k == int64(n) {
			close(done)
		}
	}, jetstream.PullMaxMessages(500))
	if err != nil {
		return time.Time{}, err
	}
	defer cc.Stop()
	b.progress.set(label, seen.Load, n)
	if publish != nil {
		if err := publish(); err != nil {
			return time.Time{}, err
		}
	}
	select {
	case <-done:
	case <-time.After(time.Minute):
		return time.Time{}, fmt.Errorf("%s: not all %d messages within a minute", label, n)
	case <-ctx.Done():
		return time.Time{}, ctx.Err()
	}
	if err := srv.Conn().FlushTimeout(10 * time.Second); err != nil {
		return time.Time{}, err
	}
	last := time.Now()
	deadline := last.Add(time.Minute)
	for {
		ci, err := cons.Info(ctx)
		if err == nil && ci.NumAckPending == 0 && ci.NumPending == 0 && ci.AckFloor.Consumer >= uint64(n) {
			return last, nil
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("%s: acks of %d messages not applied after a minute (%v)", label, n, err)
		}
		time.Sleep(time.Millisecond)
	}
}
