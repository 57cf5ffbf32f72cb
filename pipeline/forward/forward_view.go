package forward

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// LinkState is one leafnode remote (a hub) as this edge sees it, and in
// `holdfast status`.
type LinkState struct {
	Remote    string `json:"remote"`
	Connected bool   `json:"connected"`
	// Address is the hub's host:port the link is on ("" while down).
	Address string `json:"address,omitempty"`
	// Since is when the link last changed state, or start-up.
	Since    time.Time `json:"since"`
	Connects uint64    `json:"connects"`
	// Problem is why the hub keeps dropping the link ("" when it does not).
	Problem string `json:"problem,omitempty"`
}

// EdgeView gathers the leafnode links, the forwarders and, on a hub, the
// edges seen, for /healthz, /metrics and `holdfast status`.
type EdgeView struct {
	// Links returns the remotes' states; nil on a node without remotes.
	Links func() []LinkState
	// UnreachableAfter is how long a remote may be down before the health
	// is degraded.
	UnreachableAfter time.Duration
	// Hub is the tracker of the edges a hub hears from, nil elsewhere.
	Hub *EdgeTracker
	// LinkedEdges returns the edges whose leafnode link is up to this hub
	// (to any node of a hub cluster); nil: none known.
	LinkedEdges func(ctx context.Context) map[string]bool
	// JS reads SourcedStreams, the streams with sources or a mirror; a
	// source whose lag does not shrink for StallAfter while the link is up
	// is stalled.
	JS             jetstream.JetStream
	Conn           *nats.Conn // reaches the sources in other domains
	SourcedStreams []string
	StallAfter     time.Duration
	sources        sourceWatch

	mu         sync.Mutex
	forwarders map[string]*Forwarder
}

// SetForwarder records the forwarder of consumer (nil removes it).
func (v *EdgeView) SetForwarder(consumer string, f *Forwarder) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.forwarders == nil {
		v.forwarders = map[string]*Forwarder{}
	}
	if f == nil {
		delete(v.forwarders, consumer)
		return
	}
	v.forwarders[consumer] = f
}

func (v *EdgeView) forwarderList() []*Forwarder {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make([]*Forwarder, 0, len(v.forwarders))
	for _, name := range slices.Sorted(maps.Keys(v.forwarders)) {
		out = append(out, v.forwarders[name])
	}
	return out
}

func (v *EdgeView) links() []LinkState {
	if v == nil || v.Links == nil {
		return nil
	}
	return v.Links()
}

