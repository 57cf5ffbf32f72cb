package embedded

import (
	"net"
	"testing"
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
