package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/internal/natstest"
)

// Binaries built once by TestMain for the end-to-end tests.
var (
	holdfastBin string
	natsBin     string
	// lazyfsBin serves the power-loss tests' lazyfs mounts, built without
	// -race (lazyfs.MountIn).
	lazyfsBin string
	// e2eHome is HOME for every subprocess, so that no nats CLI context
	// or other user setting of the machine leaks into the tests.
	e2eHome string
)

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "holdfast-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	holdfastBin = filepath.Join(dir, "holdfast")
	natsBin = filepath.Join(dir, "nats")
	lazyfsBin = filepath.Join(dir, "lazyfs")
	e2eHome = filepath.Join(dir, "home")
	if err := os.Mkdir(e2eHome, 0o700); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}

	goBin, err := exec.LookPath("go")
	if err != nil {
		fmt.Fprintln(os.Stderr, "cannot build the binaries for the end-to-end tests: go not in PATH")
		return 1
	}
	// Built as packaging/build.sh builds the shipped binary (static,
	// -trimpath): the tests run what ships, and the packaging tests and
	// install-test reuse these compiled packages from the build cache.
	builds := [][]string{
		{"build", "-trimpath", "-o", holdfastBin, "."},
		{"build", "-trimpath", "-o", natsBin, "github.com/nats-io/natscli/nats"},
		{"build", "-trimpath", "-o", lazyfsBin, "../../internal/lazyfs/cmd/lazyfs"},
	}
	errs := make([]error, len(builds))
	var wg sync.WaitGroup
	for i, args := range builds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command(goBin, args...)
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			out, err := cmd.CombinedOutput()
			if err != nil {
				errs[i] = fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// e2eEnv is the environment of every binary the tests run: the
// test's own, without anything that changes holdfast's or the nats CLI's
// behaviour (config path, systemd sockets, nats contexts).
func e2eEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch {
		case name == "HOLDFAST_CONFIG", name == "NOTIFY_SOCKET", name == "JOURNAL_STREAM", name == "INVOCATION_ID",
			name == "HOME", name == "XDG_CONFIG_HOME",
			strings.HasPrefix(name, "WATCHDOG_"), strings.HasPrefix(name, "NATS_"):
			continue
		}
		env = append(env, kv)
	}
	return append(env, "HOME="+e2eHome, "XDG_CONFIG_HOME="+filepath.Join(e2eHome, ".config"))
}

// e2eConfigTOML is a config for one holdfast on port with its store in
// store: the seed's ORDERS and WORKER1, without workers (nothing consumes)
// and without the HTTP listener. extra is appended verbatim.
func e2eConfigTOML(store string, port int, extra string) string {
	return fmt.Sprintf(`[server]
name = "holdfast-e2e"
host = "127.0.0.1"
port = %d

[jetstream]
store_dir = %q
max_file_store = "1GB"
max_memory_store = "64MB"

[http]
listen = ""

[streams.ORDERS]
subjects = ["orders.*"]

[consumers.WORKER1]
stream = "ORDERS"
workers = 0
%s`, port, store, extra)
}

// e2eWriteConfig writes text to a config file in a fresh directory and
// returns its path.
func e2eWriteConfig(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "holdfast.toml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// e2eInstance is one holdfast config: a store dir, a port and a config file.
type e2eInstance struct {
	store string
	port  int
	cfg   string
}

func newE2EInstance(t *testing.T) *e2eInstance {
	t.Helper()
	return newE2EInstanceIn(t, t.TempDir())
}

// newE2EInstanceIn is newE2EInstance with its store in dir, which may
// outlive the test.
func newE2EInstanceIn(t *testing.T, dir string) *e2eInstance {
	t.Helper()
	in := &e2eInstance{store: filepath.Join(dir, "store"), port: natstest.FreePort(t)}
	in.cfg = e2eWriteConfig(t, e2eConfigTOML(in.store, in.port, ""))
	return in
}

// newE2EInstanceWith is newE2EInstance with worker1 in place of WORKER1's
// "workers = 0" line: its workers, handler and any tables after it.
func newE2EInstanceWith(t *testing.T, worker1 string) *e2eInstance {
	t.Helper()
	in := newE2EInstance(t)
	in.cfg = e2eWriteConfig(t, strings.Replace(e2eConfigTOML(in.store, in.port, ""), "workers = 0\n", worker1, 1))
	return in
}

func (in *e2eInstance) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", in.port) }

// e2eResult is how a finished command ended.
type e2eResult struct {
	stdout, stderr string
	code           int
}

// runHoldfast runs the binary to completion with stdin (may be nil) and
// returns its output and exit code.
func runHoldfast(t *testing.T, stdin []byte, args ...string) e2eResult {
	t.Helper()
	return e2eRunBinary(t, holdfastBin, nil, stdin, args...)
}

// runHoldfastWithin is runHoldfast for a command that may take longer
// than 30 s on a loaded machine, such as a restore into a store with
// sync = "always" (a flush per message).
func runHoldfastWithin(t *testing.T, timeout time.Duration, args ...string) e2eResult {
	t.Helper()
	return runBinaryWithin(t, timeout, holdfastBin, nil, nil, args...)
}

// e2eRunBinary runs bin to completion with extra environment variables env
// ("NAME=value") and stdin (both may be nil), within 30 s.
func e2eRunBinary(t *testing.T, bin string, env []string, stdin []byte, args ...string) e2eResult {
	t.Helper()
	return runBinaryWithin(t, 30*time.Second, bin, env, stdin, args...)
}

func runBinaryWithin(t *testing.T, timeout time.Duration, bin string, env []string, stdin []byte, args ...string) e2eResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(e2eEnv(), env...)
	cmd.Dir = t.TempDir() // a default store dir lands here, not in the source tree
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := e2eResult{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case ctx.Err() != nil:
		t.Fatalf("%s %q did not finish in time\nstdout:\n%s\nstderr:\n%s", filepath.Base(bin), args, res.stdout, res.stderr)
	case errors.As(err, &ee):
		res.code = ee.ExitCode()
	default:
		t.Fatalf("%s %q: %v", filepath.Base(bin), args, err)
	}
	return res
}

