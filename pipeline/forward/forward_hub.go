package forward

import (
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// EdgeSeen is what a hub last saw from one edge's stream, read from the
// origin headers of the forwarded messages.
type EdgeSeen struct {
	Edge   string `json:"edge"`
	Stream string `json:"stream"`
	// LastSeq is the highest origin sequence seen (of the stream's
	// incarnation created at StreamCreated).
	LastSeq       uint64    `json:"last_seq"`
	StreamCreated string    `json:"stream_created,omitempty"`
	LastOrigin    time.Time `json:"last_origin_time"` // when the edge stored it
	LastSeen      time.Time `json:"last_seen"`        // when the hub saw it
	Messages      uint64    `json:"messages"`         // seen since start (redeliveries included)
}

// MaxTrackedEdges bounds the edge streams an EdgeTracker keeps: the
// origin headers are whatever a publisher on the edge subjects writes, so
// past it the least recently seen edge stream is dropped (and counted).
const MaxTrackedEdges = 1000

// EdgeTracker watches the subjects edges forward to, on a hub, and keeps
// per edge and stream the last message seen, for at most MaxTrackedEdges
// edge streams.
type EdgeTracker struct {
	subs    []*nats.Subscription
	log     *slog.Logger
	mu      sync.Mutex
	seen    map[[2]string]*EdgeSeen
	evicted uint64
}

// OpenEdgeTracker subscribes to subjects on nc; log tells when edge
// streams start to be dropped for MaxTrackedEdges.
func OpenEdgeTracker(nc *nats.Conn, subjects []string, log *slog.Logger) (*EdgeTracker, error) {
	t := &EdgeTracker{seen: map[[2]string]*EdgeSeen{}, log: log}
	for _, s := range subjects {
		sub, err := nc.Subscribe(s, t.observe)
		if err != nil {
			t.Close()
			return nil, fmt.Errorf("cannot watch edge subjects %s: %w", s, err)
		}
		_ = sub.SetPendingLimits(-1, 64<<20)
		t.subs = append(t.subs, sub)
	}
	return t, nil
}

func (t *EdgeTracker) observe(m *nats.Msg) {
	edge := m.Header.Get(HeaderOriginServer)
	if edge == "" {
		return
	}
	stream := m.Header.Get(HeaderOriginStream)
	seq, _ := strconv.ParseUint(m.Header.Get(HeaderOriginSeq), 10, 64)
	origin, _ := time.Parse(time.RFC3339Nano, m.Header.Get(HeaderOriginTime))
	created := m.Header.Get(HeaderOriginStreamCreated)
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	k := [2]string{edge, stream}
	e := t.seen[k]
	if e == nil {
		if len(t.seen) >= MaxTrackedEdges {
			t.evictOldest()
		}
		e = &EdgeSeen{Edge: edge, Stream: stream}
		t.seen[k] = e
	}
	e.Messages++
	e.LastSeen = now
	if laterRFC3339(created, e.StreamCreated) {
		// A new incarnation of the edge's stream: sequences start again.
		e.StreamCreated, e.LastSeq = created, 0
	}
	if created == e.StreamCreated && seq > e.LastSeq {
		e.LastSeq = seq
	}
	if origin.After(e.LastOrigin) {
		e.LastOrigin = origin
	}
}

// evictOldest drops the least recently seen edge stream; t.mu is held.
func (t *EdgeTracker) evictOldest() {
	var oldest [2]string
	var at time.Time
	for k, e := range t.seen {
		if at.IsZero() || e.LastSeen.Before(at) {
			oldest, at = k, e.LastSeen
		}
	}
	delete(t.seen, oldest)
	if t.evicted++; t.evicted == 1 && t.log != nil {
		t.log.Warn("more edge streams seen than tracked: the least recently seen are dropped from status and metrics (counted in holdfast_edge_streams_dropped_total)",
			"max", MaxTrackedEdges, "dropped_edge", oldest[0], "dropped_stream", oldest[1])
	}
}

// Dropped returns how many edge streams were dropped for MaxTrackedEdges.
func (t *EdgeTracker) Dropped() uint64 {
	if t == nil {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.evicted
}

// laterRFC3339 reports whether time a is after b ("" or unreadable: none,
// before any). The texts cannot be compared as strings: RFC3339Nano drops
// trailing zeros, so "…:39.12Z" sorts after "…:39.123Z".
func laterRFC3339(a, b string) bool {
	ta, err := time.Parse(time.RFC3339Nano, a)
	if err != nil {
		return false
	}
	tb, err := time.Parse(time.RFC3339Nano, b)
	return err != nil || ta.After(tb)
}

// Seen returns what was seen, by edge and stream.
func (t *EdgeTracker) Seen() []EdgeSeen {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]EdgeSeen, 0, len(t.seen))
	for _, e := range t.seen {
		out = append(out, *e)
	}
	slices.SortFunc(out, func(a, b EdgeSeen) int {
		return strings.Compare(a.Edge+"\x00"+a.Stream, b.Edge+"\x00"+b.Stream)
	})
	return out
}

// Close unsubscribes; it is safe on nil and idempotent.
func (t *EdgeTracker) Close() {
	if t == nil {
		return
	}
	for _, s := range t.subs {
		_ = s.Unsubscribe()
	}
	t.subs = nil
}
