package daemon

import (
	"log/slog"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/holdfast-io/holdfast/embedded/store"
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

// peerWatch remembers when this node last had a route to each peer, and
// (names, when set) the name of each peer it has seen.
type peerWatch struct {
	mu    sync.Mutex
	seen  map[string]time.Time
	names *peerNames
}

// unknownPeerPrefix starts the name nats-server gives a Raft peer it has
// not heard from since it started: "Server name unknown at this time
// (peerID: ID)".
const unknownPeerPrefix = "Server name unknown at this time"

// peerNames remembers, in the store dir, the server name of every
// cluster peer this node has seen, by Raft peer ID (the same ID in every
// Raft group): after the whole cluster restarted, the server knows a peer
// that stays down only by its ID.
type peerNames struct {
	mu     sync.Mutex
	dir    string
	log    *slog.Logger
	names  map[string]string
	failed bool // a write failed: said once
}

// openPeerNames reads the names recorded in dir. A file that cannot be
// read costs only the names: logged, and the peers seen from now on are
// recorded anew.
func openPeerNames(dir string, log *slog.Logger) *peerNames {
	names, err := store.ReadPeerNames(dir)
	if err != nil {
		log.Warn("the names of the cluster's nodes are not known: a node down since the whole cluster restarted is shown by its peer ID", "err", err)
		names = map[string]string{}
	}
	return &peerNames{dir: dir, log: log, names: names}
}

// name returns the name of the peer with Raft ID id that the server
// shows as shown (knownPeerName), recording it when the server knows it
// and it is new.
func (p *peerNames) name(id, shown string) string {
	if p == nil {
		return shown
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if id != "" && !strings.HasPrefix(shown, unknownPeerPrefix) && p.names[id] != shown {
		p.names[id] = shown
		p.save()
	}
	return knownPeerName(p.names, id, shown)
}

// all returns a copy of the names by peer ID (nil when not kept).
func (p *peerNames) all() map[string]string {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.names)
}

// knownPeerName is the name of the peer with Raft ID id that the server
// shows as shown: shown itself when the server knows the peer, else its
// name in names, else the peer ID, which `nats server raft peer-remove`
// takes as well as a name.
func knownPeerName(names map[string]string, id, shown string) string {
	if id == "" || !strings.HasPrefix(shown, unknownPeerPrefix) {
		return shown
	}
	if name, ok := names[id]; ok {
		return name
	}
	return "peer ID " + id + " (name not known here)"
}

// save writes the names; p.mu is held.
func (p *peerNames) save() {
	err := store.WritePeerNames(p.dir, p.names)
	if err != nil && !p.failed {
		p.log.Warn("the names of the cluster's nodes are not recorded: after a restart of the whole cluster, a node that stays down is shown by its peer ID", "err", err)
	}
	p.failed = err != nil
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
		if p == nil {
			continue
		}
		name := w.names.name(p.Peer, p.Name)
		if seen[name] {
			continue // a peer known twice (a node restarted with a new ID) counts once
		}
		seen[name] = true
		down := p.Offline || !routed[name]
		ps := PeerStatus{Name: name, Current: p.Current && !down, Offline: down, Lag: p.Lag, Active: p.Active.Seconds()}
		if !leader {
			ps = PeerStatus{Name: name, Current: routed[name] && m.Leader != "", Offline: !routed[name]}
		}
		if last := w.observe(routed, name, now); ps.Offline {
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
