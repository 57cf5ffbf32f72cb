package config

import (
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// LeafNodesConfig is the [leafnodes] table: the hub side (Listen, for
// edges to connect to) and the edge side (Remotes, the hubs this node
// connects to). One node may be both.
type LeafNodesConfig struct {
	// Listen is host:port for leafnode connections from edges (hub side).
	Listen string `toml:"listen"`
	// User and PasswordFile are what edges must present (hub side);
	// required beyond loopback unless [auth] is configured (the server
	// then authenticates edges like clients). The file holds the plain
	// password or its bcrypt hash.
	User         string `toml:"user"`
	PasswordFile string `toml:"password_file"`
	// TLS for the listener: certificate, key, and the CA of the edges'
	// certificates when Verify asks for them.
	CertFile string `toml:"cert_file"`
	KeyFile  string `toml:"key_file"`
	CAFile   string `toml:"ca_file"`
	Verify   bool   `toml:"verify"`
	// NoAdvertise (hub side) keeps the hub from telling edges its other
	// leafnode addresses (those of its cluster's nodes), so that edges
	// connect only to the remotes' urls (behind NAT, or through a proxy).
	NoAdvertise bool `toml:"no_advertise"`
	// EdgeSubjects (hub side) are the subjects whose messages' origin
	// headers the hub tracks per edge (holdfast_edge_last_*).
	EdgeSubjects []string `toml:"edge_subjects"`

	// Remotes are the hubs this node connects to (edge side).
	Remotes []RemoteConfig `toml:"remotes"`
	// UnreachableAfter is how long a remote may be disconnected before
	// /healthz reports the edge degraded. With a forward.subject template
	// without {server} or {subject} (the hub's position cannot be read),
	// forwarding is free of duplicates through outages up to this long:
	// forwarding waits for a hub whose stream's duplicate window is
	// shorter.
	UnreachableAfter Duration `toml:"unreachable_after"`
}

// RemoteConfig is one [[leafnodes.remotes]] entry: a hub to connect to.
// At most one way to authenticate: User with PasswordFile, TokenFile, or
// Credentials (a NATS .creds file, for operator-mode hubs).
type RemoteConfig struct {
	// URL is the hub's leafnode address. URLs lists several instead (the
	// nodes of a hub cluster): the server picks one at random and tries
	// the others in turn, and the remote keeps one link whichever URL it
	// is on. Exactly one of the two is set.
	URL          string   `toml:"url"`
	URLs         []string `toml:"urls"`
	User         string   `toml:"user"`
	PasswordFile string   `toml:"password_file"`
	TokenFile    string   `toml:"token_file"`
	Credentials  string   `toml:"credentials"`
	// TLS: the CA that signed the hub's certificate, and this edge's own
	// certificate when the hub asks for one. tls:// URLs, or nats-leaf
	// URLs with CAFile set, use TLS.
	CAFile   string `toml:"ca_file"`
	CertFile string `toml:"cert_file"`
	KeyFile  string `toml:"key_file"`
}

// ForwardConfig is a consumer's [consumers.NAME.forward] table: where the
// forward handler sends the consumer's messages.
type ForwardConfig struct {
	// Subject is the destination: {server} is server.name, {subject} the
	// original subject (only as the last token).
	Subject string `toml:"subject"`
	// Domain is the hub's JetStream domain, reached over the leafnode.
	Domain string `toml:"domain"`
	// Timeout bounds one publish to the hub, waiting for its PubAck.
	Timeout Duration `toml:"timeout"`
}

// Defaults of [leafnodes] and [consumers.NAME.forward].
const (
	DefaultUnreachableAfter = 5 * time.Minute
	DefaultForwardSubject   = "edge.{server}.{subject}"
	DefaultForwardDomain    = "hub"
	DefaultForwardTimeout   = 10 * time.Second
)

// DefaultEdgeSubjects are the subjects a hub tracks edges on by default:
// where DefaultForwardSubject sends.
var DefaultEdgeSubjects = []string{"edge.>"}

// ForwardHeadroom is how much more than server.max_payload a hub's stream
// on leafnodes.edge_subjects takes: room for the origin headers an edge's
// forward handler adds (about 250 bytes, plus twice the edge's server
// name and stream name, plus the message's subject), so that a message of
// the largest size an edge with the same max_payload stores still reaches
// the hub. The server itself accepts 8KiB more than max_payload, so the
// dead letter of such a message on the hub fits too.
const ForwardHeadroom = 4 << 10

// StreamMaxMsgSize is the max_msg_size of the configured stream name:
// server.max_payload, plus ForwardHeadroom on a hub for a stream that
// takes a part of leafnodes.edge_subjects (the edges' forwarded messages).
func (c *Config) StreamMaxMsgSize(name string) int64 {
	size := c.Server.MaxPayload.Bytes
	if c.TakesEdgeMessages(name) {
		return size + ForwardHeadroom
	}
	return size
}

// TakesEdgeMessages reports whether the configured stream name is, on a
// hub, one that takes a part of leafnodes.edge_subjects: the edges'
// forwarded messages. Such a stream takes their atomic batches too.
func (c *Config) TakesEdgeMessages(name string) bool {
	sc := c.Streams[name]
	if sc == nil || !c.LeafNodes.Hub() {
		return false
	}
	for _, s := range sc.Subjects {
		for _, e := range c.LeafNodes.EdgeSubjects {
			if server.SubjectsCollide(s, e) {
				return true
			}
		}
	}
	return false
}

// Hub reports whether this node accepts leafnode connections.
func (l LeafNodesConfig) Hub() bool { return l.Listen != "" }

// Edge reports whether this node connects to hubs.
func (l LeafNodesConfig) Edge() bool { return len(l.Remotes) > 0 }

// TLSEnabled reports whether the leafnode listener uses TLS.
func (l LeafNodesConfig) TLSEnabled() bool {
	return l.CertFile != "" || l.KeyFile != "" || l.CAFile != ""
}

// TLSEnabled reports whether the connection to the remote uses TLS.
// Validate requires one scheme across the remote's URLs.
func (r RemoteConfig) TLSEnabled() bool {
	return r.CAFile != "" || r.CertFile != "" ||
		slices.ContainsFunc(r.HubURLs(), func(s string) bool { return strings.HasPrefix(s, "tls://") })
}

// HubURLs returns the remote's URLs as written: urls, or url alone.
func (r RemoteConfig) HubURLs() []string {
	if len(r.URLs) > 0 || r.URL == "" {
		return r.URLs
	}
	return []string{r.URL}
}

// URLKey is the key path of the k-th of HubURLs of the remote at index i:
// leafnodes.remotes[i].url, or leafnodes.remotes[i].urls[k].
func (r RemoteConfig) URLKey(i, k int) string {
	if len(r.URLs) > 0 || r.URL == "" {
		return fmt.Sprintf("leafnodes.remotes[%d].urls[%d]", i, k)
	}
	return fmt.Sprintf("leafnodes.remotes[%d].url", i)
}

// Redacted names the remote in logs, in its link state (`holdfast
// status`) and in the remote label of its metrics: its URLs without
// credentials, joined by "," in the order written (one URL: that URL).
// It is the same whichever of the URLs the link is on.
func (r RemoteConfig) Redacted() string {
	var out []string
	for _, s := range r.HubURLs() {
		out = append(out, RedactURL(s))
	}
	return strings.Join(out, ",")
}

// redactedList shows URLs as a TOML array, without credentials.
func redactedList(urls []string) string {
	out := make([]string, len(urls))
	for i, s := range urls {
		out[i] = q(RedactURL(s))
	}
	return "[" + strings.Join(out, ", ") + "]"
}

// RedactURL returns the URL s without credentials (s itself when it does
// not parse).
func RedactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return s
	}
	u.User = nil
	return u.String()
}

