package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/daemon"
	"github.com/holdfast-io/holdfast/internal/natstest"
)

// TestReloadOnSIGHUP: SIGHUP applies a new handler and stream limit at
// run time, and refuses a broken config while the previous one keeps
// running.
func TestReloadOnSIGHUP(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	out := filepath.Join(dir, "processed")
	script := func(tag string) string {
		return e2eScript(t, fmt.Sprintf("id=$(cat)\necho \"%s $id\" >> %q\n", tag, out))
	}
	a, b := script("A"), script("B")
	in := newE2EInstance(t)
	e2ePipelineConfig(t, in, a, "")
	base, err := os.ReadFile(in.cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := startHoldfast(t, in.cfg)
	p.waitReady()
	_, js := e2eConnect(t, in)
	publish := func(id string) {
		t.Helper()
		if _, err := js.Publish(natstest.Context(t), "orders.created", []byte(id)); err != nil {
			t.Fatal(err)
		}
	}
	waitLine := func(line string) {
		t.Helper()
		natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
			if !strings.Contains(strings.Join(e2eLines(t, out), "\n"), line) {
				return fmt.Errorf("no %q yet", line)
			}
			return nil
		})
	}
	waitLog := func(text string) {
		t.Helper()
		natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
			if !strings.Contains(p.stderr.String(), text) {
				return fmt.Errorf("no %q in the log yet", text)
			}
			return nil
		})
	}
	publish("one")
	waitLine("A one")

	next := strings.Replace(string(base), a, b, 1)
	next = strings.Replace(next, `subjects = ["orders.*"]`, "subjects = [\"orders.*\"]\nmax_age = \"24h\"", 1)
	if err := os.WriteFile(in.cfg, []byte(next), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitLog("reload done")
	for _, want := range []string{"reload: workers restarted", "field=max_age"} {
		if !strings.Contains(p.stderr.String(), want) {
			t.Fatalf("reload log lacks %q:\n%s", want, p.stderr.String())
		}
	}
	publish("two")
	waitLine("B two")

	if err := os.WriteFile(in.cfg, []byte("[streams.ORDERS]\nmax_age = \"forever\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitLog("reload refused")
	publish("three")
	waitLine("B three")
	p.stop()
}

// TestStopNotLostBehindReloads: a SIGTERM sent while a reload waits for
// slow handlers, behind a burst of further SIGHUPs, still stops holdfast.
// The signal channel used to hold four signals, and Go drops what does
// not fit: the stop request was lost and holdfast ran on.
func TestStopNotLostBehindReloads(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	started := filepath.Join(dir, "started")
	slow := e2eScript(t, fmt.Sprintf("echo x >> %q\nsleep 8\n", started))
	fast := e2eScript(t, "cat >/dev/null\n")
	in := newE2EInstance(t)
	e2ePipelineConfig(t, in, slow, "")
	// The reload below drains the old workers for up to shutdown_timeout:
	// long enough that every signal arrives while it waits.
	text := editConfig(t, in.cfg, `shutdown_timeout = "2s"`, `shutdown_timeout = "20s"`)
	p := startHoldfast(t, in.cfg)
	p.waitReady()
	_, js := e2eConnect(t, in)
	for i := range 4 {
		if _, err := js.Publish(natstest.Context(t), "orders.created", fmt.Appendf(nil, "m%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	natstest.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		if n := len(e2eLines(t, started)); n < 4 {
			return fmt.Errorf("%d handlers started", n)
		}
		return nil
	})
	if err := os.WriteFile(in.cfg, []byte(strings.Replace(text, slow, fast, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	send := func(sig syscall.Signal) {
		t.Helper()
		if err := p.cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
	}
	send(syscall.SIGHUP)
	natstest.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		if !strings.Contains(p.stderr.String(), "reload: draining") {
			return fmt.Errorf("the reload is not draining the old workers yet")
		}
		return nil
	})
	for range 6 {
		send(syscall.SIGHUP)
		time.Sleep(20 * time.Millisecond)
	}
	send(syscall.SIGTERM)
	if code := p.wait(60 * time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0:\n%s", code, p.stderr.String())
	}
	if !strings.Contains(p.stderr.String(), "shutting down") {
		t.Fatalf("no \"shutting down\" in the log:\n%s", p.stderr.String())
	}
}

// TestSecondSignalExitsAtOnce: while a graceful shutdown waits for a
// handler, a second SIGTERM exits at once with code 1, and kills the
// handler's command, which used to run on, orphaned and past its timeout.
func TestSecondSignalExitsAtOnce(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	started := filepath.Join(dir, "started")
	stuck := e2eScript(t, fmt.Sprintf("echo $$ >> %q\nsleep 120\n", started))
	in := newE2EInstance(t)
	e2ePipelineConfig(t, in, stuck, "")
	editConfig(t, in.cfg, `shutdown_timeout = "2s"`, `shutdown_timeout = "5m"`)
	p := startHoldfast(t, in.cfg)
	p.waitReady()
	_, js := e2eConnect(t, in)
	if _, err := js.Publish(natstest.Context(t), "orders.created", []byte("x")); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		if len(e2eLines(t, started)) == 0 {
			return fmt.Errorf("handler not started")
		}
		return nil
	})
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		if !strings.Contains(p.stderr.String(), "shutting down") {
			return fmt.Errorf("not shutting down yet")
		}
		return nil
	})
	// Well within the 5m shutdown_timeout the first signal granted.
	if code := p.signal(syscall.SIGTERM); code != 1 {
		t.Fatalf("exit code %d after a second SIGTERM, want 1:\n%s", code, p.stderr.String())
	}
	if !strings.Contains(p.stderr.String(), "second signal") {
		t.Fatalf("no \"second signal\" in the log:\n%s", p.stderr.String())
	}
	pid, err := strconv.Atoi(e2eLines(t, started)[0])
	if err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		// Gone, or a zombie nobody reaps yet: killed either way.
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err == nil && !bytes.Contains(stat, []byte(") Z ")) {
			return fmt.Errorf("the handler's command (pid %d) still runs after holdfast exited", pid)
		}
		return nil
	})
}

