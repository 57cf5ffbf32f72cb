package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/urfave/cli/v2"
)

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print the version, commit and nats-server version",
		Action: func(c *cli.Context) error {
			fmt.Fprintln(c.App.Writer, versionString())
			return nil
		},
	}
}

// versionString reports the ldflags version, falling back to the module
// build info (go install) and then to "dev".
func versionString() string {
	v, rev := version, commit
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && rev == "" && len(s.Value) >= 12 {
				rev = s.Value[:12]
			}
		}
	}
	if v == "" {
		v = "dev"
	}
	if rev == "" {
		rev = "unknown"
	}
	return fmt.Sprintf("holdfast %s (commit %s, nats-server %s, %s)", v, rev, server.VERSION, runtime.Version())
}
