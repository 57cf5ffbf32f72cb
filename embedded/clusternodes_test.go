package embedded

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/internal/configtest"
	"github.com/holdfast-io/holdfast/internal/natstest"
)

// TestClusterNodes: a route to this node's own route port on one of its
// addresses (or to its advertised address) is this node, whether
// cluster.routes names it or not.
func TestClusterNodes(t *testing.T) {
	local := []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.0.0.1"), net.ParseIP("::1")}
	lookup := func(host string) []net.IP {
		switch host {
		case "node1.example":
			return []net.IP{net.ParseIP("10.0.0.1")}
		case "node2.example":
			return []net.IP{net.ParseIP("10.0.0.2")}
		}
		return nil
	}
	three := []string{"nats-route://10.0.0.1:6222", "nats-route://10.0.0.2:6222", "nats-route://10.0.0.3:6222"}
	for _, tc := range []struct {
		name      string
		routes    []string
		port      int
		advertise string
		want      int
	}{
		{"every node, this one included", three, 6222, "", 3},
		{"the others only", three[1:], 6222, "", 3},
		{"one other", three[1:2], 6222, "", 2},
		{"on one host, this one included", []string{"nats-route://127.0.0.1:6222", "nats-route://127.0.0.1:6223", "nats-route://127.0.0.1:6224"}, 6223, "", 3},
		{"on one host, the others only", []string{"nats-route://127.0.0.1:6222", "nats-route://127.0.0.1:6224"}, 6223, "", 3},
		{"host names", []string{"nats-route://node1.example:6222", "nats-route://node2.example:6222", "nats-route://unknown.example:6222"}, 6222, "", 3},
		{"advertised through a proxy", []string{"nats-route://203.0.113.1:7001", "nats-route://203.0.113.1:7002", "nats-route://203.0.113.1:7003"}, 6222, "203.0.113.1:7002", 3},
		{"IPv6", []string{"nats-route://[::1]:6222", "nats-route://[::1]:6223"}, 6222, "", 2},
	} {
		if got := clusterNodes(tc.routes, tc.port, tc.advertise, local, lookup); got != tc.want {
			t.Errorf("%s: clusterNodes(%q, %d, %q) = %d, want %d", tc.name, tc.routes, tc.port, tc.advertise, got, tc.want)
		}
	}
}

// TestClusterNewNeedsEveryNode: two of the three nodes of a new cluster
// get no meta leader (nats-server elects the first one only with every
// node's vote), and the error at the end of their wait said only "(4
// route(s) connected)". It names the node each one reaches and that a new
// cluster needs every node.
func TestClusterNewNeedsEveryNode(t *testing.T) {
	t.Parallel()
	ports := []int{natstest.FreePort(t), natstest.FreePort(t), natstest.FreePort(t)}
	var routes []string
	for _, p := range ports {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", p))
	}
	errs := make(chan error, 2)
	for i, p := range ports[:2] {
		cfg := configtest.Default(t)
		cfg.Server.Name = fmt.Sprintf("node%d", i+1)
		cfg.Cluster = config.ClusterConfig{Name: "new", Listen: fmt.Sprintf("127.0.0.1:%d", p), Routes: routes}
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		log, _ := natstest.Logger(t)
		s := New(cfg, log)
		s.ReadyTimeout = 8 * time.Second
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			errs <- s.Open(ctx)
		}()
	}
	// The node that gives up first names the other, connected; the other
	// may give up after the first one stopped, and then names none.
	named := 0
	for range 2 {
		err := <-errs
		if err == nil {
			t.Fatal("two of three nodes of a new cluster got a meta leader")
		}
		for _, want := range []string{"the JetStream cluster new has no meta leader after 8s (",
			"no meta leader yet: a new cluster elects its first meta leader only once all 3 of its nodes are up: start every node"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("Open: %v\nwant %q", err, want)
			}
		}
		if strings.Contains(err.Error(), "(1 of the 2 other node(s) connected (node") {
			named++
		}
	}
	if named == 0 {
		t.Error("neither node named the other as connected (\"1 of the 2 other node(s) connected (node...)\")")
	}
}
