package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/holdfast-io/holdfast/internal/natstest"
)

// TestLogReaderGoneKeepsServing: holdfast's stderr is a pipe whose reader
// goes away (`holdfast run 2>&1 | logger` with logger killed, a log
// collector restarted). Go kills a program that writes to a broken pipe on
// fd 1 or 2 with SIGPIPE, which systemd counts as a clean exit: the
// packaged unit's Restart=on-failure would not have restarted it. holdfast
// must keep processing, and stop on SIGTERM with exit 0.
func TestLogReaderGoneKeepsServing(t *testing.T) {
	t.Parallel()
	in := newE2EInstanceWith(t, "workers = 2\nhandler = \"log\"\n")

	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(holdfastBin, "run", "--config", in.cfg)
	cmd.Env = e2eEnv()
	cmd.Dir = t.TempDir()
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})

	// Read the log until holdfast serves, then close the reader: every
	// later log line is a write to a broken pipe.
	var log strings.Builder
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			log.WriteString(sc.Text() + "\n")
			if strings.Contains(sc.Text(), "holdfast ready") {
				ready <- true
				return
			}
		}
		ready <- false
	}()
	select {
	case ok := <-ready:
		if !ok {
			<-done
			t.Fatalf("holdfast exited before it was ready (%v):\n%s", cmd.ProcessState, log.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("holdfast not ready after 30s")
	}
	r.Close()

	_, js := e2eConnect(t, in)
	// The log handler writes a line for each message.
	for i := range 20 {
		if _, err := js.Publish(natstest.Context(t), "orders.created", fmt.Appendf(nil, `{"id":"%d"}`, i)); err != nil {
			select {
			case <-done:
				t.Fatalf("holdfast died once nobody read its log: %v", cmd.ProcessState)
			case <-time.After(time.Second):
			}
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	natstest.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		select {
		case <-done:
			return nil // reported below
		default:
		}
		c, err := js.Consumer(natstest.Context(t), "ORDERS", "WORKER1")
		if err != nil {
			return err
		}
		if floor := c.CachedInfo().AckFloor.Stream; floor < 20 {
			return fmt.Errorf("ack floor %d, want 20", floor)
		}
		return nil
	})
	select {
	case <-done:
		t.Fatalf("holdfast died once nobody read its log: %v (log until then:\n%s)", cmd.ProcessState, log.String())
	default:
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("holdfast did not exit within 30s of SIGTERM")
	}
	if code := cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("holdfast exited with %v after SIGTERM, want exit 0", cmd.ProcessState)
	}
}
