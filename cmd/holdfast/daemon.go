package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

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

	srv     *embedded.Server
	workers []*pipeline.Workers
	failed  chan struct{}

	closeOnce sync.Once
	closeErr  error
	stopWatch context.CancelFunc
}

func newDaemon(cfg *config.Config, log *slog.Logger, n *notifier) *daemon {
	return &daemon{cfg: cfg, log: log, notify: n, failed: make(chan struct{})}
}

// Open starts the embedded server, bootstraps streams and consumers, and
// starts the workers.
func (d *daemon) Open(ctx context.Context) error {
	d.srv = embedded.New(d.cfg, d.log)
	d.srv.OnStatus = d.notify.Status
	if err := d.srv.Open(ctx); err != nil {
		return err
	}
	d.notify.Status("bootstrapping streams and consumers")
	if err := embedded.Bootstrap(ctx, d.srv.JetStream(), d.cfg, d.log); err != nil {
		return err
	}
	for _, name := range d.cfg.ConsumerNames() {
		cc := d.cfg.Consumers[name]
		if cc.Workers == 0 {
			d.log.Info("consumer has no in-process workers (workers = 0)", "consumer", name)
			continue
		}
		h, err := newHandler(name, cc, d.log)
		if err != nil {
			return err
		}
		w := pipeline.NewWorkers(d.srv.JetStream(), d.srv.Conn(), consumerOptions(name, cc, h), d.log)
		w.ShutdownTimeout = d.cfg.Run.ShutdownTimeout.Duration
		if err := w.Open(ctx); err != nil {
			return err
		}
		d.workers = append(d.workers, w)
	}
	wctx, cancel := context.WithCancel(context.Background())
	d.stopWatch = cancel
	go d.watchServer(wctx)
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
		if d.stopWatch != nil {
			d.stopWatch()
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
		if d.srv != nil {
			d.notify.Status("shutting down the NATS server")
			d.closeErr = d.srv.Close(ctx)
		}
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
