package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/embedded"
	"github.com/holdfast-io/holdfast/embedded/bootstrap"
	"github.com/holdfast-io/holdfast/embedded/mqtt"
	"github.com/holdfast-io/holdfast/embedded/store"
	"github.com/holdfast-io/holdfast/pipeline"
	"github.com/holdfast-io/holdfast/pipeline/forward"
	"github.com/holdfast-io/holdfast/pipeline/handler"
	"github.com/holdfast-io/holdfast/pipeline/monitor"
)

// Daemon wires the parts of `holdfast run` together: opened in order,
// closed in reverse.
type Daemon struct {
	cfg     *config.Config // what runs; replaced (never mutated) by Reload
	log     *slog.Logger
	level   *slog.LevelVar
	notify  Notifier
	version string

	http      *httpServer
	metrics   *monitor.Metrics
	srv       *embedded.Server
	peers     peerWatch  // when this node last had a route to each cluster peer
	workersMu sync.Mutex // guards workers: Healthy reads it from the watchdog
	workers   []*pipeline.Workers
	// stats are each consumer's counters, kept for the life of the
	// process: workers replaced or stopped at a reload (workers 4 -> 0 ->
	// 4) count on where they left off.
	stats map[string]*pipeline.Stats
	// workersFrom is, per consumer, the config its workers run with (for
	// workers = 0: that it has none), or nil when a reload left it
	// without the workers it should have. A reload that cannot apply a
	// consumer's new settings to its workers leaves it as it was, so that
	// the next reload tries again. Open and Reload use it, on one
	// goroutine.
	workersFrom map[string]*config.ConsumerConfig
	monitor     *monitor.Monitor
	gc          groupCommit
	// mqtt is the devices' listener ([mqtt]); mqttConn its barriers'.
	mqtt      *mqtt.Gate
	mqttConn  *nats.Conn
	statusSub *nats.Subscription
	// started is when the status subject started to be served.
	started   time.Time
	reloadSub *nats.Subscription
	flushSub  *nats.Subscription
	// configFile is the file a reload reads ("": the default path).
	configFile string
	failed     chan struct{} // closed by fail
	failOnce   sync.Once
	failErr    error

	// edge is the leafnode view (nil without [leafnodes] or sources);
	// forwarders are the forward handlers by consumer.
	edge       *forward.EdgeView
	forwarders map[string]*forward.Forwarder
	// leafsSub answers, on a node of a hub cluster, which edges are linked
	// to it; clusterNodes is the cluster's size, as its routes name it.
	leafsSub     *nats.Subscription
	clusterNodes int

	// running is cfg for other goroutines (the monitor's Recreate):
	// stored by Open and Reload.
	running atomic.Pointer[config.Config]

	// configDiff is what bootstrap.Diff last found.
	configDiff atomic.Pointer[[]string]
	// restartPending is the health warning of the last reload when it
	// was refused for changes that need a restart; nil otherwise.
	restartPending atomic.Pointer[string]
	// fileRefused is the health warning of the last reload when it
	// refused the config file itself (it has problems); nil once a
	// reload read the file again.
	fileRefused atomic.Pointer[string]
	// reloads are what the last reloads did, oldest first (nil before
	// the first; at most keptReloads).
	reloads atomic.Pointer[[]ReloadResult]

	closeOnce sync.Once
	closeErr  error
	stopWatch context.CancelFunc
}

// Notifier is told what the daemon is doing while it starts and stops
// (systemd's STATUS= line).
type Notifier interface {
	Status(string)
}

// Options are what the daemon takes besides the config.
type Options struct {
	// Log is the logger; Level its level, changed by a reload.
	Log   *slog.Logger
	Level *slog.LevelVar
	// Notify, when set, is told the start-up and shutdown steps.
	Notify Notifier
	// Version is holdfast's version line, for metrics, status and HTTP.
	Version string
	// ConfigFile is the file ReloadFromFile reads ("": the default path,
	// as config.Load takes it).
	ConfigFile string
}

type noNotifier struct{}

func (noNotifier) Status(string) {}

