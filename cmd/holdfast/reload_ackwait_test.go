package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/holdfast-io/holdfast/internal/natstest"
)

// TestReloadLoweringAckWaitDoesNotRedeliverRunningHandlers: a SIGHUP that
// lowers ack_wait while handlers run below the old ack_wait but above the
// new one must not let the server deliver their messages a second time
// while they still run. The reload applies the new ack_wait to the server
// at once and drains the consumers' workers one after another, so the
// workers of a consumer still running (WORKER2, while WORKER1 drains)
// keep the message alive at the pace of the old ack_wait.
func TestReloadLoweringAckWaitDoesNotRedeliverRunningHandlers(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	script := e2eScript(t, fmt.Sprintf(`id=$(cat)
echo "start $HOLDFAST_CONSUMER $id $HOLDFAST_DELIVERY" >> %[1]q
sleep 6
echo "done $HOLDFAST_CONSUMER $id $HOLDFAST_DELIVERY" >> %[1]q
`, log))
	in := newE2EInstance(t)
	consumer := func(name, ackWait string) string {
		return fmt.Sprintf(`[consumers.%s]
stream = "ORDERS"
workers = 2
ack_wait = %q
max_deliver = 5
handler = "exec"
[consumers.%[1]s.exec]
command = [%[3]q]
timeout = "20s"
`, name, ackWait, script)
	}
	write := func(ackWait string) {
		text := strings.Replace(e2eConfigTOML(in.store, in.port, ""), "[consumers.WORKER1]\nstream = \"ORDERS\"\nworkers = 0\n", "", 1)
		text += consumer("WORKER1", ackWait) + consumer("WORKER2", ackWait) + "[run]\nshutdown_timeout = \"20s\"\n"
		if err := os.WriteFile(in.cfg, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("20s")
	p := startHoldfast(t, in.cfg)
	p.waitReady()
	_, js := e2eConnect(t, in)
	if _, err := js.Publish(natstest.Context(t), "orders.created", []byte("m1")); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		if n := len(e2eLines(t, log)); n < 2 {
			return fmt.Errorf("%d handlers started", n)
		}
		return nil
	})
	// Both handlers have run for longer than the new ack_wait.
	time.Sleep(2500 * time.Millisecond)
	write("2s")
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 60*time.Second, 20*time.Millisecond, func() error {
		if !strings.Contains(p.stderr.String(), "reload done") {
			return fmt.Errorf("reload not done")
		}
		return nil
	})
	// Long enough for a redelivery to show.
	time.Sleep(3 * time.Second)
	p.stop()
	starts := map[string]int{}
	for _, l := range e2eLines(t, log) {
		if f := strings.Fields(l); f[0] == "start" {
			starts[f[1]]++
		}
	}
	if starts["WORKER1"] != 1 || starts["WORKER2"] != 1 {
		t.Fatalf("handler starts per consumer %v, want 1 each: a message was delivered again while its handler ran\n%s",
			starts, strings.Join(e2eLines(t, log), "\n"))
	}
}
