package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/internal/natstest"
)

func TestVersionPrintsNATSServerVersion(t *testing.T) {
	t.Parallel()
	res := runHoldfast(t, nil, "version")
	if res.code != 0 {
		t.Fatalf("holdfast version exited %d: %s", res.code, res.stderr)
	}
	if !strings.HasPrefix(res.stdout, "holdfast ") || !strings.Contains(res.stdout, "nats-server "+server.VERSION) {
		t.Errorf("holdfast version = %q, want the holdfast version and nats-server %s", res.stdout, server.VERSION)
	}
}

func TestUnknownCommandIsUsageError(t *testing.T) {
	t.Parallel()
	res := runHoldfast(t, nil, "frobnicate")
	if res.code != 2 {
		t.Errorf("holdfast frobnicate exited %d, want 2", res.code)
	}
	if !strings.Contains(res.stderr, "frobnicate") {
		t.Errorf("stderr does not name the unknown command: %q", res.stderr)
	}
}

func TestUnknownFlagIsUsageError(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"--frobnicate", "check"}, {"check", "--frobnicate"}, {"run", "--frobnicate"}} {
		res := runHoldfast(t, nil, args...)
		if res.code != 2 {
			t.Errorf("holdfast %s exited %d, want 2 (usage error)\nstderr: %s", strings.Join(args, " "), res.code, res.stderr)
		}
	}
}

// `holdfast config` prints a file that `holdfast check` accepts, read
// from a pipe.
func TestConfigOutputPassesCheck(t *testing.T) {
	t.Parallel()
	store := filepath.Join(t.TempDir(), "store")
	cfg := runHoldfast(t, nil, "config", "--store-dir", store)
	if cfg.code != 0 {
		t.Fatalf("holdfast config exited %d: %s", cfg.code, cfg.stderr)
	}
	if !strings.Contains(cfg.stdout, "[streams.ORDERS]") || !strings.Contains(cfg.stdout, "#") {
		t.Errorf("holdfast config does not print a commented file with [streams.ORDERS]:\n%s", cfg.stdout)
	}

	check := runHoldfast(t, []byte(cfg.stdout), "check", "--config", "/dev/stdin")
	if check.code != 0 {
		t.Fatalf("holdfast check --config /dev/stdin (holdfast config's output) exited %d:\n%s%s", check.code, check.stdout, check.stderr)
	}
	if !strings.Contains(check.stdout, "ok") {
		t.Errorf("holdfast check did not report ok: %q", check.stdout)
	}
	// Without side effects: run creates the store dir, check does not.
	if _, err := os.Stat(store); !os.IsNotExist(err) {
		t.Errorf("check created the store dir %s (stat: %v)", store, err)
	}

	// The same file through HOLDFAST_CONFIG and the global flag.
	path := e2eWriteConfig(t, cfg.stdout)
	if res := runHoldfast(t, nil, "--config", path, "check"); res.code != 0 {
		t.Errorf("holdfast --config FILE check exited %d:\n%s", res.code, res.stderr)
	}
	if res := e2eRunBinary(t, holdfastBin, []string{"HOLDFAST_CONFIG=" + path}, nil, "check"); res.code != 0 || !strings.Contains(res.stdout, path) {
		t.Errorf("HOLDFAST_CONFIG=FILE holdfast check exited %d without naming the file:\n%s%s", res.code, res.stdout, res.stderr)
	}
}

func TestCheckListsEveryProblem(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	notADir := filepath.Join(dir, "file")
	if err := os.WriteFile(notADir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	path := e2eWriteConfig(t, fmt.Sprintf(`[server]
port = 70000

[jetstream]
store_dir = %q
sync = "sometimes"

[log]
level = "loud"

[streams.ORDERS]
subjects = ["orders.*"]
max_age = "-1h"

[consumers.WORKER1]
stream = "ORDERS"
max_deliver = 0
ack_wait = "soon"
`, notADir))
	res := runHoldfast(t, nil, "check", "--config", path)
	if res.code != 1 {
		t.Errorf("holdfast check with a bad config exited %d, want 1", res.code)
	}
	out := res.stdout + res.stderr
	for _, want := range []string{
		"server.port",
		"jetstream.sync",
		"log.level",
		"streams.ORDERS.max_age",
		"consumers.WORKER1.max_deliver",
		"consumers.WORKER1.ack_wait",
		notADir + ": not a directory",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("holdfast check output does not mention %q:\n%s", want, out)
		}
	}
}

