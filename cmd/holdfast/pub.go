package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/urfave/cli/v2"
)

func pubCommand() *cli.Command {
	return &cli.Command{
		Name:      "pub",
		Usage:     "publish a message and wait for JetStream's acknowledgement",
		ArgsUsage: "SUBJECT [DATA|-]",
		Flags: []cli.Flag{
			serverFlag,
			&cli.StringFlag{Name: "id", Usage: "Nats-Msg-Id: a second publish with the same id within the stream's duplicate_window is stored once"},
			&cli.StringSliceFlag{Name: "header", Aliases: []string{"H"}, Usage: "header as Name:Value (repeatable)"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() < 1 || c.NArg() > 2 {
				return usageError(errors.New("usage: holdfast pub SUBJECT [DATA|-] (DATA - or absent reads stdin)"))
			}
			msg := nats.NewMsg(c.Args().Get(0))
			switch data := c.Args().Get(1); {
			case c.NArg() == 1 || data == "-":
				b, err := io.ReadAll(os.Stdin)
				if err != nil {
					return runtimeError(fmt.Errorf("read stdin: %w", err))
				}
				msg.Data = b
			default:
				msg.Data = []byte(data)
			}
			for _, h := range c.StringSlice("header") {
				k, v, ok := strings.Cut(h, ":")
				if !ok || strings.TrimSpace(k) == "" {
					return usageError(fmt.Errorf("--header %q: use Name:Value", h))
				}
				msg.Header.Add(strings.TrimSpace(k), strings.TrimSpace(v))
			}
			if id := c.String("id"); id != "" {
				msg.Header.Set(nats.MsgIdHdr, id)
			}
			_, nc, js, err := connect(c)
			if err != nil {
				return err
			}
			defer nc.Close()
			ack, err := js.PublishMsg(c.Context, msg)
			if err != nil {
				return runtimeError(fmt.Errorf("publish to %s: %w", msg.Subject, err))
			}
			dup := ""
			if ack.Duplicate {
				dup = " (duplicate: already stored, not stored again)"
			}
			fmt.Fprintf(c.App.Writer, "stored in %s as seq %d%s\n", ack.Stream, ack.Sequence, dup)
			return nil
		},
	}
}
