package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestReloadOnSIGHUP: SIGHUP applies a new handler and stream limit at
// run time, names what needs a restart, and refuses a broken config while
// the previous one keeps running.
func TestReloadOnSIGHUP(t *testing.T) {
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
		if _, err := js.Publish(e2eContext(t), "orders.created", []byte(id)); err != nil {
			t.Fatal(err)
		}
	}
	waitLine := func(line string) {
		t.Helper()
		e2eCheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
			if !strings.Contains(strings.Join(e2eLines(t, out), "\n"), line) {
				return fmt.Errorf("no %q yet", line)
			}
			return nil
		})
	}
	waitLog := func(text string) {
		t.Helper()
		e2eCheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
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
	next = strings.Replace(next, `name = "holdfast-e2e"`, `name = "renamed"`, 1)
	if err := os.WriteFile(in.cfg, []byte(next), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitLog("reload done")
	for _, want := range []string{"reload: workers restarted", "field=max_age", "some changes need a restart", "[server]"} {
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
