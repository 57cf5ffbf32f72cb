package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/holdfast-io/holdfast/internal/natstest"
)

// notifySocket is a real unix datagram socket standing in for systemd's
// NOTIFY_SOCKET: it records every sd_notify message.
type notifySocket struct {
	path string
	conn *net.UnixConn
	mu   sync.Mutex
	msgs []string
}

func newNotifySocket(t *testing.T) *notifySocket {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	ns := &notifySocket{path: path, conn: conn}
	t.Cleanup(func() { conn.Close() })
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			ns.mu.Lock()
			ns.msgs = append(ns.msgs, string(buf[:n]))
			ns.mu.Unlock()
		}
	}()
	return ns
}

// lines returns every received assignment (READY=1, STATUS=..., ...) in order.
func (ns *notifySocket) lines() []string {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	var out []string
	for _, m := range ns.msgs {
		out = append(out, strings.Split(strings.TrimSpace(m), "\n")...)
	}
	return out
}

func (ns *notifySocket) index(line string, from int) int {
	for i, l := range ns.lines() {
		if i >= from && (l == line || (strings.HasSuffix(line, "*") && strings.HasPrefix(l, strings.TrimSuffix(line, "*")))) {
			return i
		}
	}
	return -1
}

func (ns *notifySocket) waitFor(t *testing.T, line string, from int) int {
	t.Helper()
	var at int
	natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		if at = ns.index(line, from); at < 0 {
			return fmt.Errorf("no %q after message %d in %q", line, from, ns.lines())
		}
		return nil
	})
	return at
}

// TestSystemdNotify runs the binary with NOTIFY_SOCKET and WATCHDOG_USEC
// like systemd's Type=notify with WatchdogSec, and checks the protocol:
// STATUS lines during start-up, READY=1 only once serving, WATCHDOG=1 pings,
// RELOADING=1 then READY=1 around a SIGHUP, STOPPING=1 at SIGTERM.
func TestSystemdNotify(t *testing.T) {
	t.Parallel()
	ns := newNotifySocket(t)
	in := newE2EInstance(t)
	p := startHoldfastEnv(t, in.cfg, "NOTIFY_SOCKET="+ns.path, "WATCHDOG_USEC=400000")
	p.waitReady()

	ready := ns.waitFor(t, "READY=1", 0)
	status := ns.index("STATUS=*", 0)
	if status < 0 || status > ready {
		t.Fatalf("no STATUS= before READY=1: %q", ns.lines())
	}
	if ns.index("STATUS=bootstrapping streams and consumers", 0) > ready {
		t.Fatalf("READY=1 sent before the bootstrap: %q", ns.lines())
	}
	// The watchdog pings at half of WATCHDOG_USEC while the server answers.
	first := ns.waitFor(t, "WATCHDOG=1", ready)
	ns.waitFor(t, "WATCHDOG=1", first+1)

	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	reloading := ns.waitFor(t, "RELOADING=1", ready+1)
	if ns.index("MONOTONIC_USEC=*", reloading) != reloading+1 {
		t.Fatalf("RELOADING=1 without MONOTONIC_USEC: %q", ns.lines())
	}
	ns.waitFor(t, "READY=1", reloading)

	p.stop()
	stopping := ns.waitFor(t, "STOPPING=1", reloading)
	if ns.index("READY=1", stopping) >= 0 {
		t.Fatalf("READY=1 after STOPPING=1: %q", ns.lines())
	}
}

// TestStopExtendsSystemdTimeout: with a shutdown_timeout longer than the
// packaged unit's TimeoutStopSec (90 s), systemd used to SIGKILL holdfast
// in the middle of the drain it was promised. STOPPING=1 comes with
// EXTEND_TIMEOUT_USEC covering shutdown_timeout and the rest of the stop.
func TestStopExtendsSystemdTimeout(t *testing.T) {
	t.Parallel()
	ns := newNotifySocket(t)
	store := filepath.Join(t.TempDir(), "store")
	port := natstest.FreePort(t)
	cfg := e2eWriteConfig(t, e2eConfigTOML(store, port, "[run]\nshutdown_timeout = \"120s\"\n"))
	p := startHoldfastEnv(t, cfg, "NOTIFY_SOCKET="+ns.path)
	p.waitReady()
	ready := ns.waitFor(t, "READY=1", 0)
	p.stop()
	stopping := ns.waitFor(t, "STOPPING=1", ready)
	want := fmt.Sprintf("EXTEND_TIMEOUT_USEC=%d", (120*time.Second + stopMargin).Microseconds())
	if at := ns.index(want, stopping); at != stopping+1 {
		t.Fatalf("no %s with STOPPING=1: %q", want, ns.lines())
	}
}

// TestNoNotifySocketIsNoop: without NOTIFY_SOCKET holdfast runs and stops
// as usual (every sd_notify call is a no-op, nothing logged about it).
func TestNoNotifySocketIsNoop(t *testing.T) {
	t.Parallel()
	in := newE2EInstance(t)
	p := startHoldfast(t, in.cfg)
	p.waitReady()
	p.stop()
	if strings.Contains(p.stderr.String(), "sd_notify failed") {
		t.Fatalf("sd_notify errors without a socket:\n%s", p.stderr.String())
	}
}

// TestWatchdogWithheldWhileUnhealthy: the watchdog is a health probe, not
// a bare ticker — no WATCHDOG=1 while the probe fails, pings again once it
// passes.
func TestWatchdogWithheldWhileUnhealthy(t *testing.T) {
	ns := newNotifySocket(t)
	t.Setenv("NOTIFY_SOCKET", ns.path)
	t.Setenv("WATCHDOG_USEC", "100000")
	n := newNotifier(slog.New(slog.NewTextHandler(io.Discard, nil)))
	var healthy atomic.Bool
	probes := make(chan struct{}, 100)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go n.Watchdog(ctx, func(context.Context) error {
		select {
		case probes <- struct{}{}:
		default:
		}
		if !healthy.Load() {
			return errors.New("stuck")
		}
		return nil
	})
	for i := 0; i < 5; i++ { // five failed probes
		select {
		case <-probes:
		case <-time.After(10 * time.Second):
			t.Fatal("watchdog does not probe")
		}
	}
	if ns.index("WATCHDOG=1", 0) >= 0 {
		t.Fatalf("WATCHDOG=1 sent while unhealthy: %q", ns.lines())
	}
	healthy.Store(true)
	ns.waitFor(t, "WATCHDOG=1", 0)
}
