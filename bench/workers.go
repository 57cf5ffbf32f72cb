package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/embedded"
	"github.com/holdfast-io/holdfast/pipeline"
	"github.com/holdfast-io/holdfast/pipeline/handler"
)

// noopHandler succeeds at once.
var noopHandler = handler.Func(func(context.Context, *handler.Message) handler.Result { return handler.Ok() })

// startBenchWorkers starts the workers of a bench consumer with h, or with
// the handler its config names when h is nil (the daemon's own wiring).
func (b *Bencher) startBenchWorkers(ctx context.Context, srv *embedded.Server, cfg *config.Config, name string, h handler.Handler) (*pipeline.Workers, error) {
	cc := cfg.Consumers[name]
	if h == nil {
		var err error
		if h, err = b.Wiring.NewHandler(name, cc, b.Log); err != nil {
			return nil, err
		}
	}
	w := pipeline.NewWorkers(srv.JetStream(), srv.Conn(), b.Wiring.ConsumerOptions(name, cc, h), b.Log)
	w.ShutdownTimeout = cfg.Run.ShutdownTimeout.Duration
	if err := w.Open(ctx); err != nil {
		return nil, err
	}
	return w, nil
}

// consume starts the no-op workers on the messages "publish async" stored
// and measures until the server has received the last ack.
func (b *Bencher) consume(ctx context.Context, srv *embedded.Server, cfg *config.Config) (Figure, error) {
	name := benchConsumerName("consume")
	n := b.Params.Msgs
	// Like nats bench, the clock starts with the first message handled.
	var first atomic.Int64
	h := handler.Func(func(context.Context, *handler.Message) handler.Result {
		if first.Load() == 0 {
			first.CompareAndSwap(0, time.Now().UnixNano())
		}
		return handler.Ok()
	})
	w, err := b.startBenchWorkers(ctx, srv, cfg, name, h)
	if err != nil {
		return Figure{}, err
	}
	defer w.Close(context.Background())
	b.progress.set("consume", func() int64 { return int64(w.Stats().Acked.Load()) }, n)
	last, err := waitConfirmed(ctx, w, n)
	if err != nil {
		return Figure{}, err
	}
	return newFigure("consume (noop)", n, b.Params.Size, last.Sub(time.Unix(0, first.Load())), nil), nil
}

// endToEnd starts the workers of the named handler kind, publishes to them and measures
// from the first publish to the last ack; each message's latency is from
// its publish to the server receiving its ack.
func (b *Bencher) endToEnd(ctx context.Context, srv *embedded.Server, cfg *config.Config, url, kind string, acks *ackWatcher) (Figure, error) {
	name := benchConsumerName(kind)
	n := b.Params.Msgs
	if kind == "exec" {
		n = b.Params.ExecMsgs
	}
	var h handler.Handler
	if kind == "noop" {
		h = noopHandler
	}
	w, err := b.startBenchWorkers(ctx, srv, cfg, name, h)
	if err != nil {
		return Figure{}, err
	}
	defer w.Close(context.Background())
	if hh, ok := h.(interface{ CloseIdleConnections() }); ok {
		defer hh.CloseIdleConnections()
	}
	acks.expect(name, n)
	var recs []pubRecord
	label := "e2e " + kind
	start := time.Now()
	if _, err := b.publishAsync(ctx, url, benchE2ESubject(kind), n, label+" (publish)", &recs); err != nil {
		return Figure{}, err
	}
	b.progress.set(label, acks.counter(name).Load, n)
	last, err := acks.wait(ctx, name, w)
	if err != nil {
		return Figure{}, err
	}
	times := acks.times(name)
	lat := make([]time.Duration, 0, len(recs))
	for _, r := range recs {
		if t, ok := times[r.seq]; ok {
			lat = append(lat, t.Sub(r.sent))
		}
	}
	if len(lat) != n {
		return Figure{}, fmt.Errorf("saw the acks of %d of %d messages", len(lat), n)
	}
	return newFigure(label, n, b.Params.Size, last.Sub(start), lat), nil
}

// waitConfirmed returns when the server has confirmed the ack of n
// messages to w (polled every 200µs), failing when the workers report
// failures or nothing moves for a minute.
func waitConfirmed(ctx context.Context, w *pipeline.Workers, n int) (time.Time, error) {
	st := w.Stats()
	var seen uint64
	moved := time.Now()
	for {
		now := time.Now()
		acked := st.Acked.Load()
		if acked >= uint64(n) {
			return now, nil
		}
		if f := st.Retried.Load() + st.DeadLettered.Load() + st.Failures.Load(); f > 0 {
			return time.Time{}, fmt.Errorf("%d messages failed, retried or were dead-lettered: see the log (--verbose)", f)
		}
		if acked != seen {
			seen, moved = acked, now
		} else if now.Sub(moved) > time.Minute {
			return time.Time{}, fmt.Errorf("no progress for a minute: %d of %d acked", acked, n)
		}
		if err := ctx.Err(); err != nil {
			return time.Time{}, err
		}
		time.Sleep(200 * time.Microsecond)
	}
}