// ListenHostPort splits Listen.
func (l LeafNodesConfig) ListenHostPort() (string, int, error) {
	return splitHostPort(l.Listen)
}

// ForwardPublishSubject is the subject pattern a forward template
// publishes on: the template with {server} filled in and {subject} as ">".
func ForwardPublishSubject(template, serverName string) string {
	s := strings.ReplaceAll(template, "{server}", serverName)
	return strings.ReplaceAll(s, "{subject}", ">")
}

// applyLeafNodeDefaults gives an edge its JetStream domain (server.name)
// when the file does not set one.
func (c *Config) applyLeafNodeDefaults() {
	if c.LeafNodes.Edge() && c.JetStream.Domain == "" {
		c.JetStream.Domain = c.Server.Name
	}
}

// validateLeafNodes checks [leafnodes], the domain it needs and every
// forward handler.
func (c *Config) validateLeafNodes(v *validator, fromFile bool) {
	l := c.LeafNodes
	if c.leafNodesTable && !l.Hub() && !l.Edge() {
		v.add("leafnodes", "", "empty table: set listen (a hub) or [[leafnodes.remotes]] (an edge), or remove it")
	}
	if (l.Hub() || l.Edge()) && fromFile && !c.serverNameSet {
		v.add("server.name", q(c.Server.Name), "must be set in the file with [leafnodes], unique per node: it names the edge on the hub and in every forwarded message's id")
	}
	if v.duration("leafnodes.unreachable_after", l.UnreachableAfter) && l.UnreachableAfter.Duration < time.Second {
		v.add("leafnodes.unreachable_after", l.UnreachableAfter.String(), "must be at least 1s")
	}
	if l.Hub() {
		if host, port, err := l.ListenHostPort(); err != nil {
			v.add("leafnodes.listen", q(l.Listen), "must be host:port with a port 1-65535: %v", err)
		} else {
			if port == c.Server.Port {
				v.add("leafnodes.listen", q(l.Listen), "uses the client port server.port = %d: give leafnodes their own port (7422 is usual)", port)
			}
			if cl := c.Cluster; cl.Enabled() {
				if _, cp, err := cl.ListenHostPort(); err == nil && cp == port {
					v.add("leafnodes.listen", q(l.Listen), "uses the route port of cluster.listen")
				}
			}
			if !IsLoopback(host) && l.User == "" && !c.Auth.Enabled() {
				v.add("leafnodes.listen", q(l.Listen), "leafnodes on a non-loopback address need leafnodes.user and leafnodes.password_file (or an [auth] table): anyone who reaches the port could read and write every subject")
			}
		}
		if l.TLSEnabled() && (l.CertFile == "" || l.KeyFile == "") {
			v.add("leafnodes.cert_file", q(l.CertFile), "leafnode TLS needs leafnodes.cert_file and leafnodes.key_file")
		}
		if l.Verify && l.CAFile == "" {
			v.add("leafnodes.verify", "true", "needs leafnodes.ca_file: the CA that signs the edges' certificates")
		}
		for i, s := range l.EdgeSubjects {
			if !server.IsValidSubject(s) {
				v.add(fmt.Sprintf("leafnodes.edge_subjects[%d]", i), q(s), "not a valid NATS subject")
			}
		}
	} else if l.User != "" || l.PasswordFile != "" || l.TLSEnabled() || l.Verify || l.NoAdvertise {
		v.add("leafnodes.listen", `""`, "user, password_file, no_advertise and TLS settings of [leafnodes] are for the hub's listener: set listen, or move them into a [[leafnodes.remotes]] entry")
	}
	if (l.User == "") != (l.PasswordFile == "") {
		v.add("leafnodes.user", q(l.User), "leafnodes.user and leafnodes.password_file go together")
	}
	if _, taken := c.Auth.Users[l.User]; l.User != "" && (taken || l.User == InternalUser) {
		v.add("leafnodes.user", q(l.User), "is also the name of a client user: give the edges a name of their own")
	}
	c.validateRemotes(v)
	if l.Edge() && c.JetStream.Domain == "" {
		v.add("jetstream.domain", `""`, "required with [[leafnodes.remotes]]: the edge's own JetStream domain keeps its streams local and apart from the hub's (it defaults to server.name)")
	}
	for _, name := range c.ConsumerNames() {
		if cc := c.Consumers[name]; cc.Handler == "forward" {
			c.validateForward(v, name, cc)
		}
	}
	c.validateSources(v)
}

