package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/urfave/cli/v2"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/embedded"
	"github.com/holdfast-io/holdfast/pipeline"
)

// Names of what `holdfast bench` creates in its own instance, or (only the
// stream) on a running one with --server.
const (
	benchStream       = "BENCH"
	benchRemoteStream = "HOLDFAST_BENCH"
	benchDrainSubject = "bench.drain"
	benchSyncSubject  = "bench.sync"
)

// benchHandlers are the handlers `holdfast bench` can measure end to end.
var benchHandlers = []string{"noop", "exec", "http"}

func benchCommand() *cli.Command {
	return &cli.Command{
		Name:  "bench",
		Usage: "measure publish, consume and end-to-end throughput and latency through the real pipeline",
		Description: `Starts its own holdfast (embedded server on a temporary store directory, the
real bootstrap, a durable consumer and in-process workers) for each --sync
mode and measures:
  publish async   PublishAsync with at most --window PubAcks outstanding
  publish sync    one Publish at a time, each waiting for its PubAck
  consume         workers (no-op Go handler) draining the messages stored by
                  "publish async", acking each with a confirmed ack
  e2e <handler>   publish → stored → handler → ack, live, per handler
Publishers connect over TCP to 127.0.0.1 like any client; workers use the
in-process connection. Latency is from the publish call to the PubAck
(publish) or to the server receiving the handler's ack (e2e).

With --server URL it measures only the publish figures against a running
instance, in a stream HOLDFAST_BENCH (subjects holdfast.bench.>) that it
creates and deletes.`,
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "msgs", Value: 10000, Usage: "messages per figure"},
			&cli.StringFlag{Name: "size", Value: "128B", Usage: "payload size (at least 8 bytes)"},
			&cli.IntFlag{Name: "publishers", Value: 1, Usage: "concurrent publishers, each with its own connection"},
			&cli.IntFlag{Name: "window", Value: 500, Usage: "async publish: PubAcks outstanding per publisher"},
			&cli.IntFlag{Name: "workers", Value: 4, Usage: "in-process workers of the consumer"},
			&cli.StringFlag{Name: "sync", Value: "always,2m", Usage: "comma-separated jetstream.sync modes to measure: \"always\" and/or intervals"},
			&cli.StringFlag{Name: "handlers", Value: strings.Join(benchHandlers, ","), Usage: "comma-separated handlers for the e2e figures: noop, exec, http (\"\" for none)"},
			&cli.IntFlag{Name: "exec-msgs", Value: 2000, Usage: "messages for e2e exec (one process per message; 0 = --msgs)"},
			&cli.StringFlag{Name: "exec-command", Value: "/bin/true", Usage: "command of the exec handler"},
			&cli.StringFlag{Name: "dir", Usage: "parent of the temporary store directory (default: $TMPDIR, or the working directory when that is tmpfs)"},
			&cli.StringFlag{Name: "server", Usage: "NATS URL of a running holdfast: measure only publishing, against it"},
			&cli.BoolFlag{Name: "json", Usage: "print the results as JSON"},
			&cli.BoolFlag{Name: "verbose", Usage: "show holdfast's own log (only errors otherwise)"},
			&cli.StringFlag{Name: "cpuprofile", Usage: "write a CPU profile of the whole run to `FILE`", Hidden: true},
			&cli.StringFlag{Name: "memprofile", Usage: "write an allocation profile of the whole run to `FILE`", Hidden: true},
		},
		Action: runBench,
	}
}

// benchParams are the parameters of a run, as given or defaulted.
type benchParams struct {
	Msgs        int      `json:"msgs"`
	Size        int      `json:"size"`
	Publishers  int      `json:"publishers"`
	Window      int      `json:"window"`
	Workers     int      `json:"workers"`
	Sync        []string `json:"sync"`
	Handlers    []string `json:"handlers"`
	ExecMsgs    int      `json:"exec_msgs"`
	ExecCommand string   `json:"exec_command"`
	Server      string   `json:"server,omitempty"`
	Transport   string   `json:"publish_transport"`
}

// benchMachine describes where the figures were measured.
type benchMachine struct {
	CPUs       int    `json:"cpus"`
	GOOS       string `json:"goos"`
	GOARCH     string `json:"goarch"`
	GoVersion  string `json:"go_version"`
	Kernel     string `json:"kernel"`
	StoreFS    string `json:"store_fs"`
	StoreDir   string `json:"store_dir"`
	NATSServer string `json:"nats_server"`
	Holdfast   string `json:"holdfast"`
}