// TestReloadConsumerMovedToAnotherStream: a SIGHUP that moves a consumer
// to another stream is refused, naming the move as needing a restart;
// nothing of it is half-applied, and the restart moves the consumer.
func TestReloadConsumerMovedToAnotherStream(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	out := filepath.Join(dir, "processed")
	script := e2eScript(t, fmt.Sprintf("echo \"$HOLDFAST_STREAM $(cat)\" >> %q\n", out))
	in := newE2EInstance(t)
	e2ePipelineConfig(t, in, script, "")
	twoStreams := editConfig(t, in.cfg, "[consumers.WORKER1]", "[streams.OTHER]\nsubjects = [\"other.*\"]\n\n[consumers.WORKER1]")
	p := startHoldfast(t, in.cfg)
	p.waitReady()
	_, js := e2eConnect(t, in)

	moved := strings.Replace(twoStreams, "stream = \"ORDERS\"", "stream = \"OTHER\"", 1)
	if moved == twoStreams {
		t.Fatal("config template changed: no stream = \"ORDERS\" line")
	}
	p.reloadWith(in.cfg, moved)
	if !strings.Contains(p.stderr.String(), "consumers.WORKER1.stream (ORDERS -> OTHER)") {
		t.Fatalf("the reload does not say that moving WORKER1 needs a restart:\n%s", p.stderr.String())
	}
	if _, err := js.Consumer(natstest.Context(t), "OTHER", "WORKER1"); err == nil {
		t.Fatal("the reload created WORKER1 on OTHER, half-applying the move")
	}
	if _, err := js.Publish(natstest.Context(t), "orders.created", []byte("one")); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		if !slices.Contains(e2eLines(t, out), "ORDERS one") {
			return fmt.Errorf("ORDERS message not processed until the restart")
		}
		return nil
	})
	p.stop()

	p = startHoldfast(t, in.cfg)
	p.waitReady()
	_, js = e2eConnect(t, in)
	if _, err := js.Publish(natstest.Context(t), "other.created", []byte("two")); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		if !slices.Contains(e2eLines(t, out), "OTHER two") {
			return fmt.Errorf("OTHER message not processed after the restart: %v", e2eLines(t, out))
		}
		return nil
	})
	p.stop()
}

// TestReloadCountersCarryOnThroughZeroWorkers: a consumer's counters carry
// on when a reload stops its workers (workers = 0) and another starts them
// again; they used to start from zero.
func TestReloadCountersCarryOnThroughZeroWorkers(t *testing.T) {
	t.Parallel()
	o := newOpsInstance(t, "", "", "workers = 4\nhandler = \"log\"\n", "")
	base, err := os.ReadFile(o.cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := startHoldfast(t, o.cfg)
	p.waitReady()
	_, js := e2eConnect(t, o.e2eInstance)
	processed := func() uint64 {
		out, _ := o.status(t)
		c := findConsumer(t, out, "WORKER1")
		if c.Workers == nil {
			return 0
		}
		return c.Workers.Processed
	}
	publishN := func(n int) {
		t.Helper()
		for i := range n {
			if _, err := js.Publish(natstest.Context(t), "orders.created", fmt.Appendf(nil, "%d", i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitProcessed := func(want uint64) {
		t.Helper()
		natstest.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
			if n := processed(); n != want {
				return fmt.Errorf("processed %d, want %d", n, want)
			}
			return nil
		})
	}
	publishN(5)
	waitProcessed(5)
	p.reloadWith(o.cfg, strings.Replace(string(base), "workers = 4", "workers = 0", 1))
	p.reloadWith(o.cfg, string(base))
	publishN(5)
	waitProcessed(10)
	p.stop()
}

// editConfig replaces old by new (once) in the config file at path,
// failing the test when old is not there; it returns the new text.
func editConfig(t *testing.T, path, old, new string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), old) {
		t.Fatalf("config %s has no %q", path, old)
	}
	text := strings.Replace(string(b), old, new, 1)
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return text
}

// reloadWith writes text to the config file at path, sends SIGHUP and
// waits until the reload is done or refused.
func (d *e2eProc) reloadWith(path, text string) {
	d.t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		d.t.Fatal(err)
	}
	ended := func() int {
		s := d.stderr.String()
		return strings.Count(s, `msg="reload done"`) + strings.Count(s, "reload refused")
	}
	before := ended()
	if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		d.t.Fatal(err)
	}
	natstest.CheckFor(d.t, 30*time.Second, 20*time.Millisecond, func() error {
		if ended() == before {
			return fmt.Errorf("reload not done")
		}
		return nil
	})
}

