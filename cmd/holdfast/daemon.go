package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/embedded"
	"github.com/holdfast-io/holdfast/pipeline"
)

// daemon wires the parts of `holdfast run` together: opened in order,
// closed in reverse.
type daemon struct {
	cfg    *config.Config
	log    *slog.Logger
	notify *notifier

	http      *httpServer
	metrics   *pipeline.Metrics
	srv       *embedded.Server
	workers   []*pipeline.Workers
	monitor   *pipeline.Monitor
	statusSub *nats.Subscription
	failed    chan struct{}

	closeOnce sync.Once
	closeErr  error
	stopWatch context.CancelFunc
}

func newDaemon(cfg *config.Config, log *slog.Logger, n *notifier) *daemon {
	return &daemon{cfg: cfg, log: log, notify: n, failed: make(chan struct{})}
}

// Open starts the HTTP listener (503 until ready), the embedded server,
// bootstraps streams and consumers, starts the workers, the monitor and
// the status responder.
func (d *daemon) Open(ctx context.Context) error {
	d.metrics = pipeline.NewMetrics(versionString(), server.VERSION)
	if d.cfg.HTTP.Listen != "" {
		d.http = newHTTPServer(d.cfg.HTTP.Listen, d.metrics, d.log)
		if err := d.http.Open(ctx); err != nil {
			return err
		}
	}
	d.srv = embedded.New(d.cfg, d.log)
	d.srv.OnStatus = d.notify.Status
	if err := d.srv.Open(ctx); err != nil {
		return err
	}
	d.http.setNATS(d.srv.NATS())
	d.notify.Status("bootstrapping streams and consumers")
	if err := embedded.Bootstrap(ctx, d.srv.JetStream(), d.cfg, d.log); err != nil {
		return err
	}
	monitored := make([]pipeline.MonitoredConsumer, 0, len(d.cfg.Consumers))
	for _, name := range d.cfg.ConsumerNames() {
		cc := d.cfg.Consumers[name]
		mc := pipeline.MonitoredConsumer{Stream: cc.Stream, Consumer: name, WantWorkers: cc.Workers, DeadLetter: cc.DeadLetter}
		if cc.Workers == 0 {
			d.log.Info("consumer has no in-process workers (workers = 0)", "consumer", name)
			monitored = append(monitored, mc)
			continue
		}
		h, err := newHandler(name, cc, d.log)
		if err != nil {
			return err
		}
		opts := consumerOptions(name, cc, h)
		opts.OnResult = d.metrics.ObserveResult(cc.Stream)
		w := pipeline.NewWorkers(d.srv.JetStream(), d.srv.Conn(), opts, d.log)
		w.ShutdownTimeout = d.cfg.Run.ShutdownTimeout.Duration
		if err := w.Open(ctx); err != nil {
			return err
		}
		d.workers = append(d.workers, w)
		mc.Workers = w
		monitored = append(monitored, mc)
	}
	d.monitor = pipeline.NewMonitor(d.srv.JetStream(), d.srv.Conn(), pipeline.MonitorOptions{
		Streams:          d.cfg.StreamNames(),
		Consumers:        monitored,
		StallTimeout:     d.cfg.HTTP.StallTimeout.Duration,
		FailOnLoss:       d.cfg.HTTP.FailOnLoss,
		Check:            jetStreamCheck(d.srv),
		FileStoreLimit:   d.cfg.JetStream.MaxFileStore.Bytes,
		MemoryStoreLimit: d.cfg.JetStream.MaxMemoryStore.Bytes,
	}, d.log)
	if err := d.monitor.Open(ctx); err != nil {
		return err
	}
	d.metrics.SetMonitor(d.monitor)
	d.http.setMonitor(d.monitor)
	var err error
	if d.statusSub, err = serveStatus(d); err != nil {
		return err
	}
	d.http.setPhase(phaseReady)

	wctx, cancel := context.WithCancel(context.Background())
	d.stopWatch = cancel
	go d.watchServer(wctx)
	d.log.Info("serving", "version", versionString(), "store_dir", d.srv.StoreDir(), "sync", d.cfg.JetStream.Sync,
		"client_url", d.srv.NATS().ClientURL(), "http", d.http.Addr(), "streams", d.cfg.StreamNames(),
		"consumers", d.cfg.ConsumerNames(), "workers", len(d.workers))
	return nil
}

// watchServer closes failed when the NATS server stops on its own.
func (d *daemon) watchServer(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if !d.srv.NATS().Running() {
				close(d.failed)
				return
			}
		}
	}
}

// Failed is closed when the server stopped without being asked to.
func (d *daemon) Failed() <-chan struct{} { return d.failed }

// Status is a one-line summary for systemd's STATUS=.
func (d *daemon) Status() string {
	return fmt.Sprintf("serving %d stream(s), %d consumer(s) from %s", len(d.cfg.Streams), len(d.cfg.Consumers), d.srv.StoreDir())
}

// Healthy reports whether the server answers on the in-process connection
// (a JetStream API round trip), for the systemd watchdog.
func (d *daemon) Healthy(ctx context.Context) error {
	if d.srv == nil || d.srv.NATS() == nil || !d.srv.NATS().Running() {
		return errors.New("NATS server not running")
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := d.srv.JetStream().AccountInfo(ctx); err != nil {
		return fmt.Errorf("JetStream does not answer: %w", err)
	}
	return nil
}

// Close stops everything in reverse order of Open. It is idempotent.
func (d *daemon) Close(ctx context.Context) error {
	d.closeOnce.Do(func() {
		d.http.setPhase(phaseStopping)
		if d.stopWatch != nil {
			d.stopWatch()
		}
		if d.statusSub != nil {
			_ = d.statusSub.Unsubscribe()
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

// newHandler builds a consumer's configured handler.
func newHandler(name string, cc *config.ConsumerConfig, log *slog.Logger) (pipeline.Handler, error) {
	hlog := log.With("component", "handler")
	switch cc.Handler {
	case "log":
		return pipeline.NewLogHandler(hlog), nil
	case "exec":
		h, err := pipeline.NewExecHandler(pipeline.ExecOptions{Command: cc.Exec.Command, Timeout: cc.Exec.Timeout.Duration}, hlog)
		if err != nil {
			return nil, fmt.Errorf("consumers.%s.exec: %w", name, err)
		}
		return h, nil
	case "http":
		h, err := pipeline.NewHTTPHandler(pipeline.HTTPOptions{URL: cc.HTTP.URL, Timeout: cc.HTTP.Timeout.Duration}, hlog)
		if err != nil {
			return nil, fmt.Errorf("consumers.%s.http: %w", name, err)
		}
		return h, nil
	}
	return nil, fmt.Errorf("consumers.%s.handler: unknown handler %q", name, cc.Handler)
}

func consumerOptions(name string, cc *config.ConsumerConfig, h pipeline.Handler) pipeline.ConsumerOptions {
	backoff := make([]time.Duration, len(cc.Backoff))
	for i, b := range cc.Backoff {
		backoff[i] = b.Duration
	}
	return pipeline.ConsumerOptions{
		Stream:     cc.Stream,
		Consumer:   name,
		Workers:    cc.Workers,
		AckWait:    cc.AckWait.Duration,
		MaxDeliver: cc.MaxDeliver,
		Backoff:    backoff,
		DeadLetter: cc.DeadLetter,
		Handler:    h,
	}
}