// Problems are what degrades the health: a remote down for longer than
// UnreachableAfter, a reachable hub whose stream cannot take the
// forwarded messages safely. The edge keeps serving local publishers
// either way.
func (v *EdgeView) Problems(now time.Time) []string {
	if v == nil {
		return nil
	}
	var out []string
	for _, l := range v.links() {
		if down := now.Sub(l.Since); !l.Connected && down >= v.UnreachableAfter {
			out = append(out, fmt.Sprintf("leafnode %s has been unreachable for %s (leafnodes.unreachable_after = %s): messages wait here for forwarding; local publishing goes on",
				l.Remote, down.Round(time.Second), v.UnreachableAfter))
		}
		if l.Problem != "" {
			out = append(out, fmt.Sprintf("leafnode %s: %s", l.Remote, l.Problem))
		}
	}
	links := v.links()
	for _, f := range v.forwarderList() {
		p := f.Problem()
		if p == "" {
			p = unservedDomain(f, links, now)
		}
		if p != "" {
			out = append(out, fmt.Sprintf("consumer %s does not forward: %s", f.opts.Consumer, p))
		}
	}
	if v.Hub != nil {
		out = append(out, v.Hub.Problems()...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return append(out, sourceProblems(v.checkSources(ctx, now))...)
}

// domainGrace is how long every remote's link must have been up before a
// forward domain that none of their hubs serves is reported: the domains
// are read from the hubs' subscriptions, which follow the link.
const domainGrace = 5 * time.Second

// unservedDomain is why f waits although every remote's link has been up
// for domainGrace: no hub behind them serves f's JetStream domain (a typo
// in forward.domain, a hub whose jetstream.domain changed). Waiting does
// not heal that; "" otherwise (a remote down is reported as such).
func unservedDomain(f *Forwarder, links []LinkState, now time.Time) string {
	if len(links) == 0 || f.linkUp() {
		return ""
	}
	for _, l := range links {
		if !l.Connected || now.Sub(l.Since) < domainGrace {
			return ""
		}
	}
	served := "no JetStream domain (set jetstream.domain on the hub)"
	if ds := f.domains(); len(ds) > 0 {
		q := make([]string, len(ds))
		for i, d := range ds {
			q[i] = strconv.Quote(d)
		}
		served = strings.Join(q, ", ")
	}
	return fmt.Sprintf("no hub connected over the leafnode links serves JetStream domain %q: they serve %s; set consumers.%s.forward.domain to the hub's jetstream.domain (messages wait here)",
		f.opts.Domain, served, f.opts.Consumer)
}

// ForwarderStatus is one forwarding consumer in `holdfast status`.
type ForwarderStatus struct {
	Consumer   string `json:"consumer"`
	Stream     string `json:"stream"`
	Domain     string `json:"domain"`
	Ready      bool   `json:"ready"`
	Problem    string `json:"problem,omitempty"`
	Forwarded  uint64 `json:"forwarded"`
	Duplicates uint64 `json:"duplicates"`
	// Skipped counts messages not sent again because the hub's position
	// showed it held them; HubPosition is that position: the origin
	// sequence of the last message the hub holds from this consumer (0
	// when it holds none, or cannot tell: HubPositionKnown false).
	Skipped uint64 `json:"skipped"`
	// Untrusted counts hub positions not taken because the edge never
	// sent the message they came from (forged on the hub).
	Untrusted        uint64 `json:"untrusted_positions,omitempty"`
	HubPosition      uint64 `json:"hub_position"`
	HubPositionKnown bool   `json:"hub_position_known"`
	Refused          uint64 `json:"refused"`
	// Batches counts the atomic batches the hub committed (a backlog goes
	// in batches when the hub's stream takes them).
	Batches uint64 `json:"batches"`
	// Resent counts messages the hub acknowledged and lost, sent again;
	// Gone those lost on both sides (the edge's stream no longer held
	// them).
	Resent      uint64    `json:"resent"`
	Gone        uint64    `json:"gone"`
	Errors      uint64    `json:"errors"`
	LastForward time.Time `json:"last_forward,omitzero"`
	Backlog     uint64    `json:"backlog"`
	// OldestUnforwarded is when the oldest message not forwarded yet was
	// stored here (zero when the backlog is empty).
	OldestUnforwarded time.Time `json:"oldest_unforwarded,omitzero"`
	BacklogError      string    `json:"backlog_error,omitempty"`
}

// EdgeStatus is the leafnode part of `holdfast status`.
type EdgeStatus struct {
	Links    []LinkState       `json:"links,omitempty"`
	Forwards []ForwarderStatus `json:"forwards,omitempty"`
	Edges    []EdgeSeen        `json:"edges,omitempty"`
	// EdgesDropped counts edge streams no longer tracked (MaxTrackedEdges).
	EdgesDropped uint64         `json:"edges_dropped,omitempty"`
	Sources      []SourceStatus `json:"sources,omitempty"`
}

// Status reads the current state (the backlog with one consumer info and
// one message lookup per forwarder).
func (v *EdgeView) Status(ctx context.Context) *EdgeStatus {
	if v == nil {
		return nil
	}
	out := &EdgeStatus{Links: v.links(), Edges: v.Hub.Seen(), EdgesDropped: v.Hub.Dropped(), Sources: v.checkSources(ctx, time.Now())}
	if len(out.Edges) > 0 && v.LinkedEdges != nil {
		linked := v.LinkedEdges(ctx)
		for i := range out.Edges {
			out.Edges[i].Linked = linked[out.Edges[i].Edge]
		}
	}
	for _, f := range v.forwarderList() {
		st := f.Stats()
		fs := ForwarderStatus{Consumer: f.opts.Consumer, Stream: f.opts.Stream, Domain: f.opts.Domain, Ready: f.Ready(), Problem: f.Problem(),
			Forwarded: st.Forwarded.Load(), Duplicates: st.Duplicates.Load(), Skipped: st.Skipped.Load(), Untrusted: st.Untrusted.Load(), Refused: st.Refused.Load(), Errors: st.Errors.Load(), Batches: st.Batches.Load(),
			Resent: st.Resent.Load(), Gone: st.Gone.Load()}
		fs.HubPosition, fs.HubPositionKnown = f.Position()
		if fs.Problem == "" {
			fs.Problem = unservedDomain(f, out.Links, time.Now())
		}
		if n := st.LastForward.Load(); n > 0 {
			fs.LastForward = time.Unix(0, n)
		}
		bctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		var err error
		fs.Backlog, fs.OldestUnforwarded, err = f.Backlog(bctx)
		cancel()
		if err != nil {
			fs.BacklogError = err.Error()
		}
		out.Forwards = append(out.Forwards, fs)
	}
	return out
}

// desc describes one of the edge's holdfast_ metrics.
func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName("holdfast", "", name), help, labels, nil)
}

