package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/holdfast-io/holdfast/bench/benchkit"
	"github.com/nats-io/nats.go/jetstream"
)

// groupCommit compares, with the same `nats bench js pub` runs, a stock
// nats-server with sync_interval: always against holdfast with
// sync = "always" and group_commit = true on the stream, for each
// publisher count in -group-commit, alternating between the two servers
// (both run throughout; the idle one costs nothing measurable).
func (e *env) groupCommit(rep *bytes.Buffer) error {
	stockStore := filepath.Join(e.work, "stock-gc")
	defer os.RemoveAll(stockStore)
	stock, err := e.startStock("always", stockStore)
	if err != nil {
		return err
	}
	defer stock.stop()
	// A stock server that does not flush each message (sync_interval 2m)
	// is what any group commit through nats-server's store can at most
	// reach: it stores the same messages and skips every flush.
	noSyncStore := filepath.Join(e.work, "stock-nosync")
	defer os.RemoveAll(noSyncStore)
	noSync, err := e.startStock("2m", noSyncStore)
	if err != nil {
		return err
	}
	defer noSync.stop()
	hold, err := e.startGroupCommit(filepath.Join(e.work, "holdfast-gc"))
	if err != nil {
		return err
	}
	defer hold.stop()
	// The stock stream is created here, once, as nats bench --create
	// would; holdfast's benchstream comes from its config, with group
	// commit.
	// nats-server's own atomic batches, which group commit sends, are
	// measured on the stock server (`nats bench js pub atomic`).
	if err := createBenchStream(stock.url, true); err != nil {
		return err
	}
	if err := createBenchStream(noSync.url, false); err != nil {
		return err
	}

	fmt.Fprintf(rep, "\nGroup commit: `nats bench js pub` on the same machine, %d messages of %d bytes per figure; stock nats-server with `sync_interval: always` against holdfast with `sync = \"always\"` and `group_commit = true` (latencies in µs, from nats bench: mean p50 over the clients, largest p99; over several runs the median p50 and the largest p99). The last columns are what bounds group commit: the same publishers sending nats-server's own atomic batches of 1,000 (`nats bench js pub atomic --batch 1000`, the server's maximum) to the stock server, the path group commit's batches take (group commit/atomic: group commit's msgs/s over theirs, run by run); and a stock server that flushes nothing (`sync_interval: 2m`), which stores the same messages without any flush — no group commit through nats-server's store can be faster:\n\n", *msgs, *size)
	fmt.Fprintln(rep, "| publishers | publish | stock msgs/s | group commit msgs/s | group commit/stock | stock p50 / p99 | group commit p50 / p99 | stock atomic batches msgs/s | atomic/stock | group commit/atomic | stock without flushes msgs/s | without flushes/stock |")
	fmt.Fprintln(rep, "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, c := range strings.Split(*gc, ",") {
		clients, err := strconv.Atoi(strings.TrimSpace(c))
		if err != nil || clients < 1 {
			return fmt.Errorf("-group-commit: %q is not a publisher count", c)
		}
		for _, kind := range []string{"async", "sync"} {
			args := []string{"js", "pub", kind, "bench.data", "--clients", strconv.Itoa(clients), "--timeout", "60s"}
			if kind == "async" {
				args = append(args, "--batch", "500")
			}
			var p, atomic, bound pairs
			var sts, hfs []benchResult
			for run := 1; run <= *runs; run++ {
				logf("group commit: %d publisher(s), %s, run %d of %d: stock", clients, kind, run, *runs)
				st, err := e.natsBenchResult(stock.url, "bench.csv", args...)
				if err != nil {
					return err
				}
				logf("group commit: %d publisher(s), %s, run %d of %d: holdfast", clients, kind, run, *runs)
				hf, err := e.natsBenchResult(hold.url, "bench.csv", args...)
				if err != nil {
					return err
				}
				p.stock, p.hold = append(p.stock, st.rate), append(p.hold, hf.rate)
				sts, hfs = append(sts, st), append(hfs, hf)
				if kind == "async" {
					logf("group commit: %d publisher(s), %s, run %d of %d: stock without flushes", clients, kind, run, *runs)
					ns, err := e.natsBenchResult(noSync.url, "bench.csv", args...)
					if err != nil {
						return err
					}
					bound.stock, bound.hold = append(bound.stock, st.rate), append(bound.hold, ns.rate)
					logf("group commit: %d publisher(s), %s, run %d of %d: stock atomic batches", clients, kind, run, *runs)
					at, err := e.natsBenchResult(stock.url, "bench.csv", "js", "pub", "atomic", "bench.data", "--clients", strconv.Itoa(clients), "--timeout", "60s", "--batch", "1000")
					if err != nil {
						return err
					}
					atomic.stock, atomic.hold = append(atomic.stock, st.rate), append(atomic.hold, at.rate)
				}
			}
			// Group commit against the atomic batches of the same run.
			vsAtomic := pairs{stock: atomic.hold, hold: p.hold}
			switch {
			case clients == 1 && kind == "sync":
				e.goals = append(e.goals, benchkit.Goal{Figure: "group commit, 1 sync publisher", Against: "stock `sync_interval: always`", AtLeast: true, Target: 0.9, Values: p.ratios()})
			case clients == 16 && kind == "async":
				e.goals = append(e.goals, benchkit.Goal{Figure: "group commit, 16 async publishers", Against: "the server's own atomic batches of 1,000", AtLeast: true, Target: 0.8, Values: vsAtomic.ratios()})
			}
			fmt.Fprintf(rep, "| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", clients, kind, rate(p.stock), rate(p.hold), p.ratio(),
				latency(sts), latency(hfs), atomic.columns(), vsAtomic.ratio(), bound.columns())
		}
	}
	return nil
}

// createBenchStream creates the stream nats bench --create would:
// benchstream on bench.data, file storage; taking atomic batches when
// atomic.
func createBenchStream(url string, atomic bool) error {
	nc, js, err := benchkit.Connect(url, 5*time.Second)
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "benchstream", Subjects: []string{"bench.data"}, Storage: jetstream.FileStorage, AllowAtomicPublish: atomic})
	return err
}

// columns are the holdfast side's median rate and the ratio, or dashes
// when nothing was measured.
func (p pairs) columns() string {
	if len(p.hold) == 0 {
		return "– | –"
	}
	return rate(p.hold) + " | " + p.ratio()
}

// latency is the runs' median p50 and largest p99.
func latency(rs []benchResult) string {
	var p50, p99 []float64
	for _, r := range rs {
		if r.p50 > 0 {
			p50, p99 = append(p50, r.p50), append(p99, r.p99)
		}
	}
	if len(p50) == 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f / %.0f", median(p50), slices.Max(p99))
}

// startGroupCommit runs `holdfast run` with benchstream on bench.data and
// group commit on, sync always, no workers.
func (e *env) startGroupCommit(store string) (*proc, error) {
	conf, url, err := e.holdfastConfig("holdfast-gc.toml", store, "always", 0, true)
	if err != nil {
		return nil, err
	}
	return e.start(e.hold, []string{"run", "--config", conf}, url)
}
