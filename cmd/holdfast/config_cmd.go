package main

import (
	"github.com/urfave/cli/v2"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/daemon"
)

func configCommand() *cli.Command {
	return &cli.Command{
		Name:  "config",
		Usage: "print the fully commented default config file",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "store-dir", Value: config.DefaultStoreDir, Usage: "store directory to write into the file"},
			&cli.BoolFlag{Name: "reference", Usage: "print the reference of every key instead (Markdown: default, reload or restart, what it does)"},
		},
		Action: func(c *cli.Context) error {
			if c.Bool("reference") {
				return daemon.WriteConfigReference(c.App.Writer)
			}
			return config.WriteDefault(c.App.Writer, c.String("store-dir"))
		},
	}
}
