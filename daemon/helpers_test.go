package daemon

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/holdfast-io/holdfast/config"
)

// openDefault opens a daemon with the built-in config on a temporary
// store (no HTTP listener, any client port), closed with the test.
func openDefault(t *testing.T) *Daemon {
	t.Helper()
	cfg := config.DefaultConfig()
	cfg.Server.Port = -1
	cfg.HTTP.Listen = ""
	cfg.JetStream.StoreDir = t.TempDir()
	cfg.JetStream.MaxFileStore = config.Bytes(1 << 30)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	d := New(cfg, Options{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := d.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close(context.Background()) })
	return d
}
