package embedded

import (
	"context"
	"net"
	"net/url"
	"strconv"
	"time"
)

// ClusterNodes returns how many nodes cluster.routes names with this one:
// the routes that lead to another node, plus this node. A route may name
// this node itself (as docs/cluster.md's example does on every node) or not
// (each node listing only the others): nats-server ignores a route to
// itself, and counting it as another node, or not counting this node,
// would make a cluster of three look like one of two, so that any node
// down would read as a node replaced under another name. 0 outside a
// cluster.
func (s *Server) ClusterNodes() int {
	ns := s.NATS()
	if !s.cfg.Cluster.Enabled() || ns == nil {
		return 0
	}
	port := 0
	if a := ns.ClusterAddr(); a != nil {
		port = a.Port
	}
	var local []net.IP
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ip, _, err := net.ParseCIDR(a.String()); err == nil {
				local = append(local, ip)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return clusterNodes(s.cfg.Cluster.Routes, port, s.cfg.Cluster.Advertise, local, func(host string) []net.IP {
		ips, _ := net.DefaultResolver.LookupIP(ctx, "ip", host)
		return ips
	})
}

// clusterNodes counts this node and the routes that do not lead to it: a
// route leads to this node when it names the advertised host:port, or
// this node's route port on one of its local addresses (as nats-server
// tells). lookup resolves a host name.
func clusterNodes(routes []string, port int, advertise string, local []net.IP, lookup func(string) []net.IP) int {
	others := 0
	for _, r := range routes {
		u, err := url.Parse(r)
		if err != nil {
			others++
			continue
		}
		if advertise != "" && u.Host == advertise {
			continue
		}
		if p, err := strconv.Atoi(u.Port()); err != nil || p != port {
			others++
			continue
		}
		ips := []net.IP{net.ParseIP(u.Hostname())}
		if ips[0] == nil {
			ips = lookup(u.Hostname())
		}
		if !anyLocal(ips, local) {
			others++
		}
	}
	return others + 1
}

// anyLocal tells whether one of ips is among local.
func anyLocal(ips, local []net.IP) bool {
	for _, ip := range ips {
		for _, l := range local {
			if ip.Equal(l) {
				return true
			}
		}
	}
	return false
}