// validateRemotes checks the [[leafnodes.remotes]] entries.
func (c *Config) validateRemotes(v *validator) {
	seen := map[string]string{} // a URL's host:port, lower case -> the key path that gave it first
	for i, r := range c.LeafNodes.Remotes {
		key := fmt.Sprintf("leafnodes.remotes[%d]", i)
		switch {
		case r.URL != "" && r.URLs != nil:
			v.add(key+".urls", redactedList(r.URLs), "set url or urls, not both: the hub's one address in url, or every address of it (the nodes of a hub cluster) in urls")
		case r.URL == "" && r.URLs != nil && len(r.URLs) == 0:
			v.add(key+".urls", "[]", "empty: list the hub's leafnode addresses, e.g. [\"nats-leaf://hub-1:7422\", \"nats-leaf://hub-2:7422\"], or give one in url")
		case r.URL == "" && r.URLs == nil:
			v.add(key+".url", `""`, "required: the hub's leafnode address, e.g. \"nats-leaf://hub.example:7422\" (or urls = [...] with the addresses of several hub nodes)")
		default:
			c.validateRemoteURLs(v, i, r, seen)
		}
		n := 0
		for _, set := range []bool{r.User != "" || r.PasswordFile != "", r.TokenFile != "", r.Credentials != ""} {
			if set {
				n++
			}
		}
		if n > 1 {
			v.add(key, "", "use one way to authenticate: user and password_file, token_file, or credentials")
		}
		if (r.User == "") != (r.PasswordFile == "") {
			v.add(key+".user", q(r.User), "user and password_file go together")
		}
		if (r.CertFile == "") != (r.KeyFile == "") {
			v.add(key+".cert_file", q(r.CertFile), "a client certificate needs cert_file and key_file")
		}
	}
}