// benchLatency holds percentiles in microseconds.
type benchLatency struct {
	P50 float64 `json:"p50_us"`
	P90 float64 `json:"p90_us"`
	P99 float64 `json:"p99_us"`
	Max float64 `json:"max_us"`
}

// benchFigure is one measurement.
type benchFigure struct {
	Name       string        `json:"name"`
	Msgs       int           `json:"msgs"`
	Bytes      int64         `json:"bytes"`
	Seconds    float64       `json:"seconds"`
	MsgsPerSec float64       `json:"msgs_per_sec"`
	MBPerSec   float64       `json:"mb_per_sec"`
	Latency    *benchLatency `json:"latency,omitempty"`
}

// benchRun is every figure of one sync mode.
type benchRun struct {
	Sync    string        `json:"sync"`
	Figures []benchFigure `json:"figures"`
}

// benchReport is the whole result of `holdfast bench`.
type benchReport struct {
	Params  benchParams  `json:"params"`
	Machine benchMachine `json:"machine"`
	Runs    []benchRun   `json:"runs"`
}

func runBench(c *cli.Context) error {
	if c.NArg() > 0 {
		return usageError(errUnexpectedArgs(c))
	}
	p := benchParams{
		Msgs:        c.Int("msgs"),
		Publishers:  c.Int("publishers"),
		Window:      c.Int("window"),
		Workers:     c.Int("workers"),
		ExecMsgs:    c.Int("exec-msgs"),
		ExecCommand: c.String("exec-command"),
		Server:      c.String("server"),
		Transport:   "tcp",
	}
	size, err := config.ParseSize(c.String("size"))
	if err != nil {
		return usageError(fmt.Errorf("--size: %w", err))
	}
	p.Size = int(size)
	switch {
	case p.Msgs < 1:
		return usageError(errors.New("--msgs must be at least 1"))
	case p.Size < 8 || p.Size > 1<<20:
		return usageError(errors.New("--size must be between 8 bytes (the payload carries a timestamp) and 1MiB"))
	case p.Publishers < 1 || p.Publishers > p.Msgs:
		return usageError(errors.New("--publishers must be between 1 and --msgs"))
	case p.Window < 1:
		return usageError(errors.New("--window must be at least 1"))
	case p.Workers < 1:
		return usageError(errors.New("--workers must be at least 1"))
	case p.ExecMsgs < 0:
		return usageError(errors.New("--exec-msgs must not be negative"))
	}
	if p.ExecMsgs == 0 || p.ExecMsgs > p.Msgs {
		p.ExecMsgs = p.Msgs
	}
	for _, s := range splitList(c.String("sync")) {
		if s != "always" {
			if d, err := time.ParseDuration(s); err != nil || d <= 0 {
				return usageError(fmt.Errorf("--sync %q: want \"always\" or a positive interval such as \"2m\"", s))
			}
		}
		p.Sync = append(p.Sync, s)
	}
	for _, h := range splitList(c.String("handlers")) {
		if !slices.Contains(benchHandlers, h) {
			return usageError(fmt.Errorf("--handlers: unknown handler %q (want %s)", h, strings.Join(benchHandlers, ", ")))
		}
		p.Handlers = append(p.Handlers, h)
	}
	if p.Server == "" && len(p.Sync) == 0 {
		return usageError(errors.New("--sync: give at least one mode"))
	}
	if p.Server != "" {
		p.Sync, p.Handlers = []string{"server"}, nil
	}
	if slices.Contains(p.Handlers, "exec") && !filepath.IsAbs(p.ExecCommand) {
		return usageError(fmt.Errorf("--exec-command %q must be an absolute path", p.ExecCommand))
	}

	b := &bencher{params: p, out: c.App.ErrWriter}
	if isTerminal(os.Stderr) {
		b.progress = newBenchProgress(os.Stderr)
		defer b.progress.stop()
	}
	// Errors only: warnings such as "sync is an interval" are expected here.
	level := slog.LevelError
	if c.Bool("verbose") {
		level = slog.LevelInfo
	}
	b.log = slog.New(slog.NewTextHandler(c.App.ErrWriter, &slog.HandlerOptions{Level: level}))
	rep := benchReport{Params: p, Machine: benchMachineInfo()}
	stopProfiles, err := startBenchProfiles(c.String("cpuprofile"), c.String("memprofile"))
	if err != nil {
		return runtimeError(err)
	}
	defer stopProfiles()

	ctx := c.Context
	if p.Server != "" {
		run, err := b.remote(ctx)
		if err != nil {
			return runtimeError(err)
		}
		rep.Runs = append(rep.Runs, run)
		rep.Machine.StoreFS, rep.Machine.StoreDir = "remote", "remote"
	} else {
		parent, err := benchParentDir(c.String("dir"))
		if err != nil {
			return usageError(err)
		}
		for _, mode := range p.Sync {
			run, store, err := b.local(ctx, parent, mode)
			if err != nil {
				return runtimeError(fmt.Errorf("sync %s: %w", mode, err))
			}
			rep.Machine.StoreFS, rep.Machine.StoreDir = store.FSType, filepath.Dir(store.Path)
			rep.Runs = append(rep.Runs, run)
		}
	}
	if b.progress != nil {
		b.progress.stop()
	}
	if c.Bool("json") {
		enc := json.NewEncoder(c.App.Writer)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	printBenchReport(c.App.Writer, &rep)
	return nil
}

// startBenchProfiles starts a CPU profile and, when memFile is set, records
// every allocation; the returned func writes them.
func startBenchProfiles(cpuFile, memFile string) (func(), error) {
	var cpu *os.File
	if cpuFile != "" {
		f, err := os.Create(cpuFile)
		if err != nil {
			return nil, err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return nil, err
		}
		cpu = f
	}
	if memFile != "" {
		runtime.MemProfileRate = 4096
	}
	return func() {
		if cpu != nil {
			pprof.StopCPUProfile()
			cpu.Close()
		}
		if memFile != "" {
			if f, err := os.Create(memFile); err == nil {
				_ = pprof.Lookup("allocs").WriteTo(f, 0)
				f.Close()
			}
		}
	}, nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// benchParentDir is where the temporary store goes: dir, else $TMPDIR
// unless it is memory-backed (holdfast refuses tmpfs), else the working
// directory.
func benchParentDir(dir string) (string, error) {
	if dir != "" {
		return dir, nil
	}
	tmp := os.TempDir()
	var st syscall.Statfs_t
	if err := syscall.Statfs(tmp, &st); err == nil && (st.Type == 0x01021994 || st.Type == 0x858458f6) {
		return os.Getwd()
	}
	return tmp, nil
}

func benchMachineInfo() benchMachine {
	m := benchMachine{
		CPUs:       runtime.NumCPU(),
		GOOS:       runtime.GOOS,
		GOARCH:     runtime.GOARCH,
		GoVersion:  runtime.Version(),
		NATSServer: server.VERSION,
		Holdfast:   versionString(),
	}
	var u syscall.Utsname
	if err := syscall.Uname(&u); err == nil {
		m.Kernel = utsString(u.Sysname[:]) + " " + utsString(u.Release[:])
	}
	if m.Kernel == "" {
		m.Kernel = runtime.GOOS
	}
	return m
}

func utsString[T int8 | uint8](b []T) string {
	var sb strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		sb.WriteByte(byte(c))
	}
	return sb.String()
}

// bencher runs the measurements.
type bencher struct {
	params   benchParams
	out      io.Writer
	log      *slog.Logger
	progress *benchProgress
}

// local starts a holdfast instance in a fresh store under parent with the
// given sync mode and measures every figure against it.
func (b *bencher) local(ctx context.Context, parent, mode string) (run benchRun, store *embedded.StoreDirCheck, err error) {
	p := b.params
	run.Sync = mode
	dir, err := os.MkdirTemp(parent, "holdfast-bench-")
	if err != nil {
		return run, nil, fmt.Errorf("cannot create the store dir: %w", err)
	}
	defer os.RemoveAll(dir)

	httpURL, stopHTTP, err := startBenchHTTPServer()
	if err != nil {
		return run, nil, err
	}
	defer stopHTTP()

	cfg := benchConfig(dir, mode, p, httpURL)
	if err := cfg.Validate(); err != nil {
		return run, nil, err
	}
	srv := embedded.New(cfg, b.log)
	if err := srv.Open(ctx); err != nil {
		return run, nil, err
	}
	defer srv.Close(context.Background())
	store, err = embedded.CheckStoreDir(srv.StoreDir(), false, 0)
	if err != nil {
		return run, nil, err
	}
	if err := embedded.Bootstrap(ctx, srv.JetStream(), cfg, b.log); err != nil {
		return run, store, err
	}
	url := srv.NATS().ClientURL()

	// A separate in-process connection sees the workers' acks.
	acks, err := newAckWatcher(srv.NATS())
	if err != nil {
		return run, store, err
	}
	defer acks.close()

	f, err := b.publishAsync(ctx, url, benchDrainSubject, p.Msgs, "publish async", nil)
	if err != nil {
		return run, store, err
	}
	run.Figures = append(run.Figures, f)
	if f, err = b.publishSync(ctx, url, benchSyncSubject, p.Msgs); err != nil {
		return run, store, err
	}
	run.Figures = append(run.Figures, f)
	if f, err = b.consume(ctx, srv, cfg, acks); err != nil {
		return run, store, err
	}
	run.Figures = append(run.Figures, f)
	for _, h := range p.Handlers {
		f, err := b.endToEnd(ctx, srv, cfg, url, h, acks)
		if err != nil {
			return run, store, fmt.Errorf("e2e %s: %w", h, err)
		}
		run.Figures = append(run.Figures, f)
	}
	return run, store, nil
}

// benchConsumerName is the consumer of an e2e figure, or of "consume".
func benchConsumerName(handler string) string { return "BENCH_" + strings.ToUpper(handler) }

func benchE2ESubject(handler string) string { return "bench.e2e." + handler }

// benchConfig is the config of the bench instance: one stream BENCH that
// keeps everything, a consumer per figure, each filtered on its subject.
func benchConfig(dir, mode string, p benchParams, httpURL string) *config.Config {
	cfg := config.DefaultConfig()
	cfg.Server.Name = "holdfast-bench"
	cfg.Server.Port = -1
	cfg.JetStream.StoreDir = dir
	cfg.JetStream.Sync = mode
	cfg.HTTP.Listen = ""
	st := config.DefaultStream([]string{"bench.>"})
	st.MaxMsgs = -1
	st.MaxAge = config.Dur(0)
	cfg.Streams = map[string]*config.StreamConfig{benchStream: st}
	cfg.Consumers = map[string]*config.ConsumerConfig{}
	add := func(name, subject, handler string) {
		cc := config.DefaultConsumer(benchStream)
		cc.FilterSubject = subject
		cc.Workers = p.Workers
		cc.Handler = handler
		cc.Exec.Command = []string{p.ExecCommand}
		cc.HTTP.URL = httpURL
		cfg.Consumers[name] = cc
	}
	add(benchConsumerName("consume"), benchDrainSubject, "log")
	for _, h := range p.Handlers {
		handler := h
		if h == "noop" {
			handler = "log" // replaced by a Go no-op handler
		}
		add(benchConsumerName(h), benchE2ESubject(h), handler)
	}
	return cfg
}

// startBenchHTTPServer serves 204 to every POST on 127.0.0.1, keep-alive.
func startBenchHTTPServer() (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, fmt.Errorf("cannot listen for the http handler's endpoint: %w", err)
	}
	hs := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.WriteHeader(http.StatusNoContent)
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	go func() { _ = hs.Serve(ln) }()
	return "http://" + ln.Addr().String() + "/bench", func() { _ = hs.Close() }, nil
}

