package main

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/holdfast-io/holdfast/bench"
	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/daemon"
)

func benchCommand() *cli.Command {
	return &cli.Command{
		Name:  "bench",
		Usage: "measure publish, consume and end-to-end throughput and latency through the real pipeline",
		Description: `Starts its own holdfast (embedded server on a temporary store directory, the
real bootstrap, a durable consumer and in-process workers) for each --sync
mode and measures:
  publish async   PublishAsync with at most --window PubAcks outstanding
  publish sync    one Publish at a time, each waiting for its PubAck
  consume         workers (no-op Go handler) draining the messages stored by
                  "publish async", until the server confirmed every ack
  e2e <handler>   publish → stored → handler → ack, live, per handler
Publishers connect over TCP to 127.0.0.1 like any client; workers use the
in-process connection. Latency is from the publish call to the PubAck
(publish) or to the server receiving the handler's ack (e2e).

With --server URL it measures only the publish figures against a running
instance, in a stream HOLDFAST_BENCH (subjects holdfast.bench.>) that it
creates and deletes.`,
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "msgs", Value: 10000, Usage: "messages per figure"},
			&cli.StringFlag{Name: "size", Value: "128B", Usage: "payload size (at least 8 bytes)"},
			&cli.IntFlag{Name: "publishers", Value: 1, Usage: "concurrent publishers, each with its own connection"},
			&cli.IntFlag{Name: "window", Value: 500, Usage: "async publish: PubAcks outstanding per publisher"},
			&cli.IntFlag{Name: "workers", Value: 4, Usage: "in-process workers of the consumer"},
			&cli.StringFlag{Name: "sync", Value: "always,2m", Usage: "comma-separated jetstream.sync modes to measure: \"always\" and/or intervals; \"+gc\" after one (always+gc) measures it with group_commit = true"},
			&cli.StringFlag{Name: "handlers", Value: strings.Join(bench.Handlers, ","), Usage: "comma-separated handlers for the e2e figures: noop, exec, http (\"\" for none)"},
			&cli.IntFlag{Name: "exec-msgs", Value: 2000, Usage: "messages for e2e exec (one process per message; 0 = --msgs)"},
			&cli.StringFlag{Name: "exec-command", Value: "/bin/true", Usage: "command of the exec handler"},
			&cli.StringFlag{Name: "dir", Usage: "parent of the temporary store directory (default: $TMPDIR, or the working directory when that is tmpfs)"},
			&cli.StringFlag{Name: "server", Usage: "NATS URL of a running holdfast: measure only publishing, against it"},
			&cli.BoolFlag{Name: "json", Usage: "print the results as JSON"},
			&cli.BoolFlag{Name: "verbose", Usage: "show holdfast's own log (only errors otherwise)"},
			&cli.StringFlag{Name: "cpuprofile", Usage: "write a CPU profile of the whole run to `FILE`", Hidden: true},
			&cli.StringFlag{Name: "memprofile", Usage: "write an allocation profile of the whole run to `FILE`", Hidden: true},
		},
		Action: runBench,
	}
}

// runBench wires the flags to the bench engine (package bench).
func runBench(c *cli.Context) error {
	p := bench.Params{
		Msgs:        c.Int("msgs"),
		Publishers:  c.Int("publishers"),
		Window:      c.Int("window"),
		Workers:     c.Int("workers"),
		ExecMsgs:    c.Int("exec-msgs"),
		ExecCommand: c.String("exec-command"),
		Server:      c.String("server"),
		Transport:   "tcp",
		Sync:        splitList(c.String("sync")),
		Handlers:    splitList(c.String("handlers")),
	}
	size, err := config.ParseSize(c.String("size"))
	if err != nil {
		return usageError(fmt.Errorf("--size: %w", err))
	}
	p.Size = int(size)
	if err := p.Validate(); err != nil {
		return usageError(err)
	}
	b := &bench.Bencher{
		Params:  p,
		Version: versionString(),
		Wiring:  bench.Wiring{NewHandler: daemon.NewHandler, ConsumerOptions: daemon.ConsumerOptions},
	}
	if p.Server == "" {
		if b.Dir, err = bench.ParentDir(c.String("dir")); err != nil {
			return usageError(err)
		}
	}
	if isTerminal(os.Stderr) {
		b.Progress = os.Stderr
	}
	// Errors only: warnings such as "sync is an interval" are expected here.
	level := slog.LevelError
	if c.Bool("verbose") {
		level = slog.LevelInfo
	}
	b.Log = slog.New(slog.NewTextHandler(c.App.ErrWriter, &slog.HandlerOptions{Level: level}))
	stopProfiles, err := bench.StartProfiles(c.String("cpuprofile"), c.String("memprofile"))
	if err != nil {
		return runtimeError(err)
	}
	defer stopProfiles()
	rep, err := b.Run(c.Context)
	if err != nil {
		return runtimeError(err)
	}
	if c.Bool("json") {
		enc := json.NewEncoder(c.App.Writer)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	bench.PrintReport(c.App.Writer, rep)
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