// TestReloadPrefetchRestartsWorkers: a changed consumers.NAME.prefetch
// restarts the consumer's workers with it, and they go on processing.
func TestReloadPrefetchRestartsWorkers(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	out := filepath.Join(dir, "processed")
	in := newE2EInstance(t)
	e2ePipelineConfig(t, in, e2eScript(t, fmt.Sprintf("id=$(cat)\necho \"$id\" >> %q\n", out)), "prefetch = 8\n")
	base, err := os.ReadFile(in.cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := startHoldfast(t, in.cfg)
	p.waitReady()
	if !strings.Contains(p.stderr.String(), "prefetch=8") {
		t.Fatalf("workers not started with prefetch 8:\n%s", p.stderr.String())
	}
	if err := os.WriteFile(in.cfg, []byte(strings.Replace(string(base), "prefetch = 8\n", "prefetch = 32\n", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		if s := p.stderr.String(); !strings.Contains(s, "reload: workers restarted") || !strings.Contains(s, "prefetch=32") {
			return errors.New("workers not restarted with prefetch 32 yet")
		}
		return nil
	})
	_, js := e2eConnect(t, in)
	if _, err := js.Publish(natstest.Context(t), "orders.created", []byte("after-reload")); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		if !slices.Contains(e2eLines(t, out), "after-reload") {
			return errors.New("message not processed after the reload")
		}
		return nil
	})
	p.stop()
}

// TestReloadSetsBackWhatWasEditedWhileRunning: a reload applies the
// streams' and consumers' settings as a start does, also when the file did
// not change: a limit set with `nats stream edit` on a stream or on a
// dead-letter stream (where it would remove dead letters) is set back.
// Before, a reload of an unchanged file did nothing.
func TestReloadSetsBackWhatWasEditedWhileRunning(t *testing.T) {
	t.Parallel()
	in := newE2EInstance(t)
	p := startHoldfast(t, in.cfg)
	p.waitReady()
	_, js := e2eConnect(t, in)
	ctx := natstest.Context(t)
	for _, name := range []string{"ORDERS", "ORDERS_DLQ"} {
		natstest.EditStream(t, js, name, func(c *jetstream.StreamConfig) { c.MaxMsgs, c.Discard = 2, jetstream.DiscardOld })
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		if !strings.Contains(p.stderr.String(), "reload done") {
			return errors.New("no reload done in the log yet")
		}
		return nil
	})
	for name, want := range map[string]struct {
		msgs    int64
		discard jetstream.DiscardPolicy
	}{
		"ORDERS":     {1_000_000, jetstream.DiscardOld},
		"ORDERS_DLQ": {-1, jetstream.DiscardNew},
	} {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if c := s.CachedInfo().Config; c.MaxMsgs != want.msgs || c.Discard != want.discard {
			t.Errorf("stream %s after the reload: max_msgs %d, discard %s; want %d, %s", name, c.MaxMsgs, c.Discard, want.msgs, want.discard)
		}
	}
	p.stop()
}