// remote measures publishing against a running instance, in a stream of
// its own that it deletes afterwards.
func (b *bencher) remote(ctx context.Context) (benchRun, error) {
	run := benchRun{Sync: "server"}
	nc, err := nats.Connect(b.params.Server, nats.Name("holdfast-bench"), nats.Timeout(5*time.Second))
	if err != nil {
		return run, fmt.Errorf("cannot connect to %s: %w", b.params.Server, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return run, err
	}
	if _, err := js.Stream(ctx, benchRemoteStream); err == nil {
		return run, fmt.Errorf("stream %s already exists on %s (left by an interrupted bench?): delete it with `nats stream rm %s`",
			benchRemoteStream, b.params.Server, benchRemoteStream)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: benchRemoteStream, Subjects: []string{"holdfast.bench.>"}, Storage: jetstream.FileStorage,
		Description: "temporary: holdfast bench", MaxMsgs: -1, MaxBytes: -1,
	}); err != nil {
		return run, fmt.Errorf("cannot create stream %s: %w", benchRemoteStream, err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := js.DeleteStream(dctx, benchRemoteStream); err != nil {
			b.log.Error("cannot delete the bench stream: delete it by hand", "stream", benchRemoteStream, "err", err)
		}
	}()
	f, err := b.publishAsync(ctx, b.params.Server, "holdfast.bench.async", b.params.Msgs, "publish async", nil)
	if err != nil {
		return run, err
	}
	run.Figures = append(run.Figures, f)
	if f, err = b.publishSync(ctx, b.params.Server, "holdfast.bench.sync", b.params.Msgs); err != nil {
		return run, err
	}
	run.Figures = append(run.Figures, f)
	return run, nil
}

// benchPayload returns a payload of size bytes with the send time in its
// first 8 bytes.
func benchPayload(buf []byte, t time.Time) []byte {
	binary.BigEndian.PutUint64(buf, uint64(t.UnixNano()))
	return buf
}

func benchConnect(url string, i int) (*nats.Conn, error) {
	nc, err := nats.Connect(url, nats.Name(fmt.Sprintf("holdfast-bench-%d", i)), nats.Timeout(5*time.Second))
	if err != nil {
		return nil, fmt.Errorf("cannot connect to %s: %w", url, err)
	}
	return nc, nil
}

// benchPublishers opens n publisher connections to url; closeAll closes
// them (also the ones opened before an error).
func benchPublishers(url string, n int, opts ...jetstream.JetStreamOpt) (conns []jetstream.JetStream, closeAll func(), err error) {
	var ncs []*nats.Conn
	closeAll = func() {
		for _, nc := range ncs {
			nc.Close()
		}
	}
	for i := 0; i < n; i++ {
		nc, err := benchConnect(url, i)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		ncs = append(ncs, nc)
		js, err := jetstream.New(nc, opts...)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		conns = append(conns, js)
	}
	return conns, closeAll, nil
}

// pubRecord is one published message: when it was sent and where it was
// stored.
type pubRecord struct {
	sent, acked time.Time
	seq         uint64
}

// publishAsync publishes n messages on subject from the publishers, each
// with at most Window PubAcks outstanding, and measures until the last
// PubAck. When records is not nil, it receives each message's record.
func (b *bencher) publishAsync(ctx context.Context, url, subject string, n int, name string, records *[]pubRecord) (benchFigure, error) {
	p := b.params
	per := splitCount(n, p.Publishers)
	recs := make([][]pubRecord, p.Publishers)
	for i := range recs {
		recs[i] = make([]pubRecord, per[i])
	}
	conns, closeConns, err := benchPublishers(url, p.Publishers, jetstream.WithPublishAsyncMaxPending(p.Window))
	if err != nil {
		return benchFigure{}, err
	}
	defer closeConns()
	var done atomic.Int64
	b.progress.set(name, &done, n)
	errs := make([]error, p.Publishers)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = publishAsyncOne(ctx, conns[i], subject, p.Size, recs[i], &done)
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return benchFigure{}, err
	}
	all := slices.Concat(recs...)
	if records != nil {
		*records = all
	}
	lat := make([]time.Duration, len(all))
	for i, r := range all {
		lat[i] = r.acked.Sub(r.sent)
	}
	return newBenchFigure(name, n, p.Size, elapsed, lat), nil
}

