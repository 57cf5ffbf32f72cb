package handler

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/holdfast-io/holdfast/internal/natstest"
)

// helperArg marks a run of the test binary as the exec helper: the test
// binary then acts as a handler command, see TestExecHelperProcess.
const helperArg = "holdfast-exec-helper"

// helperNewArg makes a run of the test binary call NewExec on the
// command given after it and print the error or "ok" (see
// TestExecHelperProcess).
const helperNewArg = "holdfast-exec-new-handler"

// TestExecHelperProcess is not a test: run with "-- holdfast-exec-helper DIR"
// it writes its stdin to DIR/stdin and its environment (as JSON) to DIR/env,
// then exits 0.
func TestExecHelperProcess(t *testing.T) {
	args := flag.Args()
	if len(args) == 2 && args[0] == helperNewArg {
		if _, err := NewExec(ExecOptions{Command: []string{args[1]}}, nil); err != nil {
			fmt.Println(err)
		} else {
			fmt.Println("ok")
		}
		os.Exit(0)
	}
	if len(args) != 2 || args[0] != helperArg {
		return
	}
	dir := args[1]
	stdin, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	env, err := json.Marshal(os.Environ())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := os.WriteFile(filepath.Join(dir, "stdin"), stdin, 0o600); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := os.WriteFile(filepath.Join(dir, "env"), env, 0o600); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// shCommand is a Command that runs a shell script, with args as $1...
// Tests that need no file of their own use it: writing an executable while
// another goroutine forks can make exec fail with "text file busy".
func shCommand(script string, args ...string) []string {
	return append([]string{"/bin/sh", "-c", script, "handler"}, args...)
}

// writeScript writes an executable /bin/sh script and returns its path.
func writeScript(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "handler.sh")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// newExec returns an Exec handler for opts, failing the test on error.
func newExec(t *testing.T, opts ExecOptions, logger *slog.Logger) *Exec {
	t.Helper()
	h, err := NewExec(opts, logger)
	if err != nil {
		t.Fatalf("NewExec(%q): %v", opts.Command, err)
	}
	return h
}

// readPID returns the pid a script wrote to path, or an error while the
// file is missing or incomplete.
func readPID(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	if !bytes.HasSuffix(b, []byte("\n")) {
		return 0, fmt.Errorf("%s is incomplete: %q", path, b)
	}
	return strconv.Atoi(string(bytes.TrimSpace(b)))
}

// processGone reports whether pid no longer runs. A zombie counts as gone:
// its parent was killed, and in a container nothing may reap it soon.
func processGone(pid int) error {
	err := syscall.Kill(pid, 0)
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	stat, rerr := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if errors.Is(rerr, os.ErrNotExist) {
		if _, err := os.Stat("/proc/self/stat"); err == nil {
			return nil
		}
	}
	if rerr == nil {
		// The state follows the command name, which is in parentheses.
		if i := bytes.LastIndexByte(stat, ')'); i >= 0 {
			if f := strings.Fields(string(stat[i+1:])); len(f) > 0 && (f[0] == "Z" || f[0] == "X") {
				return nil
			}
		}
	}
	return fmt.Errorf("process %d still runs (kill 0: %v)", pid, err)
}

// killAtCleanup makes sure a process a test started does not outlive it.
func killAtCleanup(t *testing.T, pid int) {
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
}

func TestNewExecValidation(t *testing.T) {
	dir := t.TempDir()
	plain := filepath.Join(dir, "not-executable")
	if err := os.WriteFile(plain, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	script := writeScript(t, "exit 0")

	for _, tc := range []struct {
		name string
		opts ExecOptions
		want string // in the error; "" means no error
	}{
		{"no command", ExecOptions{}, "no command"},
		{"empty command", ExecOptions{Command: []string{""}}, "no command"},
		{"relative path", ExecOptions{Command: []string{"process-order"}}, `"process-order" is not an absolute path`},
		{"dot path", ExecOptions{Command: []string{"./process-order"}}, `"./process-order" is not an absolute path`},
		{"missing", ExecOptions{Command: []string{filepath.Join(dir, "missing")}}, filepath.Join(dir, "missing")},
		{"directory", ExecOptions{Command: []string{dir}}, dir + " is a directory"},
		{"not executable", ExecOptions{Command: []string{plain}}, plain + " is not executable"},
		{"NUL in an argument", ExecOptions{Command: []string{script, "a\x00b"}}, `command[1] "a\x00b" contains a NUL byte`},
		{"NUL in the program", ExecOptions{Command: []string{script + "\x00"}}, "command[0]"},
		{"negative timeout", ExecOptions{Command: []string{script}, Timeout: -time.Second}, "timeout -1s is negative"},
		{"negative stderr limit", ExecOptions{Command: []string{script}, StderrLimit: -1}, "stderr limit -1 is negative"},
		{"valid", ExecOptions{Command: []string{script, "--flag"}, Timeout: time.Second}, ""},
		{"valid without timeout", ExecOptions{Command: []string{script}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := NewExec(tc.opts, nil)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				if h.stderrLimit != DefaultStderrLimit {
					t.Errorf("stderr limit = %d, want %d", h.stderrLimit, DefaultStderrLimit)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want one containing %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}

func TestExecKeepsItsOwnCommand(t *testing.T) {
	script := writeScript(t, `[ "$1" = keep ] || exit 1`)
	cmd := []string{script, "keep"}
	h := newExec(t, ExecOptions{Command: cmd}, nil)
	cmd[1] = "changed"
	if r := h.Handle(context.Background(), testMessage()); r.Outcome != Success {
		t.Fatalf("result = %+v, want success", r)
	}
}

func TestExecExitStatus(t *testing.T) {
	for _, tc := range []struct {
		name    string
		script  string
		want    Outcome
		reasons []string // each must be in the reason
	}{
		{"exit 0", "exit 0", Success, nil},
		{"exit 0 with stderr", "echo all fine >&2; exit 0", Success, nil},
		{"exit 65", "echo 'parsing order' >&2; echo 'bad record: no sku' >&2; exit 65", Permanent,
			[]string{"exit status 65", "EX_DATAERR", "bad record: no sku"}},
		{"exit 65 without stderr", "exit 65", Permanent, []string{"exit status 65"}},
		{"exit 1", "echo 'database unreachable' >&2; exit 1", Retry, []string{"exit status 1", "database unreachable"}},
		{"exit 2", "exit 2", Retry, []string{"exit status 2"}},
		{"exit 64", "exit 64", Retry, []string{"exit status 64"}},
		{"exit 75", "exit 75", Retry, []string{"exit status 75"}},
		{"killed by a signal", "echo dying >&2; kill -KILL $$", Retry, []string{"killed by signal killed", "dying"}},
		{"terminated by a signal", "kill -TERM $$", Retry, []string{"killed by signal terminated"}},
		{"control characters in stderr", `printf 'bad\tinput\033[31m red\r\n' >&2; exit 65`, Permanent, []string{"bad input [31m red"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newExec(t, ExecOptions{Command: shCommand(tc.script), Timeout: time.Minute}, nil)
			r := h.Handle(context.Background(), testMessage())
			if r.Outcome != tc.want {
				t.Fatalf("outcome = %s (%q), want %s", r.Outcome, r.Reason, tc.want)
			}
			if tc.want == Success && r != Ok() {
				t.Errorf("result = %+v, want Ok()", r)
			}
			for _, want := range tc.reasons {
				if !strings.Contains(r.Reason, want) {
					t.Errorf("reason %q does not contain %q", r.Reason, want)
				}
			}
			if strings.ContainsAny(r.Reason, "\r\n\x1b") {
				t.Errorf("reason %q has control characters", r.Reason)
			}
			if r.RetryAfter != 0 {
				t.Errorf("RetryAfter = %s, want 0", r.RetryAfter)
			}
		})
	}
}

func TestExecStdinAndEnvironment(t *testing.T) {
	// Set in holdfast's own environment: the first is passed on, the others
	// are the handler's to set and must not leak into the command.
	t.Setenv("HOLDFAST_TEST_INHERITED", "from parent")
	t.Setenv("HOLDFAST_SUBJECT", "stale.subject")
	t.Setenv("HOLDFAST_MSG_ID", "stale-id")
	t.Setenv("HOLDFAST_HEADER_STALE", "stale header")

	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	h := newExec(t, ExecOptions{
		Command: []string{self, "-test.run=^TestExecHelperProcess$", "--", helperArg, dir},
		Timeout: time.Minute,
	}, nil)

	// Binary data larger than a pipe buffer.
	payload := make([]byte, 300<<10)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range payload {
		payload[i] = byte(rng.UintN(256))
	}
	msg := &Message{
		Subject:        "orders.created",
		Stream:         "ORDERS",
		Consumer:       "WORKER1",
		Sequence:       18446744073709551615,
		Delivery:       2,
		IdempotencyKey: "order-42",
		Header: nats.Header{
			"Nats-Msg-Id":  {"order-42"},
			"Content-Type": {"application/json"},
			"x-trace.id":   {"abc"},
			"X_Trace-Id":   {"def"}, // maps to the same variable as x-trace.id
			"Multi":        {"a", "b", "c"},
			"Ünïcode Näme": {"wert"},
			"lower":        {"value with spaces, and = sign"},
			"9lives":       {"cat"},
			"Empty":        {""},
		},
		Data: payload,
	}
	if r := h.Handle(context.Background(), msg); r != Ok() {
		t.Fatalf("result = %+v, want Ok", r)
	}

	gotStdin, err := os.ReadFile(filepath.Join(dir, "stdin"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(gotStdin, payload) {
		t.Errorf("stdin: got %d bytes, want the %d-byte payload", len(gotStdin), len(payload))
	}

	rawEnv, err := os.ReadFile(filepath.Join(dir, "env"))
	if err != nil {
		t.Fatal(err)
	}
	var environ []string
	if err := json.Unmarshal(rawEnv, &environ); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		if _, dup := got[k]; dup {
			t.Errorf("variable %s is set twice", k)
		}
		got[k] = v
	}
	want := map[string]string{
		"HOLDFAST_TEST_INHERITED":      "from parent",
		"HOLDFAST_SUBJECT":             "orders.created",
		"HOLDFAST_STREAM":              "ORDERS",
		"HOLDFAST_CONSUMER":            "WORKER1",
		"HOLDFAST_SEQ":                 "18446744073709551615",
		"HOLDFAST_DELIVERY":            "2",
		"HOLDFAST_MSG_ID":              "order-42",
		"HOLDFAST_HEADER_NATS_MSG_ID":  "order-42",
		"HOLDFAST_HEADER_CONTENT_TYPE": "application/json",
		// Sorted header names: "X_Trace-Id" < "x-trace.id".
		"HOLDFAST_HEADER_X_TRACE_ID":   "def,abc",
		"HOLDFAST_HEADER_MULTI":        "a,b,c",
		"HOLDFAST_HEADER__N_CODE_N_ME": "wert",
		"HOLDFAST_HEADER_LOWER":        "value with spaces, and = sign",
		"HOLDFAST_HEADER_9LIVES":       "cat",
		"HOLDFAST_HEADER_EMPTY":        "",
	}
	for k, v := range got {
		if !strings.HasPrefix(k, "HOLDFAST_") {
			continue
		}
		if w, ok := want[k]; !ok {
			// holdfast's own environment passes through (a variable of the
			// machine running the test, such as HOLDFAST_TEST_CACHE).
			if own, set := os.LookupEnv(k); set && own == v && !strings.HasPrefix(k, "HOLDFAST_HEADER_") {
				continue
			}
			t.Errorf("unexpected %s=%q", k, v)
		} else if v != w {
			t.Errorf("%s = %q, want %q", k, v, w)
		}
	}
	for k, v := range want {
		if _, ok := got[k]; !ok {
			t.Errorf("missing %s=%q", k, v)
		}
	}
	// The rest of the parent's environment is passed on.
	if path, ok := os.LookupEnv("PATH"); ok && got["PATH"] != path {
		t.Errorf("PATH = %q, want the parent's %q", got["PATH"], path)
	}
}

func TestExecIdempotencyKeyFallback(t *testing.T) {
	script := `[ "$HOLDFAST_MSG_ID" = "ORDERS:42" ] || { echo "got $HOLDFAST_MSG_ID" >&2; exit 1; }`
	h := newExec(t, ExecOptions{Command: shCommand(script)}, nil)
	msg := testMessage()
	msg.IdempotencyKey = ""
	if r := h.Handle(context.Background(), msg); r != Ok() {
		t.Fatalf("result = %+v, want Ok", r)
	}
}

func TestExecHeaderWithNULFails(t *testing.T) {
	h := newExec(t, ExecOptions{Command: shCommand("exit 0")}, nil)
	msg := testMessage()
	msg.Header.Set("X-Bad", "a\x00b")
	r := h.Handle(context.Background(), msg)
	if r.Outcome != Permanent || !strings.Contains(r.Reason, "HOLDFAST_HEADER_X_BAD") || !strings.Contains(r.Reason, "NUL") {
		t.Fatalf("result = %+v, want a permanent failure naming HOLDFAST_HEADER_X_BAD", r)
	}
}

func TestExecHeadersTooLargeForEnvironmentFail(t *testing.T) {
	h := newExec(t, ExecOptions{Command: shCommand("exit 0")}, nil)
	msg := testMessage()
	// Linux refuses a single environment string over 128 KiB.
	msg.Header.Set("X-Huge", strings.Repeat("h", 200<<10))
	r := h.Handle(context.Background(), msg)
	if r.Outcome != Permanent || !strings.Contains(r.Reason, "do not fit in the environment") {
		t.Fatalf("result = %.200v, want a permanent failure", r)
	}
}

func TestExecConcurrentMessages(t *testing.T) {
	// Each run must see its own message: the payload is the sequence.
	script := `[ "$(cat)" = "$HOLDFAST_SEQ" ] || exit 65`
	h := newExec(t, ExecOptions{Command: shCommand(script), Timeout: time.Minute}, nil)
	handleConcurrently(t, h, 16)
}

func TestExecCommandThatIgnoresStdin(t *testing.T) {
	h := newExec(t, ExecOptions{Command: shCommand("exit 0"), Timeout: time.Minute}, nil)
	msg := testMessage()
	msg.Data = bytes.Repeat([]byte("x"), 1<<20)
	if r := h.Handle(context.Background(), msg); r != Ok() {
		t.Fatalf("result = %+v, want Ok", r)
	}
}

func TestExecStderrLogged(t *testing.T) {
	for _, tc := range []struct {
		name      string
		exit      int
		wantLevel slog.Level
	}{
		{"failure logs at warn", 1, slog.LevelWarn},
		{"data error logs at warn", 65, slog.LevelWarn},
		{"success logs at info", 0, slog.LevelInfo},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logger, logs := newTestLogger(t, slog.LevelInfo)
			script := fmt.Sprintf(`printf 'first line\r\nsecond line\n\nlast, no newline' >&2; echo to stdout; exit %d`, tc.exit)
			h := newExec(t, ExecOptions{Command: shCommand(script)}, logger)
			h.Handle(context.Background(), testMessage())

			entries := logs.Entries("handler stderr")
			wantLines := []string{"first line", "second line", "", "last, no newline"}
			if len(entries) != len(wantLines) {
				t.Fatalf("got %d stderr records %v, want %d", len(entries), entries, len(wantLines))
			}
			for i, e := range entries {
				if e.Attrs["line"] != wantLines[i] {
					t.Errorf("line %d = %q, want %q", i, e.Attrs["line"], wantLines[i])
				}
				if e.Level != tc.wantLevel {
					t.Errorf("line %d level = %s, want %s", i, e.Level, tc.wantLevel)
				}
				if e.Attrs["seq"] != "42" || e.Attrs["subject"] != "orders.created" || e.Attrs["consumer"] != "WORKER1" {
					t.Errorf("line %d attrs = %v, want seq, subject and consumer", i, e.Attrs)
				}
			}
			if n := len(logs.Entries("handler stdout")); n != 0 {
				t.Errorf("stdout logged at info level (%d records)", n)
			}
		})
	}
}

func TestExecStdoutLoggedAtDebug(t *testing.T) {
	logger, logs := newTestLogger(t, slog.LevelDebug)
	h := newExec(t, ExecOptions{Command: shCommand("echo processed order 42")}, logger)
	if r := h.Handle(context.Background(), testMessage()); r != Ok() {
		t.Fatalf("result = %+v, want Ok", r)
	}
	entries := logs.Entries("handler stdout")
	if len(entries) != 1 || entries[0].Attrs["line"] != "processed order 42" || entries[0].Level != slog.LevelDebug {
		t.Fatalf("stdout records = %v, want one debug line", entries)
	}
}

func TestExecStderrBounded(t *testing.T) {
	logger, logs := newTestLogger(t, slog.LevelInfo)
	// About 100 KiB of noise, then the line that explains the failure.
	script := `
i=0
while [ $i -lt 2000 ]; do
	echo "noise line $i padding padding padding padding padding" >&2
	i=$((i+1))
done
echo "final: upstream rejected the order" >&2
exit 1`
	const limit = 1024
	h := newExec(t, ExecOptions{Command: shCommand(script), StderrLimit: limit}, logger)

	r := h.Handle(context.Background(), testMessage())
	if r.Outcome != Retry || !strings.HasSuffix(r.Reason, "final: upstream rejected the order") {
		t.Fatalf("result = %+v, want a retry ending with the last stderr line", r)
	}

	truncated := logs.Entries("handler stderr truncated")
	if len(truncated) != 1 {
		t.Fatalf("got %d truncation records, want 1", len(truncated))
	}
	dropped, err := strconv.Atoi(truncated[0].Attrs["dropped_bytes"])
	if err != nil || dropped < 90_000 {
		t.Errorf("dropped_bytes = %q, want about 100 KB", truncated[0].Attrs["dropped_bytes"])
	}
	lines := logs.Entries("handler stderr")
	total := 0
	for _, e := range lines {
		total += len(e.Attrs["line"]) + 1
	}
	if total > limit+1 {
		t.Errorf("logged %d bytes of stderr, limit is %d", total, limit)
	}
	if n := len(lines); n == 0 || lines[n-1].Attrs["line"] != "final: upstream rejected the order" {
		t.Errorf("last logged line is not the last line of stderr")
	}
	if total+dropped < 100_000 {
		t.Errorf("kept %d + dropped %d bytes, want all of stderr accounted for", total, dropped)
	}
}

// A command printing many short lines logged one record each: 3 MB of
// newlines made 65,536 records per message, drowning holdfast's own log.
func TestExecStderrLinesBounded(t *testing.T) {
	logger, logs := newTestLogger(t, slog.LevelInfo)
	h := newExec(t, ExecOptions{Command: shCommand(`i=1; while [ $i -le 5000 ]; do echo $i; i=$((i+1)); done >&2; exit 1`)}, logger)
	if r := h.Handle(context.Background(), testMessage()); r.Outcome != Retry || !strings.HasSuffix(r.Reason, ": 5000") {
		t.Fatalf("result = %+v, want a retry ending with the last stderr line", r)
	}
	lines := logs.Entries("handler stderr")
	if len(lines) != maxLoggedLines || lines[0].Attrs["line"] != "4901" || lines[len(lines)-1].Attrs["line"] != "5000" {
		t.Fatalf("got %d stderr records, want the last %d lines, 4901 to 5000", len(lines), maxLoggedLines)
	}
	truncated := logs.Entries("handler stderr truncated")
	if len(truncated) != 1 || truncated[0].Attrs["dropped_lines"] != "4900" {
		t.Fatalf("truncation records = %v, want one with dropped_lines=4900", truncated)
	}
	// 1..4900 with their newlines.
	if got, want := truncated[0].Attrs["dropped_bytes"], "23393"; got != want {
		t.Errorf("dropped_bytes = %s, want %s", got, want)
	}
}

func TestExecCancelKillsProcessGroup(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "grandchild.pid")
	script := `sleep 300 & echo $! > "$1"; wait`
	h := newExec(t, ExecOptions{Command: shCommand(script, pidFile)}, nil)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan Result, 1)
	go func() { done <- h.Handle(ctx, testMessage()) }()

	var pid int
	natstest.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() (err error) {
		pid, err = readPID(pidFile)
		return err
	})
	killAtCleanup(t, pid)
	cancel()

	r := <-done
	if r.Outcome != Retry || !strings.Contains(r.Reason, "stopped: context canceled") || !strings.Contains(r.Reason, "process group killed") {
		t.Fatalf("result = %+v, want a retry saying it was stopped", r)
	}
	natstest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error { return processGone(pid) })
}

func TestExecTimeoutKillsProcessGroup(t *testing.T) {
	// The grandchild must have started before the timeout hits for the test
	// to mean anything; on a loaded machine, try again with more time.
	timeout := 200 * time.Millisecond
	for attempt := 0; ; attempt++ {
		pidFile := filepath.Join(t.TempDir(), "grandchild.pid")
		script := `sleep 300 & echo $! > "$1"; wait`
		h := newExec(t, ExecOptions{Command: shCommand(script, pidFile), Timeout: timeout}, nil)

		r := h.Handle(context.Background(), testMessage())
		if r.Outcome != Retry || !strings.Contains(r.Reason, "timed out after "+timeout.String()) {
			t.Fatalf("result = %+v, want a retry saying it timed out", r)
		}
		pid, err := readPID(pidFile)
		if err != nil {
			if attempt < 5 {
				timeout *= 2
				continue
			}
			t.Fatalf("the script never got to start its grandchild: %v", err)
		}
		killAtCleanup(t, pid)
		natstest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error { return processGone(pid) })
		return
	}
}

