package main

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/bench/benchkit"
	"github.com/holdfast-io/holdfast/pipeline/forward"
)

// errNotOnce is returned when the hub lacks a message of the edge or holds
// one twice.
var errNotOnce = errors.New("NOT EXACTLY ONCE")

// checkOnce reads the hub's EDGE from stream sequence first to its end,
// after half a second for a late duplicate to arrive, and checks that it
// holds each origin sequence first..last of the edge exactly once (both
// streams start empty in a run, so the hub's sequences and the edge's
// count alike). each, when not nil, sees every message read.
func checkOnce(hub *node, first, last uint64, each func(jetstream.Msg) error) error {
	time.Sleep(500 * time.Millisecond)
	seen := make([]int, last-first+1)
	stray := 0
	err := readHub(hub.url, first, func(m jetstream.Msg) error {
		seq, err := strconv.ParseUint(m.Headers().Get(forward.HeaderOriginSeq), 10, 64)
		if err != nil || seq < first || seq > last {
			stray++
		} else {
			seen[seq-first]++
		}
		if each != nil {
			return each(m)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return onceError(seen, first, stray)
}

// onceError names the origin sequences (from first) seen no time or more
// than once, and counts the messages with another or no origin sequence
// (stray); nil when every one was seen once and none strayed.
func onceError(seen []int, first uint64, stray int) error {
	var lost, dup []uint64
	for i, n := range seen {
		switch {
		case n == 0:
			lost = append(lost, first+uint64(i))
		case n > 1:
			dup = append(dup, first+uint64(i))
		}
	}
	if len(lost) == 0 && len(dup) == 0 && stray == 0 {
		return nil
	}
	return fmt.Errorf("%w: of the edge's messages %d..%d, %d LOST%s, %d DUPLICATED%s, and %d hub messages with no origin sequence in that range",
		errNotOnce, first, first+uint64(len(seen))-1, len(lost), examples(lost), len(dup), examples(dup), stray)
}

// examples lists up to the first five sequences, after a space.
func examples(seqs []uint64) string {
	if len(seqs) == 0 {
		return ""
	}
	var s []string
	for _, q := range seqs[:min(5, len(seqs))] {
		s = append(s, strconv.FormatUint(q, 10))
	}
	if len(seqs) > 5 {
		s = append(s, "…")
	}
	return " (" + strings.Join(s, ", ") + ")"
}

// readHub reads the hub's EDGE with an ordered consumer, from stream
// sequence from to the last message it holds now.
func readHub(url string, from uint64, fn func(jetstream.Msg) error) error {
	nc, js, err := benchkit.Connect(url, time.Second)
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s, err := js.Stream(ctx, "EDGE")
	if err != nil {
		return err
	}
	last := s.CachedInfo().State.LastSeq
	if last < from {
		return nil
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: from})
	if err != nil {
		return err
	}
	it, err := c.Messages()
	if err != nil {
		return err
	}
	defer it.Stop()
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return fmt.Errorf("reading the hub's EDGE: %w", err)
		}
		if err := fn(m); err != nil {
			return err
		}
		meta, err := m.Metadata()
		if err != nil {
			return err
		}
		if meta.Sequence.Stream >= last {
			return nil
		}
	}
}

// natsBench runs `nats bench js pub <kind> args...` against the node with
// -msgs messages of -size bytes into a new stream of its own on the
// subject bench.<kind>, checks that the stream holds them all, and
// returns the rate read from the CSV it writes into work.
func (e *env) natsBench(work string, n *node, kind, stream string, args ...string) (float64, error) {
	csvPath := filepath.Join(work, kind+".csv")
	full := append([]string{"-s", n.url, "bench", "js", "pub", kind, "bench." + kind, "--stream", stream, "--create"}, args...)
	full = append(full, "--msgs", strconv.Itoa(*msgs), "--size", strconv.Itoa(*size), "--no-progress", "--csv", csvPath)
	cmd := exec.Command(e.nats, full...)
	cmd.Env = append(os.Environ(), "HOME="+work) // none of the user's nats contexts
	if o, err := cmd.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("nats %s: %v\n%s", strings.Join(full, " "), err, o)
	}
	if held, err := n.streamMsgs(stream); err != nil || held != uint64(*msgs) {
		return 0, fmt.Errorf("nats bench js pub %s: stream %s holds %d of %d messages (%v)", kind, stream, held, *msgs, err)
	}
	f, err := os.Open(csvPath)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	rate, err := benchRate(f, *size)
	if err != nil {
		return 0, fmt.Errorf("nats bench js pub %s: %w", kind, err)
	}
	return rate, nil
}

// benchRate reads the CSV `nats bench --csv` writes, one row per client,
// and returns the messages of all clients over the longest client's
// duration. Its MsgCount column counts the connection's protocol messages
// (PubAcks too, in natscli v0.5.0), so a client's messages are MsgBytes /
// size.
func benchRate(r io.Reader, size int) (float64, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	rows, err := cr.ReadAll()
	if err != nil {
		return 0, err
	}
	if len(rows) < 2 || len(rows[0]) < 7 || rows[0][3] != "MsgBytes" || rows[0][6] != "DurationSecs" {
		return 0, fmt.Errorf("unexpected CSV %q", rows)
	}
	var total, longest float64
	for _, row := range rows[1:] {
		if len(row) < 7 {
			return 0, fmt.Errorf("short CSV row %q", row)
		}
		b, err1 := strconv.ParseFloat(row[3], 64)
		d, err2 := strconv.ParseFloat(row[6], 64)
		if err := errors.Join(err1, err2); err != nil {
			return 0, fmt.Errorf("CSV row %q: %w", row, err)
		}
		total += b / float64(size)
		longest = max(longest, d)
	}
	if longest == 0 {
		return 0, fmt.Errorf("no duration in %q", rows)
	}
	return total / longest, nil
}
