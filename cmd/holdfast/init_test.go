package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/holdfast-io/holdfast/internal/natstest"
)

// The first day, as the README tells it: holdfast init, run, a message
// handled, one refused by the sample handler and dead-lettered, the
// handler fixed, the dead letter replayed. A second init into the same
// directory overwrites nothing.
func TestInitFirstDay(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "first")
	res := runHoldfast(t, nil, "init", dir)
	cfgPath := filepath.Join(dir, "holdfast.toml")
	if res.code != 0 || !strings.Contains(res.stdout, "holdfast run --config "+cfgPath) {
		t.Fatalf("init: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	if again := runHoldfast(t, nil, "init", dir); again.code != 2 || !strings.Contains(again.stderr, "exists") {
		t.Fatalf("a second init: exit %d\n%s", again.code, again.stderr)
	}
	if res := runHoldfast(t, nil, "check", "--config", cfgPath); res.code != 0 {
		t.Fatalf("check: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	// Ports of its own, beside the other tests.
	text, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	port := natstest.FreePort(t)
	edited := strings.Replace(string(text), "port = 4222", fmt.Sprintf("port = %d", port), 1)
	edited = strings.Replace(edited, `listen = "127.0.0.1:8222"`, `listen = ""`, 1)
	if edited == string(text) {
		t.Fatal("the port lines init writes changed: update this test")
	}
	if err := os.WriteFile(cfgPath, []byte(edited), 0o640); err != nil {
		t.Fatal(err)
	}
	p := startHoldfast(t, cfgPath)
	p.waitReady()
	hf := func(args ...string) e2eResult {
		t.Helper()
		res := runHoldfast(t, nil, append([]string{"--config", cfgPath}, args...)...)
		if res.code != 0 {
			t.Fatalf("holdfast %s: exit %d\n%s%s", strings.Join(args, " "), res.code, res.stdout, res.stderr)
		}
		return res
	}
	hf("pub", "orders.created", `{"id":1}`)
	hf("pub", "orders.created", `{"id":2,"invalid":true}`)
	natstest.CheckFor(t, 20*time.Second, 100*time.Millisecond, func() error {
		if ls := hf("dlq", "ls"); !strings.Contains(ls.stdout, "the order is marked invalid") {
			return fmt.Errorf("dlq ls:\n%s", ls.stdout)
		}
		return nil
	})
	if !strings.Contains(p.stderr.String(), `order 1 on orders.created (delivery 1): {\"id\":1}`) {
		t.Fatalf("the sample handler's line for the first order is not in the log:\n%s", p.stderr.String())
	}
	// Fixed: the handler takes every order now; the dead letter replays.
	handler := filepath.Join(dir, "handler.sh")
	if err := os.WriteFile(handler, []byte("#!/bin/sh\ncat >/dev/null\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if out := hf("dlq", "replay", "1").stdout; !strings.Contains(out, "replayed 1 of 1") {
		t.Fatalf("dlq replay: %s", out)
	}
	if ls := hf("dlq", "ls"); strings.Contains(ls.stdout, "invalid") {
		t.Fatalf("the replayed dead letter is still listed:\n%s", ls.stdout)
	}
}
