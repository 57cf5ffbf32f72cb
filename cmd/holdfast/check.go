package main

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/urfave/cli/v2"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/daemon"
	"github.com/holdfast-io/holdfast/embedded/store"
)

func checkCommand() *cli.Command {
	return &cli.Command{
		Name:  "check",
		Usage: "validate the config and the store dir without starting; lists every problem",
		Flags: []cli.Flag{serverFlag, &cli.BoolFlag{Name: "running",
			Usage: "also ask the running holdfast what a reload of its config file applies and what needs a restart; exit 1 when anything does"}},
		Action: func(c *cli.Context) error {
			cfg, source, err := config.Load(configPath(c))
			file := source
			if source == "" {
				source = "built-in defaults"
			}
			var problems []error
			if err != nil {
				problems = append(problems, err)
			}
			var secrets *config.Secrets
			if cfg != nil {
				for _, w := range cfg.SecurityWarnings(file) {
					fmt.Fprintln(c.App.Writer, "warning: "+w)
				}
				var serr error
				if secrets, serr = cfg.LoadSecrets(); serr != nil {
					problems = append(problems, serr)
				}
			}
			if cfg != nil {
				problems = append(problems, checkHandlers(cfg)...)
			}
			if cfg != nil && cfg.JetStream.StoreDir != "" {
				// Without side effects: nothing is created or left behind.
				res, serr := store.InspectDir(cfg.JetStream.StoreDir, cfg.JetStream.AllowTmpfs, cfg.JetStream.MaxFileStore.Bytes)
				if serr != nil {
					problems = append(problems, serr)
				} else {
					for _, w := range res.Warnings {
						fmt.Fprintln(c.App.Writer, "warning: "+w)
					}
					if res.Missing {
						fmt.Fprintf(c.App.Writer, "note: store dir %s does not exist yet; run creates it (in %s, which is writable)\n", res.Path, res.Parent)
					} else if secrets != nil {
						// The key (or its absence) as run would take it.
						js := cfg.JetStream
						if kerr := store.CheckKeys(filepath.Join(res.Path, server.JetStreamStoreDir), secrets.EncryptionKey, secrets.OldEncryptionKey,
							js.EncryptionKeyFile, js.EncryptionOldKeyFile); kerr != nil {
							problems = append(problems, kerr)
						}
					}
					// The lock as run takes it: a lock file run cannot open is a
					// problem, a lock another process holds only a note.
					if holder, lerr := store.ProbeLock(res.Path); lerr != nil {
						problems = append(problems, lerr)
					} else if holder != "" {
						fmt.Fprintf(c.App.Writer, "note: store dir %s is in use by %s; a second instance on it would be refused\n", res.Path, holder)
					}
				}
			}
			if len(problems) > 0 {
				return runtimeError(checkFailed(source, problems))
			}
			fmt.Fprintf(c.App.Writer, "ok: %s: %d stream(s), %d consumer(s), store dir %s\n",
				source, len(cfg.Streams), len(cfg.Consumers), cfg.JetStream.StoreDir)
			if c.Bool("running") {
				return checkRunning(c)
			}
			return nil
		},
	}
}

// checkFailed is check's error: one list of every problem, those of the
// config's validation and parsing among the others, with their count.
func checkFailed(source string, problems []error) error {
	var lines []string
	for _, err := range problems {
		var ve *config.ValidationError
		var pe *config.ParseError
		switch {
		case errors.As(err, &ve):
			for _, p := range ve.Problems {
				lines = append(lines, p.String())
			}
		case errors.As(err, &pe):
			// file: line N: ..., as the parse error names it.
			for l := range strings.SplitSeq(pe.Err.Error(), "\n") {
				lines = append(lines, (&config.ParseError{Source: pe.Source, Err: errors.New(strings.TrimSpace(l))}).Error())
			}
		default:
			lines = append(lines, err.Error())
		}
	}
	return &checkError{msg: fmt.Sprintf("check failed (%s): %d problem(s):\n  %s", source, len(lines), strings.Join(lines, "\n  ")), problems: problems}
}

// checkError lists check's problems and unwraps to each of them.
type checkError struct {
	msg      string
	problems []error
}

func (e *checkError) Error() string   { return e.msg }
func (e *checkError) Unwrap() []error { return e.problems }

// checkHandlers builds the exec and http handlers as run does, so that a
// command run would refuse (missing, a directory, not executable) fails
// check too. It starts nothing and sends nothing.
func checkHandlers(cfg *config.Config) []error {
	var problems []error
	names := slices.Sorted(maps.Keys(cfg.Consumers))
	for _, name := range names {
		cc := cfg.Consumers[name]
		if cc.Workers == 0 || (cc.Handler != "exec" && cc.Handler != "http") {
			continue // run builds no handler for it
		}
		if _, err := daemon.NewHandler(name, cc, slog.New(slog.DiscardHandler)); err != nil {
			problems = append(problems, err)
		}
	}
	return problems
}
