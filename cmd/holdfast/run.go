package main

import (
	"context"
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
		Name:  "run",
		Usage: "run the daemon: embedded NATS JetStream, streams, consumers and workers",
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usageError(errUnexpectedArgs(c))
			}
			// A log reader that went away (a pipe to a logger that was
			// killed, a restarted collector) must not end the daemon: Go
			// kills a program writing to a broken pipe on fd 1 or 2 with
			// SIGPIPE unless it is notified, and systemd counts SIGPIPE as
			// a clean exit (Restart=on-failure does not restart it). Once
			// notified, such a write fails with EPIPE and holdfast serves
			// on. Notify, not Ignore: an ignored signal stays ignored in
			// the exec handlers' processes.
			signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
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

			// holdfast owns the signals. A stop request (TERM/INT) has its
			// own channel and goroutine, so that no number of reloads can
			// crowd it out: the first one cancels ctx (start-up, a reload in
			// progress and the serve loop all see it), a second one exits at
			// once. SIGHUPs are coalesced: the channel holds one, and a
			// pending reload reads the latest file anyway.
			stopSigs := make(chan os.Signal, 2)
			signal.Notify(stopSigs, syscall.SIGTERM, syscall.SIGINT)
			defer signal.Stop(stopSigs)
			hups := make(chan os.Signal, 1)
			signal.Notify(hups, syscall.SIGHUP)
			defer signal.Stop(hups)

			n := newNotifier(log)
			d := daemon.New(cfg, daemon.Options{Log: log, Level: level, Notify: n, Version: versionString(), ConfigFile: configPath(c)})
			ctx, cancel := context.WithCancel(c.Context)
			defer cancel()
			var stopSig atomic.Value // the os.Signal that asked to stop
			go func() {
				sig := <-stopSigs
				stopSig.Store(sig)
				cancel()
				sig = <-stopSigs
				log.Error("second signal: exiting at once", "signal", sig.String(),
					"handler_commands_killed", handler.KillRunningCommands())
				os.Exit(1)
			}()
			opened := make(chan error, 1)
			go func() { opened <- d.Open(ctx) }()

			stopped := ctx.Done() // nil once the stop during start-up was logged
			// A SIGHUP during start-up is acted on once holdfast is
			// ready: the file may have changed after start-up read it.
			reloadWhenReady := false
		starting:
			for {
				select {
				case err := <-opened:
					if err != nil || ctx.Err() != nil {
						_ = d.Close(context.Background())
						if ctx.Err() != nil {
							log.Info("start-up interrupted by signal")
							return nil
						}
						return runtimeError(err)
					}
					break starting
				case <-hups:
					log.Warn("SIGHUP during start-up: the config is read again once holdfast is ready")
					reloadWhenReady = true
				case <-stopped:
					// Open sees ctx too and returns; the case above ends it.
					if sig, ok := stopSig.Load().(os.Signal); ok {
						log.Info("signal during start-up: stopping", "signal", sig.String())
					}
					stopped = nil
				}
			}
			n.Ready(d.Status())
			log.Info("holdfast ready", "status", d.Status())
			go n.Watchdog(ctx, d.Healthy)
			if reloadWhenReady {
				select {
				case hups <- syscall.SIGHUP:
				default: // another SIGHUP is pending: it reads the file then
				}
			}

			var runErr error
		serving:
			for {
				select {
				case <-hups:
					if ctx.Err() != nil {
						continue // a stop request won the race: no reload now
					}
					n.Reloading()
					_ = d.ReloadFromFile(ctx) // logged, and answered on subjects.Reload
					if ctx.Err() == nil {
						n.Ready(d.Status())
					}
				case <-ctx.Done():
					sig, _ := stopSig.Load().(os.Signal)
					name := "context cancelled"
					if sig != nil {
						name = sig.String()
					}
					log.Info("shutting down", "signal", name)
					break serving
				case <-d.Failed():
					runErr = runtimeError(d.Err())
					log.Error(runErr.Error())
					break serving
				}
			}

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
		},
	}
}
