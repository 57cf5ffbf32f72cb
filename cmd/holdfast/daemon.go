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
)

// daemon wires the parts of `holdfast run` together: opened in order,
// closed in reverse.
type daemon struct {
	cfg    *config.Config
	log    *slog.Logger
	notify *notifier

	srv    *embedded.Server
	failed chan struct{}

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
		if d.srv != nil {
			d.notify.Status("shutting down the NATS server")
			d.closeErr = d.srv.Close(ctx)
		}
	})
	return d.closeErr
}