func TestRunWithBadConfigIsUsageError(t *testing.T) {
	t.Parallel()
	path := e2eWriteConfig(t, e2eConfigTOML(filepath.Join(t.TempDir(), "store"), natstest.FreePort(t), `max_deliver = 0
`))
	res := runHoldfast(t, nil, "run", "--config", path)
	if res.code != 2 {
		t.Errorf("holdfast run with a bad config exited %d, want 2", res.code)
	}
	if !strings.Contains(res.stderr, "Error:") || !strings.Contains(res.stderr, "consumers.WORKER1.max_deliver") {
		t.Errorf("stderr does not say Error: and name the key:\n%s", res.stderr)
	}

	// An unknown key is a config error too.
	path = e2eWriteConfig(t, e2eConfigTOML(filepath.Join(t.TempDir(), "store"), natstest.FreePort(t), `max_delivery = 3
`))
	res = runHoldfast(t, nil, "run", "--config", path)
	if res.code != 2 || !strings.Contains(res.stderr, "Error:") || !strings.Contains(res.stderr, "max_delivery") {
		t.Errorf("holdfast run with an unknown key exited %d, want 2 and the key named:\n%s", res.code, res.stderr)
	}
}

// The seed's durability check: every message acknowledged with a PubAck is
// still in the stream after a graceful stop and after kill -9.
func TestDurabilityAcrossRestarts(t *testing.T) {
	t.Parallel()
	in := newE2EInstance(t)
	const n = 500

	d := startHoldfast(t, in.cfg)
	d.waitReady()
	nc, js := e2eConnect(t, in)
	e2ePublishAcked(t, js, 0, n)
	if got := natstest.StreamInfo(t, js, "ORDERS").State.Msgs; got != n {
		t.Fatalf("ORDERS has %d messages after %d acked publishes", got, n)
	}
	nc.Close()
	d.stop()

	d = startHoldfast(t, in.cfg)
	d.waitReady()
	nc, js = e2eConnect(t, in)
	st := natstest.StreamInfo(t, js, "ORDERS").State
	if st.Msgs != n || st.FirstSeq != 1 || st.LastSeq != n {
		t.Fatalf("after SIGTERM and restart ORDERS has %d messages (seq %d..%d), want %d (1..%d)", st.Msgs, st.FirstSeq, st.LastSeq, n, n)
	}
	e2ePublishAcked(t, js, n, n)
	if got := natstest.StreamInfo(t, js, "ORDERS").State.Msgs; got != 2*n {
		t.Fatalf("ORDERS has %d messages after %d more acked publishes", got, n)
	}
	nc.Close()
	if code := d.signal(syscall.SIGKILL); code != -1 {
		t.Fatalf("holdfast exited with %d, want killed by SIGKILL", code)
	}

	d = startHoldfast(t, in.cfg)
	d.waitReady()
	_, js = e2eConnect(t, in)
	st = natstest.StreamInfo(t, js, "ORDERS").State
	if st.Msgs != 2*n || st.FirstSeq != 1 || st.LastSeq != 2*n {
		t.Fatalf("after kill -9 and restart ORDERS has %d messages (seq %d..%d), want %d (1..%d)", st.Msgs, st.FirstSeq, st.LastSeq, 2*n, 2*n)
	}
	// Spot-check content: the first and the last acked message.
	s, err := js.Stream(natstest.Context(t), "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	for _, seq := range []uint64{1, 2 * n} {
		m, err := s.GetMsg(natstest.Context(t), seq)
		if err != nil {
			t.Fatalf("get message %d: %v", seq, err)
		}
		if want := fmt.Sprintf(`{"id":"%d"}`, seq-1); string(m.Data) != want {
			t.Errorf("message %d = %q, want %q", seq, m.Data, want)
		}
	}
	d.stop()
}

// e2ePublishAcked publishes count messages with ids from, from+1, ... and
// waits for each PubAck.
func e2ePublishAcked(t *testing.T, js jetstream.JetStream, from, count int) {
	t.Helper()
	ctx := natstest.Context(t)
	for i := from; i < from+count; i++ {
		ack, err := js.Publish(ctx, "orders.created", fmt.Appendf(nil, `{"id":"%d"}`, i))
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		if ack.Stream != "ORDERS" || ack.Sequence != uint64(i+1) {
			t.Fatalf("publish %d acked as %s #%d, want ORDERS #%d", i, ack.Stream, ack.Sequence, i+1)
		}
	}
}

