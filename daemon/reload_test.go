package daemon

import (
	"context"
	"errors"
	"maps"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/internal/natstest"
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

// TestHealthyDuringReload: the watchdog's probe may run while a reload
// replaces the running config (go test -race tells).
func TestHealthyDuringReload(t *testing.T) {
	d := openDefault(t)
	// A cancelled context makes the JetStream round trip fail at once, so
	// that Healthy goes on to read the config.
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 200 {
			_ = d.Healthy(cancelled)
		}
	}()
	for i := range 4 {
		next := *d.Running()
		next.Log.Level = []string{"debug", "info"}[i%2]
		d.Reload(context.Background(), &next)
	}
	<-done
}

// TestReloadWorkersOpenFails: when a reload cannot start a forward
// consumer's workers, its new forwarder is closed and not registered:
// no hub check goes on, and status, metrics and health do not show it.
func TestReloadWorkersOpenFails(t *testing.T) {
	d := openDefault(t)
	next := *d.Running()
	next.Consumers = maps.Clone(next.Consumers)
	cc := *next.Consumers["WORKER1"]
	cc.Handler, cc.Workers = "forward", 1
	next.Consumers["FORWARD"] = &cc // not on the server: the workers cannot start
	d.reloadWorkers(context.Background(), &next, "FORWARD")
	if f := d.forwarders["FORWARD"]; f != nil {
		t.Error("the forwarder of workers that could not start is still registered")
	}
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		buf := make([]byte, 1<<20)
		if stacks := string(buf[:runtime.Stack(buf, true)]); strings.Contains(stacks, "(*Forwarder).recheck") {
			return errors.New("the forwarder's hub check still runs")
		}
		return nil
	})
}
