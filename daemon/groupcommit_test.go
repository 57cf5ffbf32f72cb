package daemon

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/internal/natstest"
)

// TestGroupCommitChanged: a reload restarts a stream's ingest when group
// commit is switched or what the ingest was built from changes (subjects,
// duplicate window, max_payload), and leaves it running otherwise.
func TestGroupCommitChanged(t *testing.T) {
	withGC := func(on bool, change func(*config.Config)) *config.Config {
		c := config.DefaultConfig()
		c.Streams = map[string]*config.StreamConfig{
			"A": config.DefaultStream([]string{"a.*"}),
			"B": config.DefaultStream([]string{"b.*"}),
		}
		c.Streams["A"].GroupCommit = on
		if change != nil {
			change(c)
		}
		return c
	}
	for _, tc := range []struct {
		name              string
		cur, next         *config.Config
		wantStop, wantRun []string
	}{
		{"unchanged", withGC(true, nil), withGC(true, nil), nil, nil},
		{"off both", withGC(false, nil), withGC(false, nil), nil, nil},
		{"other stream changed", withGC(true, nil), withGC(true, func(c *config.Config) { c.Streams["B"].MaxMsgs = 5 }), nil, nil},
		{"switched on", withGC(false, nil), withGC(true, nil), nil, []string{"A"}},
		{"switched off", withGC(true, nil), withGC(false, nil), []string{"A"}, nil},
		{"subjects", withGC(true, nil), withGC(true, func(c *config.Config) { c.Streams["A"].Subjects = []string{"a.>"} }), []string{"A"}, []string{"A"}},
		{"duplicate window", withGC(true, nil), withGC(true, func(c *config.Config) { c.Streams["A"].DuplicateWindow = config.Dur(time.Hour) }), []string{"A"}, []string{"A"}},
		{"max_payload", withGC(true, nil), withGC(true, func(c *config.Config) { c.Server.MaxPayload.Bytes *= 2 }), []string{"A"}, []string{"A"}},
	} {
		stop, start := groupCommitChanged(tc.cur, tc.next)
		if !slices.Equal(stop, tc.wantStop) || !slices.Equal(start, tc.wantRun) {
			t.Errorf("%s: stop %v start %v, want stop %v start %v", tc.name, stop, start, tc.wantStop, tc.wantRun)
		}
	}
}

// TestGroupCommitFollowsTheStreamWhenReloadFails: a reload that switches
// group commit on for ORDERS and changes ZZZ in a way the server refuses
// (its new subject belongs to a stream made by hand) updates ORDERS first
// (prefixed subjects) and then fails. The ingest of ORDERS was not
// started: every publish to orders.* got "no responders" until the next
// restart. Switched off in a reload failing the same way, the ingest was
// started again beside the stream, now on orders.* itself: its "no
// responders" reached the client before the stream's PubAck, and
// js.Publish's retries stored the message again. The ingest now follows
// what the stream has.
func TestGroupCommitFollowsTheStreamWhenReloadFails(t *testing.T) {
	cfg := config.DefaultConfig()
	cfg.Server.Port = -1
	cfg.HTTP.Listen = ""
	cfg.JetStream.StoreDir = t.TempDir()
	cfg.JetStream.MaxFileStore = config.Bytes(1 << 30)
	cfg.Streams = map[string]*config.StreamConfig{
		"ORDERS": config.DefaultStream([]string{"orders.*"}),
		"ZZZ":    config.DefaultStream([]string{"zzz.*"}),
	}
	cfg.Consumers = map[string]*config.ConsumerConfig{}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	d := New(cfg, Options{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ctx := context.Background()
	if err := d.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close(context.Background()) })
	js := d.srv.JetStream()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "HANDMADE", Subjects: []string{"handmade.x"}}); err != nil {
		t.Fatal(err)
	}
	publish := func(what string) {
		t.Helper()
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		a, err := js.Publish(pctx, "orders.a", []byte(what))
		if err != nil || a.Stream != "ORDERS" {
			t.Fatalf("publish %s: %+v, %v", what, a, err)
		}
	}
	reload := func(gc bool) {
		t.Helper()
		next := *d.Running()
		next.Streams = map[string]*config.StreamConfig{"ORDERS": config.DefaultStream([]string{"orders.*"}),
			"ZZZ": config.DefaultStream([]string{"zzz.*", "handmade.x"})}
		next.Streams["ORDERS"].GroupCommit = gc
		d.Reload(ctx, &next)
	}
	publish("before")
	reload(true)
	publish("after a failed reload that switched group commit on")
	if info := natstest.StreamInfo(t, js, "ORDERS"); info.Config.SubjectTransform == nil {
		t.Fatal("ORDERS was not switched: the test does not test what it says")
	}
	// Off, from a group commit that runs, in a reload that fails the
	// same way: no ingest may go on answering beside the stream.
	on := *cfg
	on.Streams = map[string]*config.StreamConfig{"ORDERS": config.DefaultStream([]string{"orders.*"}), "ZZZ": cfg.Streams["ZZZ"]}
	on.Streams["ORDERS"].GroupCommit = true
	d.Reload(ctx, &on)
	if n := len(d.groupCommitStats()); n != 1 {
		t.Fatalf("%d ingests run after a reload that switched group commit on, want 1", n)
	}
	reload(false)
	publish("after a failed reload that switched group commit off")
	info := natstest.StreamInfo(t, js, "ORDERS")
	if info.Config.SubjectTransform != nil {
		t.Fatal("ORDERS was not switched back: the test does not test what it says")
	}
	if n := len(d.groupCommitStats()); n != 0 {
		t.Fatalf("%d ingests still run on a stream without group commit", n)
	}
	if info.State.Msgs != 3 {
		t.Fatalf("ORDERS holds %d messages, want 3", info.State.Msgs)
	}
}