// publishAsyncOne publishes len(recs) messages; a second goroutine waits
// for the PubAcks in order (they arrive in order on one stream), so each
// ack time is at most a little late.
func publishAsyncOne(ctx context.Context, js jetstream.JetStream, subject string, size int, recs []pubRecord, done *atomic.Int64) error {
	futures := make(chan jetstream.PubAckFuture, 1<<16)
	var ackErr error
	ackDone := make(chan struct{})
	go func() {
		defer close(ackDone)
		i := 0
		for f := range futures {
			select {
			case ack := <-f.Ok():
				recs[i].acked = time.Now()
				recs[i].seq = ack.Sequence
			case err := <-f.Err():
				if ackErr == nil {
					ackErr = fmt.Errorf("async publish: %w", err)
				}
			}
			done.Add(1)
			i++
		}
	}()
	buf := make([]byte, size)
	var err error
	for i := range recs {
		// The payload is copied into the connection's buffer before
		// PublishAsync returns, so one buffer serves every message.
		now := time.Now()
		recs[i].sent = now
		var f jetstream.PubAckFuture
		f, err = js.PublishAsync(subject, benchPayload(buf, now), jetstream.WithStallWait(30*time.Second))
		if err != nil {
			err = fmt.Errorf("async publish: %w", err)
			break
		}
		futures <- f
	}
	close(futures)
	<-ackDone
	if err != nil {
		return err
	}
	if ackErr != nil {
		return ackErr
	}
	return ctx.Err()
}

