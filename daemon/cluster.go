package daemon

import (
	"github.com/nats-io/nats-server/v2/server"
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
// leader), or as this node's routes see it (elsewhere: Lag and Active are
// then unknown, 0).
type PeerStatus struct {
	Name    string  `json:"name"`
	Current bool    `json:"current"`
	Offline bool    `json:"offline,omitempty"`
	Lag     uint64  `json:"lag,omitempty"`
	Active  float64 `json:"last_seen_seconds"`
}

// clusterView reads the meta group from the embedded server; nil on a
// single node.
func clusterView(ns *server.Server) *ClusterStatus {
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
	// about 10 s after it last heard from it: a peer whose routes are all
	// down is not current on the leader either (with both peers killed,
	// the leader answered "ok" for 10 s while it took no publish).
	leader := m.Leader == ns.Name()
	routed := map[string]bool{}
	if rz, err := ns.Routez(nil); err == nil {
		for _, r := range rz.Routes {
			routed[r.RemoteName] = true
		}
	}
	seen := map[string]bool{ns.Name(): true}
	for _, p := range m.Replicas {
		if p == nil || seen[p.Name] {
			continue // a peer known twice (a node restarted with a new ID) counts once
		}
		seen[p.Name] = true
		ps := PeerStatus{Name: p.Name, Current: p.Current && routed[p.Name] && !p.Offline, Offline: p.Offline, Lag: p.Lag, Active: p.Active.Seconds()}
		if !leader {
			ps = PeerStatus{Name: p.Name, Current: routed[p.Name] && m.Leader != "", Offline: !routed[p.Name]}
		}
		cs.Peers = append(cs.Peers, ps)
	}
	return cs
}

// clusterPeers counts the nodes this one sees current, itself included,
// for holdfast_cluster_peers.
func clusterPeers(ns *server.Server) func() (int, int, bool) {
	return func() (int, int, bool) {
		cs := clusterView(ns)
		if cs == nil {
			return 0, 0, false
		}
		current := 1
		for _, p := range cs.Peers {
			if p.Current {
				current++
			}
		}
		return current, len(cs.Peers) + 1, true
	}
}