// validateRemoteURLs checks the URLs of the remote at index i; seen holds
// the host:port of every URL checked before, across all remotes.
func (c *Config) validateRemoteURLs(v *validator, i int, r RemoteConfig, seen map[string]string) {
	l := c.LeafNodes
	var scheme, schemeKey string
	for k, raw := range r.HubURLs() {
		key := r.URLKey(i, k)
		u, err := url.Parse(raw)
		switch {
		case raw == "":
			v.add(key, `""`, "empty: give the hub's leafnode address, e.g. \"nats-leaf://hub.example:7422\"")
		case err != nil:
			v.add(key, q(raw), "not a URL: %v", err)
		case u.Scheme != "nats-leaf" && u.Scheme != "nats" && u.Scheme != "tls":
			v.add(key, q(raw), "must start with nats-leaf:// (or tls:// for TLS)")
		case u.Hostname() == "" || u.Port() == "":
			v.add(key, q(raw), "must name host and port (nats-leaf://hub.example:7422)")
		case !validPort(u.Port()):
			v.add(key, q(raw), "port %s is not 1-65535", u.Port())
		case u.User != nil:
			v.add(key, q(RedactURL(raw)), "must not hold credentials: use user and password_file, token_file or credentials")
		case l.Hub() && pointsAtListener(u, l.Listen):
			v.add(key, q(raw), "is this node's own leafnode listener (leafnodes.listen = %s): a remote is the hub's address; give the hub's host, or remove the remote", q(l.Listen))
		case scheme != "" && u.Scheme != scheme:
			v.add(key, q(raw), "uses %s:// but %s uses %s://: the URLs of one remote share its TLS settings; write them all with one scheme (tls:// for TLS)", u.Scheme, schemeKey, scheme)
		default:
			if scheme == "" {
				scheme, schemeKey = u.Scheme, key
			}
			hostPort := strings.ToLower(u.Host)
			if first, ok := seen[hostPort]; ok {
				v.add(key, q(raw), "listed twice (also %s): give each hub address once", first)
			} else {
				seen[hostPort] = key
			}
		}
	}
}

