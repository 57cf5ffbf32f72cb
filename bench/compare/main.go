// Command compare measures a stock nats-server with the nats CLI's
// `nats bench` and `holdfast bench` on the same machine, with the same
// message size and count, and prints a markdown table with the ratios
// holdfast/stock. It is what `make bench-compare` runs.
//
// It builds nats-server and the nats CLI from the module cache (the
// versions go.mod pins) and holdfast from this tree, runs everything on
// 127.0.0.1 with the stores under -dir, and removes them afterwards.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/holdfast-io/holdfast/bench/benchkit"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

var (
	msgs    = flag.Int("msgs", 20000, "messages per figure")
	size    = flag.Int("size", 128, "payload size in bytes")
	workers = flag.Int("workers", 4, "holdfast workers")
	syncs   = flag.String("sync", "always,2m", "sync modes: always and/or an interval (stock: sync_interval)")
	dir     = flag.String("dir", "", "parent of the work directory (default: the working directory; must not be tmpfs)")
	out     = flag.String("out", "", "also write the markdown report to this file")
	idle    = flag.Duration("idle", 10*time.Second, "how long each server sits idle before its RSS is read")
	runs    = flag.Int("runs", 1, "runs of every figure, stock and holdfast alternately; ratios are reported as the median and range over the runs")
	gc      = flag.String("group-commit", "1,4,16", "publisher counts for the group-commit comparison (stock sync_interval: always vs holdfast group_commit); empty: skip")
	goalsTo = flag.String("goals", "", "also write, as JSON to this file, the figures the edge-footprint goals name (sync always: drain and end to end against stock and the bare client; group commit's lone sync publisher and 16 async publishers), for make bench-footprint's table")
)

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(1)
	}
}

type env struct {
	work                   string
	natsServer, nats, hold string
	home                   string
	// goals collects the figures -goals writes, as they are measured.
	goals []benchkit.Goal
}

