package bootstrap

import (
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/holdfast-io/holdfast/internal/configtest"
	"github.com/holdfast-io/holdfast/internal/natstest"
	"github.com/holdfast-io/holdfast/internal/subjects"
)

// ConfigDiff finds nothing right after the bootstrap, on one node and on
// every node of a cluster; after one node's config changed a stream limit
// and was applied there (a reload), the other nodes, whose config still
// says the old value, name the field, both values and the way out.
func TestConfigDiff(t *testing.T) {
	ctx := natstest.Context(t)
	one := configtest.Default(t)
	s := runServerWithLog(t, one, slog.New(slog.DiscardHandler))
	if err := Apply(ctx, s.JetStream(), one, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	if d := Diff(ctx, s.JetStream(), one); d != nil {
		t.Fatalf("one node right after its bootstrap: %q", d)
	}

	cfgs := configtest.Cluster(t, 3, "bootstrap", nil)
	servers := openCluster(t, cfgs)
	for i, s := range servers {
		if err := Apply(ctx, s.JetStream(), cfgs[i], slog.New(slog.DiscardHandler)); err != nil {
			t.Fatal(err)
		}
	}
	for i, s := range servers {
		if d := Diff(ctx, s.JetStream(), cfgs[i]); d != nil {
			t.Fatalf("%s right after the bootstrap: %q", cfgs[i].Server.Name, d)
		}
	}
	cfgs[0].Streams["ORDERS"].MaxMsgs = 500
	if err := Apply(ctx, servers[0].JetStream(), cfgs[0], slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	if d := Diff(ctx, servers[0].JetStream(), cfgs[0]); d != nil {
		t.Fatalf("the node that applied its config: %q", d)
	}
	d := Diff(ctx, servers[1].JetStream(), cfgs[1])
	if len(d) != 1 || !strings.Contains(d[0], "stream ORDERS differs from this node's config ([streams.ORDERS]): max_msgs is 500 on the server, 1000000 in this node's config") ||
		!strings.Contains(d[0], "make the config the same on every node") {
		t.Fatalf("another node: %q", d)
	}
}

// One node's config saying replicas = 1 (a copy of a single node's file,
// a typo) made ORDERS and its dead-letter stream R1 on the whole cluster
// at that node's start: every acknowledged message then lived on one
// disk, and only the other nodes' config-diff warnings said anything.
// holdfast raises replicas from a config but never lowers them: the node
// keeps the stream at 3, says at its start why and how to lower them on
// purpose, and its config diff says it too.
func TestBootstrapNeverLowersReplicas(t *testing.T) {
	ctx := natstest.Context(t)
	cfgs := configtest.Cluster(t, 3, "bootstrap", nil)
	for _, cfg := range cfgs {
		cfg.Streams["ORDERS"].Replicas = 3
	}
	servers := openCluster(t, cfgs)
	for i, s := range servers {
		if err := Apply(ctx, s.JetStream(), cfgs[i], slog.New(slog.DiscardHandler)); err != nil {
			t.Fatal(err)
		}
	}
	cfgs[0].Streams["ORDERS"].Replicas = 1
	var log natstest.Buffer
	if err := Apply(ctx, servers[0].JetStream(), cfgs[0], slog.New(slog.NewTextHandler(&log, nil))); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"ORDERS", "ORDERS_DLQ"} {
		s, err := servers[1].JetStream().Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if r := s.CachedInfo().Config.Replicas; r != 3 {
			t.Errorf("%s has %d replicas after one node's config said 1, want 3 kept", name, r)
		}
	}
	const want = "streams.ORDERS.replicas = 1 not applied: stream ORDERS has 3 replicas"
	if !strings.Contains(log.String(), want) || !strings.Contains(log.String(), "nats stream edit ORDERS --replicas 1") {
		t.Errorf("the node's bootstrap log does not say %q and how to lower them:\n%s", want, log.String())
	}
	d := Diff(ctx, servers[0].JetStream(), cfgs[0])
	if len(d) != 2 || !strings.Contains(d[0], want) || !strings.Contains(d[1], "dead-letter stream ORDERS_DLQ") {
		t.Errorf("the node's config diff: %q, want the replicas kept for ORDERS and ORDERS_DLQ", d)
	}
	if d := Diff(ctx, servers[1].JetStream(), cfgs[1]); d != nil {
		t.Errorf("another node, whose config says 3: %q", d)
	}
}

// TestUnfinishedRestoreStaysClosed: a stream that a restore created and
// did not finish (killed: its subjects still held back, marked as being
// restored) keeps taking no publishes through a start's bootstrap, which
// gave the configured subjects back to it before: part of a backup then
// acknowledged publishes, into a stream the next restore deletes. Diff
// and the bootstrap say what it is and how to go on.
func TestUnfinishedRestoreStaysClosed(t *testing.T) {
	ctx := natstest.Context(t)
	cfg := configtest.Default(t)
	s := runServerWithLog(t, cfg, slog.New(slog.DiscardHandler))
	js := s.JetStream()
	if err := Apply(ctx, js, cfg, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	c := st.CachedInfo().Config
	c.Subjects = []string{subjects.Replacing("ORDERS")}
	c.Metadata = map[string]string{"holdfast_held_subjects": "orders.*", subjects.RestoringMeta: "/var/backups/holdfast/b1"}
	if _, err := js.UpdateStream(ctx, c); err != nil {
		t.Fatal(err)
	}
	log, lb := natstest.Logger(t)
	if err := Apply(ctx, js, cfg, log); err != nil {
		t.Fatal(err)
	}
	if st, err = js.Stream(ctx, "ORDERS"); err != nil {
		t.Fatal(err)
	}
	if got := st.CachedInfo().Config.Subjects; !slices.Equal(got, []string{subjects.Replacing("ORDERS")}) {
		t.Fatalf("ORDERS after the bootstrap takes %v: want its subjects still held back", got)
	}
	const how = "holdfast restore --replace /var/backups/holdfast/b1"
	if !strings.Contains(lb.String(), how) {
		t.Errorf("the bootstrap does not say how to go on:\n%s", lb.String())
	}
	if d := Diff(ctx, js, cfg); len(d) != 1 || !strings.Contains(d[0], "takes no publishes") || !strings.Contains(d[0], how) {
		t.Errorf("Diff: %q", d)
	}

	// Held back by a restore --replace that had not deleted it yet: the
	// stream itself, given its subjects back by a start or reload.
	c.Metadata = map[string]string{subjects.HeldMeta: "orders.*"}
	if _, err := js.UpdateStream(ctx, c); err != nil {
		t.Fatal(err)
	}
	if d := Diff(ctx, js, cfg); len(d) != 1 || !strings.Contains(d[0], "holds its subjects [orders.*] back") || !strings.Contains(d[0], "holdfast reload") {
		t.Errorf("Diff of a stream held back: %q", d)
	}
	if err := Apply(ctx, js, cfg, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	if st, err = js.Stream(ctx, "ORDERS"); err != nil {
		t.Fatal(err)
	}
	if got := st.CachedInfo().Config.Subjects; !slices.Equal(got, []string{"orders.*"}) {
		t.Fatalf("ORDERS held back, after the bootstrap, takes %v: want its own subjects back", got)
	}
}
