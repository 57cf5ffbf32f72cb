package main

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/holdfast-io/holdfast/internal/natstest"
)

// The crash harness: holdfast runs with exec workers whose handler appends
// every processed (stream sequence, idempotency key) to a file, while
// several publishers record every PubAck. holdfast is killed with SIGKILL
// at random moments — during bootstrap, during publish bursts and
// processing, during a graceful shutdown — and restarted, many times.
// Then every acknowledged message must be in the stream, every message
// processed at least once (duplicates are counted, not hidden), and the
// consumer's ack floor must not pass an unprocessed message.
//
// HOLDFAST_CHAOS_CYCLES sets the number of kills (make chaos).

type chaosResult struct {
	cycles, killsBootstrap, killsLoad, killsShutdown int
	acked, processed, duplicates, lost, unprocessed  int
}

func (r chaosResult) String() string {
	return fmt.Sprintf("%d kill -9 cycles (%d during bootstrap, %d under load, %d during shutdown): %d messages acknowledged, %d processed, %d duplicate deliveries, %d lost, %d unprocessed",
		r.cycles, r.killsBootstrap, r.killsLoad, r.killsShutdown, r.acked, r.processed, r.duplicates, r.lost, r.unprocessed)
}

// readProcessed parses the handler's record: stream sequence → how many
// times it was processed, and idempotency key → sequence.
func readProcessed(t *testing.T, path string) (map[uint64]int, map[string]uint64) {
	t.Helper()
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return map[uint64]int{}, map[string]uint64{}
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	bySeq, byID := map[uint64]int{}, map[string]uint64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		seqText, id, ok := strings.Cut(sc.Text(), " ")
		seq, err := strconv.ParseUint(seqText, 10, 64)
		if !ok || err != nil {
			continue // a line torn by the kill of the handler
		}
		bySeq[seq]++
		byID[id] = seq
	}
	return bySeq, byID
}

func TestChaosKill9(t *testing.T) {
	t.Parallel()
	runChaosKill9(t, false)
}

// TestChaosKill9GroupCommit is the same with group_commit = true on ORDERS.
func TestChaosKill9GroupCommit(t *testing.T) {
	t.Parallel()
	runChaosKill9(t, true)
}

func runChaosKill9(t *testing.T, groupCommit bool) {
	cycles := durEnvInt("HOLDFAST_CHAOS_CYCLES", 6)
	dir := durTempDir(t, "chaos")
	processedFile := filepath.Join(dir, "processed")
	port := natstest.FreePort(t)
	extra := fmt.Sprintf(`
[consumers.WORKER1.exec]
command = ["/bin/sh", "-c", "printf '%%s %%s\\n' \"$HOLDFAST_SEQ\" \"$HOLDFAST_MSG_ID\" >> %s"]
timeout = "5s"
`, processedFile)
	cfgPath := e2eWriteConfig(t, durConfig{store: filepath.Join(dir, "store"), port: port, workers: 4,
		handler: "exec", extra: extra, groupCommit: groupCommit}.toml())
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	acks := newAckLog()
	res := chaosResult{cycles: cycles}

	for cycle := range cycles {
		proc := startHoldfast(t, cfgPath)
		switch r := rand.IntN(5); {
		case r == 0 && cycle > 0:
			// During start-up: recovery, bootstrap, workers starting.
			time.Sleep(randDuration(20*time.Millisecond, 400*time.Millisecond))
			res.killsBootstrap++
		case r == 1:
			proc.waitReady()
			pubs := startPublishers(t, url, fmt.Sprintf("c%03d", cycle), 3, acks)
			time.Sleep(randDuration(200*time.Millisecond, 800*time.Millisecond))
			pubs.stop()
			// During a graceful shutdown: draining, nak'ing in-flight work.
			if err := proc.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			time.Sleep(randDuration(5*time.Millisecond, 300*time.Millisecond))
			res.killsShutdown++
		default:
			proc.waitReady()
			pubs := startPublishers(t, url, fmt.Sprintf("c%03d", cycle), 3, acks)
			time.Sleep(randDuration(200*time.Millisecond, 1500*time.Millisecond))
			_ = proc.cmd.Process.Kill()
			pubs.stop()
			res.killsLoad++
		}
		_ = proc.cmd.Process.Kill()
		proc.wait(30 * time.Second)
	}

	proc := startHoldfast(t, cfgPath)
	proc.waitReady()
	v := checkAcked(t, url, acks)
	res.acked, res.lost = v.acked, v.lost
	if v.streamMissing || v.consumerMissing {
		t.Fatalf("after %d kills: stream missing %v, consumer missing %v", cycles, v.streamMissing, v.consumerMissing)
	}
	info := waitDrained(t, url, 90*time.Second)
	proc.stop()

	bySeq, byID := readProcessed(t, processedFile)
	for _, n := range bySeq {
		res.processed++
		res.duplicates += n - 1
	}
	// Every acknowledged message was processed (none of them fails, so
	// none is dead-lettered) ...
	var firstUnprocessed string
	for _, id := range acks.ids() {
		if _, ok := byID[id]; !ok {
			if res.unprocessed == 0 {
				firstUnprocessed = id
			}
			res.unprocessed++
		}
	}
	// ... and the ack floor covers only processed sequences.
	ackFloorGap := 0
	for seq := uint64(1); seq <= info.AckFloor.Stream; seq++ {
		if bySeq[seq] == 0 {
			ackFloorGap++
		}
	}
	t.Log(res)
	fmt.Println("chaos:", res)
	if res.acked == 0 {
		t.Fatal("no message was acknowledged: the harness measured nothing")
	}
	if res.lost != 0 {
		t.Errorf("%d acknowledged messages lost (first: %s)", res.lost, v.firstLost)
	}
	if res.unprocessed != 0 {
		t.Errorf("%d acknowledged messages never processed (first: %s)", res.unprocessed, firstUnprocessed)
	}
	if ackFloorGap != 0 {
		t.Errorf("ack floor %d passes %d sequences that were never processed", info.AckFloor.Stream, ackFloorGap)
	}
}