// publishSync publishes n messages one at a time from the publishers.
func (b *bencher) publishSync(ctx context.Context, url, subject string, n int) (benchFigure, error) {
	p := b.params
	per := splitCount(n, p.Publishers)
	lats := make([][]time.Duration, p.Publishers)
	errs := make([]error, p.Publishers)
	conns, closeConns, err := benchPublishers(url, p.Publishers)
	if err != nil {
		return benchFigure{}, err
	}
	defer closeConns()
	var done atomic.Int64
	b.progress.set("publish sync", &done, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, p.Size)
			lats[i] = make([]time.Duration, 0, per[i])
			for range per[i] {
				t := time.Now()
				if _, err := conns[i].Publish(ctx, subject, benchPayload(buf, t)); err != nil {
					errs[i] = fmt.Errorf("publish: %w", err)
					return
				}
				lats[i] = append(lats[i], time.Since(t))
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return benchFigure{}, err
	}
	return newBenchFigure("publish sync", n, p.Size, elapsed, slices.Concat(lats...)), nil
}

func splitCount(n, parts int) []int {
	out := make([]int, parts)
	for i := range out {
		out[i] = n / parts
		if i < n%parts {
			out[i]++
		}
	}
	return out
}

// noopHandler succeeds at once.
var noopHandler = pipeline.HandlerFunc(func(context.Context, *pipeline.Message) pipeline.Result { return pipeline.Ok() })

