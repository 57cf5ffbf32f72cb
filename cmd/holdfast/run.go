package main

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/holdfast-io/holdfast/daemon"
	"github.com/holdfast-io/holdfast/pipeline/handler"
)

func runCommand() *cli.Command {
	return &cli.Command{
		Name:   "run",
		Usage:  "run the daemon: embedded NATS JetStream, streams, consumers and workers",
		Action: runDaemon,
	}
}

// runDaemon loads the config, sets up logging and the signals, and serves
// the daemon until a stop signal or a failure.
func runDaemon(c *cli.Context) error {
	// A log reader that went away (a pipe to a logger that was killed, a
	// restarted collector) must not end the daemon; systemd counts SIGPIPE
	// as a clean exit (Restart=on-failure does not restart it).
	surviveBrokenPipe()
	cfg, source, err := loadConfig(c)
	if err != nil {
		return err
	}
	log, level := newLogger(os.Stderr, cfg.Log)
	// Repeated at every start, so that nobody forgets them.
	for _, w := range cfg.SecurityWarnings(source) {
		log.Warn(w, "component", "security")
	}
	if source == "" {
		source = "built-in defaults"
	}
	log.Info("starting holdfast", "version", versionString(), "config", source, "pid", os.Getpid())

	// holdfast owns the signals. A stop request (TERM/INT) has its own
	// channel and goroutine, so that no number of reloads can crowd it
	// out. SIGHUPs are coalesced: the channel holds one, and a pending
	// reload reads the latest file anyway.
	sigs := &runSignals{stop: make(chan os.Signal, 2), hup: make(chan os.Signal, 1)}
	signal.Notify(sigs.stop, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs.stop)
	signal.Notify(sigs.hup, syscall.SIGHUP)
	defer signal.Stop(sigs.hup)

	n := newNotifier(log)
	d := daemon.New(cfg, daemon.Options{Log: log, Level: level, Notify: n, Version: versionString(), ConfigFile: configPath(c)})
	return serve(c.Context, d, n, log, sigs)
}

// runSignals are the signals `holdfast run` acts on.
type runSignals struct {
	stop chan os.Signal // SIGTERM and SIGINT
	hup  chan os.Signal // SIGHUP: reload the config file
	// received is the os.Signal that asked to stop, once one did.
	received atomic.Value
}

// errStartInterrupted is what startDaemon returns when a stop signal
// ended start-up: holdfast exits 0 then.
var errStartInterrupted = errors.New("start-up interrupted by signal")

// serve opens d, reloads it on SIGHUP and closes it on the first stop
// signal or when it fails; a second stop signal exits at once.
func serve(ctx context.Context, d *daemon.Daemon, n *notifier, log *slog.Logger, sigs *runSignals) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		// The first stop signal cancels ctx: start-up, a reload in
		// progress and the serve loop all see it.
		sig := <-sigs.stop
		sigs.received.Store(sig)
		cancel()
		sig = <-sigs.stop
		log.Error("second signal: exiting at once", "signal", sig.String(),
			"handler_commands_killed", handler.KillRunningCommands())
		os.Exit(1)
	}()

	reloadWhenReady, err := startDaemon(ctx, d, log, sigs)
	if errors.Is(err, errStartInterrupted) {
		return nil
	}
	if err != nil {
		return runtimeError(err)
	}
	n.Ready(d.Status())
	log.Info("holdfast ready", "status", d.Status())
	go n.Watchdog(ctx, d.Healthy)
	if reloadWhenReady {
		select {
		case sigs.hup <- syscall.SIGHUP:
		default: // another SIGHUP is pending: it reads the file then
		}
	}

	runErr := serveUntilStopped(ctx, d, n, log, sigs)
	n.Stopping(d.Running().Run.ShutdownTimeout.Duration + stopMargin)
	cancel()
	if err := d.Close(context.Background()); err != nil {
		log.Error("shutdown", "err", err)
		if runErr == nil {
			runErr = runtimeError(err)
		}
	}
	log.Info("holdfast stopped")
	return runErr
}

// startDaemon opens d and waits until it is ready. It reports whether a
// SIGHUP came during start-up, to be acted on once holdfast is ready: the
// file may have changed after start-up read it. When start-up fails or a
// stop signal ends it, d is closed.
func startDaemon(ctx context.Context, d *daemon.Daemon, log *slog.Logger, sigs *runSignals) (reloadWhenReady bool, err error) {
	opened := make(chan error, 1)
	go func() { opened <- d.Open(ctx) }()
	stopped := ctx.Done() // nil once the stop during start-up was logged
	for {
		select {
		case err := <-opened:
			if err == nil && ctx.Err() == nil {
				return reloadWhenReady, nil
			}
			_ = d.Close(context.Background())
			if ctx.Err() != nil {
				log.Info("start-up interrupted by signal")
				return false, errStartInterrupted
			}
			return false, err
		case <-sigs.hup:
			log.Warn("SIGHUP during start-up: the config is read again once holdfast is ready")
			reloadWhenReady = true
		case <-stopped:
			// Open sees ctx too and returns; the case above ends it.
			if sig, ok := sigs.received.Load().(os.Signal); ok {
				log.Info("signal during start-up: stopping", "signal", sig.String())
			}
			stopped = nil
		}
	}
}

// serveUntilStopped reloads d on each SIGHUP until ctx is cancelled by a
// stop signal, or d fails: it returns d's error then.
func serveUntilStopped(ctx context.Context, d *daemon.Daemon, n *notifier, log *slog.Logger, sigs *runSignals) error {
	for {
		select {
		case <-sigs.hup:
			if ctx.Err() != nil {
				continue // a stop request won the race: no reload now
			}
			n.Reloading()
			_ = d.ReloadFromFile(ctx) // logged, and answered on subjects.Reload
			if ctx.Err() == nil {
				n.Ready(d.Status())
			}
		case <-ctx.Done():
			name := "context cancelled"
			if sig, ok := sigs.received.Load().(os.Signal); ok {
				name = sig.String()
			}
			log.Info("shutting down", "signal", name)
			return nil
		case <-d.Failed():
			err := runtimeError(d.Err())
			log.Error(err.Error())
			return err
		}
	}
}
