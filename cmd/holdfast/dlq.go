package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/urfave/cli/v2"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/pipeline"
)

var consumerFlag = &cli.StringFlag{Name: "consumer", Usage: "only the dead letters of this consumer"}

func dlqCommand() *cli.Command {
	return &cli.Command{
		Name:        "dlq",
		Usage:       "inspect dead letters and hand them back to the handler of the consumer that failed them",
		Subcommands: []*cli.Command{dlqLsCommand(), dlqShowCommand(), dlqReplayCommand(), dlqPurgeCommand()},
	}
}

func dlqLsCommand() *cli.Command {
	return &cli.Command{
		Name:   "ls",
		Usage:  "list dead letters, oldest first",
		Flags:  []cli.Flag{serverFlag, consumerFlag},
		Action: dlqLs,
	}
}

// dlqLs prints a table of the dead letters, one row each.
func dlqLs(c *cli.Context) error {
	cfg, nc, js, err := connectJetStream(c)
	if err != nil {
		return err
	}
	defer nc.Close()
	tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STREAM\tSEQ\tCONSUMER\tSUBJECT\tORIG SEQ\tDELIVERIES\tFAILED AT\tERROR")
	targets, err := dlqStreams(cfg, c.String("consumer"))
	if err != nil {
		return err
	}
	n := 0
	for _, s := range targets {
		err := pipeline.ListDeadLetters(c.Context, js, s.stream, s.consumer, func(dl pipeline.DeadLetter) error {
			n++
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%d\t%d\t%s\t%s\n", dl.Stream, dl.Seq, terminalSafe(dl.Consumer), terminalSafe(dl.OriginalSubject),
				dl.OriginalSeq, dl.Deliveries, dl.FailedAt.Format(time.RFC3339), oneLine(terminalSafe(dl.Error), 80))
			return nil
		})
		if err != nil {
			return runtimeError(err)
		}
	}
	tw.Flush()
	fmt.Fprintf(c.App.Writer, "%d dead letter(s)\n", n)
	return nil
}

func dlqShowCommand() *cli.Command {
	return &cli.Command{
		Name:      "show",
		Usage:     "print one dead letter with its headers and payload",
		ArgsUsage: "SEQ",
		Flags:     []cli.Flag{serverFlag, &cli.StringFlag{Name: "stream", Usage: "dead-letter stream (default: the only one configured)"}},
		Action:    dlqShow,
	}
}

// dlqShow prints one dead letter: where it is, its headers sorted by key,
// and its payload.
func dlqShow(c *cli.Context) error {
	if c.NArg() != 1 {
		return usageError(fmt.Errorf("dlq show takes one SEQ (the SEQ column of holdfast dlq ls), got %q: usage: holdfast dlq show [--stream NAME] SEQ", c.Args().Slice()))
	}
	seq, err := parseSeq(c.Args().First())
	if err != nil {
		return err
	}
	cfg, nc, js, err := connectJetStream(c)
	if err != nil {
		return err
	}
	defer nc.Close()
	stream, err := pickDLQStream(cfg, c.String("stream"))
	if err != nil {
		return err
	}
	dl, err := getDeadLetter(c.Context, js, cfg, stream, seq)
	if err != nil {
		return err
	}
	if dl.Consumer == "" || dl.OriginalSubject == "" || dl.OriginalStream == "" {
		// Any message of any --stream can be read; only a dead letter
		// is shown as one.
		return runtimeError(fmt.Errorf("%s #%d on %s is not a holdfast dead letter (not on dlq.<CONSUMER>.>, or without the %s and %s headers); "+
			"the config's dead-letter streams: %s; read other messages with: go tool nats stream get %s %d",
			stream, seq, terminalSafe(dl.Subject), pipeline.HeaderOriginalSubject, pipeline.HeaderOriginalStream,
			strings.Join(slices.Sorted(maps.Keys(cfg.DeadLetterStreams())), ", "), stream, seq))
	}
	w := c.App.Writer
	fmt.Fprintf(w, "%s #%d on %s\n", dl.Stream, dl.Seq, terminalSafe(dl.Subject))
	for _, k := range slices.Sorted(maps.Keys(dl.Header)) {
		for _, v := range dl.Header[k] {
			fmt.Fprintf(w, "  %s: %s\n", terminalSafe(k), terminalSafe(v))
		}
	}
	fmt.Fprintf(w, "\n%s\n", dl.Data)
	return nil
}

