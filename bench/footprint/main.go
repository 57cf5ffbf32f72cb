// Command footprint measures what a server costs while nothing happens,
// and per message at a steady rate: the CPU time and the bytes written to
// disk of stock nats-server with JetStream (sync_interval: always, and the
// same with holdfast's default streams created) and of `holdfast run` on
// its defaults, each idle for -idle after it settled, with an empty store
// and with -stored messages kept in a stream; then of stock (always and
// its default interval) and holdfast (with and without group commit)
// while -steady-msgs messages are published at -steady-rate and consumed.
// It is what `make bench-footprint` runs.
//
// It builds nats-server from the module cache (the version go.mod pins),
// runs everything on 127.0.0.1 with the stores under -dir, and removes
// them afterwards. Each stored-messages store is filled once, with the
// server's fast sync mode (stock: the default sync_interval, holdfast:
// sync = "2m"), and stopped; every run then starts the server on it with
// the measured config, waits until the stream holds every message, lets
// it settle and measures.
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
	"slices"
	"strings"
	"time"

	"github.com/holdfast-io/holdfast/bench/benchkit"
)

var (
	holdfast     = flag.String("holdfast", "bin/holdfast", "the holdfast binary (make build)")
	baseline     = flag.String("baseline", "", "another holdfast binary (a build of main) measured the same way in the same runs; empty: none")
	runs         = flag.Int("runs", 3, "runs; each measures every server in turn, and the report gives each run and the range")
	settle       = flag.Duration("settle", 5*time.Second, "how long a server runs after start-up before the idle window")
	idle         = flag.Duration("idle", 30*time.Second, "the idle window")
	stored       = flag.Int("stored", 1_000_000, "messages kept in a stream for the stored-messages figures; 0: skip them")
	size         = flag.Int("size", 128, "payload size of the stored messages in bytes")
	steadyRate   = flag.Int("steady-rate", 200, "messages per second of the steady figures (bytes and CPU per message); 0: skip them")
	commitWindow = flag.Duration("commit-window", 40*time.Millisecond, "jetstream.commit_window of the holdfast+commit_window steady server")
	steadyMsgs   = flag.Int("steady-msgs", 3000, "messages published at -steady-rate per steady run")
	handlers     = flag.Bool("handlers", true, "steady figures also through the exec handler (/bin/true) and the forward handler (an edge forwarding to a hub)")
	fsyncs       = flag.Bool("fsyncs", true, "count each steady server's fsync and fdatasync calls in one more run under strace (skipped without strace)")
	dir          = flag.String("dir", "", "parent of the work directory (default: the working directory; must not be tmpfs)")
	out          = flag.String("out", "", "also write the markdown report to this file")
	goalsFrom    = flag.String("goals", "", "a file bench/compare -goals wrote: its throughput goals join this report's table of goals")
)

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(1)
	}
}

// result is one idle window of one server.
type result struct {
	ticks      int64
	runNS      int64
	writeBytes int64
}

// scenario is a store state the servers are measured on.
type scenario struct {
	name   string
	stored int
}

