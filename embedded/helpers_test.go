package embedded

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/internal/natstest"
)

// runServer opens an embedded server for cfg and closes it when the test
// ends.
func runServer(t *testing.T, cfg *config.Config) *Server {
	t.Helper()
	log, _ := natstest.Logger(t)
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
