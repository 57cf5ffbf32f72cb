package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/internal/subjects"
	"github.com/holdfast-io/holdfast/pipeline/forward"
)

// openEdgeView builds the leafnode view of a hub or an edge (nil for a
// node without [leafnodes] or sourced streams): the links, the hub's
// tracker of edges, the sources, and the metrics.
func (d *Daemon) openEdgeView() (*forward.EdgeView, error) {
	l := d.cfg.LeafNodes
	var sourced []string
	for _, name := range d.cfg.StreamNames() {
		if sc := d.cfg.Streams[name]; len(sc.Sources) > 0 || sc.Mirror != nil {
			sourced = append(sourced, name)
		}
	}
	if !l.Hub() && !l.Edge() && len(sourced) == 0 {
		return nil, nil
	}
	v := &forward.EdgeView{UnreachableAfter: l.UnreachableAfter.Duration,
		JS: d.srv.JetStream(), Conn: d.srv.Conn(), SourcedStreams: sourced, StallAfter: d.cfg.HTTP.StallTimeout.Duration}
	if l.Edge() {
		v.Links = func() []forward.LinkState {
			var out []forward.LinkState
			for _, ll := range d.srv.LeafLinks() {
				out = append(out, forward.LinkState{Remote: ll.Remote, Connected: ll.Connected, Address: ll.Address, Since: ll.Since, Connects: ll.Connects, Problem: ll.Problem})
			}
			return out
		}
	}
	if l.Hub() && len(l.EdgeSubjects) > 0 {
		t, err := forward.OpenEdgeTracker(d.srv.Conn(), l.EdgeSubjects, d.log.With("component", "edges"))
		if err != nil {
			return nil, err
		}
		v.Hub = t
		var edgeStreams []string
		for _, name := range d.cfg.StreamNames() {
			if d.cfg.TakesEdgeMessages(name) {
				edgeStreams = append(edgeStreams, name)
			}
		}
		// The edges the streams hold, from the start and on every node.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := t.Seed(ctx, d.srv.JetStream(), edgeStreams, l.EdgeSubjects); err != nil {
			d.log.Warn("the edges the hub's streams hold are not read back: they show once they forward again", "err", err)
		}
	}
	if l.Hub() {
		if err := d.answerLeafs(); err != nil {
			return nil, err
		}
		v.LinkedEdges = d.linkedEdges
	}
	d.metrics.Registry().MustRegister(v)
	return v, nil
}

// answerLeafs answers, on a node of a hub cluster, which edges are linked
// to it, for the other nodes' view of the fleet.
func (d *Daemon) answerLeafs() error {
	if !d.cfg.Cluster.Enabled() {
		return nil
	}
	d.clusterNodes = d.srv.ClusterNodes()
	sub, err := d.srv.Conn().Subscribe(subjects.Leafs(d.cfg.Cluster.Name), func(m *nats.Msg) {
		b, _ := json.Marshal(d.srv.LeafEdges())
		_ = m.Respond(b)
	})
	if err != nil {
		return fmt.Errorf("cannot answer for this node's edges: %w", err)
	}
	d.leafsSub = sub
	return nil
}

// linkedEdges returns the edges linked to this hub: to this node, and in
// a hub cluster to any node that answers within half a second.
func (d *Daemon) linkedEdges(ctx context.Context) map[string]bool {
	out := map[string]bool{}
	for _, n := range d.srv.LeafEdges() {
		out[n] = true
	}
	if d.leafsSub == nil || d.clusterNodes < 2 {
		return out
	}
	nc := d.srv.Conn()
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return out
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(subjects.Leafs(d.cfg.Cluster.Name), inbox, nil); err != nil {
		return out
	}
	ctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	for range d.clusterNodes { // every node answers, this one too
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			break
		}
		var names []string
		if json.Unmarshal(m.Data, &names) == nil {
			for _, n := range names {
				out[n] = true
			}
		}
	}
	return out
}

// openForwarder builds and opens the forward handler of consumer name. A
// hub that is unreachable or wanting (its stream missing or deduplicating
// over too short a window) never stops the edge: forwarding waits for it,
// and the health says why. It waits for the link until hubBy (zero:
// forward.StartWait).
func (d *Daemon) openForwarder(ctx context.Context, cfg *config.Config, name string, hubBy time.Time) (*forward.Forwarder, error) {
	cc := cfg.Consumers[name]
	f, err := forward.New(d.srv.Conn(), forward.Options{
		ServerName:         cfg.Server.Name,
		Stream:             cc.Stream,
		Consumer:           name,
		Subject:            cc.Forward.Subject,
		Domain:             cc.Forward.Domain,
		Timeout:            cc.Forward.Timeout.Duration,
		MinDuplicateWindow: cfg.LeafNodes.UnreachableAfter.Duration,
		LinkUp:             func() bool { return d.srv.LeafReaches(cc.Forward.Domain) },
		Clustered:          cfg.Cluster.Enabled(),
		Domains:            d.srv.LeafDomains,
		StartBy:            hubBy,
	}, d.log)
	if err != nil {
		return nil, fmt.Errorf("consumers.%s.forward: %w", name, err)
	}
	d.notify.Status(fmt.Sprintf("checking the hub's stream for consumer %s", name))
	if err := f.Open(ctx); err != nil {
		return nil, fmt.Errorf("consumers.%s.forward: %w", name, err)
	}
	return f, nil
}

// setForwarder records the forwarder of consumer name, closing the one it
// replaces (a reload restarted the workers); a nil f leaves the consumer
// without one (its workers no longer forward).
func (d *Daemon) setForwarder(name string, f *forward.Forwarder) {
	if old := d.forwarders[name]; old != nil && old != f {
		old.Close()
	}
	if f == nil {
		delete(d.forwarders, name)
	} else {
		if d.forwarders == nil {
			d.forwarders = map[string]*forward.Forwarder{}
		}
		d.forwarders[name] = f
	}
	if d.edge != nil {
		d.edge.SetForwarder(name, f)
	}
}

// closeLeaf stops the forwarders' background checks and the hub's
// tracker, after the workers stopped.
func (d *Daemon) closeLeaf() {
	for _, f := range d.forwarders {
		f.Close()
	}
	if d.edge != nil {
		d.edge.Hub.Close()
	}
	if d.leafsSub != nil {
		_ = d.leafsSub.Unsubscribe()
		d.leafsSub = nil
	}
}