// TestExecKillsWhatTheCommandLeftRunning: a grandchild that kept the
// command's stdout open (sh -c 'sleep 120 & echo done') outlived the
// handler's success. Whatever the command leaves in its process group is
// killed when it exits, whatever the verdict, and the handler returns at
// once instead of waiting on the pipe the grandchild held.
func TestExecKillsWhatTheCommandLeftRunning(t *testing.T) {
	for _, tt := range []struct {
		name string
		exit string
		want Outcome
	}{
		{"success", "exit 0", Success},
		{"retry", "exit 1", Retry},
		{"permanent", "exit 65", Permanent},
	} {
		t.Run(tt.name, func(t *testing.T) {
			logger, logs := newTestLogger(t, slog.LevelInfo)
			pidFile := filepath.Join(t.TempDir(), "grandchild.pid")
			script := `sleep 120 & echo $! > "$1"; echo done; ` + tt.exit
			h := newExec(t, ExecOptions{Command: shCommand(script, pidFile)}, logger)
			h.waitDelay = 20 * time.Second

			r := h.Handle(context.Background(), testMessage())
			pid, err := readPID(pidFile)
			if err != nil {
				t.Fatalf("the script did not record its grandchild: %v", err)
			}
			killAtCleanup(t, pid)
			if r.Outcome != tt.want {
				t.Fatalf("result = %+v, want %v", r, tt.want)
			}
			natstest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error { return processGone(pid) })
			if n := len(logs.Entries("handler exited but left a process outside its process group holding its stdout or stderr open")); n != 0 {
				t.Errorf("got %d warnings about a process outside the group, want none", n)
			}
		})
	}
}

