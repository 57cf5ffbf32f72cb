package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/internal/natstest"
	"github.com/holdfast-io/holdfast/pipeline"
)

// e2eScript writes an executable sh script and returns its path.
func e2eScript(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "handler.sh")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// e2eLines reads a file of lines written by a handler script; a missing
// file has none.
func e2eLines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

func e2eDeadLetters(t *testing.T, js jetstream.JetStream, stream string) []pipeline.DeadLetter {
	t.Helper()
	var out []pipeline.DeadLetter
	if err := pipeline.ListDeadLetters(natstest.Context(t), js, stream, "", func(dl pipeline.DeadLetter) error {
		out = append(out, dl)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func e2ePipelineConfig(t *testing.T, in *e2eInstance, script, consumerExtra string) {
	t.Helper()
	in.cfg = e2eWriteConfig(t, strings.Replace(e2eConfigTOML(in.store, in.port, ""), "workers = 0\n", fmt.Sprintf(`workers = 4
ack_wait = "3s"
max_deliver = 5
backoff = ["100ms"]
handler = "exec"
%s
[consumers.WORKER1.exec]
command = [%q]
timeout = "20s"

[run]
shutdown_timeout = "2s"
`, consumerExtra, script), 1))
}

// TestExecPipelineCompleteAcrossKill sends 300 messages through an exec
// handler that fails a known subset transiently and another permanently,
// kills holdfast with SIGKILL while it processes, restarts it, and checks
// that every message was processed or dead-lettered: duplicates allowed,
// loss not. No handler sees less than its message: a handler holdfast
// started ran on after the kill with its stdin cut short (an empty
// payload here), and succeeded.
func TestExecPipelineCompleteAcrossKill(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("end-to-end pipeline run")
	}
	dir := t.TempDir()
	out := filepath.Join(dir, "processed")
	script := e2eScript(t, fmt.Sprintf(`id=$(cat)
n=${id#m-}
case $((n %% 10)) in
3) echo "permanent failure for $id" >&2; exit 65 ;;
7) if [ "$HOLDFAST_DELIVERY" -lt 2 ]; then echo "transient failure for $id" >&2; exit 1; fi ;;
esac
echo "$id $HOLDFAST_SEQ $HOLDFAST_DELIVERY" >> %q
`, out))
	in := newE2EInstance(t)
	e2ePipelineConfig(t, in, script, "")

	const total = 300
	p := startHoldfast(t, in.cfg)
	p.waitReady()
	_, js := e2eConnect(t, in)
	for i := 0; i < total; i++ {
		if _, err := js.PublishAsync("orders.created", []byte(fmt.Sprintf("m-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(60 * time.Second):
		t.Fatal("publishes not acknowledged")
	}
	if st := natstest.StreamInfo(t, js, "ORDERS").State; st.Msgs != total {
		t.Fatalf("stream holds %d messages, want %d", st.Msgs, total)
	}
	// Kill it in the middle of the work.
	natstest.CheckFor(t, 60*time.Second, 10*time.Millisecond, func() error {
		if n := len(e2eLines(t, out)); n < total/4 {
			return fmt.Errorf("%d processed", n)
		}
		return nil
	})
	p.signal(syscall.SIGKILL)
	killedAt := len(e2eLines(t, out))

	p = startHoldfast(t, in.cfg)
	p.waitReady()
	_, js = e2eConnect(t, in)
	want := map[string]bool{} // id → should be processed (false: dead letter)
	for i := 0; i < total; i++ {
		want[fmt.Sprintf("m-%d", i)] = i%10 != 3
	}
	var processed map[string]int
	var dead map[string]int
	natstest.CheckFor(t, 120*time.Second, 200*time.Millisecond, func() error {
		processed = map[string]int{}
		for _, l := range e2eLines(t, out) {
			processed[strings.Fields(l)[0]]++
		}
		dead = map[string]int{}
		for _, dl := range e2eDeadLetters(t, js, "ORDERS_DLQ") {
			dead[string(dl.Data)]++
		}
		for id, ok := range want {
			if ok && processed[id] == 0 {
				return fmt.Errorf("%s not processed yet (%d processed, %d dead)", id, len(processed), len(dead))
			}
			if !ok && dead[id] == 0 {
				return fmt.Errorf("%s not dead-lettered yet (%d processed, %d dead)", id, len(processed), len(dead))
			}
		}
		return nil
	})
	for id, ok := range want {
		if !ok && processed[id] > 0 {
			t.Errorf("%s must fail permanently but was processed", id)
		}
		if ok && dead[id] > 0 {
			t.Errorf("%s was dead-lettered but should succeed", id)
		}
		if dead[id] > 1 {
			t.Errorf("%s dead-lettered %d times: the Nats-Msg-Id should deduplicate", id, dead[id])
		}
	}
	// A handler never sees a payload that is not the message: one left
	// running by the killed holdfast read its stdin cut short.
	for _, l := range e2eLines(t, out) {
		if id := strings.Fields(l)[0]; !strings.HasPrefix(id, "m-") {
			t.Errorf("a handler saw payload %q (line %q): not a message's", id, l)
		}
	}
	dups := 0
	for _, n := range processed {
		dups += n - 1
	}
	t.Logf("killed after %d processed; afterwards %d processed, %d dead letters, %d duplicate deliveries", killedAt, len(processed), len(dead), dups)
	p.stop()
}

// TestExecHandlerDiesWithHoldfast: a handler whose holdfast is killed
// (kill -9, the OOM killer) before it wrote the whole payload to the
// handler's stdin must not run on: it would read the payload cut short
// and act on it as the message. It ran on, and here recorded 65,536 of
// 200,000 bytes.
func TestExecHandlerDiesWithHoldfast(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "out")
	// It reads its stdin only after holdfast blocked writing it: more
	// than a pipe holds.
	script := e2eScript(t, fmt.Sprintf(`echo started >> %[1]q
sleep 2
echo "read $(wc -c) bytes" >> %[1]q
`, out))
	in := newE2EInstance(t)
	e2ePipelineConfig(t, in, script, "")
	p := startHoldfast(t, in.cfg)
	p.waitReady()
	_, js := e2eConnect(t, in)
	if _, err := js.Publish(natstest.Context(t), "orders.created", bytes.Repeat([]byte("x"), 200_000)); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		if len(e2eLines(t, out)) == 0 {
			return errors.New("the handler did not start")
		}
		return nil
	})
	p.signal(syscall.SIGKILL)
	time.Sleep(3 * time.Second) // the handler's sleep, and then some
	if lines := e2eLines(t, out); len(lines) != 1 {
		t.Errorf("the handler ran on after holdfast was killed: %q", lines)
	}
}

// TestDrainOnSIGTERM: in-flight handlers that finish within
// shutdown_timeout are acked; one that does not is killed and returned,
// and only that one is processed again after a restart — at once, not
// ack_wait (a minute here) after its first delivery.
func TestDrainOnSIGTERM(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	script := e2eScript(t, fmt.Sprintf(`id=$(cat)
echo "start $id $HOLDFAST_DELIVERY" >> %[1]q
case "$id" in
slow*) sleep 1 ;;
stuck) [ "$HOLDFAST_DELIVERY" -lt 2 ] && sleep 60 ;;
esac
echo "done $id $HOLDFAST_DELIVERY" >> %[1]q
`, log))
	in := newE2EInstance(t)
	e2ePipelineConfig(t, in, script, "")
	text, err := os.ReadFile(in.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(in.cfg, bytes.Replace(text, []byte(`ack_wait = "3s"`), []byte(`ack_wait = "1m"`), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startHoldfast(t, in.cfg)
	p.waitReady()
	_, js := e2eConnect(t, in)
	for _, id := range []string{"slow1", "slow2", "stuck"} {
		if _, err := js.Publish(natstest.Context(t), "orders.created", []byte(id)); err != nil {
			t.Fatal(err)
		}
	}
	natstest.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		if n := len(e2eLines(t, log)); n < 3 {
			return fmt.Errorf("%d handlers started", n)
		}
		return nil
	})
	p.stop()
	lines := strings.Join(e2eLines(t, log), "\n")
	for _, l := range []string{"done slow1 1", "done slow2 1"} {
		if !strings.Contains(lines, l) {
			t.Fatalf("in-flight handler did not finish before shutdown: no %q in\n%s", l, lines)
		}
	}
	if strings.Contains(lines, "done stuck") {
		t.Fatalf("stuck handler finished?\n%s", lines)
	}
	if !strings.Contains(p.stderr.String(), "shutdown timeout") {
		t.Fatalf("no shutdown-timeout log line:\n%s", p.stderr.String())
	}

	p = startHoldfast(t, in.cfg)
	p.waitReady()
	natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		if !strings.Contains(strings.Join(e2eLines(t, log), "\n"), "done stuck 2") {
			return fmt.Errorf("stuck message not reprocessed within 30 s of the restart (ack_wait is a minute): its nak at the stop did not outlast the server")
		}
		return nil
	})
	p.stop()
	starts := map[string]int{}
	for _, l := range e2eLines(t, log) {
		if f := strings.Fields(l); f[0] == "start" {
			starts[f[1]]++
		}
	}
	if starts["slow1"] != 1 || starts["slow2"] != 1 || starts["stuck"] != 2 {
		t.Fatalf("handler starts %v: want the finished ones once, the interrupted one twice", starts)
	}
}

// TestDLQReplay: a dead letter replayed with `holdfast dlq replay` goes back
// to its original subject and is processed.
func TestDLQReplay(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	fixed := filepath.Join(dir, "fixed")
	out := filepath.Join(dir, "processed")
	script := e2eScript(t, fmt.Sprintf(`id=$(cat)
[ -e %q ] || { echo "cannot handle $id yet" >&2; exit 65; }
echo "$id $HOLDFAST_HEADER_HOLDFAST_REPLAYED_FROM" >> %q
`, fixed, out))
	in := newE2EInstance(t)
	e2ePipelineConfig(t, in, script, "")
	p := startHoldfast(t, in.cfg)
	p.waitReady()
	_, js := e2eConnect(t, in)
	for _, id := range []string{"a", "b", "c"} {
		if _, err := js.Publish(natstest.Context(t), "orders.created", []byte(id)); err != nil {
			t.Fatal(err)
		}
	}
	natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		if n := len(e2eDeadLetters(t, js, "ORDERS_DLQ")); n != 3 {
			return fmt.Errorf("%d dead letters", n)
		}
		return nil
	})
	ls := runHoldfast(t, nil, "--config", in.cfg, "dlq", "ls")
	if ls.code != 0 || !strings.Contains(ls.stdout, "3 dead letter(s)") || !strings.Contains(ls.stdout, "cannot handle b yet") {
		t.Fatalf("dlq ls: %d\n%s%s", ls.code, ls.stdout, ls.stderr)
	}
	if err := os.WriteFile(fixed, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	one := runHoldfast(t, nil, "--config", in.cfg, "dlq", "replay", "2")
	if one.code != 0 {
		t.Fatalf("dlq replay 2: %d\n%s%s", one.code, one.stdout, one.stderr)
	}
	all := runHoldfast(t, nil, "--config", in.cfg, "dlq", "replay", "--all")
	if all.code != 0 || !strings.Contains(all.stdout, "replayed 2 of 2") {
		t.Fatalf("dlq replay --all: %d\n%s%s", all.code, all.stdout, all.stderr)
	}
	natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		if n := len(e2eLines(t, out)); n != 3 {
			return fmt.Errorf("%d processed after replay", n)
		}
		return nil
	})
	if n := len(e2eDeadLetters(t, js, "ORDERS_DLQ")); n != 0 {
		t.Fatalf("%d dead letters left after replay", n)
	}
	// Each replayed message says which dead letter it came from; dead
	// letters are numbered in the order the workers failed them.
	from := map[string]bool{}
	for _, l := range e2eLines(t, out) {
		f := strings.Fields(l)
		if len(f) != 2 || !strings.HasPrefix(f[1], "ORDERS_DLQ:") {
			t.Fatalf("replayed message lacks Holdfast-Replayed-From: %q", l)
		}
		from[f[1]] = true
	}
	if len(from) != 3 {
		t.Fatalf("replayed from %v, want 3 distinct dead letters", from)
	}
	purge := runHoldfast(t, nil, "--config", in.cfg, "dlq", "purge")
	if purge.code != 2 || !strings.Contains(purge.stderr, "--yes") {
		t.Fatalf("dlq purge without --yes: %d\n%s", purge.code, purge.stderr)
	}
	p.stop()
}
