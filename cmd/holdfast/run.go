package main

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"
)

func runCommand() *cli.Command {
	return &cli.Command{
		Name:  "run",
		Usage: "run the daemon: embedded NATS JetStream, streams, consumers and workers",
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usageError(errUnexpectedArgs(c))
			}
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

			// holdfast owns the signals: the first SIGTERM/SIGINT starts a
			// graceful shutdown, a second one exits at once.
			sigs := make(chan os.Signal, 4)
			signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
			defer signal.Stop(sigs)

			n := newNotifier(log)
			d := newDaemon(cfg, log, level, n)
			ctx, cancel := context.WithCancel(c.Context)
			defer cancel()
			opened := make(chan error, 1)
			go func() { opened <- d.Open(ctx) }()

		starting:
			for {
				select {
				case err := <-opened:
					if err != nil {
						_ = d.Close(context.Background())
						if ctx.Err() != nil {
							log.Info("start-up interrupted by signal")
							return nil
						}
						return runtimeError(err)
					}
					break starting
				case sig := <-sigs:
					if sig == syscall.SIGHUP {
						log.Warn("SIGHUP during start-up: ignored")
						continue
					}
					log.Info("signal during start-up: stopping", "signal", sig.String())
					cancel()
				}
			}
			n.Ready(d.Status())
			log.Info("holdfast ready", "status", d.Status())
			go n.Watchdog(ctx, d.Healthy)

			var runErr error
		serving:
			for {
				select {
				case sig := <-sigs:
					if sig == syscall.SIGHUP {
						n.Reloading()
						if next, _, err := loadConfig(c); err != nil {
							log.Error("reload refused: the config has problems; still running the previous one", "err", err)
						} else {
							d.Reload(ctx, next)
						}
						n.Ready(d.Status())
						continue
					}
					log.Info("shutting down", "signal", sig.String())
					break serving
				case <-d.Failed():
					runErr = runtimeError(errors.New("NATS server stopped unexpectedly"))
					log.Error(runErr.Error())
					break serving
				}
			}

			n.Stopping()
			cancel()
			closed := make(chan error, 1)
			go func() { closed <- d.Close(context.Background()) }()
			for {
				select {
				case err := <-closed:
					if err != nil {
						log.Error("shutdown", "err", err)
						if runErr == nil {
							runErr = runtimeError(err)
						}
					}
					log.Info("holdfast stopped")
					return runErr
				case sig := <-sigs:
					if sig == syscall.SIGHUP {
						continue
					}
					log.Error("second signal: exiting at once", "signal", sig.String())
					os.Exit(1)
				}
			}
		},
	}
}
