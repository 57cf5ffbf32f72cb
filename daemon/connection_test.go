package daemon

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/holdfast-io/holdfast/config"
)

// TestClosedInProcessConnectionFails: the server closes a connection that
// breaks a protocol limit (here a control line over 4096 bytes), and an
// in-process one does not come back. holdfast went on without it: no
// worker, dead letter or status answer, while /healthz said OK. The
// daemon now fails (holdfast run exits 1, systemd restarts it).
func TestClosedInProcessConnectionFails(t *testing.T) {
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
	if err := d.srv.Conn().Publish("orders."+strings.Repeat("x", 5000), nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.Failed():
		if err := d.Err(); !strings.Contains(err.Error(), "holdfast-internal") {
			t.Fatalf("failed with %v, want the connection named", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the daemon goes on without its in-process connection")
	}
}
