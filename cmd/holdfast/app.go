package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/holdfast-io/holdfast/config"
)

// Set by -ldflags -X at build time.
var (
	version = ""
	commit  = ""
)

var configFlag = &cli.StringFlag{
	Name:    "config",
	Aliases: []string{"c"},
	Usage:   "config file (default " + config.DefaultPath + " when it exists, else built-in defaults)",
	EnvVars: []string{"HOLDFAST_CONFIG"},
}

func newApp() *cli.App {
	return &cli.App{
		Name:                 "holdfast",
		Usage:                "durable messaging on an embedded NATS JetStream",
		Version:              versionString(),
		Flags:                []cli.Flag{configFlag},
		EnableBashCompletion: true,
		HideVersion:          true,
		Commands: []*cli.Command{
			runCommand(),
			checkCommand(),
			configCommand(),
			pubCommand(),
			dlqCommand(),
			versionCommand(),
		},
		OnUsageError: func(c *cli.Context, err error, _ bool) error {
			return usageError(err)
		},
		CommandNotFound: func(c *cli.Context, name string) {
			fmt.Fprintf(c.App.ErrWriter, "Error: unknown command %q: see 'holdfast help'\n", name)
			os.Exit(2)
		},
		ExitErrHandler: func(*cli.Context, error) {}, // main prints and exits
	}
}

// loadConfig reads the config named by --config/HOLDFAST_CONFIG, or the
// default path, or the built-in defaults. Config problems are usage errors.
func loadConfig(c *cli.Context) (*config.Config, string, error) {
	cfg, source, err := config.Load(c.String("config"))
	if err != nil {
		if errors.Is(err, config.ErrInvalidConfig) {
			return nil, source, usageError(err)
		}
		return nil, source, usageError(err)
	}
	return cfg, source, nil
}

// newLogger builds the process logger: stderr, text or JSON, and without
// timestamps under systemd (the journal adds its own).
func newLogger(w io.Writer, lc config.LogConfig) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(lc.Level))
	opts := &slog.HandlerOptions{Level: level}
	if os.Getenv("JOURNAL_STREAM") != "" {
		opts.ReplaceAttr = func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) == 0 && a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		}
	}
	if lc.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
