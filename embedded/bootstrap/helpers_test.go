package bootstrap

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/embedded"
	"github.com/holdfast-io/holdfast/internal/natstest"
)

// testServer is an embedded server for a test, with the logger it logs to.
type testServer struct {
	*embedded.Server
	base *slog.Logger
}

// testConfig returns the built-in defaults (stream ORDERS, consumer
// WORKER1) with the store in a fresh t.TempDir(), a random client port, no
// HTTP listener and no in-process workers.
func testConfig(t *testing.T) *config.Config {
	t.Helper()
	cfg := config.DefaultConfig()
	cfg.Server.Name = "holdfast-test"
	cfg.Server.Port = -1
	cfg.JetStream.StoreDir = t.TempDir()
	cfg.JetStream.MaxFileStore = config.Bytes(1 << 30)
	cfg.JetStream.MaxMemoryStore = config.Bytes(64 << 20)
	cfg.HTTP.Listen = ""
	for _, c := range cfg.Consumers {
		c.Workers = 0
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("test config does not validate: %v", err)
	}
	return cfg
}

// testLogger returns a debug logger into a buffer that is printed only
// when the test fails.
func testLogger(t *testing.T) (*slog.Logger, *natstest.Buffer) {
	t.Helper()
	lb := &natstest.Buffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log:\n%s", lb.String())
		}
	})
	return slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelDebug})), lb
}

// runServerWithLog opens an embedded server for cfg logging to log, and
// closes it when the test ends.
func runServerWithLog(t *testing.T, cfg *config.Config, log *slog.Logger) *testServer {
	t.Helper()
	s := embedded.New(cfg, log)
	s.ReadyTimeout = 30 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Open(ctx); err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return &testServer{Server: s, base: log}
}

// testClusterConfigs returns the configs of n nodes that form one
// JetStream cluster on 127.0.0.1, each with its own store.
func testClusterConfigs(t *testing.T, n int) []*config.Config {
	t.Helper()
	ports := make([]int, n)
	var routes []string
	for i := range ports {
		ports[i] = natstest.FreePort(t)
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", ports[i]))
	}
	cfgs := make([]*config.Config, n)
	for i, p := range ports {
		cfg := testConfig(t)
		cfg.Server.Name = fmt.Sprintf("node%d", i+1)
		cfg.Cluster = config.ClusterConfig{Name: "bootstrap", Listen: fmt.Sprintf("127.0.0.1:%d", p), Routes: routes}
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		cfgs[i] = cfg
	}
	return cfgs
}

// openCluster opens a server per config at the same moment (none is
// ready before a quorum is up), and closes them when the test ends.
func openCluster(t *testing.T, cfgs []*config.Config) []*embedded.Server {
	t.Helper()
	servers := make([]*embedded.Server, len(cfgs))
	errs := make(chan error, len(cfgs))
	for i, cfg := range cfgs {
		log, _ := testLogger(t)
		servers[i] = embedded.New(cfg, log)
		servers[i].ReadyTimeout = time.Minute
		go func() { errs <- servers[i].Open(natstest.Context(t)) }()
	}
	for range cfgs {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range servers {
		t.Cleanup(func() { _ = s.Close(context.Background()) })
	}
	return servers
}
