package daemon

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/internal/configtest"
	"github.com/holdfast-io/holdfast/internal/natstest"
)

// The meta leader of a three-node cluster whose two peers die sees one
// node of three at once: its Raft still called both peers current for
// about 10 s after they were killed (their routes already down), so
// /healthz answered "ok" on a node that took no publish.
func TestClusterPeersOnTheLeaderWhosePeersDied(t *testing.T) {
	servers := natstest.RunCluster(t, 3)
	var leader *server.Server
	for _, s := range servers {
		if s.JetStreamIsLeader() {
			leader = s
		}
	}
	if leader == nil {
		t.Fatal("no meta leader")
	}
	w := &peerWatch{}
	peers := w.clusterPeers(leader)
	// Every route up and every peer current, as the cluster settles.
	natstest.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		if p, ok := peers(); !ok || p.Current != 3 || p.Size != 3 {
			return fmt.Errorf("before: %d of %d current (ok %v), want 3 of 3", p.Current, p.Size, ok)
		}
		return nil
	})
	for _, s := range servers {
		if s != leader {
			s.Shutdown()
			s.WaitForShutdown()
		}
	}
	natstest.CheckFor(t, 3*time.Second, 50*time.Millisecond, func() error {
		if p, _ := peers(); p.Current != 1 || p.Size != 3 || len(p.Down) != 2 {
			return fmt.Errorf("the leader sees %d of %d nodes current, %d down, want 1 of 3, 2 down", p.Current, p.Size, len(p.Down))
		}
		return nil
	})
	for _, p := range w.clusterView(leader).Peers {
		if p.Current {
			t.Errorf("peer %s is current on the leader although it is down", p.Name)
		}
	}
}

// TestClusterPeerKilledIsDownEverywhere: a follower killed is down, with
// when it was last seen, on the meta leader and on the other follower at
// once: the leader's meta group marks it offline only much later, and the
// leader showed it "lagging (0 behind)" meanwhile.
func TestClusterPeerKilledIsDownEverywhere(t *testing.T) {
	servers := natstest.RunCluster(t, 3)
	var leader *server.Server
	var followers []*server.Server
	for _, s := range servers {
		if s.JetStreamIsLeader() {
			leader = s
		} else {
			followers = append(followers, s)
		}
	}
	if leader == nil || len(followers) != 2 {
		t.Fatal("no meta leader")
	}
	watches := map[*server.Server]*peerWatch{leader: {}, followers[1]: {}}
	for s, w := range watches {
		natstest.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
			if p, _ := w.clusterPeers(s)(); p.Current != 3 {
				return fmt.Errorf("%s sees %d of 3 current before", s.Name(), p.Current)
			}
			return nil
		})
	}
	killed := followers[0]
	killed.Shutdown()
	killed.WaitForShutdown()
	for s, w := range watches {
		natstest.CheckFor(t, 5*time.Second, 50*time.Millisecond, func() error {
			p, _ := w.clusterPeers(s)()
			if p.Current != 2 || len(p.Down) != 1 || p.Down[0].Name != killed.Name() || p.Down[0].Since.IsZero() {
				return fmt.Errorf("%s: %d of %d current, down %+v; want 2 current and %s down with a last-seen time", s.Name(), p.Current, p.Size, p.Down, killed.Name())
			}
			for _, ps := range w.clusterView(s).Peers {
				if ps.Name == killed.Name() && (!ps.Offline || ps.Current) {
					return fmt.Errorf("%s shows %s as %+v, want offline", s.Name(), ps.Name, ps)
				}
			}
			return nil
		})
	}
}

// TestStatusUnreadableStreamIsNotMissing: a stream whose only replica's
// node just died exists, but its info request is not answered. status
// must say that it could not be read (unknown), not that it is missing,
// and go on to read the streams and consumers that do answer.
func TestStatusUnreadableStreamIsNotMissing(t *testing.T) {
	t.Parallel()
	node := 0
	servers := natstest.RunCluster(t, 3, func(o *server.Options) {
		node++
		o.Tags = append(o.Tags, fmt.Sprintf("node%d", node))
	})
	// ORDERS and WORKER1 on a follower that dies; ORDERS_DLQ on the meta
	// leader, which stays (no meta election while status reads).
	var leader, doomed, client *server.Server
	for _, s := range servers {
		switch {
		case s.JetStreamIsLeader():
			leader = s
		case doomed == nil:
			doomed = s
		default:
			client = s
		}
	}
	js := natstest.JetStream(t, natstest.Connect(t, client))
	natstest.CreateStream(t, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.*"},
		Placement: &jetstream.Placement{Tags: []string{doomed.Name()}}})
	natstest.CreateStream(t, js, jetstream.StreamConfig{Name: "ORDERS_DLQ", Subjects: []string{"dlq.WORKER1.>"},
		Placement: &jetstream.Placement{Tags: []string{leader.Name()}}})
	natstest.CreateOrUpdateConsumer(t, js, "ORDERS", jetstream.ConsumerConfig{Durable: "WORKER1", AckPolicy: jetstream.AckExplicitPolicy})
	doomed.Shutdown()
	doomed.WaitForShutdown()

	cfg := configtest.Default(t)
	cfg.Cluster = config.ClusterConfig{Name: "natstest"}
	nc := natstest.Connect(t, client)
	out := CollectStatus(natstest.Context(t), cfg, nc, natstest.JetStream(t, nc))
	byName := statusByName(t, out)
	for _, name := range []string{"ORDERS", "WORKER1"} {
		s := byName[name]
		if s["exists"] != false || s["unknown"] != true {
			t.Errorf("%s: exists %v, unknown %v (error %v); want false, true (it exists, but did not answer)", name, s["exists"], s["unknown"], s["error"])
		}
		if text, _ := s["error"].(string); !strings.Contains(text, "no answer within 5s") && !strings.Contains(text, "offline") {
			t.Errorf("%s: error %q, want it to say that it did not answer", name, text)
		}
	}
	if s := byName["ORDERS_DLQ"]; s["exists"] != true {
		t.Errorf("ORDERS_DLQ, which answers: exists %v, error %v; want it read", s["exists"], s["error"])
	}
}

// A peer the server knows only by its Raft ID is named as this node saw
// it before, also after a restart (the names are in the store dir), and
// by its ID when this node never saw it.
func TestPeerNamesRemembered(t *testing.T) {
	dir := t.TempDir()
	log, _ := natstest.Logger(t)
	names := openPeerNames(dir, log)
	if got := names.name("BXScrY9i", "n3"); got != "n3" {
		t.Fatalf("a named peer: %q", got)
	}
	unknown := func(id string) string { return "Server name unknown at this time (peerID: " + id + ")" }
	reopened := openPeerNames(dir, log)
	if got := reopened.name("BXScrY9i", unknown("BXScrY9i")); got != "n3" {
		t.Errorf("after a restart: %q, want n3", got)
	}
	if got, want := reopened.name("44jzkV9D", unknown("44jzkV9D")), "peer ID 44jzkV9D (name not known here)"; got != want {
		t.Errorf("a peer never seen: %q, want %q", got, want)
	}
	var nilNames *peerNames
	if got := nilNames.name("BXScrY9i", unknown("BXScrY9i")); got != unknown("BXScrY9i") {
		t.Errorf("without names kept: %q", got)
	}
}
