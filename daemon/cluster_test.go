package daemon

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

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
	peers := clusterPeers(leader)
	// Every route up and every peer current, as the cluster settles.
	natstest.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		if current, size, ok := peers(); !ok || current != 3 || size != 3 {
			return fmt.Errorf("before: %d of %d current (ok %v), want 3 of 3", current, size, ok)
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
		if current, size, _ := peers(); current != 1 || size != 3 {
			return fmt.Errorf("the leader sees %d of %d nodes current, want 1 of 3", current, size)
		}
		return nil
	})
	for _, p := range clusterView(leader).Peers {
		if p.Current {
			t.Errorf("peer %s is current on the leader although it is down", p.Name)
		}
	}
}
