package daemon

import (
	"context"
	"io"
	"log/slog"
	"maps"
	"testing"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/pipeline"
)

// openDefault opens a daemon with the built-in config on a temporary
// store (no HTTP listener, any client port), closed with the test.
func openDefault(t *testing.T) *Daemon {
	t.Helper()
	return openDefaultLog(t, io.Discard)
}

// openDefaultLog is openDefault logging to log.
func openDefaultLog(t *testing.T, log io.Writer) *Daemon {
	t.Helper()
	return openWith(t, log, nil)
}

// openWith is openDefaultLog with the config changed by tweak first.
func openWith(t *testing.T, log io.Writer, tweak func(*config.Config)) *Daemon {
	t.Helper()
	cfg := config.DefaultConfig()
	cfg.Server.Port = -1
	cfg.HTTP.Listen = ""
	cfg.JetStream.StoreDir = t.TempDir()
	cfg.JetStream.MaxFileStore = config.Bytes(1 << 30)
	if tweak != nil {
		tweak(cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	d := New(cfg, Options{Log: slog.New(slog.NewTextHandler(log, nil))})
	if err := d.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close(context.Background()) })
	return d
}

// editable returns a copy of cfg whose streams and consumers may be
// added, left out and changed without touching cfg's.
func editable(cfg *config.Config) *config.Config {
	next := *cfg
	next.Streams = maps.Clone(cfg.Streams)
	for name, sc := range next.Streams {
		c := *sc
		next.Streams[name] = &c
	}
	next.Consumers = maps.Clone(cfg.Consumers)
	for name, cc := range next.Consumers {
		c := *cc
		next.Consumers[name] = &c
	}
	return &next
}

// workersOf returns the running workers of consumer name, or nil.
func workersOf(d *Daemon, name string) *pipeline.Workers {
	d.workersMu.Lock()
	defer d.workersMu.Unlock()
	for _, w := range d.workers {
		if w.Options().Consumer == name {
			return w
		}
	}
	return nil
}

// workerOptions returns the options the workers of consumer name run
// with (zero when none run).
func workerOptions(d *Daemon, name string) pipeline.ConsumerOptions {
	if w := workersOf(d, name); w != nil {
		return w.Options()
	}
	return pipeline.ConsumerOptions{}
}
