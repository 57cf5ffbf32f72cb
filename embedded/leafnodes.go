package embedded

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/internal/subjects"
)

// leafListenOptions sets the hub's leafnode listener from [leafnodes].
func leafListenOptions(opts *server.Options, l config.LeafNodesConfig) {
	if !l.Hub() {
		return
	}
	host, port, _ := l.ListenHostPort() // Validate checked it
	opts.LeafNode.Host = host
	opts.LeafNode.Port = port
	opts.LeafNode.NoAdvertise = l.NoAdvertise
}

// LeafDenied are the subjects an edge keeps off its leafnode links, both
// ways: its own streams' subjects, the dead letters and the JetStream
// advisories (each side's workers act on their own only). Two edges with
// the same stream (ORDERS on orders.*) would otherwise each store the
// other's messages, and the hub would see every edge's local traffic.
//
// Also those subjects behind group commit's prefix, where a stream with
// group_commit stores them ($HOLDFAST.GC.<stream>.<subject>).
//
// Also its own JetStream API, $JS.<its domain>.API.>: through the link
// any client of the hub could otherwise read, purge and delete the
// edge's streams and consumers, messages not yet forwarded with them.
//
// Also the acks of its streams' consumers, $JS.ACK.<stream>.>: the
// server sends a consumer's acks to that subject, without the domain, and
// carries them over a leafnode link to every server whose consumer of a
// stream and consumer of the same names subscribes to it. Two edges with
// ORDERS and FORWARD would ack (nak, terminate) each other's messages of
// the same sequence, and a message acked that way while it waits for the
// hub is not forwarded after a restart.
func LeafDenied(cfg *config.Config) []string {
	var out []string
	for _, name := range cfg.StreamNames() {
		subjs := cfg.Streams[name].Subjects
		out = append(out, subjs...)
		// With group_commit the stream stores these instead (now or
		// after a reload switches it on).
		out = append(out, subjects.GroupCommitSubjects(name, subjs)...)
	}
	for _, name := range cfg.AllStreamNames() {
		out = append(out, "$JS.ACK."+name+".>")
	}
	out = append(out, subjects.DeadLetterPrefix+">", "$JS.EVENT.>")
	if d := cfg.JetStream.Domain; d != "" {
		out = append(out, "$JS."+d+".API.>")
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// leafConnectionType is the server's name for leafnode connections in a
// user's allowed connection types (jwt.ConnectionTypeLeafnode).
const leafConnectionType = "LEAFNODE"

// clientConnectionTypes are the server's names of the connections a
// client makes: the client port, WebSocket and MQTT
// (jwt.ConnectionTypeStandard, ...Websocket, ...Mqtt).
func clientConnectionTypes() map[string]struct{} {
	return map[string]struct{}{"STANDARD": {}, "WEBSOCKET": {}, "MQTT": {}}
}

// configureLeafNodes applies [leafnodes] authentication, TLS and remotes
// to opts; secrets come from LoadSecrets.
func configureLeafNodes(opts *server.Options, cfg *config.Config, sec *config.Secrets) error {
	l := cfg.LeafNodes
	if l.Hub() {
		if l.User != "" {
			// Not LeafNode.Username: the server gives the connections
			// it admits no permissions, so an edge (any holder of the
			// shared password, on any server) could publish JetStream
			// advisories and dead letters into the hub and answer on
			// $HOLDFAST.>, which every client is denied. The edges
			// are a user with the reserved subjects denied instead,
			// for leafnode connections only: checked by holdfast's
			// authenticator where one decides, else by the server
			// among the users.
			leaf := &server.User{Username: l.User, Password: sec.LeafPassword, Permissions: withReserved(nil, nil), // no queue groups: see clientQueues
				AllowedConnectionTypes: map[string]struct{}{leafConnectionType: {}}}
			switch a := opts.CustomClientAuthentication.(type) {
			case *localAuth:
				a.leaf = leaf
			case *tokenAuth:
				a.leaf = leaf
			default:
				// The users may connect as clients, not as leafnodes:
				// with LeafNode.Username the server took only the
				// edges' credentials on this listener.
				for _, u := range opts.Users {
					if u.Username != config.InternalUser {
						u.AllowedConnectionTypes = clientConnectionTypes()
					}
				}
				for _, n := range opts.Nkeys {
					n.AllowedConnectionTypes = clientConnectionTypes()
				}
				opts.Users = append(opts.Users, leaf)
			}
		}
		if l.TLSEnabled() {
			tc, err := linkTLS("leafnodes", l.CertFile, l.KeyFile, l.CAFile, l.Verify)
			if err != nil {
				return err
			}
			opts.LeafNode.TLSConfig = tc
			opts.LeafNode.TLSTimeout = tlsHandshakeTimeout
		}
	}
	denied := LeafDenied(cfg)
	for i, r := range l.Remotes {
		secret := ""
		if i < len(sec.RemoteSecrets) {
			secret = sec.RemoteSecrets[i]
		}
		var urls []*url.URL
		for k, raw := range r.HubURLs() {
			u, err := url.Parse(raw)
			if err != nil {
				return fmt.Errorf("%s: %w", r.URLKey(i, k), err)
			}
			switch {
			case r.User != "":
				u.User = url.UserPassword(r.User, secret)
			case r.TokenFile != "":
				u.User = url.User(secret)
			}
			urls = append(urls, u)
		}
		// With several URLs the server picks one at random at each
		// connect and goes on to the next when it fails.
		ro := &server.RemoteLeafOpts{
			URLs:        urls,
			Credentials: r.Credentials,
			DenyImports: slices.Clone(denied),
			DenyExports: slices.Clone(denied),
		}
		if r.TLSEnabled() {
			tc, err := linkTLS(fmt.Sprintf("leafnodes.remotes[%d]", i), r.CertFile, r.KeyFile, r.CAFile, false)
			if err != nil {
				return err
			}
			// No fixed server name: the server verifies each hub node
			// against the host of the URL it dials, one of several
			// (TestAssumeRemoteURLsTLSNamePerURL).
			ro.TLS = true
			ro.TLSConfig = tc
			ro.TLSTimeout = tlsHandshakeTimeout
		}
		opts.LeafNode.Remotes = append(opts.LeafNode.Remotes, ro)
	}
	return nil
}

// leafPermissions adds to the in-process identity's permissions what
// the forward handlers need — publishing to their destinations, and the
// JetStream API of other domains (the hub's stream info, through the
// leafnode; also the lag of sources in other domains) — and, on a hub,
// watching the edges' subjects.
func leafPermissions(p *server.Permissions, cfg *config.Config) {
	if p != nil && p.Subscribe != nil && cfg.LeafNodes.Hub() {
		p.Subscribe.Allow = append(p.Subscribe.Allow, cfg.LeafNodes.EdgeSubjects...)
	}
	var allow []string
	for _, name := range cfg.ConsumerNames() {
		if cc := cfg.Consumers[name]; cc.Handler == "forward" {
			allow = append(allow, config.ForwardPublishSubject(cc.Forward.Subject, cfg.Server.Name))
		}
	}
	remoteSources := false
	for _, sc := range cfg.Streams {
		remoteSources = remoteSources || (sc.Mirror != nil && sc.Mirror.Domain != "") ||
			slices.ContainsFunc(sc.Sources, func(src config.SourceConfig) bool { return src.Domain != "" })
	}
	if (len(allow) == 0 && !remoteSources) || p == nil || p.Publish == nil {
		return
	}
	p.Publish.Allow = append(p.Publish.Allow, "$JS.*.API.>")
	p.Publish.Allow = append(p.Publish.Allow, allow...)
}

// LeafLink is the state of one configured remote (a hub).
type LeafLink struct {
	// Remote names the remote: its URLs without credentials, joined by ","
	// (config.RemoteConfig.Redacted), whichever of them the link is on.
	Remote    string `json:"remote"`
	Connected bool   `json:"connected"`
	// Address is the hub's host:port the link is on ("" while down):
	// which of the remote's URLs, or an address the hub advertised.
	Address string `json:"address,omitempty"`
	// Since is when the link last changed state (start-up for a link that
	// never came up).
	Since time.Time `json:"since"`
	// Connects counts the times the link came up since start.
	Connects uint64 `json:"connects"`
	// Problem is why the hub keeps dropping the link, "" when it does not.
	Problem string `json:"problem,omitempty"`
}

// leafDuplicateFor is how long after the hub last dropped a link as a
// duplicate the remote still reports it: nats-server reconnects in about
// a second, and the two connections drop each other over and over.
const leafDuplicateFor = 30 * time.Second

// leafLinks watches the configured remotes' connections and logs each
// change.
//
// The server does not say which remote a leafnode connection belongs to,
// so each new connection (a connection id in Leafz) is given to a remote
// once and keeps it until it closes: to the remote without a link one of
// whose URLs' hosts resolves (now) to the address connected to; failing that
// (the hub advertised another of its nodes, and the server went there) to
// the remote without a link whose earlier links reached the same
// JetStream domain (read from the subscriptions the hub sent over the
// link, $JS.<domain>.API.*); failing that to the one remote without a
// link that was ever connected. Two remotes that resolve to the same
// address are refused at start (checkRemoteAddresses), so an address
// names one remote.
type leafLinks struct {
	mu         sync.Mutex
	links      []LeafLink
	owner      map[uint64]int             // live connection id -> remote index (-1: none)
	linkDom    map[uint64]map[string]bool // live connection id -> JetStream domains behind it
	domRead    time.Time                  // when the live links' domains were last read
	domWanted  bool                       // a domain was asked for that no live link showed
	domains    []map[string]bool          // by remote: the domains its links reached
	urls       [][]*url.URL               // by remote: its URLs
	addrs      map[string][]string        // by URL host:port: the addresses it resolved to last
	resolvedAt []time.Time                // by remote: when it was last resolved while down
	tlsNoCert  []bool                     // by remote: TLS without a client certificate
	seen       [][]string                 // by remote: the addresses its links were on
	nsLog      *serverLogger              // the hub dropping a link as a duplicate
	serverName string
	log        *slog.Logger

	cancel context.CancelFunc
	done   chan struct{}
}

// leafPollInterval is how often the links are checked.
const leafPollInterval = 250 * time.Millisecond

// The domains behind the links are read again every leafDomainsRefresh
// (edges joining and leaving the hub change them), and at most every
// leafDomainsWanted while a domain is asked for that no live link shows.
const (
	leafDomainsRefresh = 30 * time.Second
	leafDomainsWanted  = time.Second
)

// leafReadErrorsInARow is how many read errors in a row, right after the
// link is made, name a hub that wants a client certificate.
const leafReadErrorsInARow = 3

// leafResolveEvery is how often the addresses of a remote whose link is
// down are looked up again.
const leafResolveEvery = 10 * time.Second

// startLeafWatch starts watching the remotes of cfg (none: nothing).
func (s *Server) startLeafWatch() {
	remotes := s.cfg.LeafNodes.Remotes
	if len(remotes) == 0 {
		return
	}
	now := time.Now()
	w := &leafLinks{log: s.base.With("component", "leafnodes"), done: make(chan struct{}), addrs: map[string][]string{},
		owner: map[uint64]int{}, linkDom: map[uint64]map[string]bool{}, nsLog: s.nsLog, serverName: s.cfg.Server.Name}
	for _, r := range remotes {
		w.links = append(w.links, LeafLink{Remote: r.Redacted(), Since: now})
		w.urls = append(w.urls, remoteURLs(r))
		w.domains = append(w.domains, map[string]bool{})
		w.seen = append(w.seen, nil)
		w.resolvedAt = append(w.resolvedAt, time.Time{})
		w.tlsNoCert = append(w.tlsNoCert, r.TLSEnabled() && r.CertFile == "")
	}
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	s.leaf = w
	ns := s.ns
	go func() {
		defer close(w.done)
		t := time.NewTicker(leafPollInterval)
		defer t.Stop()
		for {
			w.poll(ctx, ns, remotes)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
}

// stop ends the watch; safe on nil.
func (w *leafLinks) stop() {
	if w == nil {
		return
	}
	w.cancel()
	<-w.done
}

// poll gives the server's new solicited leafnode connections to their
// remotes, and logs what changed.
func (w *leafLinks) poll(ctx context.Context, ns *server.Server, remotes []config.RemoteConfig) {
	lz, err := ns.Leafz(nil)
	if err != nil {
		return
	}
	live := map[uint64]*server.LeafInfo{}
	for _, l := range lz.Leafs {
		if l.IsSpoke {
			live[l.ID] = l
		}
	}
	w.mu.Lock()
	for id := range w.owner {
		if live[id] == nil {
			delete(w.owner, id)
			delete(w.linkDom, id)
		}
	}
	// The domains behind a link come with the hub's subscriptions, which
	// may arrive after the link shows in Leafz, and in no set order: the
	// API of another edge behind the hub ($JS.edge01.API.>) may come
	// before the hub's own. Read them again while a link shows none, while
	// a domain is asked for that none shows, and now and then.
	unread := false
	for id := range live {
		if len(w.linkDom[id]) == 0 {
			unread = true
		}
	}
	since := time.Since(w.domRead)
	reread := len(live) > 0 && (unread || since >= leafDomainsRefresh || w.domWanted && since >= leafDomainsWanted)
	w.mu.Unlock()
	if reread {
		if lz, err := ns.Leafz(&server.LeafzOptions{Subscriptions: true}); err == nil {
			w.mu.Lock()
			for _, l := range lz.Leafs {
				if live[l.ID] != nil {
					w.linkDom[l.ID] = linkDomains(l.Subs)
				}
			}
			w.domRead, w.domWanted = time.Now(), false
			w.mu.Unlock()
		}
	}
	// New links, and links no remote took yet (their hub's domains may
	// have arrived since): matched again each poll, names looked up only
	// for a new one.
	var fresh []*server.LeafInfo
	isNew := map[uint64]bool{}
	w.mu.Lock()
	for id, l := range live {
		if i, ok := w.owner[id]; !ok || i < 0 {
			fresh = append(fresh, l)
			isNew[id] = !ok
		}
	}
	w.mu.Unlock()
	slices.SortFunc(fresh, func(a, b *server.LeafInfo) int { return cmp.Compare(a.ID, b.ID) })
	for _, l := range fresh {
		addr := net.JoinHostPort(l.IP, fmt.Sprint(l.Port))
		i := w.match(ctx, addr, l.ID, remotes, isNew[l.ID])
		w.mu.Lock()
		w.owner[l.ID] = i
		if i >= 0 && !slices.Contains(w.seen[i], addr) {
			w.seen[i] = append(w.seen[i], addr)
		}
		w.mu.Unlock()
		if i < 0 && isNew[l.ID] {
			w.log.Warn("a leafnode connection matches no configured remote (yet): it is not counted as any remote's link", "address", addr, "server", l.Name)
		}
	}
	// A remote whose link is down may never have had one: its URLs'
	// addresses, looked up now and then, name it in the server's log
	// (credentials refused, a failed TLS handshake) for noteDuplicate.
	for i := range remotes {
		w.mu.Lock()
		due := !w.links[i].Connected && time.Since(w.resolvedAt[i]) >= leafResolveEvery
		if due {
			w.resolvedAt[i] = time.Now()
		}
		w.mu.Unlock()
		if due {
			w.resolve(ctx, i, true)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	up := make([]bool, len(remotes))
	on := make([]string, len(remotes))
	onID := make([]uint64, len(remotes))
	for id, i := range w.owner {
		if i >= 0 {
			up[i] = true
			if l := live[id]; l != nil && id >= onID[i] { // the newest link, while an old one closes
				on[i], onID[i] = net.JoinHostPort(l.IP, fmt.Sprint(l.Port)), id
			}
			for d := range w.linkDom[id] {
				w.domains[i][d] = true
			}
		}
	}
	for i := range remotes {
		l := &w.links[i]
		w.noteDuplicate(i, l)
		l.Address = on[i]
		if l.Connected == up[i] {
			continue
		}
		l.Connected = up[i]
		downFor := time.Since(l.Since).Round(time.Millisecond)
		l.Since = time.Now()
		if up[i] {
			l.Connects++
			w.log.Info("leafnode connected", "remote", l.Remote, "address", l.Address, "was_down_for", downFor, "connects", l.Connects)
		} else {
			w.log.Warn("leafnode disconnected: local publishing goes on, forwarding waits for the link", "remote", l.Remote, "was_up_for", downFor)
		}
	}
}

// noteDuplicate sets remote i's Problem while its hub drops its links as
// duplicates, and logs each change; w.mu is held.
func (w *leafLinks) noteDuplicate(i int, l *LeafLink) {
	var last, lastPayload, lastAuth, lastTLS, lastRead time.Time
	var tlsDetail string
	reads := 0
	for _, a := range slices.Concat(w.seen[i], w.cachedAddrs(i)) {
		if t, _, n := w.nsLog.leafErrorCount(a, leafReadError); t.After(lastRead) {
			lastRead, reads = t, n
		}
		if t, d := w.nsLog.LeafError(a, leafTLSFailure); t.After(lastTLS) {
			lastTLS, tlsDetail = t, d
		}
		if t := w.nsLog.LeafErrorAt(a, leafDuplicate); t.After(last) {
			last = t
		}
		if t := w.nsLog.LeafErrorAt(a, leafPayloadViolation); t.After(lastPayload) {
			lastPayload = t
		}
		if t := w.nsLog.LeafErrorAt(a, leafAuthViolation); t.After(lastAuth) {
			lastAuth = t
		}
	}
	p := ""
	switch {
	case !last.IsZero() && time.Since(last) < leafDuplicateFor:
		p = fmt.Sprintf("the hub drops this link as a duplicate (last %s ago): another edge connects to it with server.name %q (server.name must be unique per edge), or another remote of this node reaches the same hub",
			time.Since(last).Round(time.Second), w.serverName)
	case !lastPayload.IsZero() && time.Since(lastPayload) < leafDuplicateFor:
		// A forwarded message the hub's streams did not limit: sent
		// again at each reconnect, it holds up everything behind it.
		p = fmt.Sprintf("the hub closes this link for a message larger than its max_payload (Maximum Payload Violation, last %s ago), again after each reconnect, and nothing behind that message is forwarded: give the hub a server.max_payload at least this edge's, or its stream a max_msg_size (a holdfast hub sets one) so that the edge dead-letters such a message",
			time.Since(lastPayload).Round(time.Second))
	case !lastAuth.IsZero() && time.Since(lastAuth) < leafDuplicateFor && !l.Connected:
		// Credentials refused do not heal by waiting: say so now, not
		// after unreachable_after.
		p = fmt.Sprintf("the hub refuses this edge's leafnode credentials (Authorization Violation, last %s ago): check the remote's user and password_file, token_file or credentials against the hub's leafnodes.user / password_file (or [auth])",
			time.Since(lastAuth).Round(time.Second))
	case !lastTLS.IsZero() && time.Since(lastTLS) < leafDuplicateFor && !l.Connected:
		// Like refused credentials, a TLS mismatch does not heal by
		// waiting.
		p = fmt.Sprintf("the TLS handshake with the hub fails (%s, last %s ago): the remote's ca_file must be the CA that signed the hub's leafnodes.cert_file for the URL's host; "+
			"a remote with ca_file, cert_file or a tls:// URL needs a hub with leafnodes.cert_file, and a hub with leafnodes.verify needs the remote's cert_file and key_file",
			tlsDetail, time.Since(lastTLS).Round(time.Second))
	case reads >= leafReadErrorsInARow && time.Since(lastRead) < leafDuplicateFor && !l.Connected && w.tlsNoCert[i]:
		// The hub closes each TLS link as soon as it is made, and this
		// remote sends no client certificate: what a hub with
		// leafnodes.verify does over TLS 1.3 (the edge sees only a read
		// error).
		p = fmt.Sprintf("the hub closes this TLS link as soon as it is made (Read Error, %d times in a row, last %s ago): a hub with leafnodes.verify wants a client certificate: give this remote cert_file and key_file signed by the hub's leafnodes.ca_file",
			reads, time.Since(lastRead).Round(time.Second))
	}
	if (p == "") != (l.Problem == "") {
		if p != "" {
			w.log.Error("leafnode link keeps being dropped: "+p, "remote", l.Remote)
		} else {
			w.log.Info("leafnode link no longer dropped by the hub", "remote", l.Remote)
		}
	}
	l.Problem = p
}

// match returns the remote a new connection (to addr, id) belongs to, or
// -1: see leafLinks.
func (w *leafLinks) match(ctx context.Context, addr string, id uint64, remotes []config.RemoteConfig, lookup bool) int {
	if len(remotes) == 1 {
		return 0
	}
	w.mu.Lock()
	free := make([]bool, len(remotes))
	for i := range free {
		free[i] = true
	}
	for _, i := range w.owner {
		if i >= 0 {
			free[i] = false
		}
	}
	w.mu.Unlock()
	var byAddr []int
	for i := range remotes {
		if free[i] && slices.Contains(w.resolve(ctx, i, lookup), addr) {
			byAddr = append(byAddr, i)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	byDomain := func(among []int) int {
		for _, i := range among {
			for d := range w.linkDom[id] {
				if w.domains[i][d] {
					return i
				}
			}
		}
		return -1
	}
	switch len(byAddr) {
	case 0:
	case 1:
		return byAddr[0]
	default:
		// TLS remotes behind one address (a proxy that routes by server
		// name): the domains their links reached before tell them apart.
		if i := byDomain(byAddr); i >= 0 {
			return i
		}
		return byAddr[0]
	}
	var freeIdx []int
	for i := range remotes {
		if free[i] {
			freeIdx = append(freeIdx, i)
		}
	}
	if i := byDomain(freeIdx); i >= 0 {
		return i
	}
	found := -1
	for i := range remotes {
		if free[i] && w.links[i].Connects > 0 {
			if found >= 0 {
				return -1
			}
			found = i
		}
	}
	return found
}

// linkDomains returns the JetStream domains whose API a hub's
// subscriptions over a link show ($JS.<domain>.API.*).
func linkDomains(subs []string) map[string]bool {
	out := map[string]bool{}
	for _, s := range subs {
		rest, ok := strings.CutPrefix(s, "$JS.")
		if !ok {
			continue
		}
		if d, _, ok := strings.Cut(rest, ".API."); ok && d != "" && !strings.Contains(d, ".") {
			out[d] = true
		}
	}
	return out
}

// resolve returns the host:port addresses remote i may be connected on,
// through any of its URLs, each looked up again when lookup is set (a new
// connection to match): a name may resolve to another address than at
// start. The last good lookup of a URL serves otherwise, and when one
// fails.
func (w *leafLinks) resolve(ctx context.Context, i int, lookup bool) []string {
	var out []string
	for _, u := range w.urls[i] {
		out = append(out, w.resolveURL(ctx, u, lookup)...)
	}
	return out
}

// resolveURL is resolve for one URL.
func (w *leafLinks) resolveURL(ctx context.Context, u *url.URL, lookup bool) []string {
	hostPort := net.JoinHostPort(u.Hostname(), u.Port())
	if !lookup {
		w.mu.Lock()
		cached := w.addrs[hostPort]
		w.mu.Unlock()
		if cached != nil {
			return append([]string{hostPort}, cached...)
		}
	}
	out, err := resolveHostPort(ctx, u)
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		return append(out, w.addrs[hostPort]...)
	}
	w.addrs[hostPort] = out
	return out
}

// cachedAddrs returns the addresses the URLs of remote i resolved to
// last; w.mu is held.
func (w *leafLinks) cachedAddrs(i int) []string {
	var out []string
	for _, u := range w.urls[i] {
		out = append(out, w.addrs[net.JoinHostPort(u.Hostname(), u.Port())]...)
	}
	return out
}

// remoteURLs returns the remote's URLs, parsed (Validate checked them).
func remoteURLs(r config.RemoteConfig) []*url.URL {
	var out []*url.URL
	for _, s := range r.HubURLs() {
		if u, err := url.Parse(s); err == nil {
			out = append(out, u)
		}
	}
	return out
}

// resolveHostPort returns the URL's host:port and, for a name, each
// address it resolves to.
func resolveHostPort(ctx context.Context, u *url.URL) ([]string, error) {
	port := u.Port()
	out := []string{net.JoinHostPort(u.Hostname(), port)}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	ips, err := net.DefaultResolver.LookupHost(rctx, u.Hostname())
	for _, ip := range ips {
		out = append(out, net.JoinHostPort(ip, port))
	}
	return out, err
}

// checkRemoteAddresses refuses two remotes that reach the same address
// through any of their URLs: holdfast binds every remote to the same
// local account, and a hub server takes one link from an edge per account
// (it drops the other as a duplicate, and both links then flap), while an
// address could no longer tell the remotes' links apart. Two TLS remotes
// with different host names may share an address (a proxy that routes by
// server name). A name that does not resolve now is compared as written.
// The URLs of one remote may share an address: that remote keeps one
// link whichever URL it is on.
func checkRemoteAddresses(ctx context.Context, remotes []config.RemoteConfig) error {
	if len(remotes) < 2 {
		return nil
	}
	type firstURL struct {
		remote   int
		key, url string
		host     string
	}
	first := map[string]firstURL{}
	for i, r := range remotes {
		for k, raw := range r.HubURLs() {
			u, err := url.Parse(raw)
			if err != nil {
				continue // Validate refused it
			}
			addrs, _ := resolveHostPort(ctx, u)
			for _, a := range addrs {
				f, ok := first[a]
				if !ok {
					first[a] = firstURL{remote: i, key: r.URLKey(i, k), url: raw, host: u.Hostname()}
					continue
				}
				if f.remote != i && !sniApart(r, remotes[f.remote], u.Hostname(), f.host) {
					return fmt.Errorf("%s %q reaches %s like %s %q: "+
						"a hub server takes one link per edge (the second is dropped as a duplicate and both flap); remove one of them, "+
						"or list every address of one hub in the urls of one remote",
						r.URLKey(i, k), config.RedactURL(raw), a, f.key, config.RedactURL(f.url))
				}
			}
		}
	}
	return nil
}

// sniApart reports whether two remotes use TLS and reach an address
// through URLs of different host names, which a proxy at that address can
// route to different hubs.
func sniApart(a, b config.RemoteConfig, hostA, hostB string) bool {
	return a.TLSEnabled() && b.TLSEnabled() && !strings.EqualFold(hostA, hostB)
}

// LeafLinks returns the state of each configured remote, in config order;
// nil when the node has none.
func (s *Server) LeafLinks() []LeafLink {
	w := s.leaf
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.links)
}

// LeafReaches reports whether a leafnode link is up to a hub that serves
// the JetStream domain (the hub's subscriptions over the link show its
// API): what a forward to that domain needs, whichever remote the link
// belongs to; a link to another hub does not count.
func (s *Server) LeafReaches(domain string) bool {
	w := s.leaf
	if w == nil {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, ds := range w.linkDom {
		if ds[domain] {
			return true
		}
	}
	// The hub's subscriptions may have come after they were read: the
	// watch reads them again.
	w.domWanted = len(w.linkDom) > 0
	return false
}

// LeafDomains returns the JetStream domains the hubs behind the leafnode
// links that are up serve, sorted.
func (s *Server) LeafDomains() []string {
	w := s.leaf
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, ds := range w.linkDom {
		for d := range ds {
			out = append(out, d)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// LeafEdges returns the server names of the leafnode connections this
// node accepted (edges linked to it as a hub), sorted.
func (s *Server) LeafEdges() []string {
	if s.ns == nil {
		return nil
	}
	lz, err := s.ns.Leafz(nil)
	if err != nil {
		return nil
	}
	var out []string
	for _, l := range lz.Leafs {
		if !l.IsSpoke && l.Name != "" {
			out = append(out, l.Name)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// LeafConnected reports whether at least one remote is connected.
func (s *Server) LeafConnected() bool {
	for _, l := range s.LeafLinks() {
		if l.Connected {
			return true
		}
	}
	return false
}

// leafSummary is for the start-up log line.
func leafSummary(cfg *config.Config) []any {
	l := cfg.LeafNodes
	var out []any
	if l.Hub() {
		out = append(out, "leafnode_listen", l.Listen, "leafnode_auth", l.User != "" || cfg.Auth.Enabled(), "leafnode_tls", l.TLSEnabled())
	}
	if l.Edge() {
		var rs []string
		for _, r := range l.Remotes {
			rs = append(rs, r.Redacted())
		}
		// A remote with several URLs is named by them joined by ",".
		out = append(out, "remotes", strings.Join(rs, " "), "domain", cfg.JetStream.Domain, "denied_on_link", LeafDenied(cfg))
	}
	return out
}
