package embedded

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/embedded/bootstrap"
	"github.com/holdfast-io/holdfast/internal/configtest"
	"github.com/holdfast-io/holdfast/internal/natstest"
	"github.com/holdfast-io/holdfast/internal/subjects"
	"github.com/holdfast-io/holdfast/internal/testcert"
)

// leafHubConfig is a hub with domain "hub", a leafnode listener on a free
// port and the stream EDGE on edge.>; user/password protect the listener
// when user is set.
func leafHubConfig(t *testing.T, user, passwordFile string) *config.Config {
	t.Helper()
	cfg := configtest.Default(t)
	cfg.Server.Name = "hub"
	cfg.JetStream.Domain = "hub"
	cfg.LeafNodes.Listen = fmt.Sprintf("127.0.0.1:%d", natstest.FreePort(t))
	cfg.LeafNodes.User, cfg.LeafNodes.PasswordFile = user, passwordFile
	cfg.Streams = map[string]*config.StreamConfig{"EDGE": config.DefaultStream([]string{"edge.>"})}
	cfg.Consumers = map[string]*config.ConsumerConfig{}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// leafEdgeConfig is an edge named name with ORDERS on orders.* and one
// remote, the hub's listener.
func leafEdgeConfig(t *testing.T, name string, hub *config.Config, remote config.RemoteConfig) *config.Config {
	t.Helper()
	cfg := configtest.Default(t)
	cfg.Server.Name = name
	cfg.JetStream.Domain = name
	remote.URL = "nats-leaf://" + hub.LeafNodes.Listen
	cfg.LeafNodes.Remotes = []config.RemoteConfig{remote}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func waitFor(t *testing.T, what string, f func() bool) {
	t.Helper()
	// The server's sources and mirrors, and leafnode links, start on
	// their own timers: a loaded CI run took more than 10 s once.
	deadline := time.Now().Add(30 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestLeafNodesEdgeToHub: two edges connect to a hub; a JetStream
// publish on an edge to edge.<name>.> is stored by the hub's stream with
// the hub's PubAck; each edge's own ORDERS keeps its messages to itself
// (the other edge's ORDERS, on the same subjects, does not store them);
// the link state follows the hub going away, and is logged.
func TestLeafNodesEdgeToHub(t *testing.T) {
	ctx := context.Background()
	hubCfg := leafHubConfig(t, "", "")
	hub := runServer(t, hubCfg)
	if err := bootstrap.Apply(ctx, hub.JetStream(), hubCfg, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	var edges []*Server
	var logs []*natstest.Buffer
	for _, name := range []string{"edge1", "edge2"} {
		cfg := leafEdgeConfig(t, name, hubCfg, config.RemoteConfig{})
		log, lb := natstest.Logger(t)
		e := runServerWithLog(t, cfg, log)
		if err := bootstrap.Apply(ctx, e.JetStream(), cfg, slog.New(slog.DiscardHandler)); err != nil {
			t.Fatal(err)
		}
		edges = append(edges, e)
		logs = append(logs, lb)
	}
	for _, e := range edges {
		waitFor(t, "the leafnode link", e.LeafConnected)
	}
	if got := len(hub.LeafLinks()); got != 0 {
		t.Errorf("hub reports %d remotes, want none", got)
	}

	hubJS, err := jetstream.NewWithDomain(edges[0].Conn(), "hub")
	if err != nil {
		t.Fatal(err)
	}
	var ack *jetstream.PubAck
	waitFor(t, "the hub's stream to answer through the leafnode", func() bool {
		ack, err = hubJS.Publish(ctx, "edge.edge1.orders.created", []byte("up"), jetstream.WithMsgID("edge1:ORDERS:1:1"))
		return err == nil
	})
	if ack.Domain != "hub" || ack.Stream != "EDGE" {
		t.Fatalf("PubAck from %s/%s, want hub/EDGE", ack.Domain, ack.Stream)
	}
	// The same id again: stored once.
	if ack, err = hubJS.Publish(ctx, "edge.edge1.orders.created", []byte("up"), jetstream.WithMsgID("edge1:ORDERS:1:1")); err != nil || !ack.Duplicate {
		t.Fatalf("second publish: %+v %v, want a duplicate", ack, err)
	}

	// Local traffic stays local.
	for i, e := range edges {
		if _, err := e.JetStream().Publish(ctx, "orders.created", []byte(fmt.Sprintf("local %d", i))); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(200 * time.Millisecond)
	for i, e := range edges {
		s, err := e.JetStream().Stream(ctx, "ORDERS")
		if err != nil {
			t.Fatal(err)
		}
		if n := s.CachedInfo().State.Msgs; n != 1 {
			t.Errorf("edge%d ORDERS holds %d messages, want its own 1", i+1, n)
		}
	}
	s, err := hub.JetStream().Stream(ctx, "EDGE")
	if err != nil {
		t.Fatal(err)
	}
	if n := s.CachedInfo().State.Msgs; n != 1 {
		t.Errorf("hub EDGE holds %d messages, want 1", n)
	}

	if err := hub.Close(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the link to go down", func() bool { return !edges[0].LeafConnected() })
	links := edges[0].LeafLinks()
	if len(links) != 1 || links[0].Connected || links[0].Connects != 1 || links[0].Remote != "nats-leaf://"+hubCfg.LeafNodes.Listen {
		t.Errorf("links = %+v", links)
	}
	for _, want := range []string{"leafnode connected", "leafnode disconnected"} {
		if !strings.Contains(logs[0].String(), want) {
			t.Errorf("edge log lacks %q", want)
		}
	}
	for line := range strings.Lines(logs[0].String()) {
		if strings.Contains(line, "leafnode") && strings.Count(line, "component=") != 1 {
			t.Errorf("want one component in each leafnode log line: %s", line)
		}
	}
}

// TestLeafNodesAuth: a hub with leafnodes.user refuses an edge with the
// wrong password and accepts the right one.
func TestLeafNodesAuth(t *testing.T) {
	dir := t.TempDir()
	pw := filepath.Join(dir, "leaf.password")
	bad := filepath.Join(dir, "bad.password")
	for f, s := range map[string]string{pw: "right-password", bad: "wrong-password"} {
		if err := os.WriteFile(f, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	hubCfg := leafHubConfig(t, "leaf", pw)
	runServer(t, hubCfg)
	wrong := runServer(t, leafEdgeConfig(t, "edge1", hubCfg, config.RemoteConfig{User: "leaf", PasswordFile: bad}))
	right := runServer(t, leafEdgeConfig(t, "edge2", hubCfg, config.RemoteConfig{User: "leaf", PasswordFile: pw}))
	waitFor(t, "the edge with the right password to connect", right.LeafConnected)
	time.Sleep(time.Second)
	if wrong.LeafConnected() {
		t.Fatal("an edge with the wrong password is connected")
	}
}

// TestLeafNodesTLS: a hub with a TLS listener that verifies the edges'
// certificates takes an edge that trusts its CA (ca_file) and presents a
// certificate, and neither one that trusts another CA nor one without a
// certificate.
func TestLeafNodesTLS(t *testing.T) {
	certs, err := testcert.Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	hubCfg := leafHubConfig(t, "", "")
	hubCfg.LeafNodes.CertFile, hubCfg.LeafNodes.KeyFile = certs.ServerCert, certs.ServerKey
	hubCfg.LeafNodes.CAFile, hubCfg.LeafNodes.Verify = certs.CA, true
	runServer(t, hubCfg)
	right := runServer(t, leafEdgeConfig(t, "edge1", hubCfg, config.RemoteConfig{CAFile: certs.CA, CertFile: certs.ClientCert, KeyFile: certs.ClientKey}))
	otherCA := runServer(t, leafEdgeConfig(t, "edge2", hubCfg, config.RemoteConfig{CAFile: certs.OtherCA, CertFile: certs.ClientCert, KeyFile: certs.ClientKey}))
	noCert := runServer(t, leafEdgeConfig(t, "edge3", hubCfg, config.RemoteConfig{CAFile: certs.CA}))
	waitFor(t, "the edge with the CA and a certificate to connect", right.LeafConnected)
	time.Sleep(time.Second)
	if otherCA.LeafConnected() {
		t.Error("an edge trusting another CA is connected")
	}
	if noCert.LeafConnected() {
		t.Error("an edge without a client certificate is connected")
	}
}

// TestLeafDenied: an edge keeps its streams' subjects, the acks of their
// consumers, its JetStream API and the dead letters off the link.
func TestLeafDenied(t *testing.T) {
	cfg := configtest.Default(t)
	cfg.Streams["MORE"] = config.DefaultStream([]string{"more.>", "orders.*"})
	got := strings.Join(LeafDenied(cfg), " ")
	if got != "$HOLDFAST.GC.MORE.more.> $HOLDFAST.GC.MORE.orders.* $HOLDFAST.GC.ORDERS.orders.* $JS.ACK.MORE.> $JS.ACK.ORDERS.> $JS.ACK.ORDERS_DLQ.> $JS.EVENT.> dlq.> more.> orders.*" {
		t.Errorf("denied = %q", got)
	}
	cfg.JetStream.Domain = "edge1"
	if got := LeafDenied(cfg); !slices.Contains(got, "$JS.edge1.API.>") {
		t.Errorf("denied = %q, without the edge's JetStream API", got)
	}
}

// TestLeafEdgeAPIOffTheLink: a client of the hub cannot reach the edge's
// JetStream API through the link (found 2026-12-04: nats --js-domain edge1
// stream rm ORDERS, run on the hub, deleted the edge's messages not yet
// forwarded), while the edge still reaches the hub's.
func TestLeafEdgeAPIOffTheLink(t *testing.T) {
	hubCfg := leafHubConfig(t, "", "")
	hub := runServer(t, hubCfg)
	edge := runServer(t, leafEdgeConfig(t, "edge1", hubCfg, config.RemoteConfig{}))
	waitFor(t, "the link to reach the hub", func() bool { return edge.LeafReaches("hub") })
	ctx := natstest.Context(t)
	if _, err := edge.JetStream().CreateStream(ctx, jetstream.StreamConfig{Name: "LOCAL", Subjects: []string{"local.>"}}); err != nil {
		t.Fatal(err)
	}
	hubJS, err := jetstream.NewWithDomain(edge.Conn(), "hub")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hubJS.AccountInfo(ctx); err != nil {
		t.Fatalf("the edge reaches no JetStream of the hub: %v", err)
	}
	nc := natstest.Connect(t, hub.NATS())
	edgeJS, err := jetstream.NewWithDomain(nc, "edge1")
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := edgeJS.DeleteStream(short, "LOCAL"); err == nil {
		t.Fatal("a client of the hub deleted a stream of the edge")
	}
	if _, err := edge.JetStream().Stream(ctx, "LOCAL"); err != nil {
		t.Fatalf("the edge's stream: %v", err)
	}
}

// TestLeafPermissions: the in-process identity may publish to the
// JetStream API of other domains only when a forward handler or a source
// or mirror in another domain needs it, and to each forward destination;
// a hub's identity may watch the edge subjects.
func TestLeafPermissions(t *testing.T) {
	for _, tc := range []struct {
		name      string
		change    func(cfg *config.Config)
		publish   []string // added to the publish allow list
		subscribe []string // added to the subscribe allow list
	}{
		{"nothing remote", func(cfg *config.Config) {}, nil, nil},
		{"local source", func(cfg *config.Config) {
			cfg.Streams["COPY"] = config.DefaultStream(nil)
			cfg.Streams["COPY"].Sources = []config.SourceConfig{{Name: "ORDERS"}}
		}, nil, nil},
		{"source in another domain", func(cfg *config.Config) {
			cfg.Streams["COPY"] = config.DefaultStream(nil)
			cfg.Streams["COPY"].Sources = []config.SourceConfig{{Name: "ORDERS"}, {Name: "CMDS", Domain: "hub"}}
		}, []string{"$JS.*.API.>"}, nil},
		{"mirror in another domain", func(cfg *config.Config) {
			cfg.Streams["CMDS"] = config.DefaultStream(nil)
			cfg.Streams["CMDS"].Mirror = &config.SourceConfig{Name: "CMDS", Domain: "hub"}
		}, []string{"$JS.*.API.>"}, nil},
		{"forward handler", func(cfg *config.Config) {
			cc := config.DefaultConsumer("ORDERS")
			cc.Handler = "forward"
			cc.Forward.Subject = "up.{server}.{subject}"
			cfg.Consumers["FWD"] = cc
		}, []string{"$JS.*.API.>", "up.edge1.>"}, nil},
		{"hub", func(cfg *config.Config) {
			cfg.LeafNodes.Listen = "127.0.0.1:7422"
			cfg.LeafNodes.EdgeSubjects = []string{"edge.>", "site.>"}
		}, nil, []string{"edge.>", "site.>"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := configtest.Default(t)
			cfg.Server.Name = "edge1"
			tc.change(cfg)
			p := InternalPermissions()
			base := InternalPermissions()
			leafPermissions(p, cfg)
			if got, want := p.Publish.Allow, append(base.Publish.Allow, tc.publish...); !slices.Equal(got, want) {
				t.Errorf("publish allow = %q, want %q", got, want)
			}
			if got, want := p.Subscribe.Allow, append(base.Subscribe.Allow, tc.subscribe...); !slices.Equal(got, want) {
				t.Errorf("subscribe allow = %q, want %q", got, want)
			}
		})
	}
	leafPermissions(nil, configtest.Default(t)) // no permissions (no [auth]): nothing to add to
}

// TestBootstrapSources: sources are created and changed in place (logged
// field by field); a changed mirror is refused by name, the stream kept.
func TestBootstrapSources(t *testing.T) {
	ctx := context.Background()
	cfg := configtest.Default(t)
	cfg.Streams["COPY"] = config.DefaultStream(nil)
	cfg.Streams["COPY"].Sources = []config.SourceConfig{{Name: "ORDERS", FilterSubject: "orders.created"}}
	cfg.Streams["MIRROR"] = config.DefaultStream(nil)
	cfg.Streams["MIRROR"].Mirror = &config.SourceConfig{Name: "ORDERS"}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s := runServer(t, cfg)
	log := slog.New(slog.DiscardHandler)
	if err := bootstrap.Apply(ctx, s.JetStream(), cfg, log); err != nil {
		t.Fatal(err)
	}
	if _, err := s.JetStream().Publish(ctx, "orders.created", []byte("x")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the copy and the mirror", func() bool {
		c, err1 := s.JetStream().Stream(ctx, "COPY")
		m, err2 := s.JetStream().Stream(ctx, "MIRROR")
		return err1 == nil && err2 == nil && c.CachedInfo().State.Msgs == 1 && m.CachedInfo().State.Msgs == 1
	})
	// Bootstrapping again changes nothing; a new filter is applied.
	if err := bootstrap.Apply(ctx, s.JetStream(), cfg, log); err != nil {
		t.Fatal(err)
	}
	cfg.Streams["COPY"].Sources[0].FilterSubject = "orders.*"
	if err := bootstrap.Apply(ctx, s.JetStream(), cfg, log); err != nil {
		t.Fatal(err)
	}
	c, err := s.JetStream().Stream(ctx, "COPY")
	if err != nil {
		t.Fatal(err)
	}
	if src := c.CachedInfo().Config.Sources; len(src) != 1 || src[0].FilterSubject != "orders.*" {
		t.Errorf("sources after the change: %+v", src)
	}
	cfg.Streams["MIRROR"].Mirror.FilterSubject = "orders.paid"
	err = bootstrap.Apply(ctx, s.JetStream(), cfg, log)
	var drift *bootstrap.DriftError
	if !errors.As(err, &drift) || drift.Field != "mirror" {
		t.Fatalf("Bootstrap with a changed mirror = %v, want a bootstrap.DriftError on mirror", err)
	}
}

// TestLeafRemotesSameAddress: two remotes written differently that reach
// the same hub address are refused at start, naming both: the hub would
// keep one link and drop the other as a duplicate (both flap), and the
// links could not be told apart.
func TestLeafRemotesSameAddress(t *testing.T) {
	hubCfg := leafHubConfig(t, "", "")
	_, port, _ := hubCfg.LeafNodes.ListenHostPort()
	cfg := leafEdgeConfig(t, "edge1", hubCfg, config.RemoteConfig{})
	cfg.LeafNodes.Remotes = append(cfg.LeafNodes.Remotes, config.RemoteConfig{URL: fmt.Sprintf("nats-leaf://localhost:%d", port)})
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s := New(cfg, slog.New(slog.DiscardHandler))
	err := s.Open(context.Background())
	if err == nil {
		_ = s.Close(context.Background())
		t.Fatal("Open accepted two remotes to one address")
	}
	for _, want := range []string{"leafnodes.remotes[1].url", "leafnodes.remotes[0].url", fmt.Sprintf("127.0.0.1:%d", port)} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
}

func TestLinkDomains(t *testing.T) {
	got := linkDomains([]string{"$JS.hub.API.INFO", "$JS.hub.API.STREAM.>", "$JS.API.>", "$JS.a.b.API.INFO", "edge.>", "$JS.other.API.>", "$JS.ACK.S.C.*"})
	want := map[string]bool{"hub": true, "other": true}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("linkDomains = %v, want %v", got, want)
	}
}

// TestCheckRemoteAddresses: two plain remotes at one address are refused;
// two TLS remotes with different host names at one address (a proxy that
// routes by server name) are not.
func TestCheckRemoteAddresses(t *testing.T) {
	ctx := context.Background()
	plain := []config.RemoteConfig{{URL: "nats-leaf://127.0.0.1:7422"}, {URL: "nats-leaf://localhost:7422"}}
	if err := checkRemoteAddresses(ctx, plain); err == nil || !strings.Contains(err.Error(), "leafnodes.remotes[1].url") {
		t.Errorf("plain remotes at one address: %v", err)
	}
	tls := []config.RemoteConfig{{URL: "tls://127.0.0.1:7422"}, {URL: "tls://localhost:7422"}}
	if err := checkRemoteAddresses(ctx, tls); err != nil {
		t.Errorf("TLS remotes with two host names: %v", err)
	}
	if err := checkRemoteAddresses(ctx, []config.RemoteConfig{{URL: "nats-leaf://127.0.0.1:7422"}, {URL: "nats-leaf://127.0.0.1:7423"}}); err != nil {
		t.Errorf("two ports: %v", err)
	}
	// Every URL of a list counts; the URLs of one remote may share an
	// address.
	lists := []config.RemoteConfig{{URLs: []string{"nats-leaf://127.0.0.1:7422", "nats-leaf://localhost:7422", "nats-leaf://127.0.0.1:7423"}}, {URL: "nats-leaf://localhost:7424"}}
	if err := checkRemoteAddresses(ctx, lists); err != nil {
		t.Errorf("a list whose URLs share an address: %v", err)
	}
	lists[1].URL = "nats-leaf://localhost:7423"
	err := checkRemoteAddresses(ctx, lists)
	for _, want := range []string{"leafnodes.remotes[1].url", "leafnodes.remotes[0].urls[2]", "127.0.0.1:7423"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("a URL of another remote's list: %v, want it to name %s", err, want)
		}
	}
}

// TestLeafRemoteURLs: each of two remotes lists two URLs, the first where
// nothing listens. Both connect through their second URL and each link
// counts as its remote's, named by both URLs; the second remote uses TLS
// to a hub whose certificate names localhost only, which its second URL
// names while its first is an IP address. Each link shows the address it
// is on. When the first hub goes away, its remote alone is down.
func TestLeafRemoteURLs(t *testing.T) {
	certs, err := testcert.Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	hubCfg := leafHubConfig(t, "", "")
	hub := runServer(t, hubCfg)
	hub2Cfg := leafHubConfig(t, "", "")
	hub2Cfg.Server.Name, hub2Cfg.JetStream.Domain = "hub2", "hub2"
	hub2Cfg.LeafNodes.CertFile, hub2Cfg.LeafNodes.KeyFile = certs.NameCert, certs.NameKey
	runServer(t, hub2Cfg)
	_, port2, _ := hub2Cfg.LeafNodes.ListenHostPort()

	cfg := configtest.Default(t)
	cfg.Server.Name, cfg.JetStream.Domain = "edge1", "edge1"
	cfg.LeafNodes.Remotes = []config.RemoteConfig{
		{URLs: []string{fmt.Sprintf("nats-leaf://127.0.0.1:%d", natstest.FreePort(t)), "nats-leaf://" + hubCfg.LeafNodes.Listen}},
		{URLs: []string{fmt.Sprintf("tls://127.0.0.1:%d", natstest.FreePort(t)), fmt.Sprintf("tls://localhost:%d", port2)}, CAFile: certs.CA},
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	log, lb := natstest.Logger(t)
	edge := runServerWithLog(t, cfg, log)
	names := []string{cfg.LeafNodes.Remotes[0].URLs[0] + "," + cfg.LeafNodes.Remotes[0].URLs[1],
		cfg.LeafNodes.Remotes[1].URLs[0] + "," + cfg.LeafNodes.Remotes[1].URLs[1]}
	waitFor(t, "both remotes' links", func() bool {
		links := edge.LeafLinks()
		return len(links) == 2 && links[0].Connected && links[1].Connected
	})
	on := []string{hubCfg.LeafNodes.Listen, fmt.Sprintf("127.0.0.1:%d", port2)}
	for i, l := range edge.LeafLinks() {
		if l.Remote != names[i] || l.Address != on[i] || l.Connects != 1 || l.Problem != "" {
			t.Errorf("remote %d: %+v, want it named %q, connected once, on %s", i, l, names[i], on[i])
		}
	}
	// The domains behind a link come with the hub's subscriptions, after
	// the link is up.
	waitFor(t, "the links to reach hub and hub2", func() bool { return edge.LeafReaches("hub") && edge.LeafReaches("hub2") })
	if strings.Contains(lb.String(), "matches no configured remote") {
		t.Errorf("a link was given to no remote:\n%s", lb)
	}

	if err := hub.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the first remote's link to go down", func() bool { return !edge.LeafLinks()[0].Connected })
	if l := edge.LeafLinks()[0]; l.Address != "" {
		t.Errorf("the first remote's link is down but on %s", l.Address)
	}
	if l := edge.LeafLinks()[1]; !l.Connected {
		t.Errorf("the second remote went down with the first hub: %+v", l)
	}
}

// TestLeafDomainsReadAgain: the domains behind a link come with the hub's
// subscriptions, in no set order: another edge's ($JS.edge01.API.>,
// passed on by the hub) may arrive before the hub's own. A link whose
// domains were read before the hub's arrived still comes to reach the
// hub: a forwarder that asks for it has the subscriptions read again. A
// fleet test once left one edge of twenty waiting for good, its link up,
// "served" only by the other edges' domains.
func TestLeafDomainsReadAgain(t *testing.T) {
	hubCfg := leafHubConfig(t, "", "")
	runServer(t, hubCfg)
	edge := runServer(t, leafEdgeConfig(t, "edge1", hubCfg, config.RemoteConfig{}))
	waitFor(t, "the link to reach the hub", func() bool { return edge.LeafReaches("hub") })

	// As if read before the hub's own subscriptions had come.
	w := edge.leaf
	w.mu.Lock()
	for id := range w.linkDom {
		w.linkDom[id] = map[string]bool{"edge01": true}
	}
	w.mu.Unlock()
	if edge.LeafReaches("hub") {
		t.Fatal("the link reaches the hub with only edge01's domain read")
	}
	deadline := time.Now().Add(5 * time.Second)
	for !edge.LeafReaches("hub") {
		if time.Now().After(deadline) {
			t.Fatalf("the link does not reach the hub 5 s after it was asked: it serves %v", edge.LeafDomains())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := edge.LeafDomains(); !slices.Equal(got, []string{"hub"}) {
		t.Errorf("LeafDomains = %v, want [hub]", got)
	}
}

// TestLeafReservedSubjects: a leafnode connection to a hub is held to
// the reserved subjects like any client, however it authenticates: a
// server that dials the hub with the leaf credentials (any edge has
// them; a compromised one need not run holdfast) can neither forge a
// max-deliveries advisory (the hub's workers would dead-letter and
// terminate a message on it), nor put a dead letter in the hub's
// dead-letter stream, nor answer requests on $HOLDFAST.> (holdfast
// status asked of the hub). Its ordinary subjects still cross.
func TestLeafReservedSubjects(t *testing.T) {
	dir := t.TempDir()
	pw := filepath.Join(dir, "leaf.password")
	if err := os.WriteFile(pw, []byte("leaf-password"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		user string // the leaf's credentials in the remote's URL
		hub  func(cfg *config.Config)
		opt  nats.Option // a client of the hub
	}{
		{"leafnodes.user", "leaf:leaf-password@", func(cfg *config.Config) {
			cfg.LeafNodes.User, cfg.LeafNodes.PasswordFile = "leaf", pw
		}, nats.Name("anonymous")},
		{"leafnodes.user with auth users", "leaf:leaf-password@", func(cfg *config.Config) {
			cfg.LeafNodes.User, cfg.LeafNodes.PasswordFile = "leaf", pw
			cfg.Auth.Users = map[string]*config.UserConfig{"ops": {Password: bcryptHash(t, "ops-password")}}
		}, nats.UserInfo("ops", "ops-password")},
		{"leafnodes.user with a token", "leaf:leaf-password@", func(cfg *config.Config) {
			cfg.LeafNodes.User, cfg.LeafNodes.PasswordFile = "leaf", pw
			cfg.Auth.Token = "0123456789abcdef-token"
		}, nats.Token("0123456789abcdef-token")},
		{"no auth", "", func(cfg *config.Config) {}, nats.Name("anonymous")},
		{"auth user", "ops:ops-password@", func(cfg *config.Config) {
			cfg.Auth.Users = map[string]*config.UserConfig{"ops": {Password: bcryptHash(t, "ops-password")}}
		}, nats.UserInfo("ops", "ops-password")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hubCfg := leafHubConfig(t, "", "")
			tc.hub(hubCfg)
			if err := hubCfg.Validate(); err != nil {
				t.Fatal(err)
			}
			hub := runServer(t, hubCfg)
			if hubCfg.LeafNodes.User != "" && len(hubCfg.Auth.Users) > 0 {
				// Only the edges' user logs in as a leafnode there.
				u, err := url.Parse("nats-leaf://ops:ops-password@" + hubCfg.LeafNodes.Listen)
				if err != nil {
					t.Fatal(err)
				}
				other, err := server.NewServer(&server.Options{
					Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
					LeafNode: server.LeafNodeOpts{Remotes: []*server.RemoteLeafOpts{{URLs: []*url.URL{u}}}},
				})
				if err != nil {
					t.Fatal(err)
				}
				go other.Start()
				t.Cleanup(other.Shutdown)
				if !other.ReadyForConnections(10 * time.Second) {
					t.Fatal("the other server did not start")
				}
				time.Sleep(time.Second)
				if other.NumLeafNodes() != 0 {
					t.Error("a client user logged in as a leafnode beside leafnodes.user")
				}
			}
			hc, err := nats.Connect(hub.NATS().ClientURL(), tc.opt)
			if err != nil {
				t.Fatal(err)
			}
			defer hc.Close()
			if tc.hub != nil && hubCfg.LeafNodes.User != "" {
				// The edges' credentials are for leafnode connections.
				if c, err := nats.Connect(hub.NATS().ClientURL(), nats.UserInfo("leaf", "leaf-password"), nats.MaxReconnects(0)); err == nil {
					c.Close()
					t.Error("a client connected with the leafnode credentials")
				}
			}

			// A plain nats-server with the leaf's credentials and no
			// denies of its own.
			u, err := url.Parse("nats-leaf://" + tc.user + hubCfg.LeafNodes.Listen)
			if err != nil {
				t.Fatal(err)
			}
			rogue, err := server.NewServer(&server.Options{
				Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
				LeafNode: server.LeafNodeOpts{Remotes: []*server.RemoteLeafOpts{{URLs: []*url.URL{u}}}},
			})
			if err != nil {
				t.Fatal(err)
			}
			go rogue.Start()
			t.Cleanup(rogue.Shutdown)
			if !rogue.ReadyForConnections(10 * time.Second) {
				t.Fatal("the rogue server did not start")
			}
			waitFor(t, "the rogue leafnode link", func() bool { return rogue.NumLeafNodes() == 1 })
			nc, err := nats.Connect(rogue.ClientURL())
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()

			// What the hub's holdfast listens to, and a control.
			watch := func(subj string) *nats.Subscription {
				sub, err := hub.Conn().SubscribeSync(subj)
				if err != nil {
					t.Fatal(err)
				}
				return sub
			}
			adv := watch("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.EDGE.W")
			dlq := watch("dlq.>")
			ok := watch("edge.ok")
			// The hub's group commit takes the edges' publishes in its
			// queue group: its interest must reach them.
			gc, err := hub.Conn().QueueSubscribeSync("edge.gc", subjects.GroupCommitQueue("EDGE"))
			if err != nil {
				t.Fatal(err)
			}
			if err := hub.Conn().Flush(); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "an ordinary subject to cross the link", func() bool {
				_ = nc.Publish("edge.ok", []byte("ok"))
				_ = nc.Flush()
				_, err := ok.NextMsg(100 * time.Millisecond)
				return err == nil
			})
			waitFor(t, "a publish to reach the hub's group commit", func() bool {
				_ = nc.Publish("edge.gc", []byte("gc"))
				_ = nc.Flush()
				_, err := gc.NextMsg(100 * time.Millisecond)
				return err == nil
			})
			_ = nc.Publish("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.EDGE.W", []byte(`{"stream_seq":1}`))
			_ = nc.Publish("dlq.W.edge.x", []byte("forged"))
			_ = nc.Publish("edge.ok", []byte("after"))
			_ = nc.Flush()
			if _, err := ok.NextMsg(5 * time.Second); err != nil {
				t.Fatalf("the control after the forgeries: %v", err)
			}
			if m, err := adv.NextMsg(200 * time.Millisecond); err == nil {
				t.Errorf("a leafnode forged a max-deliveries advisory on the hub: %s", m.Data)
			}
			if m, err := dlq.NextMsg(200 * time.Millisecond); err == nil {
				t.Errorf("a leafnode published a dead letter on the hub: %s %s", m.Subject, m.Data)
			}

			// A responder across the link on the hub's status subject.
			if _, err := nc.Subscribe("$HOLDFAST.STATUS.hub", func(m *nats.Msg) { _ = m.Respond([]byte("forged")) }); err != nil {
				t.Fatal(err)
			}
			if _, err := nc.Subscribe("edge.req", func(m *nats.Msg) { _ = m.Respond([]byte("ok")) }); err != nil {
				t.Fatal(err)
			}
			_ = nc.Flush()
			waitFor(t, "a request to cross the link", func() bool {
				_, err := hc.Request("edge.req", nil, 100*time.Millisecond)
				return err == nil
			})
			if m, err := hc.Request("$HOLDFAST.STATUS.hub", nil, 500*time.Millisecond); err == nil {
				t.Errorf("a leafnode answered $HOLDFAST.STATUS.hub on the hub: %q", m.Data)
			}
		})
	}
}

// TestLeafGroupCommitStaysLocal: a stream with group_commit stores what
// holdfast's ingest publishes under $HOLDFAST.GC.<stream>.<subject>; an
// edge keeps those subjects off its link like its streams' own, or two
// edges with the same stream behind a hub that does not deny them (a
// hand-run nats-server) store each other's messages, and the hub sees
// them all.
func TestLeafGroupCommitStaysLocal(t *testing.T) {
	ctx := context.Background()
	leafPort := natstest.FreePort(t)
	hubSrv, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		LeafNode: server.LeafNodeOpts{Host: "127.0.0.1", Port: leafPort},
	})
	if err != nil {
		t.Fatal(err)
	}
	go hubSrv.Start()
	t.Cleanup(hubSrv.Shutdown)
	if !hubSrv.ReadyForConnections(10 * time.Second) {
		t.Fatal("the hub did not start")
	}
	hubCfg := &config.Config{}
	hubCfg.LeafNodes.Listen = fmt.Sprintf("127.0.0.1:%d", leafPort)

	var edges []*Server
	for _, name := range []string{"edge1", "edge2"} {
		cfg := leafEdgeConfig(t, name, hubCfg, config.RemoteConfig{})
		cfg.Streams["ORDERS"].GroupCommit = true
		e := runServer(t, cfg)
		if err := bootstrap.Apply(ctx, e.JetStream(), cfg, slog.New(slog.DiscardHandler)); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the leafnode link", e.LeafConnected)
		edges = append(edges, e)
	}
	hc, err := nats.Connect(hubSrv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer hc.Close()
	seen, err := hc.SubscribeSync(subjects.GroupCommitPrefix + ">")
	if err != nil {
		t.Fatal(err)
	}
	_ = hc.Flush()
	time.Sleep(500 * time.Millisecond) // interest crosses the links

	// What edge1's ingest publishes.
	for i := range 3 {
		if err := edges[0].Conn().Publish(subjects.GroupCommit("ORDERS", "orders.created"), []byte(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	_ = edges[0].Conn().Flush()
	time.Sleep(time.Second)
	for i, e := range edges {
		s, err := e.JetStream().Stream(ctx, "ORDERS")
		if err != nil {
			t.Fatal(err)
		}
		want := uint64(0)
		if i == 0 {
			want = 3
		}
		if n := s.CachedInfo().State.Msgs; n != want {
			t.Errorf("edge%d ORDERS holds %d messages, want %d", i+1, n, want)
		}
	}
	if m, err := seen.NextMsg(100 * time.Millisecond); err == nil {
		t.Errorf("the hub saw an edge's local message on %s", m.Subject)
	}
}