// New returns the daemon for cfg; Open starts it.
func New(cfg *config.Config, opts Options) *Daemon {
	if opts.Notify == nil {
		opts.Notify = noNotifier{}
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.Level == nil {
		opts.Level = new(slog.LevelVar)
	}
	return &Daemon{cfg: cfg, log: opts.Log, level: opts.Level, notify: opts.Notify, version: opts.Version, configFile: opts.ConfigFile,
		failed: make(chan struct{})}
}

// Open locks the store dir, starts the HTTP listener (503 until ready), the embedded server,
// bootstraps streams and consumers, starts the workers, the monitor and
// the status responder.
func (d *Daemon) Open(ctx context.Context) error {
	d.metrics = monitor.NewMetrics(d.version, server.VERSION)
	d.srv = embedded.New(d.cfg, d.log)
	// What start-up is doing goes to systemd and, until holdfast serves,
	// to /healthz: a node waiting for its cluster says so there too.
	d.srv.OnStatus = func(msg string) {
		d.notify.Status(msg)
		d.http.setStep(msg)
	}
	if err := d.openServer(ctx); err != nil {
		return err
	}
	if err := d.openConsumers(ctx); err != nil {
		return err
	}
	if err := d.openMQTT(); err != nil {
		return err
	}
	if err := d.openMonitor(ctx); err != nil {
		return err
	}
	d.http.setPhase(phaseReady)
	d.startWatches()
	d.log.Info("serving", "version", d.version, "store_dir", d.srv.StoreDir(), "fs", d.srv.StoreFSType(), "sync", d.cfg.JetStream.Sync,
		"client_url", d.srv.NATS().ClientURL(), "http", d.http.Addr(), "streams", d.cfg.StreamNames(),
		"consumers", d.cfg.ConsumerNames(), "workers", d.cfg.TotalWorkers())
	return nil
}

// openServer locks the store, opens the HTTP listener, starts the
// embedded server and bootstraps the streams and consumers.
func (d *Daemon) openServer(ctx context.Context) error {
	// The store lock first: a second holdfast on the same store is told
	// which process holds it, not that a port is in use.
	if err := d.srv.PrepareStore(); err != nil {
		return err
	}
	if d.cfg.HTTP.Listen != "" {
		d.http = newHTTPServer(d.cfg.HTTP.Listen, d.metrics, d.log, d.version)
		var sec *config.Secrets
		if d.cfg.Auth.Enabled() {
			var err error
			if sec, err = d.cfg.LoadSecrets(); err != nil {
				return err
			}
		}
		d.http.auth = newHTTPAuth(d.cfg, sec)
		if err := d.http.Open(ctx); err != nil {
			return err
		}
	}
	if d.cfg.Cluster.Enabled() {
		d.peers.names = openPeerNames(d.srv.StoreDir(), d.log.With("component", "cluster"))
	}
	if err := d.srv.Open(ctx); err != nil {
		return err
	}
	d.http.setNATS(d.srv.NATS())
	d.running.Store(d.cfg)
	d.notify.Status("bootstrapping streams and consumers")
	d.http.setStep("bootstrapping streams and consumers")
	if err := d.applyDesired(ctx, d.cfg); err != nil {
		if why := d.srv.CreateFailure(); why != "" {
			// The API error says "error creating store for stream";
			// the server's log line says why (no space, no inodes, ...).
			return fmt.Errorf("%w (the server: %s)", err, why)
		}
		return err
	}
	return nil
}

// openConsumers opens the edge view, group commit and every consumer's
// workers.
func (d *Daemon) openConsumers(ctx context.Context) error {
	var err error
	if d.edge, err = d.openEdgeView(); err != nil {
		return err
	}
	for _, name := range d.cfg.GroupCommitStreams() {
		if err := d.openGroupCommit(ctx, d.cfg, name); err != nil {
			return err
		}
	}
	d.workersFrom = make(map[string]*config.ConsumerConfig, len(d.cfg.Consumers))
	// One wait for an unreachable hub, however many consumers forward.
	hubBy := time.Now().Add(forward.StartWait)
	for _, name := range d.cfg.ConsumerNames() {
		cc := d.cfg.Consumers[name]
		d.workersFrom[name] = cc
		if cc.Workers == 0 {
			d.log.Info("consumer has no in-process workers (workers = 0)", "consumer", name)
			continue
		}
		w, err := d.openWorkers(ctx, d.cfg, name, hubBy)
		if err != nil {
			return err
		}
		d.setWorkers(append(d.workers, w))
	}
	return nil
}

// openMonitor opens the monitor and the status and reload subjects.
func (d *Daemon) openMonitor(ctx context.Context) error {
	d.monitor = monitor.New(d.srv.JetStream(), d.srv.Conn(), monitor.Options{
		Streams:          d.cfg.StreamNames(),
		Consumers:        d.monitoredConsumers(d.cfg),
		StallTimeout:     d.cfg.HTTP.StallTimeout.Duration,
		Activity:         d.srv.StoreActivity,
		FailOnLoss:       d.cfg.HTTP.FailOnLoss,
		Check:            d.serverCheck,
		FileStoreLimit:   fileStoreLimit(d.srv, d.cfg),
		MemoryStoreLimit: d.cfg.JetStream.MaxMemoryStore.Bytes,
		StartupLosses:    startupLosses(d.srv),
		Recreate:         d.recreate,
		Diagnose:         d.srv.ProbeStoreWritable,
		StoreWriteErrors: d.srv.StoreWriteErrors,
		ServerName:       d.cfg.Server.Name,
		ClusterPeers:     d.peers.clusterPeers(d.srv.NATS()),
		ClusterNodes:     d.srv.ClusterNodes(),
		Degraded:         d.degraded,
		Warnings:         d.warnings,
		RestoreRunning:   d.srv.RestoreRunning,
	}, d.log)
	if err := d.monitor.Open(ctx); err != nil {
		return err
	}
	d.metrics.SetMonitor(d.monitor)
	d.http.setMonitor(d.monitor)
	d.started = time.Now()
	d.http.setStatus(d.clientStatus)
	d.http.setDeadLetters(d)
	var err error
	if d.statusSub, err = serveStatus(d); err != nil {
		return err
	}
	if d.reloadSub, err = serveReload(d); err != nil {
		return err
	}
	d.flushSub, err = serveFlush(d)
	return err
}

// startWatches starts the goroutines that watch the server, the config
// on the server, memory and the store directory until Close.
func (d *Daemon) startWatches() {
	wctx, cancel := context.WithCancel(context.Background())
	d.stopWatch = cancel
	go d.watchServer(wctx)
	go d.watchConfigDiff(wctx)
	go trimMemoryWhenIdle(wctx, d.log)
	go d.srv.WatchStore(wctx, 0, func(err error) {
		if errors.Is(err, store.ErrStoreMoved) {
			d.fail(fmt.Errorf("%w: holdfast stopped so that nothing more is acknowledged into files nobody will read. "+
				"Move the directory back to %s (or set jetstream.store_dir to where it is) before starting holdfast again: "+
				"started now, it begins an empty store there", err, d.running.Load().JetStream.StoreDir))
			return
		}
		d.fail(fmt.Errorf("%w: holdfast stopped so that nothing more is acknowledged into files nobody will read; "+
			"what the store held is gone with it. Put the directory back (restore a backup) before starting holdfast again, "+
			"or start it to begin with an empty store", err))
	})
}

// watchServer closes failed when the NATS server stops on its own.
func (d *Daemon) watchServer(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if !d.srv.NATS().Running() {
				d.fail(errors.New("NATS server stopped unexpectedly"))
				return
			}
			if name := d.closedConnection(); name != "" {
				d.fail(fmt.Errorf("holdfast's in-process connection %s was closed by the server (its reason is logged above): workers, dead letters, group commit and status cannot go on without it", name))
				return
			}
		}
	}
}

