package daemon

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/internal/natstest"
	"github.com/holdfast-io/holdfast/pipeline/forward"
)

// TestForwardConsumersWaitOnceForAnUnreachableHub: an edge with three
// forward consumers whose hub does not answer is ready after one wait for
// the link, not one per consumer: the hub, another machine, delays the
// edge's workers and its readiness no longer the more it forwards.
func TestForwardConsumersWaitOnceForAnUnreachableHub(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	fmt.Fprintf(&b, "[server]\nname = \"edge1\"\nport = -1\n[http]\nlisten = \"\"\n[jetstream]\nstore_dir = %q\nmax_file_store = \"1GB\"\n", t.TempDir())
	fmt.Fprintf(&b, "[[leafnodes.remotes]]\nurl = \"nats-leaf://127.0.0.1:%d\"\n", natstest.FreePort(t))
	for _, s := range []string{"A", "B", "C"} {
		fmt.Fprintf(&b, "[streams.S%s]\nsubjects = [\"s%s.*\"]\n[consumers.FWD%s]\nstream = \"S%s\"\nhandler = \"forward\"\n", s, strings.ToLower(s), s, s)
	}
	cfg, err := config.Parse(strings.NewReader(b.String()), "test.toml")
	if err != nil {
		t.Fatal(err)
	}
	d := New(cfg, Options{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	start := time.Now()
	if err := d.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close(context.Background()) })
	if took := time.Since(start); took >= 2*forward.StartWait {
		t.Fatalf("ready %s after start with the hub unreachable, want one wait of %s for the three forward consumers", took.Round(100*time.Millisecond), forward.StartWait)
	}
}