// startBenchWorkers starts the workers of a bench consumer with h, or with
// the handler its config names when h is nil (the daemon's own wiring).
func (b *bencher) startBenchWorkers(ctx context.Context, srv *embedded.Server, cfg *config.Config, name string, h pipeline.Handler) (*pipeline.Workers, error) {
	cc := cfg.Consumers[name]
	if h == nil {
		var err error
		if h, err = newHandler(name, cc, b.log); err != nil {
			return nil, err
		}
	}
	w := pipeline.NewWorkers(srv.JetStream(), srv.Conn(), consumerOptions(name, cc, h), b.log)
	w.ShutdownTimeout = cfg.Run.ShutdownTimeout.Duration
	if err := w.Open(ctx); err != nil {
		return nil, err
	}
	return w, nil
}

// consume starts the no-op workers on the messages "publish async" stored
// and measures until the server has received the last ack.
func (b *bencher) consume(ctx context.Context, srv *embedded.Server, cfg *config.Config, acks *ackWatcher) (benchFigure, error) {
	name := benchConsumerName("consume")
	n := b.params.Msgs
	acks.expect(name, n)
	b.progress.set("consume", acks.counter(name), n)
	// Like nats bench, the clock starts with the first message handled.
	var first atomic.Int64
	h := pipeline.HandlerFunc(func(context.Context, *pipeline.Message) pipeline.Result {
		if first.Load() == 0 {
			first.CompareAndSwap(0, time.Now().UnixNano())
		}
		return pipeline.Ok()
	})
	w, err := b.startBenchWorkers(ctx, srv, cfg, name, h)
	if err != nil {
		return benchFigure{}, err
	}
	defer w.Close(context.Background())
	last, err := acks.wait(ctx, name, w)
	if err != nil {
		return benchFigure{}, err
	}
	return newBenchFigure("consume (noop)", n, b.params.Size, last.Sub(time.Unix(0, first.Load())), nil), nil
}

