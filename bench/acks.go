package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/holdfast-io/holdfast/pipeline"
)

// ackWatcher subscribes to the acks the workers send ($JS.ACK.<stream>.
// <consumer>.…) on its own in-process connection and records, per
// consumer, when the server received the ack of each stream sequence.
type ackWatcher struct {
	nc  *nats.Conn
	sub *nats.Subscription

	mu   sync.Mutex
	cons map[string]*ackCount
}

type ackCount struct {
	n      atomic.Int64
	want   int
	at     map[uint64]time.Time
	last   time.Time
	doneCh chan struct{}
}

func newAckWatcher(ns *server.Server) (*ackWatcher, error) {
	nc, err := nats.Connect("", nats.InProcessServer(ns), nats.Name("holdfast-bench-acks"))
	if err != nil {
		return nil, fmt.Errorf("cannot connect in-process: %w", err)
	}
	a := &ackWatcher{nc: nc, cons: map[string]*ackCount{}}
	a.sub, err = nc.Subscribe("$JS.ACK.>", a.onAck)
	if err != nil {
		nc.Close()
		return nil, err
	}
	_ = a.sub.SetPendingLimits(-1, -1)
	if err := nc.Flush(); err != nil {
		nc.Close()
		return nil, err
	}
	return a, nil
}

func (a *ackWatcher) close() { a.nc.Close() }

// expect starts recording the acks of consumer, until n.
func (a *ackWatcher) expect(consumer string, n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.cons[consumer] = &ackCount{want: n, at: make(map[uint64]time.Time, n), doneCh: make(chan struct{})}
}

func (a *ackWatcher) counter(consumer string) *atomic.Int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return &a.cons[consumer].n
}

func (a *ackWatcher) times(consumer string) map[uint64]time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cons[consumer].at
}

// onAck records an ack. The ack subject is $JS.ACK.<stream>.<consumer>.
// <delivered>.<stream seq>.<consumer seq>.<time>.<pending>, or with
// <domain>.<account hash> after $JS.ACK.
func (a *ackWatcher) onAck(m *nats.Msg) {
	now := time.Now()
	if len(m.Data) > 0 && string(m.Data) != "+ACK" {
		return // nak, in progress, term
	}
	tok := strings.Split(m.Subject, ".")
	var consumer, seq string
	switch {
	case len(tok) == 9:
		consumer, seq = tok[3], tok[5]
	case len(tok) >= 11:
		consumer, seq = tok[5], tok[7]
	default:
		return
	}
	s, err := strconv.ParseUint(seq, 10, 64)
	if err != nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.cons[consumer]
	if c == nil {
		return
	}
	if _, dup := c.at[s]; dup {
		return
	}
	c.at[s] = now
	c.last = now
	if int(c.n.Add(1)) == c.want {
		close(c.doneCh)
	}
}

// wait returns when the server received the last expected ack of
// consumer, failing when the workers report failures or nothing moves for
// a minute.
func (a *ackWatcher) wait(ctx context.Context, consumer string, w *pipeline.Workers) (time.Time, error) {
	a.mu.Lock()
	c := a.cons[consumer]
	a.mu.Unlock()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	seen, idle := int64(-1), 0
	for {
		select {
		case <-c.doneCh:
			a.mu.Lock()
			defer a.mu.Unlock()
			return c.last, nil
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-tick.C:
			st := w.Stats()
			if n := st.Retried.Load() + st.DeadLettered.Load() + st.Failures.Load(); n > 0 {
				return time.Time{}, fmt.Errorf("%d messages failed, retried or were dead-lettered: see the log (--verbose)", n)
			}
			if n := c.n.Load(); n != seen {
				seen, idle = n, 0
			} else if idle++; idle >= 60 {
				return time.Time{}, fmt.Errorf("no progress for a minute: %d of %d acked", n, c.want)
			}
		}
	}
}