// e2eProc is a running `holdfast run`.
type e2eProc struct {
	t      *testing.T
	cmd    *exec.Cmd
	stderr *natstest.Buffer
	done   chan struct{}
	state  *os.ProcessState
}

// startHoldfast starts `holdfast run --config cfg` with stderr captured.
// The process is killed when the test ends if it still runs, and its log
// is printed if the test failed.
func startHoldfast(t *testing.T, cfg string) *e2eProc {
	t.Helper()
	return startHoldfastEnv(t, cfg)
}

// startHoldfastEnv is startHoldfast with extra environment variables
// ("NAME=value").
func startHoldfastEnv(t *testing.T, cfg string, env ...string) *e2eProc {
	t.Helper()
	cmd := exec.Command(holdfastBin, "run", "--config", cfg)
	cmd.Env = append(e2eEnv(), env...)
	cmd.Dir = t.TempDir()
	return startCmd(t, cmd)
}

// startCmd starts a holdfast command with its output captured; the
// process is killed at the end of the test, and its log shown if the
// test failed.
func startCmd(t *testing.T, cmd *exec.Cmd) *e2eProc {
	t.Helper()
	d := &e2eProc{t: t, cmd: cmd, stderr: &natstest.Buffer{}, done: make(chan struct{})}
	cmd.Stdout = d.stderr
	cmd.Stderr = d.stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start holdfast: %v", err)
	}
	go func() {
		_ = cmd.Wait()
		d.state = cmd.ProcessState
		close(d.done)
	}()
	t.Cleanup(func() {
		if !d.exited() {
			_ = cmd.Process.Kill()
			<-d.done
		}
		if t.Failed() {
			t.Logf("holdfast (pid %d) log:\n%s", cmd.Process.Pid, d.stderr.String())
		}
	})
	return d
}

func (d *e2eProc) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// logs tells whether holdfast's log holds s within 10 s. The log reaches
// the test through a pipe and a goroutine copying it: a line holdfast
// wrote before an effect the test saw (an ack) may not be there yet.
func (d *e2eProc) logs(s string) bool {
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if strings.Contains(d.stderr.String(), s) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// waitReady waits until holdfast logs that it is ready, failing at once
// if it exits instead.
func (d *e2eProc) waitReady() {
	d.t.Helper()
	d.waitReadyWithin(30 * time.Second)
}

// waitReadyWithin is waitReady with another deadline.
func (d *e2eProc) waitReadyWithin(timeout time.Duration) {
	d.t.Helper()
	deadline := time.Now().Add(timeout)
	for !strings.Contains(d.stderr.String(), "holdfast ready") {
		if d.exited() {
			d.t.Fatalf("holdfast exited with %v before it was ready:\n%s", d.state, d.stderr.String())
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("holdfast not ready after %s:\n%s", timeout, d.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// signal sends sig and waits for the process to exit; it returns the exit
// code (-1 when killed by a signal).
func (d *e2eProc) signal(sig syscall.Signal) int {
	d.t.Helper()
	if err := d.cmd.Process.Signal(sig); err != nil {
		d.t.Fatalf("send %s: %v", sig, err)
	}
	return d.wait(30 * time.Second)
}

func (d *e2eProc) wait(timeout time.Duration) int {
	d.t.Helper()
	select {
	case <-d.done:
		return d.state.ExitCode()
	case <-time.After(timeout):
		d.t.Fatalf("holdfast did not exit within %s:\n%s", timeout, d.stderr.String())
		return 0
	}
}

// stop sends SIGTERM and requires a clean exit.
func (d *e2eProc) stop() {
	d.t.Helper()
	if code := d.signal(syscall.SIGTERM); code != 0 {
		d.t.Fatalf("holdfast exited with %d after SIGTERM, want 0:\n%s", code, d.stderr.String())
	}
	if !strings.Contains(d.stderr.String(), "holdfast stopped") {
		d.t.Fatalf("holdfast did not log \"holdfast stopped\":\n%s", d.stderr.String())
	}
}

// e2eConnect opens a TCP client connection to the instance, closed when the
// test ends.
func e2eConnect(t *testing.T, in *e2eInstance) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(in.url(), nats.Name("holdfast-e2e-test"), nats.MaxReconnects(0))
	if err != nil {
		t.Fatalf("connect to %s: %v", in.url(), err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}