// configDiffEvery is how often the streams and consumers are compared
// with this node's config while their positions or the config change;
// configDiffIdle is how often while neither does (a stream edited with
// the nats CLI and nothing else changes).
const (
	configDiffEvery = 10 * time.Second
	configDiffIdle  = time.Minute
)

// watchConfigDiff compares the streams and consumers with the running
// config (bootstrap.Diff) every configDiffEvery, or every configDiffIdle
// while the server's StoreActivity and the running config stay the same,
// and logs what newly differs as a warning; the health carries it as a
// warning too.
func (d *Daemon) watchConfigDiff(ctx context.Context) {
	t := time.NewTicker(configDiffEvery)
	defer t.Stop()
	var last []string
	var activity uint64
	var compared time.Time
	var diffed *config.Config
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now, running := d.srv.StoreActivity(), d.running.Load()
		if now != 0 && now == activity && running == diffed && time.Since(compared) < configDiffIdle {
			continue
		}
		activity, diffed, compared = now, running, time.Now()
		rctx, cancel := context.WithTimeout(ctx, configDiffEvery)
		diff := bootstrap.Diff(rctx, d.srv.JetStream(), running)
		cancel()
		d.configDiff.Store(&diff)
		for _, w := range diff {
			if !slices.Contains(last, w) {
				d.log.Warn(w)
			}
		}
		last = diff
	}
}

// warnings are the health's warnings: what watchConfigDiff last found,
// the changes a refused reload left for a restart, and a config file the
// last reload refused.
func (d *Daemon) warnings() []string {
	var out []string
	if p := d.restartPending.Load(); p != nil {
		out = append(out, *p)
	}
	if p := d.fileRefused.Load(); p != nil {
		out = append(out, *p)
	}
	if p := d.configDiff.Load(); p != nil {
		closed := bootstrap.Closed(*p)
		out = append(out, slices.DeleteFunc(slices.Clone(*p), func(l string) bool { return slices.Contains(closed, l) })...)
	}
	return out
}

// degraded are the problems that degrade the health: edges a hub lost,
// and streams that refuse every publish (a restore holds their subjects
// back: publishers get errors until it is run again).
func (d *Daemon) degraded(now time.Time) []string {
	out := d.edge.Problems(now)
	if p := d.configDiff.Load(); p != nil {
		out = append(out, bootstrap.Closed(*p)...)
	}
	return out
}

// closedConnection names an in-process connection that is closed while
// the daemon runs, or "": the server closes a connection that breaks a
// protocol limit with an error, after which it does not reconnect (a
// connection lost otherwise reconnects, see connectionProblem).
func (d *Daemon) closedConnection() string {
	for name, nc := range d.connections() {
		if nc.IsClosed() {
			return name
		}
	}
	return ""
}

// connections returns holdfast's in-process connections by name.
func (d *Daemon) connections() map[string]*nats.Conn {
	out := map[string]*nats.Conn{}
	if nc := d.srv.Conn(); nc != nil {
		out["holdfast-internal"] = nc
	}
	d.gc.mu.Lock()
	defer d.gc.mu.Unlock()
	if d.gc.nc != nil {
		out["holdfast-ingest"] = d.gc.nc
	}
	return out
}

// reconnectGrace is how long an in-process connection may be reconnecting
// before the health fails: the server gives it a new pipe at once unless
// it refuses connections (server.max_connections reached); the client
// tries again every two seconds.
const reconnectGrace = 5 * time.Second

