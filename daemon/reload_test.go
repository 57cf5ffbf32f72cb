package daemon

import (
	"slices"
	"testing"

	"github.com/holdfast-io/holdfast/config"
)

// TestRestartOnlyChanges: every section a reload cannot apply is named
// when it changed — [cluster] included, which a reload used to drop
// without a word.
func TestRestartOnlyChanges(t *testing.T) {
	cur := config.DefaultConfig()
	for _, tc := range []struct {
		key    string
		change func(*config.Config)
	}{
		{"[server]", func(c *config.Config) { c.Server.Port++ }},
		{"[jetstream]", func(c *config.Config) { c.JetStream.Sync = "2m" }},
		{"[cluster]", func(c *config.Config) { c.Cluster.Name = "site-a" }},
		{"[http]", func(c *config.Config) { c.HTTP.Listen = "" }},
		{"[tls]", func(c *config.Config) { c.TLS.MinVersion = "1.3" }},
		{"log.format", func(c *config.Config) { c.Log.Format = "json" }},
	} {
		next := config.DefaultConfig()
		tc.change(next)
		if got := restartOnlyChanges(cur, next); !slices.Equal(got, []string{tc.key}) {
			t.Errorf("changing %s: restart names %v", tc.key, got)
		}
	}
	if got := restartOnlyChanges(cur, config.DefaultConfig()); len(got) != 0 {
		t.Errorf("no change: restart names %v", got)
	}
}

// TestLeafNodesChangeNeedsRestart: a changed [leafnodes] is named as
// needing a restart at reload, not dropped.
func TestLeafNodesChangeNeedsRestart(t *testing.T) {
	cur, next := config.DefaultConfig(), config.DefaultConfig()
	next.LeafNodes.Listen = "127.0.0.1:7422"
	if got := restartOnlyChanges(cur, next); !slices.Equal(got, []string{"[leafnodes]"}) {
		t.Errorf("restart names %v", got)
	}
}