func TestSecondInstanceOnSameStoreIsRefused(t *testing.T) {
	t.Parallel()
	in := newE2EInstance(t)
	first := startHoldfast(t, in.cfg)
	first.waitReady()

	// Same store, another port: only the store can be the problem.
	other := e2eWriteConfig(t, e2eConfigTOML(in.store, natstest.FreePort(t), ""))
	res := runHoldfast(t, nil, "run", "--config", other)
	if res.code != 1 {
		t.Errorf("second holdfast on the same store exited %d, want 1", res.code)
	}
	pid := fmt.Sprint(first.cmd.Process.Pid)
	if !strings.Contains(res.stderr, "locked") || !strings.Contains(res.stderr, in.store) || !strings.Contains(res.stderr, pid) {
		t.Errorf("second holdfast does not say the store %s is locked by process %s:\n%s", in.store, pid, res.stderr)
	}
	// The same config a second time (a second `make run`): its HTTP and
	// client ports are taken too, and the lock is what it names.
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	same := e2eWriteConfig(t, strings.Replace(e2eConfigTOML(in.store, in.port, ""), "[http]\nlisten = \"\"",
		fmt.Sprintf("[http]\nlisten = %q", busy.Addr().String()), 1))
	res = runHoldfast(t, nil, "run", "--config", same)
	if res.code != 1 || !strings.Contains(res.stderr, "locked") || !strings.Contains(res.stderr, pid) || strings.Contains(res.stderr, "address already in use") {
		t.Errorf("holdfast on the same store and ports exited %d; want 1 naming the lock held by %s, not a port:\n%s", res.code, pid, res.stderr)
	}
	// check notes the running instance but passes.
	if res := runHoldfast(t, nil, "check", "--config", other); res.code != 0 || !strings.Contains(res.stdout, "in use") {
		t.Errorf("holdfast check next to a running instance exited %d, want 0 with a note:\n%s%s", res.code, res.stdout, res.stderr)
	}

	if first.exited() {
		t.Fatal("the first holdfast exited")
	}
	_, js := e2eConnect(t, in)
	e2ePublishAcked(t, js, 0, 1)
	first.stop()
}

// The standard nats CLI works against holdfast.
func TestNATSCLI(t *testing.T) {
	t.Parallel()
	in := newE2EInstance(t)
	d := startHoldfast(t, in.cfg)
	d.waitReady()
	nats := func(args ...string) e2eResult {
		t.Helper()
		res := e2eRunBinary(t, natsBin, nil, nil, append([]string{"--server", in.url()}, args...)...)
		if res.code != 0 {
			t.Fatalf("nats %s exited %d:\n%s%s", strings.Join(args, " "), res.code, res.stdout, res.stderr)
		}
		return res
	}

	if res := nats("server", "check", "jetstream"); !strings.HasPrefix(res.stdout, "OK") {
		t.Errorf("nats server check jetstream did not report OK:\n%s", res.stdout)
	}

	info := nats("stream", "info", "ORDERS").stdout
	for _, re := range []string{
		`Information for Stream ORDERS`,
		`Subjects: orders\.\*\n`,
		`Storage: File\n`,
		`Retention: Limits\n`,
		`Maximum Messages: 1,000,000\n`,
		`Maximum Age: 3d0h0m0s\n`,
		`Messages: 0\n`,
	} {
		if !regexp.MustCompile(re).MatchString(info) {
			t.Errorf("nats stream info ORDERS does not match %q:\n%s", re, info)
		}
	}

	nats("pub", "orders.created", `{"id":"123"}`)
	_, js := e2eConnect(t, in)
	// A plain (core) publish: the stream stores it asynchronously.
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if got := natstest.StreamInfo(t, js, "ORDERS").State.Msgs; got != 1 {
			return fmt.Errorf("ORDERS has %d messages, want 1", got)
		}
		return nil
	})
	s, err := js.Stream(natstest.Context(t), "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(natstest.Context(t), "orders.created")
	if err != nil {
		t.Fatal(err)
	}
	if string(m.Data) != `{"id":"123"}` {
		t.Errorf("ORDERS holds %q, want {\"id\":\"123\"}", m.Data)
	}
	if info := nats("stream", "info", "ORDERS").stdout; !regexp.MustCompile(`Messages: 1\n`).MatchString(info) {
		t.Errorf("nats stream info ORDERS does not show the message:\n%s", info)
	}
	d.stop()
}

func TestSIGINTStopsLikeSIGTERM(t *testing.T) {
	t.Parallel()
	in := newE2EInstance(t)
	d := startHoldfast(t, in.cfg)
	d.waitReady()
	_, js := e2eConnect(t, in)
	e2ePublishAcked(t, js, 0, 10)
	if code := d.signal(syscall.SIGINT); code != 0 {
		t.Fatalf("holdfast exited with %d after SIGINT, want 0", code)
	}
	if !strings.Contains(d.stderr.String(), "holdfast stopped") {
		t.Fatalf("holdfast did not log \"holdfast stopped\" after SIGINT")
	}

	d = startHoldfast(t, in.cfg)
	d.waitReady()
	_, js = e2eConnect(t, in)
	if got := natstest.StreamInfo(t, js, "ORDERS").State.Msgs; got != 10 {
		t.Errorf("after SIGINT and restart ORDERS has %d messages, want 10", got)
	}
	d.stop()
}