func dlqReplayCommand() *cli.Command {
	return &cli.Command{
		Name:      "replay",
		Usage:     "run the failed consumer's handler on dead letters again (in the running holdfast); each is removed once its handler succeeded",
		ArgsUsage: "[SEQ...]",
		Flags: []cli.Flag{serverFlag, consumerFlag,
			&cli.StringFlag{Name: "stream", Usage: "dead-letter stream for SEQ arguments (default: the only one configured)"},
			&cli.BoolFlag{Name: "all", Usage: "replay every dead letter (of --consumer, if given)"}},
		Action: dlqReplay,
	}
}

// dlqReplay asks the running holdfast to replay the dead letters named by
// SEQ arguments or by --all.
func dlqReplay(c *cli.Context) error {
	if c.Bool("all") == (c.NArg() > 0) {
		what := "neither SEQ nor --all given"
		if c.Bool("all") {
			what = fmt.Sprintf("--all replays every dead letter: no SEQ goes with it, got %q", c.Args().Slice())
		}
		return usageError(fmt.Errorf("%s: usage: holdfast dlq replay SEQ... | --all [--consumer NAME]", what))
	}
	// A flag of the other form would be ignored: refuse it.
	if c.IsSet("consumer") && !c.Bool("all") {
		return usageError(errors.New("--consumer goes with --all (replay every dead letter of that consumer); SEQ arguments name dead letters of --stream, whichever consumer failed them"))
	}
	if c.IsSet("stream") && c.Bool("all") {
		return usageError(errors.New("--stream goes with SEQ arguments; --all replays the dead letters of every dead-letter stream (or of --consumer)"))
	}
	cfg, nc, js, err := connectJetStream(c)
	if err != nil {
		return err
	}
	defer nc.Close()
	var todo []pipeline.DeadLetter
	if c.Bool("all") {
		todo, err = listAllDeadLetters(c.Context, js, cfg, c.String("consumer"))
	} else {
		todo, err = getDeadLetters(c.Context, js, cfg, c.String("stream"), c.Args().Slice())
	}
	if err != nil {
		return err
	}
	// Interrupted (Ctrl-C), it stops asking and says how far it got.
	ctx, stop := interruptible(c.Context)
	defer stop()
	replayed, failed := replayDeadLetters(ctx, nc, cfg, todo)
	fmt.Fprintf(c.App.Writer, "replayed %d of %d dead letter(s)\n", replayed, len(todo))
	if ctx.Err() != nil {
		return runtimeError(fmt.Errorf("interrupted: the %d dead letter(s) not replayed are still in their dead-letter streams (the one being replayed when the interrupt came may be replayed all the same); holdfast dlq replay --all goes on with them",
			len(todo)-replayed))
	}
	if len(failed) > 0 {
		return runtimeError(errors.Join(failed...))
	}
	return nil
}

// listAllDeadLetters reads every dead letter of the configured dead-letter
// streams, or of consumer's when it is not "", as a replay request names
// it (pipeline.DeadLetter.ReplayRef).
func listAllDeadLetters(ctx context.Context, js jetstream.JetStream, cfg *config.Config, consumer string) ([]pipeline.DeadLetter, error) {
	targets, err := dlqStreams(cfg, consumer)
	if err != nil {
		return nil, err
	}
	var all []pipeline.DeadLetter
	for _, s := range targets {
		err := pipeline.ListDeadLetters(ctx, js, s.stream, s.consumer, func(dl pipeline.DeadLetter) error {
			all = append(all, dl.ReplayRef())
			return nil
		})
		if err != nil {
			return nil, runtimeError(err)
		}
	}
	return all, nil
}

// getDeadLetters reads the dead letters with the sequence numbers args in
// stream (the only dead-letter stream configured when it is "").
func getDeadLetters(ctx context.Context, js jetstream.JetStream, cfg *config.Config, stream string, args []string) ([]pipeline.DeadLetter, error) {
	stream, err := pickDLQStream(cfg, stream)
	if err != nil {
		return nil, err
	}
	var dls []pipeline.DeadLetter
	for _, a := range args {
		seq, err := parseSeq(a)
		if err != nil {
			return nil, err
		}
		dl, err := getDeadLetter(ctx, js, cfg, stream, seq)
		if err != nil {
			return nil, err
		}
		dls = append(dls, dl)
	}
	return dls, nil
}