// endToEnd starts the workers of handler, publishes to them and measures
// from the first publish to the last ack; each message's latency is from
// its publish to the server receiving its ack.
func (b *bencher) endToEnd(ctx context.Context, srv *embedded.Server, cfg *config.Config, url, handler string, acks *ackWatcher) (benchFigure, error) {
	name := benchConsumerName(handler)
	n := b.params.Msgs
	if handler == "exec" {
		n = b.params.ExecMsgs
	}
	var h pipeline.Handler
	if handler == "noop" {
		h = noopHandler
	}
	w, err := b.startBenchWorkers(ctx, srv, cfg, name, h)
	if err != nil {
		return benchFigure{}, err
	}
	defer w.Close(context.Background())
	if hh, ok := h.(interface{ CloseIdleConnections() }); ok {
		defer hh.CloseIdleConnections()
	}
	acks.expect(name, n)
	var recs []pubRecord
	label := "e2e " + handler
	start := time.Now()
	if _, err := b.publishAsync(ctx, url, benchE2ESubject(handler), n, label+" (publish)", &recs); err != nil {
		return benchFigure{}, err
	}
	b.progress.set(label, acks.counter(name), n)
	last, err := acks.wait(ctx, name, w)
	if err != nil {
		return benchFigure{}, err
	}
	times := acks.times(name)
	lat := make([]time.Duration, 0, len(recs))
	for _, r := range recs {
		if t, ok := times[r.seq]; ok {
			lat = append(lat, t.Sub(r.sent))
		}
	}
	if len(lat) != n {
		return benchFigure{}, fmt.Errorf("saw the acks of %d of %d messages", len(lat), n)
	}
	return newBenchFigure(label, n, b.params.Size, last.Sub(start), lat), nil
}

// ackWatcher subscribes to the acks the workers send ($JS.ACK.<stream>.
// <consumer>.…) on its own in-process connection and records, per
// consumer, when the server received the ack of each stream sequence.
type ackWatcher struct {
	nc  *nats.Conn
	sub *nats.Subscription

	mu    sync.Mutex
	cons  map[string]*ackCount
	order []string
}

type ackCount struct {
	n      atomic.Int64
	want   int
	at     map[uint64]time.Time
	last   time.Time
	doneCh chan struct{}
}

func newAckWatcher(ns *server.Server) (*ackWatcher, error) {
	nc, err := nats.Connect("", nats.InProcessServer(ns), nats.Name("holdfast-bench-acks"))
	if err != nil {
		return nil, fmt.Errorf("cannot connect in-process: %w", err)
	}
	a := &ackWatcher{nc: nc, cons: map[string]*ackCount{}}
	a.sub, err = nc.Subscribe("$JS.ACK.>", a.onAck)
	if err != nil {
		nc.Close()
		return nil, err
	}
	_ = a.sub.SetPendingLimits(-1, -1)
	if err := nc.Flush(); err != nil {
		nc.Close()
		return nil, err
	}
	return a, nil
}

func (a *ackWatcher) close() { a.nc.Close() }

// expect starts recording the acks of consumer, until n.
func (a *ackWatcher) expect(consumer string, n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.cons[consumer] = &ackCount{want: n, at: make(map[uint64]time.Time, n), doneCh: make(chan struct{})}
}

func (a *ackWatcher) counter(consumer string) *atomic.Int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return &a.cons[consumer].n
}

func (a *ackWatcher) times(consumer string) map[uint64]time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cons[consumer].at
}

// onAck records an ack. The ack subject is $JS.ACK.<stream>.<consumer>.
// <delivered>.<stream seq>.<consumer seq>.<time>.<pending>, or with
// <domain>.<account hash> after $JS.ACK.
func (a *ackWatcher) onAck(m *nats.Msg) {
	now := time.Now()
	if len(m.Data) > 0 && string(m.Data) != "+ACK" {
		return // nak, in progress, term
	}
	tok := strings.Split(m.Subject, ".")
	var consumer, seq string
	switch {
	case len(tok) == 9:
		consumer, seq = tok[3], tok[5]
	case len(tok) >= 11:
		consumer, seq = tok[5], tok[7]
	default:
		return
	}
	s, err := strconv.ParseUint(seq, 10, 64)
	if err != nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.cons[consumer]
	if c == nil {
		return
	}
	if _, dup := c.at[s]; dup {
		return
	}
	c.at[s] = now
	c.last = now
	if int(c.n.Add(1)) == c.want {
		close(c.doneCh)
	}
}

