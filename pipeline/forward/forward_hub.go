package forward

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"
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
	// Pending is how many messages were waiting on the edge behind the
	// last one seen (its Holdfast-Origin-Pending): its backlog then.
	Pending uint64 `json:"pending"`
	// Delay is how long the last message seen took from the edge's store
	// to the hub.
	Delay time.Duration `json:"delay_ns"`
	// Linked is set when the edge's leafnode is connected to this hub,
	// to any node of a hub cluster (filled in by EdgeView.Status).
	Linked bool `json:"linked"`
	// Resent counts messages the edge sent again, since this hub's start,
	// because the hub had acknowledged and lost them; Lost is how many
	// the hub lost that the edge no longer held either (lost on both
	// sides), as the edge last told.
	Resent uint64 `json:"resent,omitempty"`
	Lost   uint64 `json:"lost,omitempty"`
	// lostBefore is what earlier runs of the edge told (its count starts
	// again at each start); lostNow what this one tells; lostLive is set
	// when a message that arrived since this hub's start told more.
	lostBefore, lostNow uint64
	lostLive            bool
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
	t.record(m.Header, time.Now(), true)
}

// record notes a forwarded message with the origin headers h, seen at
// now; count adds it to the messages seen since start (not one read back
// from the stream).
func (t *EdgeTracker) record(h nats.Header, now time.Time, count bool) {
	// The headers are the publisher's to write, in any bytes; the names
	// become Prometheus labels, which must be UTF-8.
	edge := strings.ToValidUTF8(h.Get(HeaderOriginServer), "\uFFFD")
	if edge == "" {
		return
	}
	stream := strings.ToValidUTF8(h.Get(HeaderOriginStream), "\uFFFD")
	seq, _ := strconv.ParseUint(h.Get(HeaderOriginSeq), 10, 64)
	origin, _ := time.Parse(time.RFC3339Nano, h.Get(HeaderOriginTime))
	created := h.Get(HeaderOriginStreamCreated)
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
	if count {
		e.Messages++
		if h.Get(HeaderOriginResent) != "" {
			if e.Resent++; e.Resent == 1 && t.log != nil {
				t.log.Error("an edge sends again messages this hub had acknowledged and lost (its store wiped or put back from an older copy)",
					"edge", edge, "stream", stream, "first_origin_seq", seq)
			}
		}
	}
	if n, err := strconv.ParseUint(h.Get(HeaderOriginLost), 10, 64); err == nil {
		if n < e.lostNow {
			e.lostBefore += e.lostNow // the edge started again
		}
		if n != e.lostNow && count {
			// Told by a message that arrived now, not read back at start.
			e.lostLive = true
			if t.log != nil {
				t.log.Error("messages this hub lost are lost on the edge too: it no longer holds them", "edge", edge, "stream", stream, "lost", n)
			}
		}
		e.lostNow = n
		e.Lost = e.lostBefore + n
	}
	if now.After(e.LastSeen) {
		e.LastSeen = now
	}
	if laterRFC3339(created, e.StreamCreated) {
		// A new incarnation of the edge's stream: sequences start again.
		e.StreamCreated, e.LastSeq = created, 0
	}
	if created == e.StreamCreated && seq > e.LastSeq {
		e.LastSeq = seq
		if p, err := strconv.ParseUint(h.Get(HeaderOriginPending), 10, 64); err == nil {
			e.Pending = p
		}
		if !origin.IsZero() {
			e.Delay = max(now.Sub(origin), 0)
		}
	}
	if origin.After(e.LastOrigin) {
		e.LastOrigin = origin
	}
}

// Seed reads back, from the hub's streams names, the last message each
// edge forwarded into subjects (the edge subjects), so that the view of
// the fleet holds every edge the streams hold from the start, and is the
// same on every node of a hub cluster, whose streams are the same. An edge
// is the second token of the subjects (edge.<server>.…, the forward
// handler's default destination); LastSeen is when the hub stored that
// message.
func (t *EdgeTracker) Seed(ctx context.Context, js jetstream.JetStream, names, subjects []string) error {
	for _, name := range names {
		s, err := js.Stream(ctx, name)
		if err != nil {
			return fmt.Errorf("stream %s: %w", name, err)
		}
		prefixes := map[string]bool{}
		for _, filter := range subjects {
			info, err := s.Info(ctx, jetstream.WithSubjectFilter(filter))
			if err != nil {
				return fmt.Errorf("stream %s: %w", name, err)
			}
			for subj := range info.State.Subjects {
				if tok := strings.SplitN(subj, ".", 3); len(tok) == 3 && len(prefixes) < MaxTrackedEdges {
					prefixes[tok[0]+"."+tok[1]] = true
				}
			}
		}
		for _, p := range slices.Sorted(maps.Keys(prefixes)) {
			if last, err := lastOfEachEdgeStream(ctx, js, name, p+".>"); err == nil {
				for _, m := range last {
					t.record(m.Header, m.Time, false)
				}
				continue
			}
			// No direct get on the stream, or more subjects than one
			// answer holds: the last message of the edge, of one stream.
			m, err := s.GetLastMsgForSubject(ctx, p+".>")
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				continue
			}
			if err != nil {
				return fmt.Errorf("stream %s: last message on %s.>: %w", name, p, err)
			}
			t.record(m.Header, m.Time, false)
		}
	}
	return nil
}

// lastOfEachEdgeStream reads, with one direct get of the last message of
// each subject matching filter in the hub's stream, the last message of
// each edge stream there, in the hub's order: an edge may forward several
// streams under one prefix.
func lastOfEachEdgeStream(ctx context.Context, js jetstream.JetStream, stream, filter string) ([]*jetstream.RawStreamMsg, error) {
	msgs, err := jetstreamext.GetLastMsgsFor(ctx, js, stream, []string{filter})
	if err != nil {
		return nil, err
	}
	last := map[[2]string]*jetstream.RawStreamMsg{}
	for m, err := range msgs {
		if err != nil {
			return nil, err
		}
		k := [2]string{m.Header.Get(HeaderOriginServer), m.Header.Get(HeaderOriginStream)}
		if l := last[k]; l == nil || m.Sequence > l.Sequence {
			last[k] = m
		}
	}
	return slices.SortedFunc(maps.Values(last), func(a, b *jetstream.RawStreamMsg) int {
		return cmp.Compare(a.Sequence, b.Sequence)
	}), nil
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

// Problems are the losses of edges' messages this hub learned since its
// start: what it had acknowledged and lost, sent again by the edge, and
// what is lost on both sides.
func (t *EdgeTracker) Problems() []string {
	var out []string
	for _, e := range t.Seen() {
		if e.Resent > 0 {
			out = append(out, fmt.Sprintf("this hub lost messages of edge %s (stream %s) that it had acknowledged — its store wiped, or put back from an older copy: the edge sent %d again", e.Edge, e.Stream, e.Resent))
		}
		if e.lostLive {
			out = append(out, fmt.Sprintf("%d message(s) of edge %s (stream %s) that this hub had acknowledged are lost on both sides: the edge no longer held them", e.Lost, e.Edge, e.Stream))
		}
	}
	return out
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