// pointsAtListener reports whether the remote URL u reaches listen, a
// leafnode listener of this node: the same port on the same host, or on
// a loopback or local address when listen is on every address.
func pointsAtListener(u *url.URL, listen string) bool {
	lhost, lport, err := net.SplitHostPort(listen)
	if err != nil || lport != u.Port() {
		return false
	}
	rhost := strings.ToLower(u.Hostname())
	if strings.EqualFold(rhost, lhost) || IsLoopback(rhost) && IsLoopback(lhost) {
		return true
	}
	if lhost != "" && lhost != "0.0.0.0" && lhost != "::" {
		return false
	}
	if IsLoopback(rhost) {
		return true
	}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.Equal(net.ParseIP(rhost)) {
			return true
		}
	}
	return false
}

// validateForward checks a consumer's forward handler settings.
func (c *Config) validateForward(v *validator, name string, cc *ConsumerConfig) {
	key := "consumers." + name + ".forward"
	f := cc.Forward
	if !c.LeafNodes.Edge() {
		v.add(key, "", "handler = \"forward\" sends to a hub over a leafnode: add a [[leafnodes.remotes]] entry with the hub's url")
	}
	if f.Domain == "" || !validName(f.Domain) {
		v.add(key+".domain", q(f.Domain), "must be the hub's JetStream domain (no spaces, '.', '*', '>')")
	} else if f.Domain == c.JetStream.Domain {
		v.add(key+".domain", q(f.Domain), "is this node's own jetstream.domain: the hub must have another domain, or the messages would stay here")
	}
	if v.duration(key+".timeout", f.Timeout) && f.Timeout.Duration < MinHandlerTimeout {
		v.add(key+".timeout", f.Timeout.String(), "must be at least %s", MinHandlerTimeout)
	}
	tmpl := f.Subject
	if i := strings.Index(tmpl, "{subject}"); i >= 0 && i != len(tmpl)-len("{subject}") {
		v.add(key+".subject", q(tmpl), "{subject} (the original subject, one or more tokens) may only be the last token, e.g. \"edge.{server}.{subject}\"")
		return
	}
	rest := strings.NewReplacer("{server}", "", "{subject}", "").Replace(tmpl)
	if strings.ContainsAny(rest, "{}") {
		v.add(key+".subject", q(tmpl), "unknown placeholder: only {server} and {subject} are known")
		return
	}
	pattern := ForwardPublishSubject(tmpl, c.Server.Name)
	literal := strings.TrimSuffix(strings.TrimSuffix(pattern, ">"), ".")
	switch {
	case tmpl == "" || !server.IsValidSubject(pattern) || (literal != "" && !server.IsValidLiteralSubject(literal)):
		v.add(key+".subject", q(tmpl), "not a valid subject template: tokens without wildcards, e.g. \"edge.{server}.{subject}\"")
		return
	case strings.HasPrefix(pattern, "$") || strings.HasPrefix(pattern, "dlq.") || replySubject(pattern) != "":
		v.add(key+".subject", q(tmpl), "reserved: pick a destination of your own such as \"edge.{server}.{subject}\"")
		return
	}
	for _, sname := range c.StreamNames() {
		for _, s := range c.Streams[sname].Subjects {
			if server.SubjectsCollide(s, pattern) {
				v.add(key+".subject", q(tmpl), "overlaps %q of this node's stream %s: the forwarded messages would be stored here again and forwarded again (a loop); pick a destination no local stream captures", s, sname)
				return
			}
		}
	}
	if !validSubjectToken(c.Server.Name) {
		v.add("server.name", q(c.Server.Name), "is used in the forward subject and must contain no '.', '*' or '>'")
	}
}

// validSubjectToken reports whether name can be one subject token.
func validSubjectToken(name string) bool {
	return name != "" && !strings.ContainsAny(name, ".*> \t")
}

// forwardDefaults are the [consumers.NAME.forward] defaults.
func forwardDefaults() ForwardConfig {
	return ForwardConfig{Subject: DefaultForwardSubject, Domain: DefaultForwardDomain, Timeout: Dur(DefaultForwardTimeout)}
}

