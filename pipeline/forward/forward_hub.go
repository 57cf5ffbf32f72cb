package forward

import (
	"fmt"
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

// EdgeTracker watches the subjects edges forward to, on a hub, and keeps
// per edge and stream the last message seen.
type EdgeTracker struct {
	subs []*nats.Subscription
	mu   sync.Mutex
	seen map[[2]string]*EdgeSeen
}

// OpenEdgeTracker subscribes to subjects on nc.
func OpenEdgeTracker(nc *nats.Conn, subjects []string) (*EdgeTracker, error) {
	t := &EdgeTracker{seen: map[[2]string]*EdgeSeen{}}
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
