package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/holdfast-io/holdfast/internal/natstest"
)

// TestGracefulRestartWithBacklog publishes a backlog while the consumer has
// no workers, restarts holdfast with workers, stops it gracefully (SIGTERM)
// in the middle of the backlog with handlers in flight, and starts it once
// more: every message is processed exactly once — a graceful restart never
// duplicates, only crashes may — and the consumer's ack floor ends at the
// stream's last sequence.
func TestGracefulRestartWithBacklog(t *testing.T) {
	t.Parallel()
	// Each message is a shell and a sleep (8 ms of CPU here): 300 show
	// the graceful stop in the middle as 600 did, for half the CPU.
	const total = 300
	dir := t.TempDir()
	processedFile := filepath.Join(dir, "processed")
	port := natstest.FreePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	store := filepath.Join(dir, "store")
	extra := fmt.Sprintf(`
[consumers.WORKER1.exec]
command = ["/bin/sh", "-c", "sleep 0.01; printf '%%s %%s\\n' \"$HOLDFAST_SEQ\" \"$HOLDFAST_MSG_ID\" >> %s"]
timeout = "10s"
`, processedFile)
	idle := e2eWriteConfig(t, durConfig{store: store, port: port, workers: 0, handler: "exec", extra: extra}.toml())
	busy := e2eWriteConfig(t, durConfig{store: store, port: port, workers: 4, handler: "exec", extra: extra}.toml())

	// The backlog, with nothing consuming it.
	p := startHoldfast(t, idle)
	p.waitReady()
	in := &e2eInstance{store: store, port: port, cfg: idle}
	_, js := e2eConnect(t, in)
	for i := range total {
		if _, err := js.PublishAsync("orders.created", []byte(fmt.Sprintf("m-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(60 * time.Second):
		t.Fatal("publishes not acknowledged")
	}
	if st := natstest.StreamInfo(t, js, "ORDERS").State; st.Msgs != total || st.LastSeq != total {
		t.Fatalf("stream holds %d messages up to %d, want %d", st.Msgs, st.LastSeq, total)
	}
	p.stop()
	if n := len(e2eLines(t, processedFile)); n != 0 {
		t.Fatalf("%d messages processed without workers", n)
	}

	// Workers start on the backlog; SIGTERM while they are in the middle.
	p = startHoldfast(t, busy)
	p.waitReady()
	natstest.CheckFor(t, 60*time.Second, 5*time.Millisecond, func() error {
		if n := len(e2eLines(t, processedFile)); n < total/4 {
			return fmt.Errorf("%d of %d processed", n, total)
		}
		return nil
	})
	p.stop()
	stoppedAt := len(e2eLines(t, processedFile))

	// And once more, to the end of the backlog.
	p = startHoldfast(t, busy)
	p.waitReady()
	info := waitDrained(t, url, 90*time.Second)
	p.stop()

	bySeq := map[string]int{}
	for _, l := range e2eLines(t, processedFile) {
		seq, _, _ := strings.Cut(l, " ")
		bySeq[seq]++
	}
	var missing, dups []string
	for seq := 1; seq <= total; seq++ {
		switch n := bySeq[fmt.Sprint(seq)]; {
		case n == 0:
			missing = append(missing, fmt.Sprint(seq))
		case n > 1:
			dups = append(dups, fmt.Sprintf("%d (x%d)", seq, n))
		}
	}
	t.Logf("%d messages: %d processed before the SIGTERM in the middle, %d sequences processed in all; %d redelivered (returned unprocessed at the SIGTERM)",
		total, stoppedAt, len(bySeq), info.NumRedelivered)
	if len(missing) > 0 {
		t.Errorf("%d sequences never processed: %v", len(missing), missing)
	}
	if len(dups) > 0 {
		t.Errorf("a graceful restart processed %d sequences more than once: %v", len(dups), dups)
	}
	if len(bySeq) != total {
		t.Errorf("%d distinct sequences processed, want %d", len(bySeq), total)
	}
	if info.AckFloor.Stream != total || info.NumAckPending != 0 || info.NumPending != 0 {
		t.Errorf("consumer ends at ack floor %d (%d ack pending, %d pending), want ack floor %d and nothing outstanding",
			info.AckFloor.Stream, info.NumAckPending, info.NumPending, total)
	}
}
