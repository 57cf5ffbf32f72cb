package main

import (
	"github.com/urfave/cli/v2"

	"github.com/holdfast-io/holdfast/config"
)

func configCommand() *cli.Command {
	return &cli.Command{
		Name:  "config",
		Usage: "print the fully commented default config file",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "store-dir", Value: config.DefaultStoreDir, Usage: "store directory to write into the file"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usageError(errUnexpectedArgs(c))
			}
			return config.WriteDefault(c.App.Writer, c.String("store-dir"))
		},
	}
}