// TestReloadRefusesEmptyFile: a SIGHUP that finds the config file empty
// (truncated by `cat > FILE` and not written yet) keeps the running
// config. It used to apply the built-in defaults: WORKER1 got 4 workers
// with the log handler, which acknowledged every waiting message without
// the configured handler ever seeing it.
func TestReloadRefusesEmptyFile(t *testing.T) {
	t.Parallel()
	in := newE2EInstance(t)
	p := startHoldfast(t, in.cfg)
	p.waitReady()
	_, js := e2eConnect(t, in)
	for i := range 3 {
		if _, err := js.Publish(natstest.Context(t), "orders.created", []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	for _, text := range []string{"", "\n# only a comment\n\n"} {
		if err := os.WriteFile(in.cfg, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		// Either answer ends the reload: refused, or applied ("reload done").
		reloads := func() int {
			return strings.Count(p.stderr.String(), "reload refused") + strings.Count(p.stderr.String(), `msg="reload done"`)
		}
		before := reloads()
		if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
			if reloads() == before {
				return errors.New("the reload has not ended yet")
			}
			return nil
		})
	}
	if !strings.Contains(p.stderr.String(), "sets no key") {
		t.Errorf("the refusal does not say why:\n%s", p.stderr.String())
	}
	time.Sleep(500 * time.Millisecond) // workers that started would have acked by now
	ci := natstest.ConsumerInfo(t, js, "ORDERS", "WORKER1")
	if ci.NumPending != 3 || ci.AckFloor.Stream != 0 {
		t.Errorf("WORKER1 after the empty file's reload: %d pending, ack floor %d; want 3 pending, none acknowledged", ci.NumPending, ci.AckFloor.Stream)
	}
	p.stop()
}

// TestHealthWhileReloadDrainsWorkers: while a reload waits for a running
// handler before it restarts the consumer's workers (up to
// shutdown_timeout), /healthz says degraded, naming the drain, with 200.
// It answered 503 "its 1 workers are not running" for the whole drain, as
// if they had died: a planned `systemctl reload` paged like an outage,
// and `holdfast status` showed "1 NOT RUNNING".
func TestHealthWhileReloadDrainsWorkers(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	started, release := filepath.Join(dir, "started"), filepath.Join(dir, "release")
	script := e2eScript(t, fmt.Sprintf("cat >/dev/null\necho x >> %q\nwhile [ ! -e %q ]; do sleep 0.05; done\n", started, release))
	in := newE2EInstance(t)
	e2ePipelineConfig(t, in, script, "")
	httpAddr := fmt.Sprintf("127.0.0.1:%d", natstest.FreePort(t))
	editConfig(t, in.cfg, `listen = ""`, fmt.Sprintf("listen = %q", httpAddr))
	editConfig(t, in.cfg, `shutdown_timeout = "2s"`, `shutdown_timeout = "60s"`)
	p := startHoldfast(t, in.cfg)
	p.waitReady()
	_, js := e2eConnect(t, in)
	if _, err := js.Publish(natstest.Context(t), "orders.created", []byte("m")); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		if len(e2eLines(t, started)) == 0 {
			return errors.New("the handler has not started")
		}
		return nil
	})
	editConfig(t, in.cfg, `timeout = "20s"`, `timeout = "21s"`)
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	health := func() (int, string, string) {
		t.Helper()
		resp, err := http.Get("http://" + httpAddr + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var h struct{ Status, Reason string }
		if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, h.Status, h.Reason
	}
	natstest.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		code, status, reason := health()
		if code != http.StatusOK {
			t.Fatalf("/healthz during the reload's drain = %d %s %q, want 200 degraded", code, status, reason)
		}
		if status != "degraded" || !strings.Contains(reason, "draining") {
			return fmt.Errorf("/healthz = %s %q, want degraded naming the drain", status, reason)
		}
		return nil
	})
	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		if code, status, reason := health(); code != http.StatusOK || status != "ok" {
			return fmt.Errorf("/healthz after the reload = %d %s %q, want 200 ok", code, status, reason)
		}
		return nil
	})
	p.stop()
}

// TestReloadRetriesAHandlerItCouldNotBuild: a reload whose new exec
// command is not there yet keeps the workers on their previous handler;
// once the command is installed, the next reload of the same file
// switches them to it. The refused settings used to count as running: the
// next reload saw nothing changed, and the workers ran the previous
// command until a restart, without a word.
func TestReloadRetriesAHandlerItCouldNotBuild(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	out := filepath.Join(dir, "processed")
	body := func(tag string) string { return fmt.Sprintf("#!/bin/sh\nid=$(cat)\necho \"%s $id\" >> %q\n", tag, out) }
	a := e2eScript(t, body("A")[len("#!/bin/sh\n"):])
	b := filepath.Join(dir, "handler-b.sh") // installed after the reload
	in := newE2EInstance(t)
	e2ePipelineConfig(t, in, a, "")
	p := startHoldfast(t, in.cfg)
	p.waitReady()
	_, js := e2eConnect(t, in)
	publish := func(id string) {
		t.Helper()
		if _, err := js.Publish(natstest.Context(t), "orders.created", []byte(id)); err != nil {
			t.Fatal(err)
		}
	}
	waitLine := func(line string) {
		t.Helper()
		natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
			lines := e2eLines(t, out)
			if !slices.Contains(lines, line) {
				return fmt.Errorf("no %q in %q", line, lines)
			}
			return nil
		})
	}
	reload := func(done int) {
		t.Helper()
		if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
			if n := strings.Count(p.stderr.String(), "reload done"); n < done {
				return fmt.Errorf("%d reloads done, want %d", n, done)
			}
			return nil
		})
	}
	publish("one")
	waitLine("A one")

	editConfig(t, in.cfg, a, b)
	reload(1)
	if !strings.Contains(p.stderr.String(), "reload: workers keep their previous handler") {
		t.Fatalf("the reload did not refuse the missing command:\n%s", p.stderr.String())
	}
	publish("two")
	waitLine("A two")

	if err := os.WriteFile(b, []byte(body("B")), 0o755); err != nil {
		t.Fatal(err)
	}
	reload(2)
	publish("three")
	waitLine("B three")
	p.stop()
}

