package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/holdfast-io/holdfast/config"
)

// Set by -ldflags -X at build time.
var (
	version = ""
	commit  = ""
)

// newConfigFlag returns a --config flag. The app and every command that
// reads the config get their own, so that both `holdfast --config FILE
// check` and `holdfast check --config FILE` work (urfave/cli only parses a
// flag where it is defined). Only the app's reads HOLDFAST_CONFIG, so that
// a flag anywhere on the command line wins over the environment.
func newConfigFlag(env bool) *cli.StringFlag {
	f := &cli.StringFlag{
		Name:    "config",
		Aliases: []string{"c"},
		Usage:   "config file (default " + config.DefaultPath + " when it exists, else built-in defaults)",
	}
	if env {
		f.EnvVars = []string{"HOLDFAST_CONFIG"}
	}
	return f
}

// configPath is the --config given after the command, else before it,
// else HOLDFAST_CONFIG, else "".
func configPath(c *cli.Context) string {
	for _, cc := range c.Lineage() {
		if cc.IsSet("config") {
			return cc.String("config")
		}
	}
	return ""
}

// prepareCommands gives cmd and its subcommands the --config flag (unless
// they do not read the config) and makes their usage errors exit with 2.
func prepareCommands(cmds []*cli.Command) {
	for _, cmd := range cmds {
		if cmd.Name != "config" && cmd.Name != "version" && cmd.Name != "passwd" && cmd.Name != "completion" && cmd.Name != "init" {
			cmd.Flags = append(cmd.Flags, newConfigFlag(false))
		}
		for _, f := range cmd.Flags {
			if f == serverFlag {
				cmd.Flags = append(cmd.Flags, clientFlags()...)
				break
			}
		}
		if cmd.OnUsageError == nil {
			cmd.OnUsageError = func(_ *cli.Context, err error, _ bool) error { return usageError(err) }
		}
		if cmd.Before == nil && len(cmd.Subcommands) == 0 {
			cmd.Before = checkArgs
		}
		prepareCommands(cmd.Subcommands)
	}
}

// checkArgs refuses, before the command does anything, a flag given
// after its arguments (urfave/cli stops reading flags at the first
// argument, so `holdfast pub SUBJECT DATA --server URL` would take
// --server as data, or fail with a bare usage line) and any argument to a
// command that takes none (`holdfast dlq purge --yes 6` purged every dead
// letter, the 6 unread).
func checkArgs(c *cli.Context) error {
	for _, arg := range c.Args().Slice() {
		name, _, _ := strings.Cut(strings.TrimLeft(arg, "-"), "=")
		if !strings.HasPrefix(arg, "-") || name == "" {
			continue
		}
		for _, f := range c.Command.Flags {
			if slices.Contains(f.Names(), name) {
				return usageError(fmt.Errorf("%s after the arguments: flags come first, as in holdfast %s [flags] %s",
					arg, commandPath(c), c.Command.ArgsUsage))
			}
		}
	}
	if c.Command.ArgsUsage == "" && c.NArg() > 0 {
		return usageError(fmt.Errorf("%s takes no arguments, got %q: see holdfast %s --help", commandPath(c), c.Args().Slice(), commandPath(c)))
	}
	return nil
}

// commandPath is the command's name with its parents', e.g. "dlq show".
func commandPath(c *cli.Context) string {
	var names []string
	for _, cc := range c.Lineage() {
		if cc.Command != nil && cc.Command.Name != "" && cc.Command.Name != c.App.Name {
			names = append([]string{cc.Command.Name}, names...)
		}
	}
	return strings.Join(names, " ")
}

func newApp() *cli.App {
	app := &cli.App{
		Name:                 "holdfast",
		Usage:                "durable messaging on an embedded NATS JetStream",
		Version:              versionString(),
		Flags:                []cli.Flag{newConfigFlag(true)},
		EnableBashCompletion: true,
		HideVersion:          true,
		Commands: []*cli.Command{
			initCommand(),
			runCommand(),
			checkCommand(),
			reloadCommand(),
			configCommand(),
			pubCommand(),
			dlqCommand(),
			statusCommand(),
			benchCommand(),
			backupCommand(),
			restoreCommand(),
			passwdCommand(),
			versionCommand(),
			manCommand(),
			completionCommand(),
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
	prepareCommands(app.Commands)
	return app
}

// loadConfig reads the config named by --config/HOLDFAST_CONFIG, or the
// default path, or the built-in defaults. Config problems are usage errors.
func loadConfig(c *cli.Context) (*config.Config, string, error) {
	cfg, source, err := config.Load(configPath(c))
	if err != nil {
		// A config with problems, or a --config that cannot be read.
		return nil, source, usageError(err)
	}
	return cfg, source, nil
}

// newLogger builds the process logger: stderr, text or JSON, and without
// timestamps under systemd (the journal adds its own).
func newLogger(w io.Writer, lc config.LogConfig) (*slog.Logger, *slog.LevelVar) {
	level := new(slog.LevelVar)
	var l slog.Level
	_ = l.UnmarshalText([]byte(lc.Level))
	level.Set(l)
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
		return slog.New(slog.NewJSONHandler(w, opts)), level
	}
	return slog.New(slog.NewTextHandler(w, opts)), level
}