var (
	descLeafConnected  = desc("leafnode_connected", "1 when the leafnode link to the remote (a hub) is up.", "remote")
	descLeafConnects   = desc("leafnode_connects_total", "Times the leafnode link to the remote came up since start.", "remote")
	descLeafChange     = desc("leafnode_state_since_timestamp_seconds", "When the leafnode link last changed state (or start-up).", "remote")
	descFwdForwarded   = desc("forward_messages_total", "Messages the hub stored (PubAck) for this forwarding consumer.", "consumer")
	descFwdDuplicates  = desc("forward_duplicates_total", "Forwarded messages the hub had already (a duplicate PubAck: sent again after a lost PubAck).", "consumer")
	descFwdSkipped     = desc("forward_skipped_total", "Messages not sent again because the hub's position showed it held them (after a reconnect or a restart).", "consumer")
	descFwdPosition    = desc("forward_hub_position", "The origin sequence of the last message the hub holds from this consumer, as last read or acknowledged (absent when it cannot be read).", "consumer")
	descFwdBatches     = desc("forward_batches_total", "Atomic batches the hub committed for this forwarding consumer (its messages count in forward_messages_total).", "consumer")
	descFwdResent      = desc("forward_resent_total", "Messages the hub acknowledged and then lost (a store wiped or put back from an older copy), sent again from this edge's stream.", "consumer")
	descFwdGone        = desc("forward_lost_total", "Messages the hub acknowledged and lost that this edge's stream no longer held: lost on both sides.", "consumer")
	descFwdRefused     = desc("forward_refused_total", "Messages that can never be forwarded (too large, refused by the hub): dead-lettered here.", "consumer")
	descFwdErrors      = desc("forward_errors_total", "Publishes to the hub that failed and were retried.", "consumer")
	descFwdReady       = desc("forward_ready", "1 when the link is up and the hub's stream passed the start-up check.", "consumer")
	descFwdLast        = desc("forward_last_success_timestamp_seconds", "When the hub last acknowledged a forwarded message.", "consumer")
	descFwdBacklog     = desc("forward_backlog_messages", "Messages of the consumer not forwarded yet (pending and awaiting the hub's PubAck).", "consumer")
	descFwdOldest      = desc("forward_oldest_unforwarded_age_seconds", "Age of the oldest message not forwarded yet (0 when none): the forwarding lag.", "consumer")
	descEdgeLastOrigin = desc("edge_last_message_timestamp_seconds", "Hub: when the edge stored the last message seen from it.", "edge", "stream")
	descEdgeLastSeen   = desc("edge_last_seen_timestamp_seconds", "Hub: when the last message from the edge arrived.", "edge", "stream")
	descEdgeLastSeq    = desc("edge_last_seq", "Hub: the highest origin sequence seen from the edge's stream (current incarnation).", "edge", "stream")
	descSourceLag      = desc("stream_source_lag", "Messages a stream's source (or mirror) is behind, as the server reports it.", "stream", "source")
	descSourceActive   = desc("stream_source_active_seconds", "How long ago the source last had activity (-1: never).", "stream", "source")
	descSourceStalled  = desc("stream_source_stalled", "1 when the source's lag has not shrunk for the stall timeout while the link was up.", "stream", "source")
	descEdgeMessages   = desc("edge_messages_seen_total", "Hub: messages seen from the edge's stream since start, sent-again ones included.", "edge", "stream")
	descEdgePending    = desc("edge_pending_messages", "Hub: messages that were waiting on the edge behind the last one seen from it (its backlog then).", "edge", "stream")
	descEdgeDelay      = desc("edge_delay_seconds", "Hub: how long the last message seen from the edge took from the edge's store to the hub.", "edge", "stream")
	descEdgeResent     = desc("edge_resent_total", "Hub: messages the edge sent again since this hub's start because the hub had acknowledged and lost them.", "edge", "stream")
	descEdgeLost       = desc("edge_lost_total", "Hub: messages the hub lost that the edge no longer held either: lost on both sides, as the edge tells.", "edge", "stream")
	descEdgeLinked     = desc("edge_linked", "Hub: 1 when the edge's leafnode link is up to this hub (any node of a hub cluster).", "edge", "stream")
	descEdgesDropped   = desc("edge_streams_dropped_total", "Hub: edge streams dropped from tracking, least recently seen first, past the bound of tracked ones.")
)