// TestExecLeftoverOutsideGroupDoesNotHangWait: a process that left the
// command's process group cannot be killed with it; the handler stops
// waiting for the pipe it holds after waitDelay and says so.
func TestExecLeftoverOutsideGroupDoesNotHangWait(t *testing.T) {
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("no setsid command:", err)
	}
	logger, logs := newTestLogger(t, slog.LevelInfo)
	pidFile := filepath.Join(t.TempDir(), "grandchild.pid")
	// The grandchild inherits stderr, leaves the group and keeps stderr
	// open after the script exits successfully.
	script := `setsid sh -c 'echo $$ > "$1"; exec sleep 300' grandchild "$1" &
while [ ! -s "$1" ]; do sleep 0.01; done; exit 0`
	h := newExec(t, ExecOptions{Command: shCommand(script, pidFile)}, logger)
	h.waitDelay = 100 * time.Millisecond

	r := h.Handle(context.Background(), testMessage())
	if pid, err := readPID(pidFile); err == nil {
		killAtCleanup(t, pid)
	}
	if r != Ok() {
		t.Fatalf("result = %+v, want Ok", r)
	}
	if n := len(logs.Entries("handler exited but left a process outside its process group holding its stdout or stderr open")); n != 1 {
		t.Errorf("got %d warnings about the leftover process, want 1", n)
	}
}

