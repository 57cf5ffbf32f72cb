package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/holdfast-io/holdfast/internal/natstest"
)

// natsJS returns a directory holding testdata/natsjs with its npm
// packages installed (nats.js and ws, the versions package.json pins),
// kept between runs in the user's cache. Without node and npm the test
// skips, or fails when HOLDFAST_REQUIRE_NODE is set (as .ci/run sets it).
func natsJS(t *testing.T) string {
	t.Helper()
	need := func(format string, args ...any) {
		t.Helper()
		if os.Getenv("HOLDFAST_REQUIRE_NODE") != "" {
			t.Fatalf(format, args...)
		}
		t.Skipf(format, args...)
	}
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			need("%s not installed (apt-get install nodejs npm)", tool)
		}
	}
	pkg, err := os.ReadFile("testdata/natsjs/package.json")
	if err != nil {
		t.Fatal(err)
	}
	script, err := os.ReadFile("testdata/natsjs/publish.mjs")
	if err != nil {
		t.Fatal(err)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "holdfast-test", "natsjs")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	old, _ := os.ReadFile(filepath.Join(dir, "package.json"))
	if err := os.WriteFile(filepath.Join(dir, "publish.mjs"), script, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@nats-io", "nats-core")); err != nil || string(old) != string(pkg) {
		if err := os.WriteFile(filepath.Join(dir, "package.json"), pkg, 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("npm", "install", "--no-audit", "--no-fund", "--loglevel=error")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			need("npm install in %s: %v\n%s", dir, err, out)
		}
	}
	return dir
}

// TestWebSocketNatsJS: a nats.js client (the library browsers use) over
// [websocket] (ws:// on loopback) publishes with JetStream: its PubAck
// names ORDERS, and the worker handles the message.
func TestWebSocketNatsJS(t *testing.T) {
	t.Parallel()
	dir := natsJS(t)
	wport := natstest.FreePort(t)
	in := newE2EInstanceWith(t, "workers = 1\nhandler = \"log\"\n")
	in.cfg = e2eWriteConfig(t, readFile(t, in.cfg)+fmt.Sprintf("\n[websocket]\nlisten = \"127.0.0.1:%d\"\nno_tls = true\n", wport))
	p := startHoldfast(t, in.cfg)
	p.waitReady()

	cmd := exec.Command("node", "publish.mjs", fmt.Sprintf("ws://127.0.0.1:%d", wport), "orders.created", `{"from":"nats.js"}`)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("nats.js over WebSocket: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var ack struct {
		Stream string `json:"stream"`
		Seq    uint64 `json:"seq"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &ack); err != nil || ack.Stream != "ORDERS" || ack.Seq != 1 {
		t.Fatalf("nats.js PubAck %+v (%v), want ORDERS seq 1:\n%s", ack, err, out)
	}
	natstest.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		if !strings.Contains(p.stderr.String(), `msg=message component=handler subject=orders.created stream=ORDERS consumer=WORKER1 seq=1`) {
			return fmt.Errorf("the worker did not log the message")
		}
		return nil
	})
}