// Describe implements prometheus.Collector.
func (v *EdgeView) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descLeafConnected, descLeafConnects, descLeafChange, descFwdForwarded, descFwdDuplicates,
		descFwdSkipped, descFwdPosition, descFwdBatches, descFwdResent, descFwdGone, descFwdRefused, descFwdErrors, descFwdReady, descFwdLast, descFwdBacklog, descFwdOldest,
		descEdgeLastOrigin, descEdgeLastSeen, descEdgeLastSeq, descEdgeMessages, descEdgePending, descEdgeDelay, descEdgeLinked, descEdgeResent, descEdgeLost, descEdgesDropped, descSourceLag, descSourceActive, descSourceStalled} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (v *EdgeView) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	now := time.Now()
	st := v.Status(ctx)
	b2f := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	for _, l := range st.Links {
		ch <- prometheus.MustNewConstMetric(descLeafConnected, prometheus.GaugeValue, b2f(l.Connected), l.Remote)
		ch <- prometheus.MustNewConstMetric(descLeafConnects, prometheus.CounterValue, float64(l.Connects), l.Remote)
		ch <- prometheus.MustNewConstMetric(descLeafChange, prometheus.GaugeValue, float64(l.Since.UnixNano())/1e9, l.Remote)
	}
	for _, f := range st.Forwards {
		ch <- prometheus.MustNewConstMetric(descFwdForwarded, prometheus.CounterValue, float64(f.Forwarded), f.Consumer)
		ch <- prometheus.MustNewConstMetric(descFwdDuplicates, prometheus.CounterValue, float64(f.Duplicates), f.Consumer)
		ch <- prometheus.MustNewConstMetric(descFwdSkipped, prometheus.CounterValue, float64(f.Skipped), f.Consumer)
		if f.HubPositionKnown {
			ch <- prometheus.MustNewConstMetric(descFwdPosition, prometheus.GaugeValue, float64(f.HubPosition), f.Consumer)
		}
		ch <- prometheus.MustNewConstMetric(descFwdBatches, prometheus.CounterValue, float64(f.Batches), f.Consumer)
		ch <- prometheus.MustNewConstMetric(descFwdResent, prometheus.CounterValue, float64(f.Resent), f.Consumer)
		ch <- prometheus.MustNewConstMetric(descFwdGone, prometheus.CounterValue, float64(f.Gone), f.Consumer)
		ch <- prometheus.MustNewConstMetric(descFwdRefused, prometheus.CounterValue, float64(f.Refused), f.Consumer)
		ch <- prometheus.MustNewConstMetric(descFwdErrors, prometheus.CounterValue, float64(f.Errors), f.Consumer)
		ch <- prometheus.MustNewConstMetric(descFwdReady, prometheus.GaugeValue, b2f(f.Ready), f.Consumer)
		if !f.LastForward.IsZero() {
			ch <- prometheus.MustNewConstMetric(descFwdLast, prometheus.GaugeValue, float64(f.LastForward.UnixNano())/1e9, f.Consumer)
		}
		if f.BacklogError == "" {
			ch <- prometheus.MustNewConstMetric(descFwdBacklog, prometheus.GaugeValue, float64(f.Backlog), f.Consumer)
			age := 0.0
			if !f.OldestUnforwarded.IsZero() {
				age = max(now.Sub(f.OldestUnforwarded).Seconds(), 0)
			}
			ch <- prometheus.MustNewConstMetric(descFwdOldest, prometheus.GaugeValue, age, f.Consumer)
		}
	}
	for _, s := range st.Sources {
		if s.Source == "" {
			continue
		}
		active := -1.0
		if s.Active >= 0 {
			active = s.Active.Seconds()
		}
		ch <- prometheus.MustNewConstMetric(descSourceLag, prometheus.GaugeValue, float64(s.Lag), s.Stream, s.Source)
		ch <- prometheus.MustNewConstMetric(descSourceActive, prometheus.GaugeValue, active, s.Stream, s.Source)
		ch <- prometheus.MustNewConstMetric(descSourceStalled, prometheus.GaugeValue, b2f(s.Stalled), s.Stream, s.Source)
	}
	if v.Hub != nil {
		ch <- prometheus.MustNewConstMetric(descEdgesDropped, prometheus.CounterValue, float64(st.EdgesDropped))
	}
	for _, e := range st.Edges {
		ch <- prometheus.MustNewConstMetric(descEdgeLastOrigin, prometheus.GaugeValue, float64(e.LastOrigin.UnixNano())/1e9, e.Edge, e.Stream)
		ch <- prometheus.MustNewConstMetric(descEdgeLastSeen, prometheus.GaugeValue, float64(e.LastSeen.UnixNano())/1e9, e.Edge, e.Stream)
		ch <- prometheus.MustNewConstMetric(descEdgeLastSeq, prometheus.GaugeValue, float64(e.LastSeq), e.Edge, e.Stream)
		ch <- prometheus.MustNewConstMetric(descEdgeMessages, prometheus.CounterValue, float64(e.Messages), e.Edge, e.Stream)
		ch <- prometheus.MustNewConstMetric(descEdgePending, prometheus.GaugeValue, float64(e.Pending), e.Edge, e.Stream)
		ch <- prometheus.MustNewConstMetric(descEdgeDelay, prometheus.GaugeValue, e.Delay.Seconds(), e.Edge, e.Stream)
		ch <- prometheus.MustNewConstMetric(descEdgeLinked, prometheus.GaugeValue, b2f(e.Linked), e.Edge, e.Stream)
		ch <- prometheus.MustNewConstMetric(descEdgeResent, prometheus.CounterValue, float64(e.Resent), e.Edge, e.Stream)
		ch <- prometheus.MustNewConstMetric(descEdgeLost, prometheus.CounterValue, float64(e.Lost), e.Edge, e.Stream)
	}
}