func TestExecCommandRemovedAfterStart(t *testing.T) {
	script := writeScript(t, "exit 0")
	h := newExec(t, ExecOptions{Command: []string{script}}, nil)
	if err := os.Remove(script); err != nil {
		t.Fatal(err)
	}
	r := h.Handle(context.Background(), testMessage())
	if r.Outcome != Retry || !strings.Contains(r.Reason, "cannot start "+script) {
		t.Fatalf("result = %+v, want a retry saying the command cannot start", r)
	}
}

func TestHeaderEnvName(t *testing.T) {
	for header, want := range map[string]string{
		"Content-Type":  "CONTENT_TYPE",
		"x-trace.id":    "X_TRACE_ID",
		"already_OK_9":  "ALREADY_OK_9",
		"a b":           "A_B",
		"Ünïcode":       "_N_CODE",
		"日本":            "__",
		"=":             "_",
		"\xff\xfe":      "__",
		"Nats-Msg-Id":   "NATS_MSG_ID",
		"with$dollar{}": "WITH_DOLLAR__",
	} {
		if got := headerEnvName(header); got != want {
			t.Errorf("headerEnvName(%q) = %q, want %q", header, got, want)
		}
	}
}

func TestTailBuffer(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, limit := range []int{1, 7, 64, 1000} {
		b := &tailBuffer{limit: limit}
		var all []byte
		for i := 0; i < 500; i++ {
			p := make([]byte, rng.IntN(3*limit+2))
			for j := range p {
				p[j] = byte(rng.UintN(256))
			}
			n, err := b.Write(p)
			if n != len(p) || err != nil {
				t.Fatalf("Write = %d, %v; want %d, nil", n, err, len(p))
			}
			all = append(all, p...)

			want := all[max(0, len(all)-limit):]
			if !bytes.Equal(b.Bytes(), want) {
				t.Fatalf("limit %d, after %d bytes: kept bytes differ from the tail", limit, len(all))
			}
			if got := b.Dropped(); got != int64(len(all)-len(want)) {
				t.Fatalf("limit %d: Dropped = %d, want %d", limit, got, len(all)-len(want))
			}
			if len(b.buf) > 2*limit {
				t.Fatalf("limit %d: holds %d bytes", limit, len(b.buf))
			}
		}
	}
}