// loadLeafSecrets reads the leafnode password and the remotes' secrets,
// and checks that the certificate, CA and credentials files exist.
func (c *Config) loadLeafSecrets(v *validator, sec *Secrets) {
	l := c.LeafNodes
	if l.PasswordFile != "" {
		sec.LeafPassword = readPassword(v, "leafnodes.password_file", l.PasswordFile)
	}
	if l.KeyFile != "" {
		checkSecretFile(v, "leafnodes.key_file", l.KeyFile, false)
	}
	checkExists(v, "leafnodes.cert_file", l.CertFile)
	checkExists(v, "leafnodes.ca_file", l.CAFile)
	checkTLSFiles(v, "leafnodes.", l.CertFile, l.KeyFile, l.CAFile)
	sec.RemoteSecrets = make([]string, len(l.Remotes))
	for i, r := range l.Remotes {
		key := fmt.Sprintf("leafnodes.remotes[%d]", i)
		if r.PasswordFile != "" {
			sec.RemoteSecrets[i] = readPassword(v, key+".password_file", r.PasswordFile)
		}
		if r.TokenFile != "" {
			sec.RemoteSecrets[i] = readPassword(v, key+".token_file", r.TokenFile)
		}
		if r.Credentials != "" {
			checkSecretFile(v, key+".credentials", r.Credentials, true)
		}
		if r.KeyFile != "" {
			checkSecretFile(v, key+".key_file", r.KeyFile, false)
		}
		checkExists(v, key+".cert_file", r.CertFile)
		checkExists(v, key+".ca_file", r.CAFile)
		checkTLSFiles(v, key+".", r.CertFile, r.KeyFile, r.CAFile)
	}
}

// SourceConfig is one entry of a stream's sources, or its mirror: another
// stream whose messages the server copies into this one, across a
// leafnode when Domain names the other side's JetStream domain.
type SourceConfig struct {
	Name          string `toml:"name"`
	Domain        string `toml:"domain"`
	FilterSubject string `toml:"filter_subject"`
	// StartSeq is the source's first sequence to copy; 0 copies all.
	StartSeq uint64 `toml:"start_seq"`
}

// validateSources checks each stream's sources and mirror.
func (c *Config) validateSources(v *validator) {
	for _, name := range c.StreamNames() {
		sc := c.Streams[name]
		key := "streams." + name
		if sc.Mirror != nil {
			if len(sc.Subjects) > 0 {
				v.add(key+".subjects", fmt.Sprint(sc.Subjects), "a mirror has no subjects of its own: remove subjects, or use sources instead of mirror")
			}
			if len(sc.Sources) > 0 {
				v.add(key+".mirror", "", "a stream has either a mirror or sources, not both")
			}
			c.validateSource(v, key+".mirror", name, *sc.Mirror)
		}
		seen := map[string]bool{}
		for i, src := range sc.Sources {
			k := fmt.Sprintf("%s.sources[%d]", key, i)
			c.validateSource(v, k, name, src)
			id := src.Domain + "/" + src.Name + "/" + src.FilterSubject
			if seen[id] {
				v.add(k, q(src.Name), "listed twice")
			}
			seen[id] = true
		}
	}
}

func (c *Config) validateSource(v *validator, key, stream string, src SourceConfig) {
	if !validName(src.Name) {
		v.add(key+".name", q(src.Name), "must name the stream to copy from (no spaces, '.', '*', '>')")
	} else if src.Name == stream && (src.Domain == "" || src.Domain == c.JetStream.Domain) {
		v.add(key+".name", q(src.Name), "is this stream itself")
	}
	if src.Domain != "" && !validName(src.Domain) {
		v.add(key+".domain", q(src.Domain), "must be a JetStream domain name (no spaces, '.', '*', '>')")
	}
	if src.FilterSubject != "" && !server.IsValidSubject(src.FilterSubject) {
		v.add(key+".filter_subject", q(src.FilterSubject), "not a valid NATS subject")
	}
}

// SourceAPIPrefix is the JetStream API prefix of a source in domain ("":
// none, the local JetStream).
func SourceAPIPrefix(domain string) string {
	if domain == "" {
		return ""
	}
	return "$JS." + domain + ".API"
}
