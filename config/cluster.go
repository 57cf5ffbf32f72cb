package config

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// ClusterConfig is the [cluster] table: this node's part in a JetStream
// cluster of holdfast nodes (NATS routes and Raft; nothing home-made).
type ClusterConfig struct {
	// Name is the cluster's name, the same on every node.
	Name string `toml:"name"`
	// Listen is host:port for routes from the other nodes.
	Listen string `toml:"listen"`
	// Routes are the nodes to connect to, as nats-route://host:port (this
	// node's own address may be among them: the server skips itself).
	Routes []string `toml:"routes"`
	// User and PasswordFile authenticate routes, required when Listen is
	// beyond loopback; the same on every node. The file holds the plain
	// password (a node presents it to the others).
	User         string `toml:"user"`
	PasswordFile string `toml:"password_file"`
	// TLS for routes: a certificate, its key and the CA that signed the
	// other nodes' certificates; Verify asks them for theirs.
	CertFile string `toml:"cert_file"`
	KeyFile  string `toml:"key_file"`
	CAFile   string `toml:"ca_file"`
	Verify   bool   `toml:"verify"`
	// Advertise is the host:port the other nodes should use to reach
	// this node's routes, when it is not Listen's (behind NAT, a proxy or a
	// load balancer). The nodes tell each other this address, and connect
	// to the nodes they learn of this way besides their Routes: without
	// it, they use the address they see and the port in Listen, which
	// goes around a proxy.
	Advertise string `toml:"advertise"`
	// NoAdvertise keeps this node from telling clients the other nodes'
	// client URLs (clients then reconnect only to the URLs they were
	// given). It does not change which nodes connect to each other: see
	// Advertise.
	NoAdvertise bool `toml:"no_advertise"`
}

// Enabled reports whether the config asks for a cluster.
func (c ClusterConfig) Enabled() bool {
	return c.Name != "" || c.Listen != "" || len(c.Routes) > 0
}

// TLSEnabled reports whether routes use TLS.
func (c ClusterConfig) TLSEnabled() bool {
	return c.CertFile != "" || c.KeyFile != "" || c.CAFile != ""
}

// ClusterReplicas is the replicas a stream gets in cluster mode when its
// table does not say.
const ClusterReplicas = 3

// ListenHostPort splits Listen.
func (c ClusterConfig) ListenHostPort() (string, int, error) { return splitHostPort(c.Listen) }

// splitHostPort splits a listen or advertise address, host:port with a
// port 1-65535.
func splitHostPort(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	if !validPort(p) {
		return "", 0, fmt.Errorf("port %q is not 1-65535", p)
	}
	port, _ := strconv.Atoi(p)
	return host, port, nil
}

// validPort reports whether p is a TCP port number, 1-65535.
func validPort(p string) bool {
	n, err := strconv.Atoi(p)
	return err == nil && n >= 1 && n <= 65535
}