// TestSIGHUPDuringStartUpIsApplied: a SIGHUP that arrives while holdfast
// starts (here while it creates 150 streams) is acted on once it is
// ready: the config file is read again. It used to be dropped with a
// warning ("SIGHUP during start-up: ignored"), and a config written just
// before it (after start-up had read the file) never applied until the
// next reload or restart.
func TestSIGHUPDuringStartUpIsApplied(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	out := filepath.Join(dir, "processed")
	script := func(tag string) string {
		return e2eScript(t, fmt.Sprintf("id=$(cat)\necho \"%s $id\" >> %q\n", tag, out))
	}
	a, b := script("A"), script("B")
	in := newE2EInstance(t)
	e2ePipelineConfig(t, in, a, "")
	var streams strings.Builder
	for i := range 150 {
		fmt.Fprintf(&streams, "\n[streams.S%d]\nsubjects = [\"s%d.>\"]\n", i, i)
	}
	f, err := os.OpenFile(in.cfg, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(streams.String()); err != nil {
		t.Fatal(err)
	}
	f.Close()
	p := startHoldfast(t, in.cfg)
	natstest.CheckFor(t, 30*time.Second, 2*time.Millisecond, func() error {
		if !strings.Contains(p.stderr.String(), "NATS server ready") {
			return errors.New("the NATS server is not ready yet")
		}
		return nil
	})
	editConfig(t, in.cfg, a, b)
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	p.waitReadyWithin(60 * time.Second)
	if !strings.Contains(p.stderr.String(), "SIGHUP during start-up") {
		t.Skip("start-up ended before the SIGHUP arrived")
	}
	natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		if !strings.Contains(p.stderr.String(), "reload done") {
			return errors.New("no reload after the start-up")
		}
		return nil
	})
	_, js := e2eConnect(t, in)
	if _, err := js.Publish(natstest.Context(t), "orders.created", []byte("one")); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		lines := e2eLines(t, out)
		if !slices.Contains(lines, "B one") {
			return fmt.Errorf("no \"B one\" in %q", lines)
		}
		return nil
	})
	p.stop()
}

// TestReloadAddsConsumerAndAppliesTheRest: a SIGHUP whose file adds
// [consumers.ARCHIVE] and changes WORKER1 (workers 2 -> 3, max_deliver
// 3 -> 4) applies all of it: status shows ARCHIVE's workers and WORKER1's
// new ones, and the server WORKER1's max_deliver. Leaving ARCHIVE out
// again stops its workers and keeps the consumer on the server.
func TestReloadAddsConsumerAndAppliesTheRest(t *testing.T) {
	t.Parallel()
	o := newOpsInstance(t, "", "", "workers = 2\nmax_deliver = 3\nhandler = \"log\"\n", "")
	base, err := os.ReadFile(o.cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := startHoldfast(t, o.cfg)
	p.waitReady()
	_, js := e2eConnect(t, o.e2eInstance)
	next := strings.Replace(string(base), "workers = 2\nmax_deliver = 3\n", "workers = 3\nmax_deliver = 4\n", 1)
	next += "\n[consumers.ARCHIVE]\nstream = \"ORDERS\"\nworkers = 1\nhandler = \"log\"\n"
	p.reloadWith(o.cfg, next)
	if s := p.stderr.String(); strings.Contains(s, "need a restart") || !strings.Contains(s, `msg="reload done"`) {
		t.Fatalf("the reload was not applied:\n%s", s)
	}
	natstest.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		out, _ := o.status(t)
		for name, want := range map[string]int{"WORKER1": 3, "ARCHIVE": 1} {
			c := findConsumer(t, out, name)
			if c.Workers == nil || c.Workers.Configured != want || !c.Workers.Running {
				return fmt.Errorf("status of %s: workers %+v, want %d running", name, c.Workers, want)
			}
		}
		return nil
	})
	if ci := natstest.ConsumerInfo(t, js, "ORDERS", "WORKER1"); ci.Config.MaxDeliver != 4 {
		t.Errorf("WORKER1's max_deliver on the server: %d, want 4", ci.Config.MaxDeliver)
	}
	if _, err := js.Publish(natstest.Context(t), "orders.created", []byte("x")); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		if ci := natstest.ConsumerInfo(t, js, "ORDERS", "ARCHIVE"); ci.AckFloor.Stream != 1 {
			return fmt.Errorf("ARCHIVE's ack floor is %d: its workers did not process the message", ci.AckFloor.Stream)
		}
		return nil
	})

	p.reloadWith(o.cfg, string(base))
	if !strings.Contains(p.stderr.String(), "consumer left out of the config") {
		t.Fatalf("the reload does not say ARCHIVE was left out:\n%s", p.stderr.String())
	}
	natstest.ConsumerInfo(t, js, "ORDERS", "ARCHIVE") // kept on the server
	out, _ := o.status(t)
	for _, c := range out.Consumers {
		if c.Name == "ARCHIVE" {
			t.Errorf("status still shows ARCHIVE, left out of the config: %+v", c)
		}
	}
	if code, h := o.health(t); code != http.StatusOK || h.Status != "ok" {
		t.Errorf("/healthz after leaving ARCHIVE out = %d %+v", code, h)
	}
	p.stop()
}

