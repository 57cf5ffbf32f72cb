package daemon

import (
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/holdfast-io/holdfast/pipeline/monitor"
)

// ClusterStatus is this node's view of its JetStream cluster, for
// `holdfast status` and the metrics.
type ClusterStatus struct {
	Name       string       `json:"name"`
	Node       string       `json:"node"`
	MetaLeader string       `json:"meta_leader,omitempty"`
	Size       int          `json:"size"`
	Routes     int          `json:"routes"`
	Peers      []PeerStatus `json:"peers"`
}

// PeerStatus is another node as the meta group sees it (on the meta
// leader), or as this node's routes see it (elsewhere: Lag is then
// unknown, 0). A peer this node has no route to is Offline, whatever the
// meta group still thinks of it; DownSince is when this node last had a
// route to it (zero when never, since this node started).
type PeerStatus struct {
	Name      string    `json:"name"`
	Current   bool      `json:"current"`
	Offline   bool      `json:"offline,omitempty"`
	Lag       uint64    `json:"lag,omitempty"`
	Active    float64   `json:"last_seen_seconds"`
	DownSince time.Time `json:"down_since,omitzero"`
}

// peerWatch remembers when this node last had a route to each peer.
type peerWatch struct {
	mu   sync.Mutex
	seen map[string]time.Time
}

// observe records the peers routed now and returns when peer was last
// routed (zero if never).
func (w *peerWatch) observe(routed map[string]bool, peer string, now time.Time) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.seen == nil {
		w.seen = map[string]time.Time{}
	}
	for name := range routed {
		w.seen[name] = now
	}
	return w.seen[peer]
}

// clusterView reads the meta group from the embedded server; nil on a
// single node.
func (w *peerWatch) clusterView(ns *server.Server) *ClusterStatus {
	if ns == nil || !ns.JetStreamIsClustered() {
		return nil
	}
	cs := &ClusterStatus{Node: ns.Name(), Routes: ns.NumRoutes()}
	jsi, err := ns.Jsz(&server.JSzOptions{})
	if err != nil || jsi.Meta == nil {
		return cs
	}
	m := jsi.Meta
	cs.Name, cs.MetaLeader, cs.Size = m.Name, m.Leader, m.Size
	// Only the meta leader tracks how current its followers are; a
	// follower reports a peer current when a route to it is up and the
	// meta group has a leader. The leader's Raft calls a peer current for
	// about 10 s after it last heard from it, and the meta group marks it
	// offline much later: a peer whose routes are all down is down on
	// every node at once.
	leader := m.Leader == ns.Name()
	routed := map[string]bool{}
	if rz, err := ns.Routez(nil); err == nil {
		for _, r := range rz.Routes {
			routed[r.RemoteName] = true
		}
	}
	now := time.Now()
	seen := map[string]bool{ns.Name(): true}
	for _, p := range m.Replicas {
		if p == nil || seen[p.Name] {
			continue // a peer known twice (a node restarted with a new ID) counts once
		}
		seen[p.Name] = true
		down := p.Offline || !routed[p.Name]
		ps := PeerStatus{Name: p.Name, Current: p.Current && !down, Offline: down, Lag: p.Lag, Active: p.Active.Seconds()}
		if !leader {
			ps = PeerStatus{Name: p.Name, Current: routed[p.Name] && m.Leader != "", Offline: !routed[p.Name]}
		}
		if last := w.observe(routed, p.Name, now); ps.Offline {
			ps.DownSince = last
		}
		cs.Peers = append(cs.Peers, ps)
	}
	return cs
}

// clusterPeers counts the nodes this one sees current, itself included,
// and names the peers it sees down, for the monitor and
// holdfast_cluster_peers.
func (w *peerWatch) clusterPeers(ns *server.Server) func() (monitor.Peers, bool) {
	return func() (monitor.Peers, bool) {
		cs := w.clusterView(ns)
		if cs == nil {
			return monitor.Peers{}, false
		}
		p := monitor.Peers{Current: 1, Size: len(cs.Peers) + 1}
		for _, peer := range cs.Peers {
			if peer.Current {
				p.Current++
			}
			if peer.Offline {
				p.Down = append(p.Down, monitor.DownPeer{Name: peer.Name, Since: peer.DownSince})
			}
		}
		return p, true
	}
}
