package bootstrap

import (
	"context"
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

// openCluster opens a server per config at the same moment (none is
// ready before a quorum is up), and closes them when the test ends.
func openCluster(t *testing.T, cfgs []*config.Config) []*embedded.Server {
	t.Helper()
	servers := make([]*embedded.Server, len(cfgs))
	errs := make(chan error, len(cfgs))
	for i, cfg := range cfgs {
		log, _ := natstest.Logger(t)
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
