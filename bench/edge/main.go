// Command edge measures how fast an edge holdfast catches up with its hub
// after an outage. It is what `make bench-edge` runs.
//
// Each run starts, in a temporary directory, an edge holdfast (ORDERS on
// orders.*, the consumer FORWARD with handler = "forward") while its hub is
// down, publishes -msgs messages to the edge with PubAcks, then starts the
// hub (domain "hub", EDGE on edge.>) and times how long the hub takes to
// hold them all. It checks that every message is on the hub exactly once,
// reads both processes' peak RSS, measures the forward latency at a steady
// -rate with the link up, and, as the reference, the hub's own ingest with
// `nats bench js pub atomic` and `js pub async`. Both sides run the
// default sync = "always", all on 127.0.0.1.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/holdfast-io/holdfast/bench/benchkit"
)

var (
	msgs     = flag.Int("msgs", 100000, "messages in the edge's backlog, and in each nats bench reference")
	size     = flag.Int("size", 128, "payload size in bytes")
	runs     = flag.Int("runs", 1, "runs; the report gives each run's figures and their range")
	window   = flag.Int("window", 500, "PubAcks outstanding while publishing to the edge")
	batch    = flag.Int("batch", 100, "batch size of the hub's atomic-batch reference")
	rate     = flag.Int("rate", 200, "steady state: messages per second published to the edge")
	steadyDu = flag.Duration("steady", 10*time.Second, "steady state: how long to publish at -rate")
	holdfast = flag.String("holdfast", "bin/holdfast", "the holdfast binary (make build)")
	dir      = flag.String("dir", "", "parent of the run directories (default: the working directory; must not be tmpfs)")
	out      = flag.String("out", "", "also write the markdown report to this file")
)

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(1)
	}
}

func run() error {
	if *runs < 1 || *msgs < 1 || *size < 8 || *rate < 1 {
		return errors.New("-runs, -msgs and -rate must be positive, -size at least 8 (the steady state's timestamp)")
	}
	parent := *dir
	if parent == "" {
		parent, _ = os.Getwd()
	}
	bin, err := filepath.Abs(*holdfast)
	if err != nil {
		return err
	}
	version, err := exec.Command(bin, "version").Output()
	if err != nil {
		return fmt.Errorf("%s version: %w (run make build)", bin, err)
	}
	// The nats CLI go.mod pins as a tool: its path in the build cache.
	natsPath, err := exec.Command("go", "tool", "-n", "nats").Output()
	if err != nil {
		return fmt.Errorf("go tool -n nats: %w", err)
	}
	env := &env{holdfast: bin, nats: strings.TrimSpace(string(natsPath)), parent: parent}
	natsVersion, _ := exec.Command(env.nats, "--version").CombinedOutput()

	var results []result
	for i := 1; i <= *runs; i++ {
		r, err := env.measure(i)
		if err != nil {
			return fmt.Errorf("run %d: %w", i, err)
		}
		logf("run %d of %d: %s", i, *runs, r)
		results = append(results, r)
	}

	var rep bytes.Buffer
	fmt.Fprintf(&rep, "Measured by `make bench-edge` (%s): %s, nats CLI %s; %d CPUs, kernel %s; stores under %s.\n\n",
		time.Now().UTC().Format("2006-01-02"), strings.TrimSpace(string(version)), strings.TrimSpace(string(natsVersion)),
		runtime.NumCPU(), kernel(), parent)
	fmt.Fprintf(&rep, "Hub and edge holdfast on 127.0.0.1, both `sync = \"always\"`, one forward worker. "+
		"Catch-up: the edge stores %d messages of %d B (PubAck, %d outstanding) while the hub is down; "+
		"the clock runs from the hub's process start until its EDGE stream holds them all (stream info every %s). "+
		"Every run checked each origin sequence on the hub exactly once. "+
		"Reference: the hub's own ingest of the same count and size into a stream of its own, with `nats bench`. "+
		"Steady state: %d msg/s for %s with the link up; latency = publish on the edge (client clock) → stored in the hub's stream (its timestamp). "+
		"Peak RSS: VmHWM at the end of the catch-up (the edge's includes its publish phase).\n\n",
		*msgs, *size, *window, pollEvery, *rate, *steadyDu)
	writeTable(&rep, figures(results))
	os.Stdout.Write(rep.Bytes())
	if *out != "" {
		return os.WriteFile(*out, rep.Bytes(), 0o644)
	}
	return nil
}

// figure is one row of the report: a name and its value in each run.
type figure struct {
	name   string
	format string
	values []float64
}

// figures turns the runs' results into the report's rows.
func figures(rs []result) []figure {
	row := func(name, format string, value func(r result) float64) figure {
		f := figure{name: name, format: format}
		for _, r := range rs {
			f.values = append(f.values, value(r))
		}
		return f
	}
	return []figure{
		row(fmt.Sprintf("backlog published to the edge (PubAck, %d outstanding), msg/s", *window), "%.0f", func(r result) float64 { return r.publish }),
		row("**catch-up: hub start → all on the hub, msg/s**", "**%.0f**", func(r result) float64 { return float64(*msgs) / r.done.Seconds() }),
		row("catch-up: hub start → all on the hub, s", "%.1f", func(r result) float64 { return r.done.Seconds() }),
		row("hub start → first message on the hub (start, link, checks), s", "%.2f", func(r result) float64 { return r.first.Seconds() }),
		row("forwarding: first message → all on the hub, msg/s", "%.0f", func(r result) float64 { return float64(*msgs) / (r.done - r.first).Seconds() }),
		row(fmt.Sprintf("hub ingest: `nats bench js pub atomic --batch %d --dedup`, msg/s", *batch), "%.0f", func(r result) float64 { return r.atomic }),
		row("hub ingest: `nats bench js pub async` (window 500), msg/s", "%.0f", func(r result) float64 { return r.async }),
		row("**catch-up / atomic**", "**%.3f**", func(r result) float64 { return float64(*msgs) / r.done.Seconds() / r.atomic }),
		row("forwarding / atomic", "%.3f", func(r result) float64 { return float64(*msgs) / (r.done - r.first).Seconds() / r.atomic }),
		row("edge peak RSS (VmHWM), MiB", "%.1f", func(r result) float64 { return mib(r.edgeHWM) }),
		row("hub peak RSS (VmHWM), MiB", "%.1f", func(r result) float64 { return mib(r.hubHWM) }),
		row("steady forward latency p50, ms", "%.1f", func(r result) float64 { return ms(r.p50) }),
		row("steady forward latency p99, ms", "%.1f", func(r result) float64 { return ms(r.p99) }),
		row("steady forward latency max, ms", "%.1f", func(r result) float64 { return ms(r.max) }),
	}
}

// writeTable writes one column per run and the range over the runs.
func writeTable(w *bytes.Buffer, figs []figure) {
	t := benchkit.NewTable(w, *runs, "figure")
	for _, f := range figs {
		t.Row([]string{f.name}, f.format, f.values)
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench-edge: "+format+"\n", args...)
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func kernel() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}