// wait returns when the server received the last expected ack of
// consumer, failing when the workers report failures or nothing moves for
// a minute.
func (a *ackWatcher) wait(ctx context.Context, consumer string, w *pipeline.Workers) (time.Time, error) {
	a.mu.Lock()
	c := a.cons[consumer]
	a.mu.Unlock()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	seen, idle := int64(-1), 0
	for {
		select {
		case <-c.doneCh:
			a.mu.Lock()
			defer a.mu.Unlock()
			return c.last, nil
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-tick.C:
			st := w.Stats()
			if n := st.Retried.Load() + st.DeadLettered.Load() + st.Failures.Load(); n > 0 {
				return time.Time{}, fmt.Errorf("%d messages failed, retried or were dead-lettered: see the log (--verbose)", n)
			}
			if n := c.n.Load(); n != seen {
				seen, idle = n, 0
			} else if idle++; idle >= 60 {
				return time.Time{}, fmt.Errorf("no progress for a minute: %d of %d acked", n, c.want)
			}
		}
	}
}

func newBenchFigure(name string, n, size int, elapsed time.Duration, lat []time.Duration) benchFigure {
	sec := elapsed.Seconds()
	f := benchFigure{
		Name:       name,
		Msgs:       n,
		Bytes:      int64(n) * int64(size),
		Seconds:    sec,
		MsgsPerSec: float64(n) / sec,
		MBPerSec:   float64(n) * float64(size) / sec / 1e6,
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		pct := func(q float64) float64 {
			i := int(q*float64(len(lat))+0.5) - 1
			i = max(0, min(i, len(lat)-1))
			return float64(lat[i]) / 1e3
		}
		f.Latency = &benchLatency{P50: pct(0.50), P90: pct(0.90), P99: pct(0.99), Max: float64(lat[len(lat)-1]) / 1e3}
	}
	return f
}

func printBenchReport(w io.Writer, r *benchReport) {
	p, m := r.Params, r.Machine
	fmt.Fprintf(w, "holdfast bench: %d msgs of %d B, %d publisher(s) (window %d), %d worker(s)\n",
		p.Msgs, p.Size, p.Publishers, p.Window, p.Workers)
	fmt.Fprintf(w, "machine: %d CPUs, %s, %s/%s, %s; store on %s (%s); nats-server %s\n\n",
		m.CPUs, m.Kernel, m.GOOS, m.GOARCH, m.GoVersion, m.StoreFS, m.StoreDir, m.NATSServer)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "sync\tfigure\tmsgs\tmsgs/s\tMB/s\tp50\tp90\tp99\tmax\t")
	for _, run := range r.Runs {
		for _, f := range run.Figures {
			l := "-\t-\t-\t-"
			if f.Latency != nil {
				l = fmt.Sprintf("%s\t%s\t%s\t%s", benchMicros(f.Latency.P50), benchMicros(f.Latency.P90),
					benchMicros(f.Latency.P99), benchMicros(f.Latency.Max))
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f\t%.2f\t%s\t\n", run.Sync, f.Name, f.Msgs, f.MsgsPerSec, f.MBPerSec, l)
		}
	}
	_ = tw.Flush()
}

func benchMicros(us float64) string {
	d := time.Duration(us * 1e3)
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2fs", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.2fms", float64(d)/1e6)
	}
	return fmt.Sprintf("%.0fµs", us)
}

// benchProgress shows the current figure and its count on a terminal.
type benchProgress struct {
	w        io.Writer
	mu       sync.Mutex
	name     string
	done     *atomic.Int64
	total    int
	stopCh   chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

func newBenchProgress(w io.Writer) *benchProgress {
	p := &benchProgress{w: w, stopCh: make(chan struct{})}
	p.wg.Add(1)
	go p.loop()
	return p
}

// set switches to a new figure; on a nil progress it does nothing.
func (p *benchProgress) set(name string, done *atomic.Int64, total int) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.name, p.done, p.total = name, done, total
}

func (p *benchProgress) loop() {
	defer p.wg.Done()
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-p.stopCh:
			fmt.Fprint(p.w, "\r\033[K")
			return
		case <-t.C:
			p.mu.Lock()
			if p.done != nil {
				n := p.done.Load()
				const width = 30
				fill := int(int64(width) * n / int64(max(p.total, 1)))
				fmt.Fprintf(p.w, "\r\033[K%-22s [%s%s] %d/%d", p.name, strings.Repeat("=", fill), strings.Repeat(" ", width-fill), n, p.total)
			}
			p.mu.Unlock()
		}
	}
}

func (p *benchProgress) stop() {
	p.stopOnce.Do(func() { close(p.stopCh); p.wg.Wait() })
}