func run() error {
	if *runs < 1 {
		return fmt.Errorf("-runs %d: give 1 or more runs", *runs)
	}
	parent := *dir
	if parent == "" {
		parent, _ = os.Getwd()
	}
	work, err := os.MkdirTemp(parent, ".bench-compare-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	e := &env{work: work, natsServer: filepath.Join(work, "nats-server"), nats: filepath.Join(work, "nats"),
		hold: filepath.Join(work, "holdfast"), home: filepath.Join(work, "home")}
	if err := os.Mkdir(e.home, 0o700); err != nil {
		return err
	}
	logf("building nats-server, nats and holdfast in %s", work)
	for _, b := range [][]string{
		{"build", "-o", e.natsServer, "github.com/nats-io/nats-server/v2"},
		{"build", "-o", e.nats, "github.com/nats-io/natscli/nats"},
		{"build", "-trimpath", "-o", e.hold, "./cmd/holdfast"},
	} {
		if o, err := exec.Command("go", b...).CombinedOutput(); err != nil {
			return fmt.Errorf("go %s: %v\n%s", strings.Join(b, " "), err, o)
		}
	}
	version, _ := exec.Command(e.natsServer, "--version").Output()
	natsVersion, _ := exec.Command(e.nats, "--version").CombinedOutput()

	var rep bytes.Buffer
	fmt.Fprintf(&rep, "Measured by `make bench-compare` (%s): %d messages of %d bytes, 1 publisher, holdfast with %d workers.\n\n",
		time.Now().UTC().Format("2006-01-02"), *msgs, *size, *workers)
	if *runs > 1 {
		fmt.Fprintf(&rep, "Each figure measured in %d runs, stock and holdfast alternately: msgs/s are the medians; holdfast/stock is the median of the runs' ratios, then their range and each run's ratio in order.\n\n", *runs)
	}
	fmt.Fprintf(&rep, "Stock: %s, nats CLI %s; both on 127.0.0.1, stores in %s.\n\n",
		strings.TrimSpace(string(version)), strings.TrimSpace(string(natsVersion)), parent)
	var rss, ratios bytes.Buffer
	var machine string
	var modes []string
	if *syncs != "" {
		modes = strings.Split(*syncs, ",")
		fmt.Fprintln(&rep, "| sync | figure | stock msgs/s | holdfast msgs/s | holdfast/stock |")
		fmt.Fprintln(&rep, "| --- | --- | ---: | ---: | ---: |")
	}
	for _, mode := range modes {
		mode = strings.TrimSpace(mode)
		f := newFigures()
		for run := 1; run <= *runs; run++ {
			m, err := e.measure(mode, run, f)
			if err != nil {
				return err
			}
			machine = m
		}
		row := func(name string) {
			p := f.get(name)
			fmt.Fprintf(&rep, "| %s | %s | %s | %s | %s |\n", mode, name, rate(p.stock), rate(p.hold), p.ratio())
		}
		for _, name := range f.order {
			if !strings.HasPrefix(name, "rss ") && !strings.HasPrefix(name, "e2e ") {
				row(name)
			}
		}
		for _, h := range []string{"exec", "http"} {
			if p := f.get("e2e " + h); len(p.hold) > 0 {
				fmt.Fprintf(&rep, "| %s | end to end, %s handler | – | %s | – |\n", mode, h, rate(p.hold))
			}
		}
		if mode == "always" {
			e.goals = append(e.goals, alwaysGoals(f)...)
		}
		withGC := ""
		if p := f.get(figRunGC); len(p.hold) > 0 {
			withGC = fmt.Sprintf(", %s with group_commit = true", p.ratio())
		}
		fmt.Fprintf(&ratios, "sync %s: drain %s (a bare nats.go client in holdfast's process: %s); end to end %s with nats bench's publisher (%s with holdfast bench's, where a bare nats.go client reached %s%s); target ≥ 1.20×\n", mode,
			f.get(figDrain).ratio(), f.get(figBare).ratio(), f.get(figRun).ratio(), f.get(figE2E).ratio(), f.get(figE2EBare).ratio(), withGC)
		for _, when := range []string{"after load", "after restart"} {
			p := f.get("rss " + when)
			var diff []float64
			for i := range p.stock {
				diff = append(diff, p.hold[i]-p.stock[i])
			}
			spread := ""
			if len(diff) > 1 {
				spread = fmt.Sprintf(" (%+.1f to %+.1f)", mib(int64(slices.Min(diff))), mib(int64(slices.Max(diff))))
			}
			fmt.Fprintf(&rss, "| %s | %s | %.1f | %.1f | %+.1f%s |\n", mode, when, mib(int64(median(p.stock))), mib(int64(median(p.hold))),
				mib(int64(median(diff))), spread)
		}
	}
	if len(modes) > 0 {
		fmt.Fprintf(&rep, "\nIdle RSS (MiB), each holding the same %d messages with one durable consumer that acked them all, after %s idle:\n\n", 2**msgs, *idle)
		fmt.Fprintln(&rep, "| sync | when | stock | holdfast | holdfast − stock |")
		fmt.Fprintln(&rep, "| --- | --- | ---: | ---: | ---: |")
		rep.Write(rss.Bytes())
	}
	if *gc != "" {
		if err := e.groupCommit(&rep); err != nil {
			return fmt.Errorf("group commit: %w", err)
		}
	}
	if machine != "" {
		fmt.Fprintf(&rep, "\nMachine: %s\n", machine)
	}
	if ratios.Len() > 0 {
		fmt.Fprintf(&rep, "\nRatios holdfast/stock:\n\n")
		for _, l := range strings.Split(strings.TrimSpace(ratios.String()), "\n") {
			fmt.Fprintf(&rep, "- %s\n", l)
		}
	}
	os.Stdout.Write(rep.Bytes())
	if *goalsTo != "" {
		if err := benchkit.SaveGoals(*goalsTo, e.goals); err != nil {
			return err
		}
	}
	if *out != "" {
		return os.WriteFile(*out, rep.Bytes(), 0o644)
	}
	return nil
}