// connectionProblem says which in-process connection is closed, or has
// been reconnecting for longer than reconnectGrace, and what stops
// because of it; nil when none.
func (d *Daemon) connectionProblem() error {
	if d.srv == nil {
		return nil
	}
	if name := d.closedConnection(); name != "" {
		return fmt.Errorf("holdfast's in-process connection %s is closed (the server's reason is logged): workers, dead letters, group commit and status cannot go on without it", name)
	}
	for name, nc := range d.connections() {
		if since, ok := d.srv.Reconnecting(nc); ok && time.Since(since) > reconnectGrace {
			return fmt.Errorf("holdfast's in-process connection %s has been reconnecting for %s: workers, dead letters, group commit and status wait for it; the server refuses it while it is at server.max_connections (%d)",
				name, time.Since(since).Round(time.Second), d.cfg.Server.MaxConnections)
		}
	}
	return nil
}

// serverCheck is the monitor's check of the server: holdfast's in-process
// connections, then JetStream on the configured file store.
func (d *Daemon) serverCheck() error {
	if err := d.connectionProblem(); err != nil {
		return err
	}
	return jetStreamCheck(d.srv)()
}

// fileStoreLimit is the file store limit the server runs with: the
// configured one, or less when the disk could not hold it.
func fileStoreLimit(srv *embedded.Server, cfg *config.Config) int64 {
	if jc := srv.NATS().JetStreamConfig(); jc != nil && jc.MaxStore > 0 {
		return jc.MaxStore
	}
	return cfg.JetStream.MaxFileStore.Bytes
}

// startupLosses describes the acknowledged messages the store had lost
// when it was opened.
func startupLosses(srv *embedded.Server) []string {
	var out []string
	for _, l := range srv.DataLosses() {
		if l.Lost() {
			out = append(out, l.String())
		}
	}
	return out
}

// recreate creates the configured streams and consumers again, for the
// monitor when one disappeared while running; the workers resume on
// their own once their consumer is back.
func (d *Daemon) recreate(ctx context.Context) error {
	return d.applyDesired(ctx, d.running.Load())
}

// applyDesired creates or updates the streams and consumers of cfg, and
// flushes their definitions to disk when the server does not
// (jetstream.commit_window).
func (d *Daemon) applyDesired(ctx context.Context, cfg *config.Config) error {
	if err := bootstrap.Apply(ctx, d.srv.JetStream(), cfg, d.log); err != nil {
		return err
	}
	return d.srv.Flush()
}

// handlerTimeout is the longest a consumer's handler may run: the exec or
// http timeout; 0 (none) for the log handler.
func handlerTimeout(cc *config.ConsumerConfig) time.Duration {
	switch cc.Handler {
	case "exec":
		return cc.Exec.Timeout.Duration
	case "http":
		return cc.HTTP.Timeout.Duration
	case "forward":
		return cc.Forward.Timeout.Duration
	}
	return 0
}

// setWorkers replaces the list of running workers.
func (d *Daemon) setWorkers(ws []*pipeline.Workers) {
	d.workersMu.Lock()
	defer d.workersMu.Unlock()
	d.workers = ws
}

// fail records why the daemon cannot go on serving and closes Failed.
// The first reason wins.
func (d *Daemon) fail(err error) {
	d.failOnce.Do(func() {
		d.failErr = err
		close(d.failed)
	})
}

// Running is the config the daemon runs on (the last one a reload
// applied).
func (d *Daemon) Running() *config.Config { return d.running.Load() }

// Failed is closed when the daemon cannot go on serving (the server
// stopped without being asked to, the store dir vanished); Err says why.
func (d *Daemon) Failed() <-chan struct{} { return d.failed }

// Err is the reason Failed was closed, nil before.
func (d *Daemon) Err() error {
	select {
	case <-d.failed:
		return d.failErr
	default:
		return nil
	}
}

// Status is a one-line summary for systemd's STATUS=.
func (d *Daemon) Status() string {
	cfg := d.running.Load()
	return fmt.Sprintf("serving %d stream(s), %d consumer(s) from %s", len(cfg.Streams), len(cfg.Consumers), d.srv.StoreDir())
}

