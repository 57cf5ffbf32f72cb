package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/embedded/bootstrap"
	"github.com/holdfast-io/holdfast/internal/natstest"
	"github.com/holdfast-io/holdfast/internal/subjects"
	"github.com/holdfast-io/holdfast/pipeline/monitor"
)

// TestRestartOnlyChanges: every key a reload cannot apply is named when
// it changed, by its path.
func TestRestartOnlyChanges(t *testing.T) {
	cur := config.DefaultConfig()
	for _, tc := range []struct {
		key    string
		change func(*config.Config)
	}{
		{"server.port", func(c *config.Config) { c.Server.Port++ }},
		{"jetstream.sync", func(c *config.Config) { c.JetStream.Sync = "2m" }},
		{"cluster.name", func(c *config.Config) { c.Cluster.Name = "site-a" }},
		{"http.listen", func(c *config.Config) { c.HTTP.Listen = "" }},
		{"tls.min_version", func(c *config.Config) { c.TLS.MinVersion = "1.3" }},
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
	if got := restartOnlyChanges(cur, next); !slices.Equal(got, []string{"leafnodes.listen"}) {
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
		if err := d.Reload(context.Background(), &next); err != nil {
			t.Fatal(err)
		}
	}
	<-done
}

// TestReloadWorkersOpenFails: when a reload cannot start a forward
// consumer's workers, its new forwarder is closed and not registered:
// no hub check goes on, and status, metrics and health do not show it.
func TestReloadWorkersOpenFails(t *testing.T) {
	d := openDefault(t)
	next := editable(d.Running())
	cc := *next.Consumers["WORKER1"]
	cc.Handler, cc.Workers = "forward", 1
	next.Consumers["FORWARD"] = &cc // not on the server: the workers cannot start
	d.reloadWorkers(context.Background(), next, "FORWARD")
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

// TestReloadAddsAndLeavesOutStreamsAndConsumers: a reload that adds a
// stream and a consumer also applies the other changes of the file
// (workers 4 -> 3, max_deliver 5 -> 4), creates both and starts the new
// consumer's workers; one that leaves them out again stops the workers
// and leaves the stream, the consumer and their messages on the server.
func TestReloadAddsAndLeavesOutStreamsAndConsumers(t *testing.T) {
	d := openDefault(t)
	ctx := natstest.Context(t)
	js := d.srv.JetStream()
	base := d.Running()
	next := editable(base)
	next.Consumers["WORKER1"].Workers, next.Consumers["WORKER1"].MaxDeliver = 3, 4
	archive := *next.Consumers["WORKER1"]
	archive.Workers = 1
	next.Consumers["ARCHIVE"] = &archive
	extra := *next.Streams["ORDERS"]
	extra.Subjects = []string{"extra.*"}
	next.Streams["EXTRA"] = &extra
	if err := next.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := d.Reload(ctx, next); err != nil {
		t.Fatal(err)
	}
	if o := workerOptions(d, "WORKER1"); o.Workers != 3 || o.MaxDeliver != 4 {
		t.Errorf("WORKER1's workers after the reload: %d with max_deliver %d, want 3 with max_deliver 4", o.Workers, o.MaxDeliver)
	}
	if ci := natstest.ConsumerInfo(t, js, "ORDERS", "WORKER1"); ci.Config.MaxDeliver != 4 {
		t.Errorf("WORKER1's max_deliver on the server: %d, want 4", ci.Config.MaxDeliver)
	}
	if w := workersOf(d, "ARCHIVE"); w == nil || !w.Running() {
		t.Error("ARCHIVE's workers do not run after the reload that added it")
	}
	natstest.ConsumerInfo(t, js, "ORDERS", "ARCHIVE")
	if _, err := js.Stream(ctx, "EXTRA"); err != nil {
		t.Fatalf("stream EXTRA after the reload that added it: %v", err)
	}
	if got := monitoredNames(d.monitor.CheckNow(ctx)); !slices.Equal(got, []string{"ORDERS/ARCHIVE", "ORDERS/WORKER1", "stream EXTRA"}) {
		t.Errorf("the monitor watches %q after adding ARCHIVE and EXTRA", got)
	}
	if _, err := js.Publish(ctx, "extra.created", []byte("kept")); err != nil {
		t.Fatal(err)
	}

	if err := d.Reload(ctx, editable(base)); err != nil {
		t.Fatal(err)
	}
	if workersOf(d, "ARCHIVE") != nil {
		t.Error("ARCHIVE's workers still run after the reload that left it out")
	}
	natstest.ConsumerInfo(t, js, "ORDERS", "ARCHIVE")
	s, err := js.Stream(ctx, "EXTRA")
	if err != nil || s.CachedInfo().State.Msgs != 1 {
		t.Fatalf("stream EXTRA after the reload that left it out: %v, want it kept with its message", err)
	}
	r := d.monitor.CheckNow(ctx)
	if got := monitoredNames(r); !slices.Equal(got, []string{"ORDERS/WORKER1"}) {
		t.Errorf("the monitor watches %q after leaving ARCHIVE and EXTRA out", got)
	}
	if r.Health.Status != monitor.HealthOK {
		t.Errorf("health after leaving ARCHIVE and EXTRA out: %+v", r.Health)
	}
}

// monitoredNames lists the consumers ("STREAM/NAME") a monitor report
// has, then its configured streams other than ORDERS and its dead-letter
// stream ("stream NAME").
func monitoredNames(r *monitor.Report) []string {
	var out []string
	for _, c := range r.Consumers {
		out = append(out, c.Stream+"/"+c.Name)
	}
	for _, s := range r.Streams {
		if s.Name != "ORDERS" && s.Name != "ORDERS_DLQ" {
			out = append(out, "stream "+s.Name)
		}
	}
	return out
}

// TestReloadRefusesRestartChangesWhole: a reload with a change only a
// restart applies applies none of its changes, says which keys need the
// restart (with systemctl only under systemd), and the health warns of
// them, still ok, until a reload of a file without them.
func TestReloadRefusesRestartChangesWhole(t *testing.T) {
	t.Setenv("INVOCATION_ID", "")
	t.Setenv("NOTIFY_SOCKET", "")
	var log natstest.Buffer
	d := openDefaultLog(t, &log)
	ctx := natstest.Context(t)
	base := d.Running()
	next := editable(base)
	next.Consumers["WORKER1"].Workers = 3
	next.LeafNodes.Listen = "127.0.0.1:7422"
	err := d.Reload(ctx, next)
	if !errors.Is(err, ErrRestartNeeded) || !strings.Contains(err.Error(), "leafnodes.listen") {
		t.Fatalf("reload with leafnodes.listen changed: %v, want ErrRestartNeeded naming leafnodes.listen", err)
	}
	if d.Running() != base {
		t.Error("the running config changed")
	}
	if n := workerOptions(d, "WORKER1").Workers; n != 4 {
		t.Errorf("WORKER1's workers: %d, want its 4 kept", n)
	}
	if s := log.String(); !strings.Contains(s, "reload refused") || !strings.Contains(s, "(restart holdfast)") ||
		strings.Contains(s, "systemctl") || strings.Contains(s, "reload done") {
		t.Errorf("the reload's log does not say it was refused, with restart holdfast and no reload done:\n%s", s)
	}
	const warning = "config on disk differs from the running config: restart to apply leafnodes.listen"
	h := d.monitor.CheckNow(ctx).Health
	if h.Status != monitor.HealthOK || len(h.Warnings) != 1 || h.Warnings[0] != warning {
		t.Errorf("health after the refused reload: %s %q, want ok with %q", h.Status, h.Warnings, warning)
	}

	t.Setenv("INVOCATION_ID", "0123")
	if err := d.Reload(ctx, next); err == nil {
		t.Fatal("the second reload was applied")
	}
	if !strings.Contains(log.String(), "(systemctl restart holdfast)") {
		t.Errorf("under systemd the log does not say systemctl restart holdfast:\n%s", log.String())
	}
	if h := d.monitor.CheckNow(ctx).Health; len(h.Warnings) != 1 || h.Warnings[0] != warning+" (systemctl restart holdfast)" {
		t.Errorf("health under systemd: %q", h.Warnings)
	}

	next.LeafNodes = base.LeafNodes
	if err := d.Reload(ctx, next); err != nil {
		t.Fatal(err)
	}
	if n := workerOptions(d, "WORKER1").Workers; n != 3 {
		t.Errorf("WORKER1's workers after the reload without the restart change: %d, want 3", n)
	}
	if h := d.monitor.CheckNow(ctx).Health; len(h.Warnings) != 0 {
		t.Errorf("health still warns after the reload was applied: %q", h.Warnings)
	}
}

// TestReloadsKept: the reload answer keeps the last reloads, each with
// when it started, oldest first, at most keptReloads of them, so that
// askers whose reloads ran one after the other each find their own.
func TestReloadsKept(t *testing.T) {
	d := openDefault(t)
	ctx := natstest.Context(t)
	begin := time.Now()
	for i := range keptReloads + 3 {
		next := editable(d.Running())
		next.Consumers["WORKER1"].Workers = 1 + i%2
		if err := d.Reload(ctx, next); err != nil {
			t.Fatal(err)
		}
	}
	recent, last := d.lastReloads()
	if len(recent) != keptReloads || last == nil || last.Seq != keptReloads+3 {
		t.Fatalf("%d reloads kept, the last %+v; want %d, the last number %d", len(recent), last, keptReloads, keptReloads+3)
	}
	for i, r := range recent {
		if r.Seq != uint64(4+i) || r.Started.Before(begin) || r.Time.Before(r.Started) ||
			(i > 0 && r.Started.Before(recent[i-1].Time)) {
			t.Fatalf("reload %d kept as %+v: out of order or without its start", i, r)
		}
	}
}

// TestReloadSaysWhatItSetBack: a reload with the same config that gives a
// stream its subjects back (a restore --replace stopped before its delete
// held them back) says so; it answered "applied: (none)", though the
// daemon logged the stream updated.
func TestReloadSaysWhatItSetBack(t *testing.T) {
	d := openDefault(t)
	ctx := natstest.Context(t)
	js := d.srv.JetStream()
	holdOrders(t, d, map[string]string{subjects.HeldMeta: "orders.*"})
	if err := d.Reload(ctx, editable(d.Running())); err != nil {
		t.Fatal(err)
	}
	_, last := d.lastReloads()
	if last == nil || len(last.SetBack) != 1 || !strings.Contains(last.SetBack[0], "holds its subjects [orders.*] back") {
		t.Fatalf("reload %+v: want the held subjects in what it set back", last)
	}
	if st, err := js.Stream(ctx, "ORDERS"); err != nil || !slices.Equal(st.CachedInfo().Config.Subjects, []string{"orders.*"}) {
		t.Fatalf("ORDERS after the reload: %v", err)
	}
}

// TestHeldStreamDegradesHealth: a stream a killed restore left with its
// subjects held back refuses every publish: the health is degraded,
// naming it and what to run (it said "ok", with a warning among drifts).
func TestHeldStreamDegradesHealth(t *testing.T) {
	d := openDefault(t)
	ctx := natstest.Context(t)
	holdOrders(t, d, map[string]string{subjects.HeldMeta: "orders.*", subjects.RestoringMeta: "/backups/b1"})
	// The reload compares the streams with the config at once (the
	// watcher does every 10 s) and keeps the stream closed.
	if err := d.Reload(ctx, editable(d.Running())); err != nil {
		t.Fatal(err)
	}
	h := d.monitor.CheckNow(ctx).Health
	if h.Status != "degraded" || !strings.Contains(h.Reason, "stream ORDERS takes no publishes") || !strings.Contains(h.Reason, "holdfast restore --replace /backups/b1") {
		t.Fatalf("health %+v: want degraded by ORDERS, with the command", h)
	}
	if slices.ContainsFunc(h.Warnings, func(w string) bool { return strings.Contains(w, "takes no publishes") }) {
		t.Errorf("the closed stream is a warning too: %q", h.Warnings)
	}
}

// holdOrders holds ORDERS' subjects back as a restore does, with meta.
func holdOrders(t *testing.T, d *Daemon, meta map[string]string) {
	t.Helper()
	ctx := natstest.Context(t)
	js := d.srv.JetStream()
	st, err := js.Stream(ctx, "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	c := st.CachedInfo().Config
	c.Subjects = []string{subjects.Replacing("ORDERS")}
	c.Metadata = meta
	if _, err := js.UpdateStream(ctx, c); err != nil {
		t.Fatal(err)
	}
}

// TestReloadRefusedHalfwaySaysWhatItApplied: a reload whose second
// stream the server refuses has updated the first one already: the
// reload's error names what it applied, and the running config has it,
// so that the config-diff warning does not blame another node or client
// for it.
func TestReloadRefusedHalfwaySaysWhatItApplied(t *testing.T) {
	d := openWith(t, io.Discard, func(cfg *config.Config) {
		cfg.Streams["B"] = config.DefaultStream([]string{"b.*"})
	})
	ctx := natstest.Context(t)
	js := d.srv.JetStream()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "X", Subjects: []string{"c.*"}}); err != nil {
		t.Fatal(err)
	}
	next := editable(d.Running())
	next.Streams["B"].MaxMsgs = 500
	next.Streams["ORDERS"].Subjects = []string{"orders.*", "c.*"}
	err := d.Reload(ctx, next)
	if err == nil || !strings.Contains(err.Error(), "overlap stream X") {
		t.Fatalf("reload with ORDERS overlapping X: %v, want the overlap", err)
	}
	if !strings.Contains(err.Error(), "applied: streams.B.max_msgs") {
		t.Errorf("the reload's error does not name what it applied (streams.B.max_msgs): %v", err)
	}
	if got := d.Running().Streams["B"].MaxMsgs; got != 500 {
		t.Errorf("running config's streams.B.max_msgs = %d, want the 500 the server has", got)
	}
	if got := d.Running().Streams["ORDERS"].Subjects; !slices.Equal(got, []string{"orders.*"}) {
		t.Errorf("running config's streams.ORDERS.subjects = %v, want the refused change left out", got)
	}
	if diff := bootstrap.Diff(ctx, js, d.Running()); len(diff) != 0 {
		t.Errorf("config diff after the reload: %q, want none", diff)
	}
}

// TestReloadRefusesImpliedLogHandler: WORKER1 runs the exec handler; a
// reload of a file that keeps [streams.ORDERS] and has no
// [consumers.WORKER1] table would give it the built-in log handler, which
// acknowledged the waiting messages without the command seeing them
// (found 2026-12-05): refused, the workers keep their handler.
func TestReloadRefusesImpliedLogHandler(t *testing.T) {
	d := openWith(t, io.Discard, func(cfg *config.Config) {
		cc := cfg.Consumers["WORKER1"]
		cc.Handler, cc.Exec.Command, cc.Workers = "exec", []string{"/bin/true"}, 1
	})
	next, err := config.Parse(strings.NewReader("[streams.ORDERS]\nsubjects = [\"orders.*\"]\n"), "holdfast.toml")
	if err != nil {
		t.Fatal(err)
	}
	cur := d.Running()
	next.Server, next.JetStream, next.HTTP = cur.Server, cur.JetStream, cur.HTTP
	err = d.Reload(context.Background(), next)
	if err == nil || !strings.Contains(err.Error(), `no table for consumer WORKER1, which ran with handler "exec"`) {
		t.Fatalf("reload without WORKER1's table: %v, want it refused", err)
	}
	if h := d.Running().Consumers["WORKER1"].Handler; h != "exec" {
		t.Errorf("WORKER1 runs handler %q after the refused reload, want exec", h)
	}
}

// TestReloadSaysWhatWorkersCouldNotStart: a reload whose exec command is
// not installed (the workers keep their handler), or whose new consumer's
// workers cannot start, answers those keys as not applied, with why.
func TestReloadSaysWhatWorkersCouldNotStart(t *testing.T) {
	d := openDefault(t)
	ctx := natstest.Context(t)
	next := editable(d.Running())
	missing := filepath.Join(t.TempDir(), "not-installed")
	next.Consumers["WORKER1"].Handler = "exec"
	next.Consumers["WORKER1"].Exec.Command = []string{missing}
	added := *next.Consumers["WORKER1"]
	next.Consumers["WORKER2"] = &added
	if err := d.Reload(ctx, next); err != nil {
		t.Fatal(err)
	}
	// As holdfast reload reads it.
	msg, err := d.srv.Conn().Request(subjects.Reload(d.Running().Server.Name), nil, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var reply struct {
		LastReload struct {
			Plan       ReloadPlan `json:"plan"`
			NotApplied []HeldBack `json:"not_applied"`
		} `json:"last_reload"`
	}
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		t.Fatal(err)
	}
	last := reply.LastReload
	var keys []string
	for _, h := range last.NotApplied {
		keys = append(keys, h.Key)
		if !strings.Contains(h.Why, missing) {
			t.Errorf("not applied %s: %q does not name the missing command", h.Key, h.Why)
		}
	}
	for _, want := range []string{"consumers.WORKER1.handler", "consumers.WORKER1.exec", "consumers.WORKER2 (new: created, workers started)"} {
		if !slices.Contains(keys, want) {
			t.Errorf("reload answered not applied %q; want %s among them (plan: applied %q)", keys, want, last.Plan.Apply)
		}
	}
	if got := workerOptions(d, "WORKER1"); got.Consumer != "WORKER1" {
		t.Errorf("WORKER1's workers are gone after a refused handler: %+v", got)
	}
}

// TestReloadOfABrokenFileWarns: a reload that refuses the config file
// itself (a SIGHUP after an edit that broke it) leaves a health warning
// until a reload reads the file: nothing else told that the next start
// would fail on it. Before, only the log said so.
func TestReloadOfABrokenFileWarns(t *testing.T) {
	d := openDefault(t)
	ctx := natstest.Context(t)
	running := d.Running()
	path := filepath.Join(t.TempDir(), "holdfast.toml")
	d.configFile = path
	if err := os.WriteFile(path, []byte("[consumers.WORKER1\nworkers = 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := d.ReloadFromFile(ctx); err == nil {
		t.Fatal("a reload of a broken file was applied")
	}
	h := d.monitor.CheckNow(ctx).Health
	if len(h.Warnings) != 1 || !strings.Contains(h.Warnings[0], "refused the config file") || !strings.Contains(h.Warnings[0], path) {
		t.Fatalf("health after the refused file: %q, want a warning naming %s", h.Warnings, path)
	}
	// A file that loads (here one that needs a restart: the test's
	// server has a random port, which a file may not have) ends it.
	good := fmt.Sprintf("[server]\nname = %q\nport = 4222\n[http]\nlisten = \"\"\n[jetstream]\nstore_dir = %q\nmax_file_store = \"1GB\"\n",
		running.Server.Name, running.JetStream.StoreDir)
	if err := os.WriteFile(path, []byte(good), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := d.ReloadFromFile(ctx); err != nil && !errors.Is(err, ErrRestartNeeded) {
		t.Fatalf("reload of the mended file: %v", err)
	}
	for _, w := range d.monitor.CheckNow(ctx).Health.Warnings {
		if strings.Contains(w, "refused the config file") {
			t.Errorf("health still warns of the file after it was read again: %q", w)
		}
	}
}