func TestLastLine(t *testing.T) {
	for in, want := range map[string]string{
		"":                       "",
		"\n\n":                   "",
		"one":                    "one",
		"one\ntwo\n":             "two",
		"one\ntwo\r\n\n  \n":     "two",
		"tab\there\n":            "tab here",
		strings.Repeat("é", 150): strings.Repeat("é", 100) + "...",
	} {
		if got := lastLine([]byte(in)); got != want {
			t.Errorf("lastLine(%q) = %q, want %q", in, got, want)
		}
	}
}

// handleConcurrently hands n messages to h at once, message i with
// sequence i and payload "i", and requires every one to succeed: each
// call must see its own message.
func handleConcurrently(t *testing.T, h Handler, n int) {
	t.Helper()
	var wg sync.WaitGroup
	results := make([]Result, n)
	for i := range results {
		wg.Go(func() {
			msg := testMessage()
			msg.Sequence = uint64(i)
			msg.Data = []byte(strconv.Itoa(i))
			results[i] = h.Handle(context.Background(), msg)
		})
	}
	wg.Wait()
	for i, r := range results {
		if r != Ok() {
			t.Errorf("message %d: %+v, want Ok", i, r)
		}
	}
}

// KillRunningCommands kills the process group of a running command, so a
// program exiting at once leaves none of its handlers' commands behind.
func TestKillRunningCommands(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "grandchild.pid")
	h := newExec(t, ExecOptions{Command: shCommand(`sleep 300 & echo $! > "$1"; wait`, pidFile), Timeout: 5 * time.Minute}, nil)
	killRunningCommand(t, h, pidFile)
	if n := KillRunningCommands(); n != 0 {
		t.Errorf("KillRunningCommands() = %d after the command ended, want 0", n)
	}
}