// validateCluster checks [cluster] and what depends on it: server.name set
// in the file, replicas within what the cluster can hold.
func (c *Config) validateCluster(v *validator, fromFile bool) {
	cl := c.Cluster
	if c.clusterTable && !cl.Enabled() {
		v.add("cluster", "", "empty table: set name, listen and routes for a cluster of holdfast nodes, or remove it")
	}
	if !cl.Enabled() {
		for _, name := range c.StreamNames() {
			if r := c.Streams[name].Replicas; r != 1 {
				v.add("streams."+name+".replicas", strconv.Itoa(r), "must be 1 on a single node: replicas = 3 needs a [cluster] of three holdfast nodes")
			}
		}
		return
	}
	if cl.Name == "" {
		v.add("cluster.name", "", "required with [cluster]: the same name on every node, e.g. \"site-a\"")
	} else if strings.ContainsAny(cl.Name, " \t\n.*>") {
		v.add("cluster.name", q(cl.Name), "must contain no spaces, dots or wildcards")
	}
	if fromFile && !c.serverNameSet {
		v.add("server.name", q(c.Server.Name), "must be set in the file with [cluster], unique per node (the hostname default is only safe on one node)")
	}
	host := ""
	if cl.Listen == "" {
		v.add("cluster.listen", "", "required with [cluster]: host:port for the routes of the other nodes, e.g. \"0.0.0.0:6222\"")
	} else if h, port, err := cl.ListenHostPort(); err != nil {
		v.add("cluster.listen", q(cl.Listen), "must be host:port with a port 1-65535: %v", err)
	} else {
		host = h
		if port == c.Server.Port {
			v.add("cluster.listen", q(cl.Listen), "uses the client port server.port = %d: give routes their own port (6222 is usual)", port)
		}
	}
	if host != "" && !IsLoopback(host) && (cl.User == "" || cl.PasswordFile == "") {
		v.add("cluster.listen", q(cl.Listen), "routes on a non-loopback address need cluster.user and cluster.password_file (the same on every node): anyone who reaches the port could join the cluster and read every stream")
	}
	if cl.Advertise != "" {
		const want = "must be host:port, the address the other nodes reach this node's routes at, e.g. \"10.0.0.1:6222\""
		if h, _, err := splitHostPort(cl.Advertise); err != nil {
			v.add("cluster.advertise", q(cl.Advertise), want+": %v", err)
		} else if h == "" {
			v.add("cluster.advertise", q(cl.Advertise), want+": the host is missing")
		}
	}
	if (cl.User == "") != (cl.PasswordFile == "") {
		v.add("cluster.user", q(cl.User), "cluster.user and cluster.password_file go together")
	}
	if len(cl.Routes) == 0 {
		v.add("cluster.routes", "[]", "list the nodes of the cluster, e.g. [\"nats-route://10.0.0.1:6222\", \"nats-route://10.0.0.2:6222\", \"nats-route://10.0.0.3:6222\"]")
	}
	seen := map[string]bool{}
	for i, r := range cl.Routes {
		key := fmt.Sprintf("cluster.routes[%d]", i)
		u, err := url.Parse(r)
		switch {
		case err != nil:
			v.add(key, q(r), "not a URL: %v", err)
			continue
		case u.Scheme != "nats-route" && u.Scheme != "nats":
			v.add(key, q(r), "must start with nats-route:// (nats-route://host:6222)")
			continue
		case u.Port() == "" || u.Hostname() == "":
			v.add(key, q(r), "must name host and port (nats-route://host:6222)")
			continue
		case !validPort(u.Port()):
			v.add(key, q(r), "port %s is not 1-65535", u.Port())
			continue
		case u.User != nil:
			v.add(key, q(r), "must not hold credentials: set cluster.user and cluster.password_file")
			continue
		}
		hp := strings.ToLower(u.Host)
		if seen[hp] {
			v.add(key, q(r), "listed twice")
		}
		seen[hp] = true
	}
	if cl.TLSEnabled() && (cl.CertFile == "" || cl.KeyFile == "") {
		v.add("cluster.cert_file", q(cl.CertFile), "route TLS needs cluster.cert_file and cluster.key_file (and cluster.ca_file for the other nodes' certificates)")
	}
	// The most replicas the cluster can hold: this node and the others
	// the routes name (this node's own address may be among them).
	nodes := len(cl.Routes) + 1
	for _, name := range c.StreamNames() {
		r := c.Streams[name].Replicas
		switch {
		case r != 1 && r != 3:
			v.add("streams."+name+".replicas", strconv.Itoa(r), "must be 1 or 3")
		case r > nodes:
			v.add("streams."+name+".replicas", strconv.Itoa(r), "more than the %d node(s) cluster.routes names with this one: list every node in cluster.routes", nodes)
		}
	}
}

// DeadLetterReplicas is the replicas of the dead-letter streams: those of
// the most replicated stream they take dead letters from, so that a dead
// letter is as safe as the message it was.
func (c *Config) DeadLetterReplicas(deadLetter string) int {
	r := 1
	for _, name := range c.ConsumerNames() {
		cc := c.Consumers[name]
		if cc.DeadLetter == deadLetter {
			if s := c.Streams[cc.Stream]; s != nil {
				r = max(r, s.Replicas)
			}
		}
	}
	return r
}

// applyClusterDefaults gives streams whose table does not set replicas
// the cluster's default.
func (c *Config) applyClusterDefaults(replicasSet func(stream string) bool) {
	if !c.Cluster.Enabled() {
		return
	}
	for name, sc := range c.Streams {
		if !replicasSet(name) {
			sc.Replicas = ClusterReplicas
		}
	}
}