// getDeadLetter reads the dead letter seq of stream. A stream that does
// not exist and is none of the config's dead-letter streams is a mistyped
// --stream: a usage error that names the configured ones.
func getDeadLetter(ctx context.Context, js jetstream.JetStream, cfg *config.Config, stream string, seq uint64) (pipeline.DeadLetter, error) {
	dl, err := pipeline.GetDeadLetter(ctx, js, stream, seq)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		if _, ok := cfg.DeadLetterStreams()[stream]; !ok {
			return dl, usageError(fmt.Errorf("--stream %s: there is no such stream (the config's dead-letter streams: %s)",
				terminalSafe(stream), strings.Join(slices.Sorted(maps.Keys(cfg.DeadLetterStreams())), ", ")))
		}
	}
	if err != nil {
		return dl, runtimeError(err)
	}
	return dl, nil
}

// replayDeadLetters requests a replay of each dead letter in todo and
// returns how many were replayed and why the others were not. A consumer
// whose workers do not answer is asked once: its other dead letters are
// counted, not requested.
func replayDeadLetters(ctx context.Context, nc *nats.Conn, cfg *config.Config, todo []pipeline.DeadLetter) (int, []error) {
	progress := isTerminal(os.Stderr) && len(todo) > 20
	var failed []error
	replayed := 0
	unanswered := map[string]int{}
	for i, dl := range todo {
		if ctx.Err() != nil {
			break
		}
		if _, ok := unanswered[dl.Consumer]; ok {
			unanswered[dl.Consumer]++
		} else if err := pipeline.RequestReplay(ctx, nc, dl, cfg.ReplayTimeout(dl.Consumer)); err != nil {
			failed = append(failed, err)
			if errors.Is(err, pipeline.ErrNoReplayWorkers) {
				unanswered[dl.Consumer] = 0
			}
		} else {
			replayed++
		}
		if progress && (i%50 == 0 || i == len(todo)-1) {
			fmt.Fprintf(os.Stderr, "\rreplayed %d/%d", i+1, len(todo))
		}
	}
	if progress {
		fmt.Fprintln(os.Stderr)
	}
	for _, name := range slices.Sorted(maps.Keys(unanswered)) {
		if n := unanswered[name]; n > 0 {
			failed = append(failed, fmt.Errorf("%d more dead letter(s) of consumer %s not replayed for the same reason", n, name))
		}
	}
	return replayed, failed
}

func dlqPurgeCommand() *cli.Command {
	return &cli.Command{
		Name:  "purge",
		Usage: "delete dead letters for good (needs --yes)",
		Flags: []cli.Flag{serverFlag, consumerFlag,
			&cli.BoolFlag{Name: "yes", Usage: "confirm: the dead letters are deleted and cannot be replayed"},
			&cli.Uint64Flag{Name: "upto", Usage: "delete only dead letters up to this sequence (the SEQ column of holdfast dlq ls): those stored since you looked are kept"}},
		Action: dlqPurge,
	}
}

// dlqPurge deletes the dead letters of every dead-letter stream, or of
// --consumer's, once --yes confirms it.
func dlqPurge(c *cli.Context) error {
	cfg, nc, js, err := connectJetStream(c)
	if err != nil {
		return err
	}
	defer nc.Close()
	streams, err := dlqStreams(cfg, c.String("consumer"))
	if err != nil {
		return err
	}
	var names []string
	for _, s := range streams {
		names = append(names, s.stream)
	}
	upto := c.Uint64("upto")
	if c.IsSet("upto") && upto == 0 {
		return usageError(errors.New("--upto 0: give the last sequence to delete, 1 or more (the SEQ column of holdfast dlq ls)"))
	}
	if c.IsSet("upto") && len(streams) > 1 {
		return usageError(fmt.Errorf("--upto %d: give the last sequence to delete of one dead-letter stream; %d are configured (%s): pick one with --consumer",
			upto, len(streams), strings.Join(names, ", ")))
	}
	if !c.Bool("yes") {
		return usageError(fmt.Errorf("purge deletes dead letters in %s for good: check them with 'holdfast dlq ls' and pass --yes, with --upto SEQ to keep those stored since", strings.Join(names, ", ")))
	}
	ctx, stop := interruptible(c.Context)
	defer stop()
	for _, s := range streams {
		res, err := pipeline.PurgeDeadLetters(ctx, js, s.stream, s.consumer, upto)
		if err != nil {
			return runtimeError(fmt.Errorf("purge %s: %w (purged %d dead letter(s) before that)", s.stream, err, res.Deleted))
		}
		what := ""
		if s.consumer != "" {
			what += " of consumer " + s.consumer
		}
		if upto > 0 {
			what += fmt.Sprintf(" up to seq %d", upto)
		}
		fmt.Fprintf(c.App.Writer, "purged %d dead letter(s)%s from %s\n", res.Deleted, what, s.stream)
		if res.Parked > 0 {
			fmt.Fprintf(c.App.Writer, "kept %d parked message(s) in %s: interrupted on their last delivery, not failed; the workers hand them to the handler when they start\n",
				res.Parked, s.stream)
		}
	}
	return nil
}