// TestKillRunningCommandsReachesACommandThatLeftItsGroup: a command that
// moved itself to another process group (here: its parent's) is killed
// too. It used to survive: only its own, now empty, group was signalled,
// and holdfast exited on a second signal leaving it running.
func TestKillRunningCommandsReachesACommandThatLeftItsGroup(t *testing.T) {
	if _, err := os.Stat("/usr/bin/perl"); err != nil {
		t.Skip("no perl to call setpgrp:", err)
	}
	pidFile := filepath.Join(t.TempDir(), "command.pid")
	script := `setpgrp(0, getpgrp(getppid())) or die "setpgrp: $!"; open F, ">", $ARGV[0] or die; print F "$$\n"; close F; sleep 300;`
	h := newExec(t, ExecOptions{Command: []string{"/usr/bin/perl", "-e", script, pidFile}, Timeout: 5 * time.Minute}, nil)
	killRunningCommand(t, h, pidFile)
}

// killRunningCommand handles a test message with h until its command has
// written a pid (its own, or a child's) to pidFile, then requires that
// KillRunningCommands signals one command, that Handle returns a retry
// ("killed by signal") and that the process of that pid is gone.
func killRunningCommand(t *testing.T, h *Exec, pidFile string) {
	t.Helper()
	done := make(chan Result, 1)
	go func() { done <- h.Handle(context.Background(), testMessage()) }()
	var pid int
	natstest.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() (err error) {
		pid, err = readPID(pidFile)
		return err
	})
	killAtCleanup(t, pid)
	// The command may write its pid before Start has returned to Handle,
	// which tracks it just after.
	natstest.CheckFor(t, 10*time.Second, time.Millisecond, func() error {
		runningCommands.Lock()
		defer runningCommands.Unlock()
		if n := len(runningCommands.pgids); n != 1 {
			return fmt.Errorf("%d commands tracked, want 1", n)
		}
		return nil
	})
	if n := KillRunningCommands(); n != 1 {
		t.Errorf("KillRunningCommands() = %d, want 1", n)
	}
	select {
	case r := <-done:
		if r.Outcome != Retry || !strings.Contains(r.Reason, "killed by signal") {
			t.Errorf("result = %+v, want a retry: killed by signal", r)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Handle still running 30s after KillRunningCommands: the command survived")
	}
	natstest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error { return processGone(pid) })
}