func run() error {
	if *runs < 1 || *idle <= 0 || *stored < 0 || *size < 1 {
		return errors.New("-runs, -idle and -size must be positive, -stored not negative")
	}
	parent := *dir
	if parent == "" {
		parent, _ = os.Getwd()
	}
	work, err := os.MkdirTemp(parent, ".bench-footprint-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)

	natsServer := filepath.Join(work, "nats-server")
	logf("building nats-server in %s", work)
	if o, err := exec.Command("go", "build", "-o", natsServer, "github.com/nats-io/nats-server/v2").CombinedOutput(); err != nil {
		return fmt.Errorf("go build nats-server: %v\n%s", err, o)
	}
	servers := []*server{stockServer(natsServer), stockStreamsServer(natsServer)}
	steadyServers := []*server{stockServer(natsServer), stockServerSync("stock-2m", natsServer, false)}
	versions := []string{}
	for _, hf := range []struct{ name, path string }{{"holdfast", *holdfast}, {"baseline", *baseline}} {
		if hf.path == "" {
			continue
		}
		bin, err := filepath.Abs(hf.path)
		if err != nil {
			return err
		}
		v, err := exec.Command(bin, "version").Output()
		if err != nil {
			return fmt.Errorf("%s version: %w (run make build)", bin, err)
		}
		versions = append(versions, fmt.Sprintf("%s: %s", hf.name, strings.TrimSpace(string(v))))
		servers = append(servers, holdfastServer(hf.name, bin))
		steadyServers = append(steadyServers, holdfastServerWith(hf.name, bin, steadyLog),
			holdfastServerWith(hf.name+"+group_commit", bin, steadyLog+steadyGroupCommit),
			holdfastServerWindow(hf.name+"+commit_window", bin, commitWindow.String(), steadyLog))
		if *handlers {
			steadyServers = append(steadyServers, holdfastServerWith(hf.name+"+exec", bin, steadyExec+steadyLog),
				holdfastServerWindow(hf.name+"+exec+commit_window", bin, commitWindow.String(), steadyExec+steadyLog),
				holdfastEdgeServer(hf.name+"+forward", bin, ""),
				holdfastEdgeServer(hf.name+"+forward+commit_window", bin, commitWindow.String()))
		}
	}
	stockVersion, _ := exec.Command(natsServer, "--version").Output()

	scenarios := []scenario{{name: "empty store"}}
	if *stored > 0 {
		scenarios = append(scenarios, scenario{name: fmt.Sprintf("%d messages stored", *stored), stored: *stored})
	}
	// results[scenario][server][run]
	results := make([][][]result, len(scenarios))
	fills := map[string]time.Duration{}
	for si, sc := range scenarios {
		results[si] = make([][]result, len(servers))
		if sc.stored > 0 {
			for _, srv := range servers {
				took, err := fillStore(srv, work, sc.stored)
				if err != nil {
					return fmt.Errorf("%s: fill: %w", srv.name, err)
				}
				fills[srv.name] = took
				logf("%s: %d messages stored in %s", srv.name, sc.stored, took.Round(100*time.Millisecond))
			}
		}
		for r := 1; r <= *runs; r++ {
			for i, srv := range servers {
				res, err := measureIdle(srv, work, sc)
				if err != nil {
					return fmt.Errorf("%s, %s, run %d: %w", srv.name, sc.name, r, err)
				}
				logf("%s, %s, run %d of %d: %d ticks, %.1f ms on CPU, %d bytes written", srv.name, sc.name, r, *runs,
					res.ticks, float64(res.runNS)/1e6, res.writeBytes)
				results[si][i] = append(results[si][i], res)
			}
		}
	}

	// steady[server][run]; syncs[server]: fsyncs per message, or nil
	var steady [][]steadyResult
	var syncs []float64
	if *steadyRate > 0 {
		steady = make([][]steadyResult, len(steadyServers))
		for r := 1; r <= *runs; r++ {
			for i, srv := range steadyServers {
				res, err := measureSteady(srv, work, *steadyMsgs, *steadyRate, *size, false)
				if err != nil {
					return fmt.Errorf("%s, steady, run %d: %w", srv.name, r, err)
				}
				logf("%s, %d msg/s, run %d of %d: %.0f B written and %.2f ms on CPU per message, PubAck p50 %s p99 %s, handled p50 %s p99 %s", srv.name, *steadyRate, r, *runs,
					res.bytesPerMsg(), res.cpuMSPerMsg(), res.p50.Round(10*time.Microsecond), res.p99.Round(10*time.Microsecond),
					res.handled50.Round(10*time.Microsecond), res.handled99.Round(10*time.Microsecond))
				steady[i] = append(steady[i], res)
			}
		}
		if _, err := exec.LookPath("strace"); *fsyncs && err == nil {
			syncs = make([]float64, len(steadyServers))
			for i, srv := range steadyServers {
				res, err := measureSteady(srv, work, *steadyMsgs, *steadyRate, *size, true)
				if err != nil {
					return fmt.Errorf("%s, steady under strace: %w", srv.name, err)
				}
				syncs[i] = float64(res.syncs) / float64(res.msgs)
				logf("%s, %d msg/s, under strace: %.2f fsync and fdatasync calls per message", srv.name, *steadyRate, syncs[i])
			}
		} else if *fsyncs {
			logf("strace not installed: no fsync counts (apt-get install strace)")
		}
	}

	var rep bytes.Buffer
	fmt.Fprintf(&rep, "Measured by `make bench-footprint` (%s): stock %s; %s; %d CPUs, kernel %s; stores under %s.\n\n",
		time.Now().UTC().Format("2006-01-02"), strings.TrimSpace(string(stockVersion)), strings.Join(versions, "; "),
		runtime.NumCPU(), kernel(), parent)
	fmt.Fprintf(&rep, "Each server idle for %s after %s of settling, %d runs, servers in turn within each run. "+
		"Stock: nats-server with JetStream on the file store, `sync_interval: always`. "+
		"stock+streams: the same with holdfast's default streams ORDERS and ORDERS_DLQ and the durable consumer WORKER1 created in it, nothing pulling: "+
		"the server's own idle cost for what holdfast creates. "+
		"holdfast: `holdfast run` on its defaults (stream ORDERS, 4 workers, monitor, HTTP), only ports and store set. "+
		"CPU ticks: utime+stime from /proc/PID/stat (1/%d s); CPU ms: the threads' time on a CPU from /proc/PID/task/*/schedstat; "+
		"written: write_bytes from /proc/PID/io over the window.", *idle, *settle, *runs, userHZ)
	if *stored > 0 {
		fmt.Fprintf(&rep, " Stored: %d messages of %d B in a stream %s (no limits) the benchmark creates on each server, "+
			"filled once by asynchronous publishes with the fast sync mode (stock default interval, holdfast `sync = \"2m\"`), then restarted with the measured config for every run", *stored, *size, fillStream)
		var took []string
		for _, srv := range servers {
			took = append(took, fmt.Sprintf("%s %.1f s", srv.name, fills[srv.name].Seconds()))
		}
		fmt.Fprintf(&rep, " (fill: %s)", strings.Join(took, ", "))
		fmt.Fprint(&rep, ".")
	}
	fmt.Fprint(&rep, "\n\n")
	goals := footprintGoals(servers, scenarios, results, steadyServers, steady)
	if *goalsFrom != "" {
		more, err := benchkit.LoadGoals(*goalsFrom)
		if err != nil {
			return err
		}
		goals = append(goals, more...)
	}
	fmt.Fprintf(&rep, "Goals: each run's figure against what the goal names, measured in the same run; \"today\" is holdfast on its default `sync = \"always\"` with the same handler. "+
		"Bytes per message with `commit_window = %q` (`COMMIT_WINDOW`; a longer window writes less and holds each PubAck longer). ", commitWindow.String())
	if *goalsFrom != "" {
		fmt.Fprintf(&rep, "Throughput and group commit from `bench/compare -sync always` run just before (%s).", *goalsFrom)
	} else {
		fmt.Fprint(&rep, "Throughput and group commit not measured: `make bench-footprint` runs bench/compare for them.")
	}
	fmt.Fprint(&rep, " No acknowledged message lost under power cuts with the commit window: `TestPowerLossCommitWindow` and `TestPowerLossCommitWindowCompaction` in `make test`.\n\n")
	benchkit.WriteGoals(&rep, goals)
	fmt.Fprint(&rep, "\n")
	writeTable(&rep, servers, scenarios, results)
	if steady != nil {
		fmt.Fprintf(&rep, "\nSteady: %d messages of %d B published into ORDERS at %d msg/s, each at its time whether or not the ones before were answered (as independent devices do), each acknowledged by a consumer: "+
			"on stock a pull consumer in the benchmark's process (its CPU not counted), on holdfast its own WORKER1 with the default log handler "+
			"(log level warn, so that the figures are the store's and not the log's). Per message: write_bytes and CPU time of the server's process from the first publish "+
			"until the consumer's ack floor reached the last message; latency: publish to PubAck, and publish to handled: until the consumer's `+ACK` for the message "+
			"(sent once the handler succeeded) reached a subscription of the benchmark's on $JS.ACK.> (one more small delivery per message for the server, on each). stock-2m: stock on its default sync_interval (2 minutes), "+
			"which loses acknowledged messages at a power cut. commit_window: holdfast with jetstream.commit_window = %q. "+
			"exec: WORKER1 runs /bin/true per message (its children's CPU counted, cutime+cstime). "+
			"forward: holdfast as an edge whose WORKER1 forwards each message to a hub (a second `holdfast run` with the stream EDGE, `sync = \"always\"`) over a leafnode link, "+
			"acked once the hub's PubAck came; the edge's process measured, the hub's not.\n\n", *steadyMsgs, *size, *steadyRate, commitWindow.String())
		writeSteadyTable(&rep, steadyServers, steady)
		if syncs != nil {
			fmt.Fprint(&rep, "\nfsync and fdatasync calls of the server's process per message, counted by strace in one more run of each (which slows it):\n\n| server | calls per message |\n| --- | ---: |\n")
			for i, srv := range steadyServers {
				fmt.Fprintf(&rep, "| %s | %.2f |\n", srv.name, syncs[i])
			}
		}
	}
	os.Stdout.Write(rep.Bytes())
	if *out != "" {
		return os.WriteFile(*out, rep.Bytes(), 0o644)
	}
	return nil
}

// footprintGoals are the edge-footprint goals measured here: idle CPU at
// most 1.5× stock's and no bytes written while idle, for each store
// state; bytes per message with the commit window at most 1/8 of
// holdfast's on always through the same handler; CPU per message of the
// edge forwarding to a hub at most 1/4 of the 1.7 ms measured before the
// work began (6453cf0).
func footprintGoals(servers []*server, scenarios []scenario, results [][][]result, steadyServers []*server, steady [][]steadyResult) []benchkit.Goal {
	var goals []benchkit.Goal
	hf := slices.IndexFunc(servers, func(s *server) bool { return s.name == "holdfast" })
	for si, sc := range scenarios {
		var ticks, written []float64
		for r, res := range results[si][hf] {
			ticks = append(ticks, float64(res.ticks)/float64(max(results[si][0][r].ticks, 1)))
			written = append(written, float64(res.writeBytes))
		}
		goals = append(goals,
			benchkit.Goal{Figure: "idle CPU ticks, " + sc.name, Against: servers[0].name + " (`sync_interval: always`, no stream)", Target: 1.5, Values: ticks},
			benchkit.Goal{Figure: fmt.Sprintf("bytes written while idle for %s, %s", *idle, sc.name), Against: "–", Unit: "B", Values: written})
	}
	if steady == nil {
		return goals
	}
	at := func(name string) []steadyResult {
		if i := slices.IndexFunc(steadyServers, func(s *server) bool { return s.name == name }); i >= 0 {
			return steady[i]
		}
		return nil
	}
	for _, h := range []struct{ handler, server string }{{"log", "holdfast"}, {"exec", "holdfast+exec"}, {"forward", "holdfast+forward"}} {
		today, window := at(h.server), at(h.server+"+commit_window")
		if today == nil || window == nil {
			continue
		}
		var ratios []float64
		for r := range window {
			ratios = append(ratios, window[r].bytesPerMsg()/max(today[r].bytesPerMsg(), 1))
		}
		goals = append(goals, benchkit.Goal{Figure: fmt.Sprintf("bytes written per message, %s handler, commit window", h.handler),
			Against: "today, the same handler", Target: 0.125, Values: ratios})
	}
	for _, name := range []string{"holdfast+forward", "holdfast+forward+commit_window"} {
		var ms []float64
		for _, r := range at(name) {
			ms = append(ms, r.cpuMSPerMsg())
		}
		if ms != nil {
			goals = append(goals, benchkit.Goal{Figure: "CPU per message, " + name + " (the edge's process)",
				Against: "1/4 of the edge's 1.7 ms before this work (6453cf0); stock `always` in this run below", Target: 0.43, Unit: "ms", Values: ms})
		}
	}
	return goals
}

// fillStore fills a store of its own for srv with n messages and stops
// the server; it returns how long the publishes took.
func fillStore(srv *server, work string, n int) (time.Duration, error) {
	p, err := srv.start(work, storeDir(work, srv, n), true)
	if err != nil {
		return 0, err
	}
	defer p.stop()
	start := time.Now()
	if err := p.fill(n, *size); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

func storeDir(work string, srv *server, stored int) string {
	return filepath.Join(work, fmt.Sprintf("%s-store-%d", srv.name, stored))
}

// measureIdle starts srv on the scenario's store, lets it settle and
// measures the idle window. An empty store is made anew for each run.
func measureIdle(srv *server, work string, sc scenario) (result, error) {
	store := storeDir(work, srv, sc.stored)
	if sc.stored == 0 {
		if err := os.RemoveAll(store); err != nil {
			return result{}, err
		}
	}
	p, err := srv.start(work, store, false)
	if err != nil {
		return result{}, err
	}
	defer p.stop()
	if sc.stored > 0 {
		if err := p.waitStored(sc.stored); err != nil {
			return result{}, err
		}
	}
	time.Sleep(*settle)
	before, err := readSample(p.pid())
	if err != nil {
		return result{}, err
	}
	time.Sleep(*idle)
	after, err := readSample(p.pid())
	if err != nil {
		return result{}, err
	}
	select {
	case <-p.done:
		return result{}, fmt.Errorf("%s exited during the idle window", srv.name)
	default:
	}
	return result{ticks: after.ticks - before.ticks, runNS: after.runNS - before.runNS,
		writeBytes: after.writeBytes - before.writeBytes}, nil
}

// writeTable writes, per scenario, each server's figures and each holdfast
// binary's ratios to stock and to stock+streams: one column per run and
// the range.
func writeTable(w *bytes.Buffer, servers []*server, scenarios []scenario, results [][][]result) {
	t := benchkit.NewTable(w, *runs, "store", "figure")
	secs := idle.Seconds()
	row := func(store, name, format string, values []float64) { t.Row([]string{store, name}, format, values) }
	for si, sc := range scenarios {
		for i, srv := range servers {
			var ticks, perSec, ms, written []float64
			for _, r := range results[si][i] {
				ticks = append(ticks, float64(r.ticks))
				perSec = append(perSec, float64(r.ticks)/secs)
				ms = append(ms, float64(r.runNS)/1e6)
				written = append(written, float64(r.writeBytes))
			}
			row(sc.name, fmt.Sprintf("%s CPU ticks per %s", srv.name, *idle), "%.0f", ticks)
			row(sc.name, fmt.Sprintf("%s CPU ticks per s", srv.name), "%.2f", perSec)
			row(sc.name, fmt.Sprintf("%s CPU ms per %s (schedstat)", srv.name, *idle), "%.1f", ms)
			row(sc.name, fmt.Sprintf("%s bytes written per %s", srv.name, *idle), "%.0f", written)
		}
		for _, base := range []int{0, 1} {
			for i, srv := range servers {
				if !srv.holdfast {
					continue
				}
				var ticks, ms []float64
				for r := range results[si][base] {
					stock, hf := results[si][base][r], results[si][i][r]
					// A stock window of 0 ticks counts as 1: the ratio is
					// then a lower bound.
					ticks = append(ticks, float64(hf.ticks)/float64(max(stock.ticks, 1)))
					ms = append(ms, float64(hf.runNS)/float64(max(stock.runNS, 1)))
				}
				row(sc.name, fmt.Sprintf("**%s/%s, CPU ticks**", srv.name, servers[base].name), "**%.2f×**", ticks)
				row(sc.name, fmt.Sprintf("%s/%s, CPU ms", srv.name, servers[base].name), "%.2f×", ms)
			}
		}
	}
}

// writeSteadyTable writes each steady server's figures per message and
// each holdfast figure's ratio to stock (sync_interval always).
func writeSteadyTable(w *bytes.Buffer, servers []*server, results [][]steadyResult) {
	t := benchkit.NewTable(w, *runs, "figure")
	row := func(name, format string, values []float64) { t.Row([]string{name}, format, values) }
	per := func(rs []steadyResult, f func(steadyResult) float64) []float64 {
		var out []float64
		for _, r := range rs {
			out = append(out, f(r))
		}
		return out
	}
	for i, srv := range servers {
		row(srv.name+" bytes written per message", "%.0f", per(results[i], steadyResult.bytesPerMsg))
		row(srv.name+" CPU ms per message", "%.3f", per(results[i], steadyResult.cpuMSPerMsg))
		row(srv.name+" PubAck p50 ms", "%.2f", per(results[i], func(r steadyResult) float64 { return float64(r.p50) / 1e6 }))
		row(srv.name+" PubAck p99 ms", "%.2f", per(results[i], func(r steadyResult) float64 { return float64(r.p99) / 1e6 }))
		row(srv.name+" publish→handled p50 ms", "%.2f", per(results[i], func(r steadyResult) float64 { return float64(r.handled50) / 1e6 }))
		row(srv.name+" publish→handled p99 ms", "%.2f", per(results[i], func(r steadyResult) float64 { return float64(r.handled99) / 1e6 }))
	}
	for i, srv := range servers {
		if !srv.holdfast {
			continue
		}
		var b, c []float64
		for r := range results[i] {
			stock, hf := results[0][r], results[i][r]
			b = append(b, hf.bytesPerMsg()/max(stock.bytesPerMsg(), 1))
			c = append(c, hf.cpuMSPerMsg()/max(stock.cpuMSPerMsg(), 1e-9))
		}
		row("**"+srv.name+"/stock, bytes per message**", "**%.2f×**", b)
		row(srv.name+"/stock, CPU per message", "%.2f×", c)
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench-footprint: "+format+"\n", args...)
}

func kernel() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}