// parseSeq reads a dead letter's sequence number (from 1) given on the
// command line.
func parseSeq(arg string) (uint64, error) {
	seq, err := strconv.ParseUint(arg, 10, 64)
	if err != nil || seq == 0 {
		return 0, usageError(fmt.Errorf("SEQ %q is not a sequence number (1 or more, the SEQ column of holdfast dlq ls)", arg))
	}
	return seq, nil
}

type dlqTarget struct{ stream, consumer string }

// dlqStreams lists the dead-letter streams to look at: all configured, or
// the one of consumer (filtered to its subjects). A consumer the config
// does not have, or one without a dead-letter stream, is a usage error, so
// that a mistyped --consumer does not read as one without dead letters;
// so is a config without any dead-letter stream.
func dlqStreams(cfg *config.Config, consumer string) ([]dlqTarget, error) {
	if consumer != "" {
		cc := cfg.Consumers[consumer]
		if cc == nil {
			return nil, usageError(fmt.Errorf("--consumer %s: no such consumer in the config (consumers: %s)",
				consumer, strings.Join(slices.Sorted(maps.Keys(cfg.Consumers)), ", ")))
		}
		if cc.DeadLetter == "" {
			return nil, usageError(fmt.Errorf("--consumer %s: it has no dead-letter stream (consumers.%s.dead_letter = \"\"): its failed messages are terminated and logged, never stored as dead letters", consumer, consumer))
		}
		return []dlqTarget{{cc.DeadLetter, consumer}}, nil
	}
	var out []dlqTarget
	dls := cfg.DeadLetterStreams()
	if len(dls) == 0 {
		return nil, usageError(errors.New("no consumer has a dead-letter stream (consumers.NAME.dead_letter is \"\" everywhere): " +
			"failed messages are terminated and logged, never stored as dead letters; nothing to list, replay or purge"))
	}
	for name := range dls {
		out = append(out, dlqTarget{stream: name})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].stream < out[j].stream })
	return out, nil
}

func pickDLQStream(cfg *config.Config, stream string) (string, error) {
	if stream != "" {
		return stream, nil
	}
	dls := cfg.DeadLetterStreams()
	if len(dls) == 0 {
		return "", usageError(errors.New("no consumer has a dead-letter stream (consumers.NAME.dead_letter is \"\" everywhere): nothing to show or replay"))
	}
	if len(dls) == 1 {
		for name := range dls {
			return name, nil
		}
	}
	var names []string
	for name := range dls {
		names = append(names, name)
	}
	sort.Strings(names)
	return "", usageError(fmt.Errorf("%d dead-letter streams configured (%s): pick one with --stream", len(dls), strings.Join(names, ", ")))
}

// terminalSafe quotes s (Go syntax) when it holds a control character
// (C0, DEL or C1) or bytes that are not UTF-8: a subject or header value
// of a message is the publisher's, and an escape sequence in it (ESC [2K,
// a carriage return, the one-byte CSI 0x9b) could rewrite what the
// operator sees.
func terminalSafe(s string) string {
	if utf8.ValidString(s) && strings.IndexFunc(s, unicode.IsControl) < 0 {
		return s
	}
	return strconv.Quote(s)
}

// oneLine joins s's lines with single spaces and cuts it to at most max
// bytes, on a character boundary, marking the cut with an ellipsis.
func oneLine(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) <= max {
		return s
	}
	cut := max - 1
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