// TestNewExecRefusesACommandItsUserCannotRun: a command whose mode
// lets someone run it, but not the user holdfast runs as (a root-owned
// 0700 script for the holdfast user), is refused when the handler is made
// (holdfast check, run, a reload). It used to pass, and every message then
// failed to start ("permission denied") until max_deliver dead-lettered
// it. As root the check runs as nobody, in a copy of the test binary.
func TestNewExecRefusesACommandItsUserCannotRun(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "handler.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\nexit 0\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	want := "cannot be executed by this process"
	if os.Geteuid() != 0 {
		// Executable by others, not by its owner.
		if err := os.Chmod(script, 0o601); err != nil {
			t.Fatal(err)
		}
		_, err := NewExec(ExecOptions{Command: []string{script}}, nil)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("NewExec(%s, mode 0601) = %v, want an error containing %q", script, err, want)
		}
		return
	}
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skipf("no unprivileged user to make the handler as: %v", err)
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	gid, _ := strconv.Atoi(nobody.Gid)
	// nobody must reach the directory and run a copy of the test binary
	// (the original may sit in a private build directory).
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	binary := filepath.Join(dir, "pipeline.test")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(binary, b, 0o755); err != nil {
		t.Fatal(err)
	}
	newAs := func(t *testing.T) string {
		t.Helper()
		cmd := exec.Command(binary, "-test.run=^TestExecHelperProcess$", "--", helperNewArg, script)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("helper as %s: %v\n%s", nobody.Username, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	if out := newAs(t); !strings.Contains(out, want) || !strings.Contains(out, "permission denied") {
		t.Errorf("NewExec as nobody on a root-owned 0700 script: %q, want %q and permission denied", out, want)
	}
	// The same script, once nobody may run it, is accepted.
	if err := os.Chmod(script, 0o755); err != nil {
		t.Fatal(err)
	}
	if out := newAs(t); out != "ok" {
		t.Errorf("NewExec as nobody on a 0755 script: %q, want ok", out)
	}
}

// TestNewExecRefusesAScriptWhoseInterpreterCannotRun: a script
// whose #! line names an interpreter that is missing (python not
// installed on the host) or that ends with a carriage return (a script
// saved with Windows line endings) is refused, naming the interpreter.
// Both passed holdfast check, and every message then failed with "cannot
// start /path/script: ... no such file or directory" — of a file that is
// there — until max_deliver dead-lettered it.
func TestNewExecRefusesAScriptWhoseInterpreterCannotRun(t *testing.T) {
	dir := t.TempDir()
	notExec := filepath.Join(dir, "not-executable-interpreter")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, text string
		want       string // in the error; "" means no error
	}{
		{"missing interpreter", "#!/usr/bin/python9\nprint(1)\n", `interpreter "/usr/bin/python9" (the #! line) cannot be executed: no such file or directory`},
		{"with arguments", "#! /usr/bin/python9 -u\nprint(1)\n", `interpreter "/usr/bin/python9"`},
		{"windows line endings", "#!/bin/sh\r\nexit 0\r\n", `Windows line endings`},
		{"interpreter not executable", "#!" + notExec + "\n", "interpreter \"" + notExec + "\" (the #! line) cannot be executed: permission denied"},
		{"no interpreter", "#!\nexit 0\n", "names no interpreter"},
		{"valid", "#!/bin/sh\nexit 0\n", ""},
		{"valid with blanks and arguments", "#! \t/bin/sh -e\nexit 0\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "handler")
			if err := os.WriteFile(path, []byte(tc.text), 0o755); err != nil {
				t.Fatal(err)
			}
			_, err := NewExec(ExecOptions{Command: []string{path}}, nil)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path)):
				t.Fatalf("error = %v, want one naming %s and containing %q", err, path, tc.want)
			}
		})
	}
}

