package embedded

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/internal/natstest"
)

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

// testLogger returns a debug logger that writes into a buffer dumped on
// failure: the lines are printed only when the test fails, so that server
// goroutines logging during shutdown never call t.Log after the test has
// returned.
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

// runServer opens an embedded server for cfg and closes it when the test
// ends.
func runServer(t *testing.T, cfg *config.Config) *Server {
	t.Helper()
	log, _ := testLogger(t)
	return runServerWithLog(t, cfg, log)
}

func runServerWithLog(t *testing.T, cfg *config.Config, log *slog.Logger) *Server {
	t.Helper()
	return openServer(t, New(cfg, log))
}

// openServer opens s (made by New, maybe adjusted by the test) and closes
// it when the test ends.
func openServer(t *testing.T, s *Server) *Server {
	t.Helper()
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
	return s
}

// openWithin runs Open in a goroutine and fails the test if it has not
// returned within d: start-up failures must be errors, never hangs.
func openWithin(t *testing.T, s *Server, d time.Duration) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- s.Open(context.Background()) }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		t.Fatalf("Open did not return within %s", d)
		return nil
	}
}