// Healthy is the systemd watchdog's probe: the server answers a
// JetStream API round trip on the in-process connection, the monitor's
// checks keep coming, every consumer's workers run and none is stalled.
// Only what a restart cures fails it: being stuck. A stall is holdfast's
// own workers not progressing when they could (see
// monitor.ConsumerStatus.Stalled); handlers running within their
// timeout, delayed retries and a consumer without in-process workers
// blocked by its clients do not fail it, nor does a retention loss.
func (d *Daemon) Healthy(ctx context.Context) error {
	if d.srv == nil || d.srv.NATS() == nil || !d.srv.NATS().Running() {
		return errors.New("NATS server not running")
	}
	if err := d.connectionProblem(); err != nil {
		return err
	}
	if err := d.srv.CheckStore(); err != nil {
		return err
	}
	// A stream that failed a write refuses every later one until it is
	// opened again (nats-server keeps the error; the file-store limit can
	// be raised at run time but not lowered): a restart, whose start-up
	// caps the store to what the disk holds, is the cure.
	if err := d.srv.StoreWriteFault(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := d.srv.JetStream().AccountInfo(ctx); err != nil {
		// running, not cfg: Healthy runs on the watchdog's goroutine
		// while a reload replaces the config.
		if !d.running.Load().Cluster.Enabled() {
			return fmt.Errorf("JetStream does not answer: %w", err)
		}
		// In a cluster the JetStream API needs a meta leader: a node cut off
		// from the others (a minority) cannot answer, and a restart would
		// not mend that. It is not stuck as long as its server answers;
		// /healthz reports the rest.
		if ferr := d.srv.Conn().FlushTimeout(5 * time.Second); ferr != nil {
			return fmt.Errorf("the NATS server does not answer: %w", ferr)
		}
	}
	d.workersMu.Lock()
	workers := slices.Clone(d.workers)
	d.workersMu.Unlock()
	for _, w := range workers {
		if !w.Running() {
			return fmt.Errorf("workers of consumer %s are not running", w.Options().Consumer)
		}
	}
	if d.monitor == nil {
		return nil
	}
	r := d.monitor.Report()
	if r == nil {
		return nil // the first check has not finished yet
	}
	if age := time.Since(r.Time); age > time.Minute {
		return fmt.Errorf("the monitor's last check finished %s ago", age.Round(time.Second))
	}
	for _, c := range r.Consumers {
		if c.Stalled {
			return fmt.Errorf("consumer %s on stream %s is stalled: %s", c.Name, c.Stream, c.StallReason)
		}
	}
	return nil
}

// Close stops everything in reverse order of Open. It is idempotent.
func (d *Daemon) Close(ctx context.Context) error {
	d.closeOnce.Do(func() {
		d.http.setPhase(phaseStopping)
		d.closeMQTT()
		if d.stopWatch != nil {
			d.stopWatch()
		}
		for _, sub := range []*nats.Subscription{d.statusSub, d.reloadSub, d.flushSub} {
			if sub != nil {
				_ = sub.Unsubscribe()
			}
		}
		if d.monitor != nil {
			_ = d.monitor.Close(ctx)
		}
		if len(d.workers) > 0 {
			d.notify.Status("draining workers")
			var wg sync.WaitGroup
			for _, w := range d.workers {
				wg.Add(1)
				go func() { defer wg.Done(); _ = w.Close(ctx) }()
			}
			wg.Wait()
		}
		d.closeLeaf()
		d.closeAllGroupCommit(ctx)
		var errs []error
		if d.srv != nil {
			d.notify.Status("shutting down the NATS server")
			errs = append(errs, d.srv.Close(ctx))
		}
		errs = append(errs, d.http.Close(ctx))
		d.closeErr = errors.Join(errs...)
	})
	return d.closeErr
}

// openWorkers starts the workers of consumer name as cfg describes them,
// counting on in the consumer's counters; a forward consumer waits for the
// link to its hub until hubBy (zero: forward.StartWait).
func (d *Daemon) openWorkers(ctx context.Context, cfg *config.Config, name string, hubBy time.Time) (*pipeline.Workers, error) {
	cc := cfg.Consumers[name]
	var h handler.Handler
	var fw *forward.Forwarder
	var err error
	if cc.Handler == "forward" {
		fw, err = d.openForwarder(ctx, cfg, name, hubBy)
		h = fw
	} else {
		h, err = NewHandler(name, cc, d.log)
	}
	if err != nil {
		return nil, err
	}
	if d.stats == nil {
		d.stats = make(map[string]*pipeline.Stats)
	}
	if d.stats[name] == nil {
		d.stats[name] = &pipeline.Stats{}
	}
	opts := ConsumerOptions(name, cc, h)
	if cfg.CommitWindowOn() {
		opts.FlushDeadLetters = d.srv.Flush
	}
	if fw != nil && opts.Workers > 1 {
		// The hub's position says what it holds only if the messages
		// go out in order.
		d.log.Warn("a forward consumer sends in order with one worker: workers is read as 1", "consumer", name, "workers", opts.Workers)
		opts.Workers = 1
	}
	opts.OnResult = d.metrics.ObserveResult(cc.Stream)
	opts.Stats = d.stats[name]
	if fw != nil {
		opts.Paused = func() bool { return !fw.Ready() }
		d.setForwarder(name, fw)
	}
	w := pipeline.NewWorkers(d.srv.JetStream(), d.srv.Conn(), opts, d.log)
	w.ShutdownTimeout = cfg.Run.ShutdownTimeout.Duration
	if err := w.Open(ctx); err != nil {
		if fw != nil {
			// Neither its hub check nor its place in status, metrics
			// and health outlives workers that never ran.
			d.setForwarder(name, nil)
			fw.Close()
		}
		return nil, fmt.Errorf("cannot start the workers of consumer %s: %w", name, err)
	}
	return w, nil
}

// Reload applies next, the config on disk, when all of its changes can
// be applied while running: log level, [run], streams and consumers added,
// changed or left out, and each consumer's workers and handler. When any
// change needs a restart (PlanReload) it applies nothing, logs which, and
// warns of them in the health until a reload or a restart settles them;
// it returns an error wrapping ErrRestartNeeded then. A stream or consumer
// left out of the config stays on the server with its messages: holdfast
// never deletes one. A change the server refuses is logged and the
// previous setting keeps running; the streams updated before it run on
// next's, and the error names their keys. Reload runs on the signal loop, never
// concurrently with Open or Close.
func (d *Daemon) Reload(ctx context.Context, next *config.Config) error {
	return d.reload(ctx, next, time.Now())
}

// reload is Reload, of a reload that started at started.
func (d *Daemon) reload(ctx context.Context, next *config.Config, started time.Time) error {
	cur := d.running.Load()
	plan := PlanReload(cur, next)
	if !plan.Reloadable() {
		w := restartWarning(plan.Restart)
		d.restartPending.Store(&w)
		d.log.Error("reload refused: these changes need a restart ("+restartCommand()+"); nothing of this reload was applied",
			"restart", plan.Restart, "reloadable", plan.Apply)
		err := fmt.Errorf("%w: %s", ErrRestartNeeded, strings.Join(plan.Restart, ", "))
		d.recordReload(started, plan, err, nil, nil)
		return err
	}
	d.restartPending.Store(nil)
	// What differs on the server now: what no longer differs after the
	// apply, the reload set back.
	bctx, bcancel := context.WithTimeout(ctx, configDiffEvery)
	before := bootstrap.Diff(bctx, d.srv.JetStream(), cur)
	bcancel()
	applied, workersFailed, err := d.apply(ctx, cur, next)
	d.cfg = applied
	d.running.Store(applied)
	if err != nil {
		d.recordReload(started, plan, err, nil, nil)
		return err
	}
	notApplied := workersNotApplied(plan, workersFailed)
	// What the bootstrap held back on purpose (logged there) is not
	// applied: the reload's answer says so, and status at once.
	dctx, cancel := context.WithTimeout(ctx, configDiffEvery)
	diff := bootstrap.Diff(dctx, d.srv.JetStream(), applied)
	cancel()
	d.configDiff.Store(&diff)
	var heldBack []HeldBack
	for _, line := range diff {
		for _, key := range plan.Apply {
			if strings.HasPrefix(line, key+" = ") {
				heldBack = append(heldBack, HeldBack{Key: key, Why: line})
				break
			}
		}
	}
	setBack := slices.DeleteFunc(before, func(line string) bool { return slices.Contains(diff, line) })
	d.recordReload(started, plan, nil, setBack, notApplied, heldBack...)
	d.log.Info("reload done", "applied", plan.Apply, "held_back", len(heldBack), "not_applied", len(notApplied), "set_back", setBack)
	return nil
}

// workersNotApplied are the keys of plan's consumers whose workers the
// reload could not start with their new settings (failed, by consumer).
func workersNotApplied(plan ReloadPlan, failed map[string]error) []HeldBack {
	var out []HeldBack
	for _, key := range plan.Apply {
		for name, err := range failed {
			if strings.HasPrefix(key, "consumers."+name+".") || strings.HasPrefix(key, "consumers."+name+" (") {
				out = append(out, HeldBack{Key: key, Why: fmt.Sprintf("%s not applied: %v", key, err)})
			}
		}
	}
	return out
}

// apply applies next over cur (see Reload) and returns what runs now,
// the consumers whose workers could not start with their new settings,
// and an error when the server refused the streams' and consumers'
// settings (then they and the workers keep theirs).
func (d *Daemon) apply(ctx context.Context, cur, next *config.Config) (*config.Config, map[string]error, error) {
	applied := *cur
	if cur.Log.Level != next.Log.Level {
		var lv slog.Level
		_ = lv.UnmarshalText([]byte(next.Log.Level))
		d.level.Set(lv)
		applied.Log.Level = next.Log.Level
		d.log.Info("reload: log level changed", "old", cur.Log.Level, "new", next.Log.Level)
	}
	applied.Run = next.Run
	for _, w := range d.workers {
		w.ShutdownTimeout = next.Run.ShutdownTimeout.Duration // read only by Close, on this goroutine
	}
	// Also with the same streams and consumers: like a start, the
	// bootstrap sets back what was edited on the server meanwhile (a
	// limit set with nats stream edit, on a dead-letter stream one that
	// would remove dead letters), and creates what is new.
	trial := applied
	trial.Streams, trial.Consumers = next.Streams, next.Consumers
	// The server applies a shorter ack_wait to the messages already
	// delivered, while the consumers' workers still run and drain one
	// after another below: they keep their messages alive at its pace
	// from now on, or those would be delivered again while their
	// handlers run.
	for _, w := range d.workers {
		if cc := trial.Consumers[w.Options().Consumer]; cc != nil && cc.AckWait.Duration > 0 && cc.AckWait.Duration < w.AckWait() {
			w.SetAckWait(cc.AckWait.Duration)
		}
	}
	// Group commit stops before its stream leaves the configured
	// subjects to clients, and starts once it has the prefixed ones.
	stopGC, startGC := groupCommitChanged(cur, &trial)
	for _, name := range stopGC {
		d.closeGroupCommit(ctx, name)
	}
	if err := d.applyDesired(ctx, &trial); err != nil {
		// Drift is found before anything changes; a refusal by the
		// server stops at that stream or consumer, after those logged
		// as updated above.
		applied.Streams = d.reopenGroupCommit(ctx, cur, &trial, append(slices.Clone(stopGC), startGC...))
		cfg, err := d.refused(cur, next, &applied, err)
		return cfg, nil, err
	}
	for _, name := range startGC {
		if err := d.openGroupCommit(ctx, &trial, name); err != nil {
			d.log.Error("reload: cannot start group commit: publishes to the stream get no answer until the next restart", "stream", name, "err", err)
		}
	}
	for _, name := range stopGC {
		if !slices.Contains(startGC, name) {
			d.log.Info("reload: group commit off", "stream", name)
		}
	}
	d.leaveOut(ctx, cur, &trial)
	if d.mqtt != nil {
		// Devices' PUBACKs wait for the streams configured now, and a
		// topic only they take is no longer refused (or is, once left out).
		d.mqtt.SetStreams(gateStreams(&trial))
	}
	failed := map[string]error{}
	for _, name := range trial.ConsumerNames() {
		if err := d.reloadWorkers(ctx, &trial, name); err != nil {
			failed[name] = err
		}
	}
	d.monitor.SetConsumers(trial.StreamNames(), d.monitoredConsumers(&trial))
	return &trial, failed, nil
}

// refused is apply's end when the server refused a stream or consumer
// (err): the configured streams the bootstrap updated before the refusal
// run on next's settings in applied, and the error names their keys.
func (d *Daemon) refused(cur, next, applied *config.Config, err error) (*config.Config, error) {
	var keys []string
	if pe := (*bootstrap.PartialError)(nil); errors.As(err, &pe) {
		planned := PlanReload(cur, next).Apply
		for _, name := range pe.Streams {
			applied.Streams[name] = next.Streams[name]
			keys = append(keys, slices.DeleteFunc(slices.Clone(planned), func(k string) bool {
				return !strings.HasPrefix(k, "streams."+name+".") && !strings.HasPrefix(k, "streams."+name+" (")
			})...)
		}
		err = pe.Err
	}
	if len(keys) == 0 {
		d.log.Error("reload: stream and consumer settings not applied; workers keep theirs; still running the previous config for them", "err", err)
		return applied, fmt.Errorf("reload: stream and consumer settings not applied: %w", err)
	}
	d.log.Error("reload: stream and consumer settings applied only in part: the streams before the refusal are updated; the rest, and the workers, keep theirs",
		"applied", keys, "err", err)
	return applied, fmt.Errorf("reload: stream and consumer settings applied only in part (applied: %s; the rest, and the workers, keep theirs): %w",
		strings.Join(keys, ", "), err)
}

// leaveOut stops the workers of the consumers cur has and next has not.
// Those consumers and the streams next leaves out stay on the server
// with their messages; holdfast no longer watches them.
func (d *Daemon) leaveOut(ctx context.Context, cur, next *config.Config) {
	for _, name := range cur.ConsumerNames() {
		if next.Consumers[name] != nil {
			continue
		}
		if i := slices.IndexFunc(d.workers, func(w *pipeline.Workers) bool { return w.Options().Consumer == name }); i >= 0 {
			w := d.workers[i]
			d.setWorkers(slices.Delete(slices.Clone(d.workers), i, i+1))
			d.log.Info("reload: draining the workers of a consumer left out of the config", "consumer", name,
				"in_flight", w.Stats().InFlight.Load(), "shutdown_timeout", w.ShutdownTimeout)
			_ = w.Close(ctx)
		}
		d.setForwarder(name, nil)
		delete(d.workersFrom, name)
		d.log.Info("reload: consumer left out of the config: its workers stopped; the consumer and its messages stay on the server",
			"consumer", name, "stream", cur.Consumers[name].Stream)
	}
	for _, name := range cur.StreamNames() {
		if next.Streams[name] == nil {
			d.log.Info("reload: stream left out of the config: holdfast no longer watches it; it and its messages stay on the server", "stream", name)
			if cur.Streams[name].GroupCommit {
				d.log.Warn("reload: the stream left out kept group commit's prefixed subjects: publishes to its configured subjects get no answer until it is configured again or its subjects are edited", "stream", name)
			}
		}
	}
}

// monitoredConsumers is what the monitor watches of cfg's consumers,
// with the workers that run now.
func (d *Daemon) monitoredConsumers(cfg *config.Config) []monitor.Consumer {
	out := make([]monitor.Consumer, 0, len(cfg.Consumers))
	for _, name := range cfg.ConsumerNames() {
		cc := cfg.Consumers[name]
		mc := monitor.Consumer{Stream: cc.Stream, Consumer: name, WantWorkers: cc.Workers, DeadLetter: cc.DeadLetter,
			Handler: cc.Handler, HandlerTimeout: handlerTimeout(cc)}
		if i := slices.IndexFunc(d.workers, func(w *pipeline.Workers) bool { return w.Options().Consumer == name }); i >= 0 {
			mc.Workers = d.workers[i]
		}
		out = append(out, mc)
	}
	return out
}

// reloadWorkers restarts a consumer's workers when what they run with
// changed. The old workers drain first (up to shutdown_timeout); the new
// ones keep their counters. It compares with what the workers run with,
// not with the previous config: a reload that could not apply a handler
// (its command missing) is tried again at the next one. It returns why
// the workers could not start with the new settings.
func (d *Daemon) reloadWorkers(ctx context.Context, cfg *config.Config, name string) error {
	cc := cfg.Consumers[name]
	old := d.workersFrom[name]
	same := old != nil && old.Workers == cc.Workers && old.Handler == cc.Handler && reflect.DeepEqual(old.Exec, cc.Exec) &&
		reflect.DeepEqual(old.HTTP, cc.HTTP) && reflect.DeepEqual(old.Forward, cc.Forward) && reflect.DeepEqual(old.Backoff, cc.Backoff) && old.MaxDeliver == cc.MaxDeliver &&
		old.AckWait == cc.AckWait && old.DeadLetter == cc.DeadLetter && prefetch(old) == prefetch(cc) &&
		maxPrefetch(old) == maxPrefetch(cc)
	if same {
		return nil
	}
	i := slices.IndexFunc(d.workers, func(w *pipeline.Workers) bool { return w.Options().Consumer == name })
	if cc.Workers > 0 && cc.Handler != "forward" {
		if _, err := NewHandler(name, cc, d.log); err != nil {
			d.log.Error("reload: workers keep their previous handler; the next reload tries the new one again", "consumer", name, "err", err)
			return fmt.Errorf("the workers keep their previous handler (none for a new consumer); the next reload tries again: %w", err)
		}
	}
	if i >= 0 {
		old := d.workers[i]
		d.setWorkers(slices.Delete(slices.Clone(d.workers), i, i+1))
		d.log.Info("reload: draining the consumer's workers before restarting them", "consumer", name,
			"in_flight", old.Stats().InFlight.Load(), "shutdown_timeout", old.ShutdownTimeout)
		_ = old.Close(ctx)
	}
	// The old workers' forwarder goes with them (openWorkers records a
	// new one if the consumer still forwards): else its check of the hub
	// would go on and still show in status, metrics and health.
	d.setForwarder(name, nil)
	var w *pipeline.Workers
	var openErr error
	if cc.Workers > 0 {
		var err error
		if w, err = d.openWorkers(ctx, cfg, name, time.Time{}); err != nil {
			d.log.Error("reload: cannot start workers: the consumer has none until a reload or a restart starts them", "consumer", name, "err", err)
			d.workersFrom[name] = nil
			openErr = fmt.Errorf("cannot start workers: the consumer has none until a reload or a restart starts them: %w", err)
		} else {
			d.setWorkers(append(slices.Clone(d.workers), w))
			d.workersFrom[name] = cc
		}
	} else {
		d.workersFrom[name] = cc
	}
	d.monitor.SetWorkers(cc.Stream, name, cc.Workers, w)
	d.monitor.SetHandlerTimeout(cc.Stream, name, handlerTimeout(cc))
	if openErr != nil {
		return openErr
	}
	d.log.Info("reload: workers restarted", "consumer", name, "workers", cc.Workers, "handler", cc.Handler)
	return nil
}

// NewHandler builds a consumer's configured handler.
func NewHandler(name string, cc *config.ConsumerConfig, log *slog.Logger) (handler.Handler, error) {
	hlog := log.With("component", "handler")
	switch cc.Handler {
	case "log":
		return handler.NewLog(hlog), nil
	case "exec":
		h, err := handler.NewExec(handler.ExecOptions{Command: cc.Exec.Command, Timeout: cc.Exec.Timeout.Duration}, hlog)
		if err != nil {
			return nil, fmt.Errorf("consumers.%s.exec: %w", name, err)
		}
		return h, nil
	case "http":
		h, err := handler.NewHTTP(handler.HTTPOptions{URL: cc.HTTP.URL, Timeout: cc.HTTP.Timeout.Duration}, hlog)
		if err != nil {
			return nil, fmt.Errorf("consumers.%s.http: %w", name, err)
		}
		return h, nil
	}
	return nil, fmt.Errorf("consumers.%s.handler: unknown handler %q", name, cc.Handler)
}

// ConsumerOptions are the workers' options for a configured consumer.
func ConsumerOptions(name string, cc *config.ConsumerConfig, h handler.Handler) pipeline.ConsumerOptions {
	backoff := make([]time.Duration, len(cc.Backoff))
	for i, b := range cc.Backoff {
		backoff[i] = b.Duration
	}
	return pipeline.ConsumerOptions{
		Stream:      cc.Stream,
		Consumer:    name,
		Workers:     cc.Workers,
		AckWait:     cc.AckWait.Duration,
		MaxDeliver:  cc.MaxDeliver,
		Backoff:     backoff,
		DeadLetter:  cc.DeadLetter,
		Handler:     h,
		Prefetch:    prefetch(cc),
		MaxPrefetch: maxPrefetch(cc),
	}
}

// prefetch is the consumer's prefetch as used: the server never has more
// than max_ack_pending messages out, the workers' own included.
func prefetch(cc *config.ConsumerConfig) int {
	return min(cc.Prefetch, maxPrefetch(cc))
}

// maxPrefetch is the furthest the workers may pull ahead (quick handlers,
// see pipeline.ConsumerOptions.MaxPrefetch): max_ack_pending - workers.
func maxPrefetch(cc *config.ConsumerConfig) int {
	return max(0, cc.MaxAckPending-cc.Workers)
}