// TestExecInterpreterRemovedAfterStart: when a script's interpreter
// disappears while holdfast runs (a package removed), the retry's reason
// names the interpreter, not "no such file or directory" of the script.
func TestExecInterpreterRemovedAfterStart(t *testing.T) {
	dir := t.TempDir()
	interp := filepath.Join(dir, "interp")
	if err := os.WriteFile(interp, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(dir, "handler")
	if err := os.WriteFile(script, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	h := newExec(t, ExecOptions{Command: []string{script}}, nil)
	// Now the script names an interpreter that is not there.
	if err := os.WriteFile(script, []byte("#!"+interp+"-gone\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	r := h.Handle(context.Background(), testMessage())
	if r.Outcome != Retry || !strings.Contains(r.Reason, `interpreter "`+interp+`-gone" (the #! line) cannot be executed`) {
		t.Fatalf("result = %+v, want a retry naming the missing interpreter", r)
	}
}

// TestNewExecRefusesAScriptWithoutAnInterpreterLine: a script
// without a #! line (or with a byte-order mark before it) runs from a
// shell, which falls back to sh, but not from holdfast, which starts it
// without a shell: it passed holdfast check, and every message then failed
// with "exec format error" until dead-lettered.
func TestNewExecRefusesAScriptWithoutAnInterpreterLine(t *testing.T) {
	if hasBinfmtMisc() {
		t.Skip("binfmt_misc formats are registered: the kernel may run other files")
	}
	for _, tc := range []struct {
		name, text, want string
	}{
		{"no #! line", "echo hi\n", "begin it with a #! line such as #!/bin/sh"},
		{"byte-order mark", "\xef\xbb\xbf#!/bin/sh\necho hi\n", "byte-order mark"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "handler")
			if err := os.WriteFile(path, []byte(tc.text), 0o755); err != nil {
				t.Fatal(err)
			}
			_, err := NewExec(ExecOptions{Command: []string{path}}, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "exec format error") {
				t.Fatalf("error = %v, want one saying exec format error and %q", err, tc.want)
			}
		})
	}
	// A binary is fine.
	if _, err := NewExec(ExecOptions{Command: []string{"/bin/true"}}, nil); err != nil {
		t.Fatalf("/bin/true refused: %v", err)
	}
}