// alwaysGoals are the throughput goals of the edge-footprint work, from
// the figures of sync always: draining and the live pipeline at least as
// fast as stock, and within 5 % of a bare nats.go client in holdfast's
// process.
func alwaysGoals(f *figures) []benchkit.Goal {
	vsBare := func(fig, bare string) []float64 {
		return pairs{stock: f.get(bare).hold, hold: f.get(fig).hold}.ratios()
	}
	return []benchkit.Goal{
		{Figure: "workers draining a filled stream, no-op handler, `always`", Against: "stock `nats bench js consume`", AtLeast: true, Target: 1, Values: f.get(figDrain).ratios()},
		{Figure: "the same", Against: "a bare nats.go client in holdfast's process", AtLeast: true, Target: 0.95, Values: vsBare(figDrain, figBare)},
		{Figure: "live pipeline (publish → handled → acked), no-op handler, `always`", Against: "stock consume with publish at once", AtLeast: true, Target: 1, Values: f.get(figE2E).ratios()},
		{Figure: "the same", Against: "a bare nats.go client in holdfast's process", AtLeast: true, Target: 0.95, Values: vsBare(figE2E, figE2EBare)},
		{Figure: "the same, `holdfast run` (log handler) fed by `nats bench js pub async`", Against: "stock consume with publish at once", AtLeast: true, Target: 1, Values: f.get(figRun).ratios()},
	}
}

// The figures of a sync mode, by the name they are printed with.
const (
	figDrain   = "drain: consume, explicit ack (stock: callback, batch 500, Ack; holdfast: workers, no-op handler, acks confirmed by batch)"
	figBare    = "drain ceiling: a bare nats.go client in holdfast's process (Consume, batch 500, Ack; none of holdfast's pipeline) vs stock js consume"
	figE2EBare = "end to end ceiling: a bare nats.go client in holdfast's process consuming while holdfast bench's publisher publishes vs stock js consume with js pub async at once"
	figE2E     = "end to end, no-op handler, holdfast bench (its own publisher in-process) vs stock js consume with js pub async at once"
	figRun     = "end to end, `holdfast run` (4 workers, log handler at warn) vs stock, both fed by nats bench js pub async"
	figRunGC   = "end to end, `holdfast run` as above with group_commit = true on its stream (still a flush before each PubAck) vs the same stock"
)

// measure runs, for sync mode, stock and then holdfast once and adds what
// they measured to f; it returns holdfast bench's machine line.
func (e *env) measure(mode string, run int, f *figures) (string, error) {
	logf("sync %s, run %d of %d: stock nats-server + nats bench", mode, run, *runs)
	st, err := e.stock(mode)
	if err != nil {
		return "", fmt.Errorf("stock, sync %s: %w", mode, err)
	}
	logf("sync %s, run %d of %d: holdfast bench", mode, run, *runs)
	hf, machine, err := e.holdfastBench(mode)
	if err != nil {
		return "", fmt.Errorf("holdfast bench, sync %s: %w", mode, err)
	}
	f.add("publish async (window 500)", st.pubAsync, hf["publish async"])
	f.add("publish sync", st.pubSync, hf["publish sync"])
	f.add(figDrain, st.consume, hf["consume (noop)"])
	f.add("drain, stock with DoubleAck", st.consumeDouble, hf["consume (noop)"])
	f.add(figBare, st.consume, hf["consume (bare nats.go)"])
	f.add(figE2E, st.pipeline, hf["e2e noop"])
	f.add(figE2EBare, st.pipeline, hf["e2e bare nats.go"])
	for _, h := range []string{"exec", "http"} {
		if v, ok := hf["e2e "+h]; ok {
			f.add("e2e "+h, 0, v)
		}
	}

	logf("sync %s, run %d of %d: idle RSS with the same data", mode, run, *runs)
	stockRSS, stockRestart, err := e.stockRSS(mode)
	if err != nil {
		return "", fmt.Errorf("stock RSS: %w", err)
	}
	holdRSS, holdRestart, holdPipeline, err := e.holdfastRSS(mode)
	if err != nil {
		return "", fmt.Errorf("holdfast RSS: %w", err)
	}
	f.add(figRun, st.pipeline, holdPipeline)
	if mode == "always" {
		logf("sync %s, run %d of %d: holdfast run with group commit, end to end", mode, run, *runs)
		gcPipeline, err := e.groupCommitPipeline()
		if err != nil {
			return "", fmt.Errorf("holdfast run with group commit: %w", err)
		}
		f.add(figRunGC, st.pipeline, gcPipeline)
	}
	f.add("rss after load", float64(stockRSS), float64(holdRSS))
	f.add("rss after restart", float64(stockRestart), float64(holdRestart))
	return machine, nil
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench-compare: "+format+"\n", args...)
}

