// Package bench is the engine of `holdfast bench`: it starts its own
// holdfast (embedded server on a temporary store, the real bootstrap, real
// pipeline.Workers) for each sync mode and measures publishing, draining
// and the live pipeline, or measures publishing against a running
// instance. cmd/holdfast wires its flags to Params.
package bench

import (
	"context"
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
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/embedded"
	"github.com/holdfast-io/holdfast/embedded/bootstrap"
	"github.com/holdfast-io/holdfast/embedded/store"
	"github.com/holdfast-io/holdfast/ingest"
	"github.com/holdfast-io/holdfast/pipeline"
	"github.com/holdfast-io/holdfast/pipeline/handler"
)

// Names of what `holdfast bench` creates in its own instance, or (only the
// stream) on a running one with --server.
const (
	benchStream       = "BENCH"
	benchRemoteStream = "HOLDFAST_BENCH"
	benchDrainSubject = "bench.drain"
	benchSyncSubject  = "bench.sync"
)

// Handlers are the handlers `holdfast bench` can measure end to end.
var Handlers = []string{"noop", "exec", "http"}

// Params are the parameters of a run, as given or defaulted.
type Params struct {
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

// Machine describes where the figures were measured.
type Machine struct {
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

// Latency holds percentiles in microseconds.
type Latency struct {
	P50 float64 `json:"p50_us"`
	P90 float64 `json:"p90_us"`
	P99 float64 `json:"p99_us"`
	Max float64 `json:"max_us"`
}

// Figure is one measurement.
type Figure struct {
	Name       string   `json:"name"`
	Msgs       int      `json:"msgs"`
	Bytes      int64    `json:"bytes"`
	Seconds    float64  `json:"seconds"`
	MsgsPerSec float64  `json:"msgs_per_sec"`
	MBPerSec   float64  `json:"mb_per_sec"`
	Latency    *Latency `json:"latency,omitempty"`
}

// SyncRun is every figure of one sync mode.
type SyncRun struct {
	Sync    string   `json:"sync"`
	Figures []Figure `json:"figures"`
	// GroupCommit is what the stream's group commit did over the whole
	// run (a "+gc" mode only): how the published messages were stored.
	GroupCommit *ingest.Stats `json:"group_commit,omitempty"`
}

// Report is the whole result of `holdfast bench`.
type Report struct {
	Params  Params    `json:"params"`
	Machine Machine   `json:"machine"`
	Runs    []SyncRun `json:"runs"`
}

// Validate checks the parameters as given and fills in the defaults that
// depend on others (ExecMsgs).
func (p *Params) Validate() error {
	switch {
	case p.Msgs < 1:
		return errors.New("--msgs must be at least 1")
	case p.Size < 8 || p.Size > 1<<20:
		return errors.New("--size must be between 8 bytes (the payload carries a timestamp) and 1MiB")
	case p.Publishers < 1 || p.Publishers > p.Msgs:
		return errors.New("--publishers must be between 1 and --msgs")
	case p.Window < 1:
		return errors.New("--window must be at least 1")
	case p.Workers < 1:
		return errors.New("--workers must be at least 1")
	case p.ExecMsgs < 0:
		return errors.New("--exec-msgs must not be negative")
	}
	if p.ExecMsgs == 0 || p.ExecMsgs > p.Msgs {
		p.ExecMsgs = p.Msgs
	}
	for _, s := range p.Sync {
		s, _ = groupCommitMode(s)
		if s != "always" {
			if d, err := time.ParseDuration(s); err != nil || d <= 0 {
				return fmt.Errorf("--sync %q: want \"always\" or a positive interval such as \"2m\", each with or without \"+gc\"", s)
			}
		}
	}
	for _, h := range p.Handlers {
		if !slices.Contains(Handlers, h) {
			return fmt.Errorf("--handlers: unknown handler %q (want %s)", h, strings.Join(Handlers, ", "))
		}
	}
	if p.Server == "" && len(p.Sync) == 0 {
		return errors.New("--sync: give at least one mode")
	}
	if p.Server != "" {
		p.Sync, p.Handlers = []string{"server"}, nil
	}
	if slices.Contains(p.Handlers, "exec") && !filepath.IsAbs(p.ExecCommand) {
		return fmt.Errorf("--exec-command %q must be an absolute path", p.ExecCommand)
	}
	return nil
}

// Wiring is how the daemon builds a consumer's handler and options from
// its config; the bench uses the same, so it measures what runs.
type Wiring struct {
	NewHandler      func(name string, cc *config.ConsumerConfig, log *slog.Logger) (handler.Handler, error)
	ConsumerOptions func(name string, cc *config.ConsumerConfig, h handler.Handler) pipeline.ConsumerOptions
}

// Bencher runs the measurements.
type Bencher struct {
	Params Params
	// Dir is the parent of the temporary store directories (see ParentDir).
	Dir string
	// Version is holdfast's version, for the report.
	Version string
	Wiring  Wiring
	// Log gets holdfast's own log.
	Log *slog.Logger
	// Progress, when set, shows the current figure (a terminal).
	Progress io.Writer

	progress *progress
}

// Run measures every figure the parameters ask for. Params must be valid.
func (b *Bencher) Run(ctx context.Context) (*Report, error) {
	p := b.Params
	if b.Log == nil {
		b.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if b.Progress != nil {
		b.progress = newProgress(b.Progress)
		defer b.progress.stop()
	}
	rep := Report{Params: p, Machine: MachineInfo(b.Version)}
	if p.Server != "" {
		run, err := b.remote(ctx)
		if err != nil {
			return nil, err
		}
		rep.Runs = append(rep.Runs, run)
		rep.Machine.StoreFS, rep.Machine.StoreDir = "remote", "remote"
	} else {
		for _, mode := range p.Sync {
			run, store, err := b.local(ctx, b.Dir, mode)
			if err != nil {
				return nil, fmt.Errorf("sync %s: %w", mode, err)
			}
			rep.Machine.StoreFS, rep.Machine.StoreDir = store.FSType, filepath.Dir(store.Path)
			rep.Runs = append(rep.Runs, run)
		}
	}
	if b.progress != nil {
		b.progress.stop()
	}
	return &rep, nil
}

// StartProfiles starts a CPU profile and, when memFile is set, records
// every allocation; the returned func writes them.
func StartProfiles(cpuFile, memFile string) (func(), error) {
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

// ParentDir is where the temporary store goes: dir, else $TMPDIR
// unless it is memory-backed (holdfast refuses tmpfs), else the working
// directory.
func ParentDir(dir string) (string, error) {
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

// MachineInfo describes this machine, for the report.
func MachineInfo(version string) Machine {
	m := Machine{
		CPUs:       runtime.NumCPU(),
		GOOS:       runtime.GOOS,
		GOARCH:     runtime.GOARCH,
		GoVersion:  runtime.Version(),
		NATSServer: server.VERSION,
		Holdfast:   version,
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

// local starts a holdfast instance in a fresh store under parent with the
// given sync mode and measures every figure against it.
// groupCommitSuffix after a sync mode (--sync always+gc) measures it with
// group_commit = true on the bench stream.
const groupCommitSuffix = "+gc"

// groupCommitMode splits a --sync mode into jetstream.sync and whether
// group commit is on.
func groupCommitMode(mode string) (string, bool) {
	sync, gc := strings.CutSuffix(mode, groupCommitSuffix)
	return sync, gc
}

func (b *Bencher) local(ctx context.Context, parent, mode string) (run SyncRun, checked *store.DirCheck, err error) {
	p := b.Params
	run.Sync = mode
	mode, groupCommit := groupCommitMode(mode)
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
	cfg.Streams[benchStream].GroupCommit = groupCommit
	if err := cfg.Validate(); err != nil {
		return run, nil, err
	}
	srv := embedded.New(cfg, b.Log)
	if err := srv.Open(ctx); err != nil {
		return run, nil, err
	}
	defer srv.Close(context.Background())
	checked, err = store.CheckDir(srv.StoreDir(), false, 0)
	if err != nil {
		return run, nil, err
	}
	if err := bootstrap.Apply(ctx, srv.JetStream(), cfg, b.Log); err != nil {
		return run, checked, err
	}
	if groupCommit {
		gc, err := b.openGroupCommit(ctx, srv, cfg)
		if err != nil {
			return run, checked, err
		}
		defer func() {
			st := gc.Stats()
			run.GroupCommit = &st
			gc.close()
		}()
	}
	url := srv.NATS().ClientURL()

	f, err := b.publishAsync(ctx, url, benchDrainSubject, p.Msgs, "publish async", nil)
	if err != nil {
		return run, checked, err
	}
	run.Figures = append(run.Figures, f)
	if f, err = b.publishSync(ctx, url, benchSyncSubject, p.Msgs); err != nil {
		return run, checked, err
	}
	run.Figures = append(run.Figures, f)
	if f, err = b.consume(ctx, srv, cfg); err != nil {
		return run, checked, err
	}
	run.Figures = append(run.Figures, f)
	if f, err = b.bareConsume(ctx, srv); err != nil {
		return run, checked, err
	}
	run.Figures = append(run.Figures, f)
	// A separate in-process connection sees the workers' acks, for the
	// latencies; only from here on, so that "consume" does not pay for it.
	acks, err := newAckWatcher(srv.NATS())
	if err != nil {
		return run, checked, err
	}
	defer acks.close()
	for _, h := range p.Handlers {
		f, err := b.endToEnd(ctx, srv, cfg, url, h, acks)
		if err != nil {
			return run, checked, fmt.Errorf("e2e %s: %w", h, err)
		}
		run.Figures = append(run.Figures, f)
		if h == "noop" {
			if f, err = b.bareEndToEnd(ctx, srv, url); err != nil {
				return run, checked, err
			}
			run.Figures = append(run.Figures, f)
		}
	}
	return run, checked, nil
}

// benchGroupCommit is the bench stream's ingest and its connection.
type benchGroupCommit struct {
	*ingest.Committer
	nc *nats.Conn
}

func (g benchGroupCommit) close() {
	_ = g.Committer.Close(context.Background())
	g.nc.Close()
}

// openGroupCommit starts the bench stream's ingest as the daemon does
// (daemon/groupcommit.go), on a connection of its own.
func (b *Bencher) openGroupCommit(ctx context.Context, srv *embedded.Server, cfg *config.Config) (benchGroupCommit, error) {
	nc, err := srv.Connect("holdfast-ingest")
	if err != nil {
		return benchGroupCommit{}, fmt.Errorf("group commit: %w", err)
	}
	c := ingest.New(nc, ingest.OptionsFor(cfg, benchStream), b.Log)
	if err := c.Open(ctx); err != nil {
		nc.Close()
		return benchGroupCommit{}, fmt.Errorf("group commit: %w", err)
	}
	return benchGroupCommit{Committer: c, nc: nc}, nil
}

// benchConsumerName is the consumer of an e2e figure, or of "consume".
func benchConsumerName(handler string) string { return "BENCH_" + strings.ToUpper(handler) }

func benchE2ESubject(handler string) string { return "bench.e2e." + handler }

// benchConfig is the config of the bench instance: one stream BENCH that
// keeps everything, a consumer per figure, each filtered on its subject.
func benchConfig(dir, mode string, p Params, httpURL string) *config.Config {
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
		switch handler {
		case "exec":
			cc.Exec.Command = []string{p.ExecCommand}
		case "http":
			cc.HTTP.URL = httpURL
		}
		cfg.Consumers[name] = cc
	}
	add(benchConsumerName("consume"), benchDrainSubject, "log")
	// Created by the bootstrap like the others, drained without workers.
	add(bareConsumer, benchDrainSubject, "log")
	add(bareE2EConsumer, bareE2ESubject, "log")
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
func (b *Bencher) remote(ctx context.Context) (SyncRun, error) {
	run := SyncRun{Sync: "server"}
	nc, err := nats.Connect(b.Params.Server, nats.Name("holdfast-bench"), nats.Timeout(5*time.Second))
	if err != nil {
		return run, fmt.Errorf("cannot connect to %s: %w", b.Params.Server, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return run, err
	}
	if _, err := js.Stream(ctx, benchRemoteStream); err == nil {
		return run, fmt.Errorf("stream %s already exists on %s (left by an interrupted bench?): delete it with `nats stream rm %s`",
			benchRemoteStream, b.Params.Server, benchRemoteStream)
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
			b.Log.Error("cannot delete the bench stream: delete it by hand", "stream", benchRemoteStream, "err", err)
		}
	}()
	f, err := b.publishAsync(ctx, b.Params.Server, "holdfast.bench.async", b.Params.Msgs, "publish async", nil)
	if err != nil {
		return run, err
	}
	run.Figures = append(run.Figures, f)
	if f, err = b.publishSync(ctx, b.Params.Server, "holdfast.bench.sync", b.Params.Msgs); err != nil {
		return run, err
	}
	run.Figures = append(run.Figures, f)
	return run, nil
}