// TestReloadRefusesRestartChangesWhole: a reload whose file changes
// leafnodes.listen (with its jetstream.domain) and WORKER1's workers
// applies nothing: `holdfast reload` exits 1 naming the keys, the log
// says "restart holdfast" (not systemctl: no systemd here) and no "reload
// done", /healthz stays 200 ok with a warning naming them, and `holdfast
// check --running` lists both kinds of change. With the file set back,
// check --running exits 0.
func TestReloadRefusesRestartChangesWhole(t *testing.T) {
	t.Parallel()
	o := newOpsInstance(t, "", "", "workers = 2\nhandler = \"log\"\n", "")
	base, err := os.ReadFile(o.cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := startHoldfast(t, o.cfg)
	p.waitReady()
	leaf := fmt.Sprintf("127.0.0.1:%d", natstest.FreePort(t))
	next := strings.Replace(string(base), "workers = 2\n", "workers = 3\n", 1)
	next = strings.Replace(next, "max_memory_store = \"64MB\"\n", "max_memory_store = \"64MB\"\ndomain = \"hub\"\n", 1)
	next += fmt.Sprintf("\n[leafnodes]\nlisten = %q\n", leaf)
	if err := os.WriteFile(o.cfg, []byte(next), 0o600); err != nil {
		t.Fatal(err)
	}
	res := runHoldfast(t, nil, "reload", "--config", o.cfg)
	if res.code != 1 || !strings.Contains(res.stderr, "leafnodes.listen") || !strings.Contains(res.stderr, "jetstream.domain") ||
		!strings.Contains(res.stdout, "consumers.WORKER1.workers") {
		t.Fatalf("holdfast reload exited %d, want 1 naming leafnodes.listen and jetstream.domain:\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
	}
	if s := p.stderr.String(); !strings.Contains(s, "reload refused") || !strings.Contains(s, "(restart holdfast)") ||
		strings.Contains(s, "systemctl") || strings.Contains(s, "reload done") {
		t.Fatalf("the log does not refuse the reload with restart holdfast, or says reload done:\n%s", s)
	}
	out, _ := o.status(t)
	if c := findConsumer(t, out, "WORKER1"); c.Workers == nil || c.Workers.Configured != 2 {
		t.Errorf("WORKER1's workers after the refused reload: %+v, want 2", c.Workers)
	}
	if conn, err := net.Dial("tcp", leaf); err == nil {
		conn.Close()
		t.Error("the refused reload opened the leafnode listener")
	}
	const warning = "config on disk differs from the running config: restart to apply jetstream.domain, leafnodes.listen"
	natstest.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		code, h := o.health(t)
		if code != http.StatusOK || h.Status != "ok" {
			t.Fatalf("/healthz after the refused reload = %d %+v, want 200 ok with a warning", code, h)
		}
		if !slices.Contains(h.Warnings, warning) {
			return fmt.Errorf("/healthz warnings %q lack %q", h.Warnings, warning)
		}
		return nil
	})
	res = runHoldfast(t, nil, "check", "--running", "--config", o.cfg)
	if res.code != 1 || !strings.Contains(res.stdout, "needs a restart:\n  jetstream.domain\n  leafnodes.listen\n") ||
		!strings.Contains(res.stdout, "a reload applies:\n  consumers.WORKER1.workers\n") {
		t.Fatalf("holdfast check --running exited %d:\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
	}

	if err := os.WriteFile(o.cfg, base, 0o600); err != nil {
		t.Fatal(err)
	}
	res = runHoldfast(t, nil, "check", "--running", "--config", o.cfg)
	if res.code != 0 || !strings.Contains(res.stdout, "needs a restart:\n  (none)\n") {
		t.Fatalf("holdfast check --running on the running file exited %d:\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
	}
	res = runHoldfast(t, nil, "reload", "--config", o.cfg)
	if res.code != 0 || !strings.Contains(res.stdout, "reloaded "+o.cfg) {
		t.Fatalf("holdfast reload of the running file exited %d:\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
	}
	natstest.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		if _, h := o.health(t); slices.Contains(h.Warnings, warning) {
			return fmt.Errorf("/healthz still warns after the file was set back and reloaded: %q", h.Warnings)
		}
		return nil
	})
	p.stop()
}

// TestReloadWithoutCredentialsSignalsThePID: `holdfast reload --pid` (the
// unit's ExecReload) that cannot ask the running holdfast (no credentials
// for its [auth]) still checks the file first, refusing a bad one without
// a signal, and signals a good one with a warning that the log tells the
// result.
func TestReloadWithoutCredentialsSignalsThePID(t *testing.T) {
	t.Parallel()
	etc := t.TempDir()
	hashPassword(t, filepath.Join(etc, "app.hash"), "app-password-123")
	o := newOpsInstance(t, "", "", "workers = 2\nhandler = \"log\"\n",
		fmt.Sprintf("[auth.users.app]\npassword_file = %q\n", filepath.Join(etc, "app.hash")))
	base, err := os.ReadFile(o.cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := startHoldfast(t, o.cfg)
	p.waitReady()
	pid := strconv.Itoa(p.cmd.Process.Pid)

	if err := os.WriteFile(o.cfg, append(slices.Clone(base), "\n[nonsense]\n"...), 0o600); err != nil {
		t.Fatal(err)
	}
	res := runHoldfast(t, nil, "reload", "--config", o.cfg, "--pid", pid)
	if res.code != 1 || !strings.Contains(res.stderr, "reload refused") || !strings.Contains(res.stderr, "nonsense") {
		t.Fatalf("reload of a bad file without credentials: exit %d, want 1 naming the problem\n%s%s", res.code, res.stdout, res.stderr)
	}
	time.Sleep(500 * time.Millisecond) // a signal, had one been sent, is logged by now
	if s := p.stderr.String(); strings.Contains(s, `msg="reload`) {
		t.Fatalf("the bad file reached the running holdfast:\n%s", s)
	}

	if err := os.WriteFile(o.cfg, []byte(strings.Replace(string(base), "workers = 2\n", "workers = 3\n", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	res = runHoldfast(t, nil, "reload", "--config", o.cfg, "--pid", pid)
	if res.code != 0 || !strings.Contains(res.stderr, "warning: sent SIGHUP") {
		t.Fatalf("reload without credentials: exit %d, want 0 with a warning\n%s%s", res.code, res.stdout, res.stderr)
	}
	natstest.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		if s := p.stderr.String(); !strings.Contains(s, "reload done") || !strings.Contains(s, "consumers.WORKER1.workers") {
			return fmt.Errorf("the reload is not applied, or not logged with the key:\n%s", s)
		}
		return nil
	})
}

// TestReloadSaysWhatItHeldBack: a lowered limit that would delete
// messages the consumer has not processed is held back by the reload
// (the daemon logs why); `holdfast reload` printed it under "applied"
// and exited 0. It now lists it apart, with the reason, and exits 1.
func TestReloadSaysWhatItHeldBack(t *testing.T) {
	t.Parallel()
	o := newOpsInstance(t, "", "", "", "")
	p := startHoldfast(t, o.cfg)
	p.waitReady()
	_, js := e2eConnect(t, o.e2eInstance)
	e2ePublishAcked(t, js, 0, 20)
	editConfig(t, o.cfg, "subjects = [\"orders.*\"]\n", "subjects = [\"orders.*\"]\nmax_msgs = 5\n")
	res := runHoldfast(t, nil, "reload", "--config", o.cfg)
	applied, heldBack, _ := strings.Cut(res.stdout, "not applied")
	if res.code != 1 || strings.Contains(applied, "streams.ORDERS.max_msgs") || !strings.Contains(heldBack, "streams.ORDERS.max_msgs = 5 not applied: it would delete") {
		t.Fatalf("holdfast reload exited %d, want 1 with streams.ORDERS.max_msgs under \"not applied\", not applied:\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
	}
	p.stop()
}

// TestReloadOfAnotherFileRefused: holdfast reloads the file it was
// started with. `holdfast reload --config OTHER` validated OTHER, made the
// daemon reload its own file and said "applied: (none)", exit 0, as if
// OTHER had been read. It is now refused before the signal, naming both.
func TestReloadOfAnotherFileRefused(t *testing.T) {
	t.Parallel()
	o := newOpsInstance(t, "", "", "", "")
	p := startHoldfast(t, o.cfg)
	p.waitReady()
	other := filepath.Join(t.TempDir(), "holdfast.toml")
	if err := os.WriteFile(other, []byte(strings.Replace(readFile(t, o.cfg), "subjects = [\"orders.*\"]\n", "subjects = [\"orders.*\"]\nmax_age = \"1h\"\n", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	res := runHoldfast(t, nil, "reload", "--config", other)
	if res.code != 2 || !strings.Contains(res.stderr, "holdfast runs with "+o.cfg) || !strings.Contains(res.stderr, other) {
		t.Fatalf("holdfast reload --config %s exited %d, want 2 naming both files:\nstdout:\n%s\nstderr:\n%s", other, res.code, res.stdout, res.stderr)
	}
	if strings.Contains(p.stderr.String(), "reload") {
		t.Fatalf("the daemon reloaded:\n%s", p.stderr.String())
	}
	if res := runHoldfast(t, nil, "reload", "--config", o.cfg); res.code != 0 {
		t.Fatalf("holdfast reload of its own file: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	p.stop()
}

// TestReloadAfterPicksTheReloadOfItsSignal: two askers at once, whose
// signals made reloads 6 (which applied the change) and 7 (nothing left
// to apply): each gets the first reload that started after its signal,
// also when both ended before it read, rather than the last one, which
// told the first asker "applied: (none)".
func TestReloadAfterPicksTheReloadOfItsSignal(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	r := &daemon.ReloadReply{Recent: []daemon.ReloadResult{
		{Seq: 5, Started: at(-5000)},
		{Seq: 6, Started: at(10), Plan: daemon.ReloadPlan{Apply: []string{"consumers.WORKER1.workers"}}},
		{Seq: 7, Started: at(40)},
	}}
	r.LastReload = &r.Recent[2]
	for _, tc := range []struct {
		sent time.Time
		want uint64
	}{{at(0), 6}, {at(20), 7}, {at(50), 0}} {
		got := reloadAfter(r, 5, tc.sent)
		if (got == nil && tc.want != 0) || (got != nil && got.Seq != tc.want) {
			t.Errorf("signal at %s: reload %v, want %d", tc.sent.Format("15:04:05.000"), got, tc.want)
		}
	}
	// A holdfast from before Recent: the last reload after the asker's.
	old := &daemon.ReloadReply{LastReload: &daemon.ReloadResult{Seq: 7}}
	if got := reloadAfter(old, 5, at(0)); got == nil || got.Seq != 7 {
		t.Errorf("without Recent: %v, want reload 7", got)
	}
}

// TestCheckRunningNamesWhatTheServerCannotChange: a file that changes a
// stream's retention (which the server cannot change in place) is one a
// reload refuses as a whole, and a restart too: holdfast check --running
// says so and exits 1, naming the key, as the reload then does.
func TestCheckRunningNamesWhatTheServerCannotChange(t *testing.T) {
	t.Parallel()
	o := newOpsInstance(t, "", "", "", "")
	p := startHoldfast(t, o.cfg)
	p.waitReady()
	editConfig(t, o.cfg, "subjects = [\"orders.*\"]\n", "subjects = [\"orders.*\"]\nretention = \"interest\"\n")
	res := runHoldfast(t, nil, "check", "--running", "--config", o.cfg)
	if res.code != 1 || !strings.Contains(res.stdout, "stream ORDERS: retention is Limits on the server but the config says Interest") ||
		!strings.Contains(res.stdout, "streams.ORDERS.retention") || !strings.Contains(res.stderr, "a reload would be refused") {
		t.Errorf("holdfast check --running exited %d, want 1 naming the retention the server cannot change:\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
	}
	res = runHoldfast(t, nil, "reload", "--config", o.cfg)
	if res.code != 1 || !strings.Contains(res.stderr, "retention is Limits on the server") {
		t.Errorf("holdfast reload exited %d, want 1 naming the retention:\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
	}
	p.stop()
}

// TestReloadOfItsFileStartedRelative: holdfast started with a relative
// --config (from the config's directory) reloads that file when asked
// with its absolute path from elsewhere. The daemon answered with the
// path as given ("holdfast.toml"), which the asker resolved against its
// own directory, and the reload was refused as one of "another file".
func TestReloadOfItsFileStartedRelative(t *testing.T) {
	t.Parallel()
	o := newOpsInstance(t, "", "", "", "")
	cmd := exec.Command(holdfastBin, "run", "--config", filepath.Base(o.cfg))
	cmd.Env = e2eEnv()
	cmd.Dir = filepath.Dir(o.cfg)
	p := startCmd(t, cmd)
	p.waitReady()
	res := runHoldfast(t, nil, "reload", "--config", o.cfg)
	if res.code != 0 || !strings.Contains(res.stdout, "applied:") {
		t.Fatalf("holdfast reload --config %s of the file holdfast runs with: exit %d, want 0\nstdout:\n%s\nstderr:\n%s", o.cfg, res.code, res.stdout, res.stderr)
	}
	p.stop()
}