func num(v float64) string {
	if v == 0 {
		return "–"
	}
	return strconv.FormatFloat(v, 'f', 0, 64)
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// proc is a running server.
type proc struct {
	cmd  *exec.Cmd
	url  string
	done chan struct{}
}

func (e *env) start(bin string, args []string, url string) (*proc, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "HOME="+e.home)
	logFile, err := os.OpenFile(filepath.Join(e.work, filepath.Base(bin)+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, url: url, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	deadline := time.Now().Add(time.Minute)
	for {
		nc, err := nats.Connect(url, nats.Timeout(time.Second))
		if err == nil {
			js, _ := jetstream.New(nc)
			_, err = js.AccountInfo(context.Background())
			nc.Close()
			if err == nil {
				return p, nil
			}
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("%s exited at start-up: see %s", bin, logFile.Name())
		default:
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, fmt.Errorf("%s not ready after a minute: %v", bin, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// rss reads VmRSS after the idle period.
func (p *proc) rss() (int64, error) {
	time.Sleep(*idle)
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmRSS")
}

func (e *env) stockConfig(mode, store string, port int) (string, error) {
	sync := ""
	if mode == "always" {
		sync = "sync_interval: always"
	} else if mode != "" {
		sync = "sync_interval: " + mode
	}
	text := fmt.Sprintf("listen: 127.0.0.1:%d\njetstream {\n  store_dir: %q\n  max_file_store: 10GB\n  max_memory_store: 1GB\n  %s\n}\n", port, store, sync)
	path := filepath.Join(e.work, "nats-server.conf")
	return path, os.WriteFile(path, []byte(text), 0o644)
}

func (e *env) startStock(mode, store string) (*proc, error) {
	port, err := benchkit.FreePort()
	if err != nil {
		return nil, err
	}
	conf, err := e.stockConfig(mode, store, port)
	if err != nil {
		return nil, err
	}
	return e.start(e.natsServer, []string{"-c", conf}, fmt.Sprintf("nats://127.0.0.1:%d", port))
}

// natsBench runs `nats bench` with --csv and returns the msgs/s of its
// first result row.
func (e *env) natsBench(url string, args ...string) (float64, error) {
	return e.natsBenchCSV(url, "bench.csv", args...)
}

// natsBenchCSV is natsBench with its CSV in the work directory's file csvName
// (two runs at once need two).
func (e *env) natsBenchCSV(url, csvName string, args ...string) (float64, error) {
	r, err := e.natsBenchResult(url, csvName, args...)
	return r.rate, err
}

// benchResult is one `nats bench` run over all its clients: messages over
// the longest client's duration, the mean of the clients' p50 latencies
// and the largest p99 (0 when nats bench measured none).
type benchResult struct{ rate, p50, p99 float64 }

// natsBenchResult runs `nats bench` with its CSV in the work directory's
// file csvName.
func (e *env) natsBenchResult(url, csvName string, args ...string) (benchResult, error) {
	csvPath := filepath.Join(e.work, csvName)
	_ = os.Remove(csvPath)
	full := append([]string{"-s", url, "bench"}, args...)
	full = append(full, "--msgs", strconv.Itoa(*msgs), "--size", strconv.Itoa(*size), "--no-progress", "--csv", csvPath)
	cmd := exec.Command(e.nats, full...)
	cmd.Env = append(os.Environ(), "HOME="+e.home)
	if o, err := cmd.CombinedOutput(); err != nil {
		return benchResult{}, fmt.Errorf("nats %s: %v\n%s", strings.Join(full, " "), err, o)
	}
	f, err := os.Open(csvPath)
	if err != nil {
		return benchResult{}, err
	}
	defer f.Close()
	res, err := parseBenchCSV(f, *size)
	if err != nil {
		return benchResult{}, fmt.Errorf("nats bench %s: %w", args[0], err)
	}
	return res, nil
}

// parseBenchCSV reads the CSV `nats bench --csv` writes: one row per
// client. Its MsgCount column is the connection's protocol messages in and
// out (natscli v0.5.0 internal/bench.NewSample: nc.OutMsgs + nc.InMsgs, so
// every ack and PubAck counts too, about twice the messages); the client's
// messages are MsgBytes / size (msgSize × the client's job count).
func parseBenchCSV(r io.Reader, size int) (benchResult, error) {
	if size <= 0 {
		return benchResult{}, fmt.Errorf("message size %d: must be positive", size)
	}
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	rows, err := cr.ReadAll()
	if err != nil {
		return benchResult{}, err
	}
	if len(rows) < 2 || len(rows[0]) < 7 || rows[0][3] != "MsgBytes" || rows[0][6] != "DurationSecs" {
		return benchResult{}, fmt.Errorf("unexpected CSV %q", rows)
	}
	var res benchResult
	var msgsTotal, longest float64
	for _, row := range rows[1:] {
		if len(row) < 7 {
			return benchResult{}, fmt.Errorf("short CSV row %q", row)
		}
		b, err1 := strconv.ParseFloat(row[3], 64)
		d, err2 := strconv.ParseFloat(row[6], 64)
		if err := errors.Join(err1, err2); err != nil {
			return benchResult{}, fmt.Errorf("CSV row %q: %w", row, err)
		}
		msgsTotal += b / float64(size)
		longest = max(longest, d)
		if len(row) >= 13 {
			p50, _ := strconv.ParseFloat(row[10], 64)
			p99, _ := strconv.ParseFloat(row[12], 64)
			res.p50 += p50 / float64(len(rows)-1)
			res.p99 = max(res.p99, p99)
		}
	}
	if longest == 0 {
		return benchResult{}, fmt.Errorf("no duration in %q", rows)
	}
	res.rate = msgsTotal / longest
	return res, nil
}

type stockFigures struct{ pubAsync, pubSync, consume, consumeDouble, pipeline float64 }

// stock runs nats bench against a fresh stock server: async and sync
// publish (2×msgs stored), then a durable pull consumer with explicit acks
// reads msgs with Ack and the next msgs with DoubleAck; then the pipeline:
// the consumer started first, waiting, and msgs published async while it
// consumes (its rate).
func (e *env) stock(mode string) (st stockFigures, err error) {
	store := filepath.Join(e.work, "stock-"+mode)
	defer os.RemoveAll(store)
	p, err := e.startStock(mode, store)
	if err != nil {
		return st, err
	}
	defer p.stop()
	if st.pubAsync, err = e.natsBench(p.url, "js", "pub", "async", "bench.data", "--create", "--batch", "500"); err != nil {
		return st, err
	}
	if st.pubSync, err = e.natsBench(p.url, "js", "pub", "sync", "bench.data"); err != nil {
		return st, err
	}
	if st.consume, err = e.natsBench(p.url, "js", "consume", "--acks", "explicit"); err != nil {
		return st, err
	}
	if st.consumeDouble, err = e.natsBench(p.url, "js", "consume", "--acks", "explicit", "--doubleack"); err != nil {
		return st, err
	}
	st.pipeline, err = e.stockPipeline(p.url)
	return st, err
}

// stockPipeline starts `nats bench js consume` on the drained durable
// consumer, waits until its pull request is at the server, publishes msgs
// with `nats bench js pub async` at the same time and returns the
// consumer's rate.
func (e *env) stockPipeline(url string) (float64, error) {
	type result struct {
		rate float64
		err  error
	}
	done := make(chan result, 1)
	go func() {
		r, err := e.natsBenchCSV(url, "consume.csv", "js", "consume", "--acks", "explicit")
		done <- result{r, err}
	}()
	nc, js, err := benchkit.Connect(url, 5*time.Second)
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := js.Consumer(ctx, "benchstream", "nats-bench")
		var info *jetstream.ConsumerInfo
		if err == nil {
			info, err = c.Info(ctx)
		}
		cancel()
		if err == nil && info.NumWaiting > 0 {
			break
		}
		select {
		case r := <-done:
			return 0, fmt.Errorf("nats bench js consume ended before the publish: %v", r.err)
		default:
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("nats bench js consume not waiting for messages after 30s (%v)", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := e.natsBench(url, "js", "pub", "async", "bench.data", "--batch", "500"); err != nil {
		return 0, err
	}
	r := <-done
	return r.rate, r.err
}

func (e *env) holdfastBench(mode string) (map[string]float64, string, error) {
	cmd := exec.Command(e.hold, "bench", "--msgs", strconv.Itoa(*msgs), "--size", strconv.Itoa(*size),
		"--workers", strconv.Itoa(*workers), "--sync", mode, "--dir", e.work, "--json")
	cmd.Env = append(os.Environ(), "HOME="+e.home)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	o, err := cmd.Output()
	if err != nil {
		return nil, "", fmt.Errorf("%v\n%s", err, stderr.String())
	}
	var rep struct {
		Machine struct {
			CPUs      int    `json:"cpus"`
			Kernel    string `json:"kernel"`
			GoVersion string `json:"go_version"`
			StoreFS   string `json:"store_fs"`
		} `json:"machine"`
		Runs []struct {
			Figures []struct {
				Name       string  `json:"name"`
				MsgsPerSec float64 `json:"msgs_per_sec"`
			} `json:"figures"`
		} `json:"runs"`
	}
	if err := json.Unmarshal(o, &rep); err != nil {
		return nil, "", err
	}
	figs := map[string]float64{}
	for _, r := range rep.Runs {
		for _, f := range r.Figures {
			figs[f.Name] = f.MsgsPerSec
		}
	}
	m := rep.Machine
	return figs, fmt.Sprintf("%d CPUs, %s, %s, store on %s", m.CPUs, m.Kernel, m.GoVersion, m.StoreFS), nil
}

// stockRSS fills a stock server with 2×msgs, consumes them all with
// explicit acks, and reads its idle RSS, then again after a restart.
func (e *env) stockRSS(mode string) (load, restart int64, err error) {
	store := filepath.Join(e.work, "stock-rss-"+mode)
	defer os.RemoveAll(store)
	p, err := e.startStock(mode, store)
	if err != nil {
		return 0, 0, err
	}
	if err := e.fill(p.url, true); err != nil {
		p.stop()
		return 0, 0, err
	}
	for range 2 {
		if _, err := e.natsBench(p.url, "js", "consume", "--acks", "explicit"); err != nil {
			p.stop()
			return 0, 0, err
		}
	}
	load, err = p.rss()
	p.stop()
	if err != nil {
		return 0, 0, err
	}
	if p, err = e.startStock(mode, store); err != nil {
		return 0, 0, err
	}
	defer p.stop()
	restart, err = p.rss()
	return load, restart, err
}

func (e *env) fill(url string, create bool) error {
	args := []string{"js", "pub", "async", "bench.data"}
	if create {
		args = append(args, "--create")
	}
	if _, err := e.natsBench(url, args...); err != nil {
		return err
	}
	_, err := e.natsBench(url, "js", "pub", "sync", "bench.data")
	return err
}

// holdfastRSS runs `holdfast run` with the stream benchstream and a
// consumer whose workers ack everything (log handler, log level warn),
// publishes the same messages with nats bench, waits until all are acked
// and reads its idle RSS, then again after a restart. The first msgs are
// published with `nats bench js pub async` while the workers run: the
// shipped daemon's end-to-end rate with the publisher stock uses.
func (e *env) holdfastRSS(mode string) (load, restart int64, pipeline float64, err error) {
	store := filepath.Join(e.work, "holdfast-rss-"+mode)
	defer os.RemoveAll(store)
	conf, url, err := e.holdfastConfig("holdfast.toml", store, mode, *workers, false)
	if err != nil {
		return 0, 0, 0, err
	}
	args := []string{"run", "--config", conf}
	p, err := e.start(e.hold, args, url)
	if err != nil {
		return 0, 0, 0, err
	}
	if pipeline, err = e.holdfastPipeline(url); err != nil {
		p.stop()
		return 0, 0, 0, err
	}
	if _, err := e.natsBench(url, "js", "pub", "sync", "bench.data"); err != nil {
		p.stop()
		return 0, 0, 0, err
	}
	if err := waitAcked(url, "benchstream", "WORKER", uint64(2**msgs)); err != nil {
		p.stop()
		return 0, 0, 0, err
	}
	load, err = p.rss()
	p.stop()
	if err != nil {
		return 0, 0, 0, err
	}
	if p, err = e.start(e.hold, args, url); err != nil {
		return 0, 0, 0, err
	}
	defer p.stop()
	restart, err = p.rss()
	return load, restart, pipeline, err
}

// holdfastConfig writes the config of a `holdfast run` (file name in the
// work directory) on a free port: the stream benchstream on bench.data,
// keeping everything, and the consumer WORKER with workers log-handler
// workers (none: 0) at log level warn; group_commit on the stream when
// groupCommit. It returns the file and the NATS URL.
func (e *env) holdfastConfig(name, store, sync string, workers int, groupCommit bool) (conf, url string, err error) {
	port, err := benchkit.FreePort()
	if err != nil {
		return "", "", err
	}
	conf = filepath.Join(e.work, name)
	text := fmt.Sprintf(`[server]
host = "127.0.0.1"
port = %d
[jetstream]
store_dir = %q
sync = %q
max_file_store = "10GB"
[http]
listen = ""
[log]
level = "warn"
[streams.benchstream]
subjects = ["bench.data"]
max_msgs = -1
max_age = "0s"
group_commit = %t
[consumers.WORKER]
stream = "benchstream"
workers = %d
handler = "log"
`, port, store, sync, groupCommit, workers)
	return conf, fmt.Sprintf("nats://127.0.0.1:%d", port), os.WriteFile(conf, []byte(text), 0o644)
}

// groupCommitPipeline is the end-to-end figure of `holdfast run` with
// group commit on its stream (sync always, the workers of holdfastRSS).
func (e *env) groupCommitPipeline() (float64, error) {
	store := filepath.Join(e.work, "holdfast-e2e-gc")
	defer os.RemoveAll(store)
	conf, url, err := e.holdfastConfig("holdfast-e2e-gc.toml", store, "always", *workers, true)
	if err != nil {
		return 0, err
	}
	p, err := e.start(e.hold, []string{"run", "--config", conf}, url)
	if err != nil {
		return 0, err
	}
	defer p.stop()
	return e.holdfastPipeline(url)
}

// holdfastPipeline runs `nats bench js pub async` against the holdfast at
// url and returns the rate at which the consumer WORKER's ack floor moved
// while it did: from the first poll that saw it move to the poll that saw
// msgs more acked than before publish.
func (e *env) holdfastPipeline(url string) (float64, error) {
	publish := func() error {
		_, err := e.natsBench(url, "js", "pub", "async", "bench.data", "--batch", "500")
		return err
	}
	nc, js, err := benchkit.Connect(url, 5*time.Second)
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	// holdfast answers the JetStream API before its bootstrap created the
	// stream and the consumer.
	var c jetstream.Consumer
	for start := time.Now(); ; time.Sleep(50 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err = js.Consumer(ctx, "benchstream", "WORKER")
		cancel()
		if err == nil {
			break
		}
		if time.Since(start) > 30*time.Second {
			return 0, fmt.Errorf("consumer WORKER: %w", err)
		}
	}
	floor := func() (uint64, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ci, err := c.Info(ctx)
		if err != nil {
			return 0, err
		}
		return ci.AckFloor.Stream, nil
	}
	base, err := floor()
	if err != nil {
		return 0, err
	}
	pubErr := make(chan error, 1)
	go func() { pubErr <- publish() }()
	var first time.Time
	var firstFloor uint64
	want := base + uint64(*msgs)
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		f, err := floor()
		now := time.Now()
		if err != nil {
			return 0, err
		}
		if first.IsZero() && f > base {
			first, firstFloor = now, f
		}
		if f >= want {
			if err := <-pubErr; err != nil {
				return 0, err
			}
			if now.Equal(first) {
				return 0, errors.New("all acked before the first poll")
			}
			return float64(want-firstFloor) / now.Sub(first).Seconds(), nil
		}
		time.Sleep(2 * time.Millisecond)
	}
	return 0, fmt.Errorf("consumer WORKER did not ack %d messages in 5 minutes", *msgs)
}

func waitAcked(url, stream, consumer string, n uint64) error {
	nc, js, err := benchkit.Connect(url, 5*time.Second)
	if err != nil {
		return err
	}
	defer nc.Close()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := js.Consumer(ctx, stream, consumer)
		var ci *jetstream.ConsumerInfo
		if err == nil {
			ci, err = c.Info(ctx)
		}
		cancel()
		if err == nil && ci.AckFloor.Stream >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("consumer %s did not ack %d messages in 5 minutes (%v)", consumer, n, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// connectJS connects to url (5 s timeout) with a JetStream context.
