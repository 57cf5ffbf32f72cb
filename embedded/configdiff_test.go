package embedded

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/holdfast-io/holdfast/internal/natstest"
)

// ConfigDiff finds nothing right after the bootstrap, on one node and on
// every node of a cluster; after one node's config changed a stream limit
// and was applied there (a reload), the other nodes, whose config still
// says the old value, name the field, both values and the way out.
func TestConfigDiff(t *testing.T) {
	ctx := natstest.Context(t)
	one := testConfig(t)
	s := runServerWithLog(t, one, slog.New(slog.DiscardHandler))
	if err := Bootstrap(ctx, s.JetStream(), one, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	if d := ConfigDiff(ctx, s.JetStream(), one); d != nil {
		t.Fatalf("one node right after its bootstrap: %q", d)
	}

	cfgs := testClusterConfigs(t, 3)
	servers, _ := openCluster(t, cfgs)
	for i, s := range servers {
		if err := Bootstrap(ctx, s.JetStream(), cfgs[i], slog.New(slog.DiscardHandler)); err != nil {
			t.Fatal(err)
		}
	}
	for i, s := range servers {
		if d := ConfigDiff(ctx, s.JetStream(), cfgs[i]); d != nil {
			t.Fatalf("%s right after the bootstrap: %q", cfgs[i].Server.Name, d)
		}
	}
	cfgs[0].Streams["ORDERS"].MaxMsgs = 500
	if err := Bootstrap(ctx, servers[0].JetStream(), cfgs[0], slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	if d := ConfigDiff(ctx, servers[0].JetStream(), cfgs[0]); d != nil {
		t.Fatalf("the node that applied its config: %q", d)
	}
	d := ConfigDiff(ctx, servers[1].JetStream(), cfgs[1])
	if len(d) != 1 || !strings.Contains(d[0], "stream ORDERS differs from this node's config ([streams.ORDERS]): max_msgs is 500 on the server, 1000000 in this node's config") ||
		!strings.Contains(d[0], "make the config the same on every node") {
		t.Fatalf("another node: %q", d)
	}
}
