package embedded

import (
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
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/config"
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
func LeafDenied(cfg *config.Config) []string {
	var out []string
	for _, name := range cfg.StreamNames() {
		out = append(out, cfg.Streams[name].Subjects...)
	}
	out = append(out, DeadLetterSubjectPrefix+">", "$JS.EVENT.>")
	slices.Sort(out)
	return slices.Compact(out)
}

// configureLeafNodes applies [leafnodes] authentication, TLS and remotes
// to opts; secrets come from LoadSecrets.
func configureLeafNodes(opts *server.Options, cfg *config.Config, sec *config.Secrets) error {
	l := cfg.LeafNodes
	if l.Hub() {
		if l.User != "" {
			opts.LeafNode.Username = l.User
			opts.LeafNode.Password = sec.LeafPassword
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
		u, err := url.Parse(r.URL)
		if err != nil {
			return fmt.Errorf("leafnodes.remotes[%d].url: %w", i, err)
		}
		secret := ""
		if i < len(sec.RemoteSecrets) {
			secret = sec.RemoteSecrets[i]
		}
		switch {
		case r.User != "":
			u.User = url.UserPassword(r.User, secret)
		case r.TokenFile != "":
			u.User = url.User(secret)
		}
		ro := &server.RemoteLeafOpts{
			URLs:        []*url.URL{u},
			Credentials: r.Credentials,
			DenyImports: slices.Clone(denied),
			DenyExports: slices.Clone(denied),
		}
		if r.TLSEnabled() {
			tc, err := linkTLS(fmt.Sprintf("leafnodes.remotes[%d]", i), r.CertFile, r.KeyFile, r.CAFile, false)
			if err != nil {
				return err
			}
			tc.ServerName = u.Hostname()
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
	// Remote is the remote's URL without credentials.
	Remote    string `json:"remote"`
	Connected bool   `json:"connected"`
	// Since is when the link last changed state (start-up for a link that
	// never came up).
	Since time.Time `json:"since"`
	// Connects counts the times the link came up since start.
	Connects uint64 `json:"connects"`
}

// leafLinks watches the configured remotes' connections and logs each
// change.
type leafLinks struct {
	mu    sync.Mutex
	links []LeafLink
	addrs [][]string // resolved host:port of each remote
	log   *slog.Logger

	cancel context.CancelFunc
	done   chan struct{}
}

// leafPollInterval is how often the links are checked.
const leafPollInterval = 250 * time.Millisecond

// startLeafWatch starts watching the remotes of cfg (none: nothing).
func (s *Server) startLeafWatch() {
	remotes := s.cfg.LeafNodes.Remotes
	if len(remotes) == 0 {
		return
	}
	now := time.Now()
	w := &leafLinks{log: s.log.With("component", "leafnodes"), done: make(chan struct{})}
	for _, r := range remotes {
		w.links = append(w.links, LeafLink{Remote: r.Redacted(), Since: now})
		w.addrs = append(w.addrs, nil)
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

// poll compares the server's solicited leafnode connections with the
// remotes and logs what changed.
func (w *leafLinks) poll(ctx context.Context, ns *server.Server, remotes []config.RemoteConfig) {
	lz, err := ns.Leafz(nil)
	if err != nil {
		return
	}
	var spokes []string
	for _, l := range lz.Leafs {
		if l.IsSpoke {
			spokes = append(spokes, net.JoinHostPort(l.IP, fmt.Sprint(l.Port)))
		}
	}
	for i, r := range remotes {
		up := false
		if len(remotes) == 1 {
			up = len(spokes) > 0
		} else {
			addrs := w.resolve(ctx, i, r)
			for _, sp := range spokes {
				up = up || slices.Contains(addrs, sp)
			}
		}
		w.mu.Lock()
		l := &w.links[i]
		changed := l.Connected != up
		if changed {
			l.Connected = up
			downFor := time.Since(l.Since).Round(time.Millisecond)
			l.Since = time.Now()
			if up {
				l.Connects++
				w.log.Info("leafnode connected", "remote", l.Remote, "was_down_for", downFor, "connects", l.Connects)
			} else {
				w.log.Warn("leafnode disconnected: local publishing goes on, forwarding waits for the link", "remote", l.Remote, "was_up_for", downFor)
			}
		}
		w.mu.Unlock()
	}
}

// resolve returns the host:port addresses remote i may be connected on.
func (w *leafLinks) resolve(ctx context.Context, i int, r config.RemoteConfig) []string {
	if w.addrs[i] != nil {
		return w.addrs[i]
	}
	u, err := url.Parse(r.URL)
	if err != nil {
		return nil
	}
	port := u.Port()
	out := []string{net.JoinHostPort(u.Hostname(), port)}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if ips, err := net.DefaultResolver.LookupHost(rctx, u.Hostname()); err == nil {
		for _, ip := range ips {
			out = append(out, net.JoinHostPort(ip, port))
		}
		w.addrs[i] = out
	}
	return out
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
		out = append(out, "remotes", strings.Join(rs, ","), "domain", cfg.JetStream.Domain, "denied_on_link", LeafDenied(cfg))
	}
	return out
}

// streamSources maps a stream's configured sources and mirror onto the
// server's.
func streamSources(sc *config.StreamConfig) ([]*jetstream.StreamSource, *jetstream.StreamSource) {
	conv := func(src config.SourceConfig) *jetstream.StreamSource {
		out := &jetstream.StreamSource{Name: src.Name, FilterSubject: src.FilterSubject, OptStartSeq: src.StartSeq}
		if p := config.SourceAPIPrefix(src.Domain); p != "" {
			out.External = &jetstream.ExternalStream{APIPrefix: p}
		}
		return out
	}
	var sources []*jetstream.StreamSource
	for _, src := range sc.Sources {
		sources = append(sources, conv(src))
	}
	var mirror *jetstream.StreamSource
	if sc.Mirror != nil {
		mirror = conv(*sc.Mirror)
	}
	return sources, mirror
}

// sourceKey is what identifies a source for the bootstrap's comparison.
func sourceKey(s *jetstream.StreamSource) string {
	if s == nil {
		return "none"
	}
	api := ""
	if s.External != nil {
		api = s.External.APIPrefix
	}
	return fmt.Sprintf("%s@%s filter=%q start=%d", s.Name, api, s.FilterSubject, s.OptStartSeq)
}

// diffSources applies the wanted sources to next (the server can change
// them) and refuses a changed mirror (it cannot).
func diffSources(next *jetstream.StreamConfig, want jetstream.StreamConfig, changes *[]Change) error {
	if h, w := sourceKey(next.Mirror), sourceKey(want.Mirror); h != w {
		return &DriftError{Kind: "stream", Name: want.Name, Field: "mirror", Have: h, Want: w,
			Fix: fmt.Sprintf("set streams.%s.mirror back, or back up the stream (nats stream backup), delete it and restart holdfast to recreate it", want.Name)}
	}
	keys := func(ss []*jetstream.StreamSource) []string {
		out := make([]string, 0, len(ss))
		for _, s := range ss {
			out = append(out, sourceKey(s))
		}
		slices.Sort(out)
		return out
	}
	if h, w := keys(next.Sources), keys(want.Sources); !slices.Equal(h, w) {
		record(changes, "sources", h, w)
		next.Sources = want.Sources
	}
	return nil
}
