package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/urfave/cli/v2"

	"github.com/holdfast-io/holdfast/backup"
	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/embedded/bootstrap"
	"github.com/holdfast-io/holdfast/internal/subjects"
)

func restoreCommand() *cli.Command {
	return &cli.Command{
		Name:      "restore",
		Usage:     "restore the streams of a backup, with their consumers' state, into the running holdfast",
		ArgsUsage: "DIR",
		Description: "Verifies every file of the backup against its manifest first and refuses a truncated or corrupted backup\n" +
			"without changing anything. A stream that does not exist, or exists but never held a message (the empty\n" +
			"stream a fresh holdfast creates), is restored; one that has held messages is refused unless --replace.\n" +
			"The workers resume from each restored consumer's ack floor.",
		Flags: []cli.Flag{serverFlag,
			&cli.StringSliceFlag{Name: "stream", Usage: "restore only this stream of the backup (repeatable)"},
			&cli.BoolFlag{Name: "replace", Usage: "delete existing streams that hold messages and restore the backup in their place (their messages are lost)"},
			&cli.BoolFlag{Name: "verify-only", Usage: "only verify the backup's files against the manifest; connect to nothing"}},
		Action: runRestore,
	}
}

// runRestore is holdfast restore: the backup verified before anything
// connects (a damaged backup is refused even when holdfast is not
// running), then restored unless --verify-only.
func runRestore(c *cli.Context) error {
	dir, err := restoreDirArg(c)
	if err != nil {
		return err
	}
	verified, err := backup.Verify(dir)
	if err != nil {
		return runtimeError(err)
	}
	if c.Bool("verify-only") {
		w := c.App.Writer
		printManifest(w, verified)
		fmt.Fprintf(w, "backup %s is complete and intact: %d file(s) match the manifest (written %s by %s)\n",
			dir, len(verified.Files), verified.Created.Format(time.RFC3339), verified.HoldfastVersion)
		return nil
	}
	if only := c.StringSlice("stream"); len(only) > 0 {
		if _, err := verified.Select(only); err != nil {
			return usageError(fmt.Errorf("--stream: %w (backup %s)", err, dir))
		}
	}
	return restoreVerified(c, dir, verified)
}

// restoreDirArg is restore's one argument, DIR: a usage error unless it
// names a directory.
func restoreDirArg(c *cli.Context) (string, error) {
	if c.NArg() != 1 {
		return "", usageError(errors.New("usage: holdfast restore [flags] DIR"))
	}
	dir := c.Args().First()
	if dir == "" {
		return "", usageError(errors.New("DIR is empty: name the directory holdfast backup wrote (usage: holdfast restore [flags] DIR)"))
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		what := "is not a directory"
		if err != nil {
			what = fmt.Sprintf("cannot be read (%v)", errors.Unwrap(err))
		}
		return "", usageError(fmt.Errorf("%s %s: name the directory holdfast backup wrote", dir, what))
	}
	return dir, nil
}

// restoreVerified restores the verified backup in dir into the running
// holdfast and says what it restored, and where the restored streams
// keep the backup's settings.
func restoreVerified(c *cli.Context, dir string, verified *backup.Manifest) error {
	w := c.App.Writer
	cfg, nc, js, err := connectJetStream(c)
	if err != nil {
		return err
	}
	defer nc.Close()
	if err := checkBackupAgainstConfig(cfg, dir, verified, c.StringSlice("stream")); err != nil {
		return err
	}
	bar := newProgressBar(os.Stderr, "restoring")
	// Interrupted (Ctrl-C, systemctl stop, a closed terminal), the
	// restore ends the server's restore and deletes what it left.
	ctx, stop := interruptible(c.Context)
	defer stop()
	m, restored, err := backup.Restore(ctx, nc, dir, backup.RestoreOptions{
		Streams:     c.StringSlice("stream"),
		Replace:     c.Bool("replace"),
		Replicas:    configuredReplicas(cfg),
		GroupCommit: configuredGroupCommit(cfg),
		Verified:    verified,
		Progress:    bar.update,
		Notice: func(msg string) {
			bar.clear()
			fmt.Fprintln(c.App.ErrWriter, msg)
		},
	})
	bar.done()
	if len(restored) > 0 {
		printRestored(w, m, restored)
	}
	if err != nil {
		return runtimeError(err)
	}
	if err := awaitFlush(ctx, nc, cfg); err != nil {
		return runtimeError(fmt.Errorf("restored %d stream(s) from %s, but %w", len(restored), dir, err))
	}
	fmt.Fprintf(w, "restored %d stream(s) from %s (written %s)\n", len(restored), dir, m.Created.Format(time.RFC3339))
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	printKeptSettings(c.App.ErrWriter, cfg, bootstrap.Diff(dctx, js, cfg), restored)
	return nil
}

// printKeptSettings tells, of diff (bootstrap.Diff after the restore),
// where the restored streams and their consumers differ from cfg: they
// keep the backup's settings (its subjects, limits, max_deliver, ...)
// until a reload or the next start applies the config's, and publishes
// to subjects only the config gives them find no stream meanwhile.
func printKeptSettings(w io.Writer, cfg *config.Config, diff []string, restored []backup.Restored) {
	var lines []string
	for _, line := range diff {
		for _, r := range restored {
			ofConsumer := false
			for name, cc := range cfg.Consumers {
				ofConsumer = ofConsumer || (cc.Stream == r.Name && strings.HasPrefix(line, "consumer "+name+" "))
			}
			if strings.HasPrefix(line, "stream "+r.Name+" ") || strings.HasPrefix(line, "stream "+r.Name+":") || ofConsumer {
				// Diff words a difference for a cluster's nodes; here the
				// backup made it.
				line, _, _ = strings.Cut(line, "; another node's config")
				lines = append(lines, line)
				break
			}
		}
	}
	if len(lines) == 0 {
		return
	}
	fmt.Fprintln(w, "note: the restored streams keep the backup's settings where they differ from the config, until holdfast reload (or the next start) applies the config's:")
	for _, l := range lines {
		fmt.Fprintln(w, "  "+l)
	}
}

// awaitFlush returns once the holdfast nc is connected to has flushed
// what its server stored: with jetstream.commit_window the server writes
// the restored messages and definitions without flushing them, and a
// power cut before holdfast's next flush lost the restored streams whole
// after the restore reported success. Without a commit window the
// server flushed them itself, and a server that does not answer (not a
// holdfast, or one from before subjects.Flush) is left at that.
func awaitFlush(ctx context.Context, nc *nats.Conn, cfg *config.Config) error {
	name := nc.ConnectedServerName()
	if name == "" {
		name = cfg.Server.Name
	}
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	msg, err := nc.RequestWithContext(fctx, subjects.Flush(name), nil)
	switch {
	case err != nil && !cfg.CommitWindowOn():
		return nil
	case err != nil:
		return fmt.Errorf("holdfast did not confirm on %s that they are on disk (%w): with jetstream.commit_window a power cut before its next flush could lose them; run holdfast status, and restore again if it restarted since", subjects.Flush(name), err)
	case len(msg.Data) > 0:
		return fmt.Errorf("holdfast could not flush them to disk: %s", msg.Data)
	}
	return nil
}

// configuredReplicas returns the replicas the config gives each stream
// and dead-letter stream: a restore gives them to what it restores, as
// the bootstrap would have.
func configuredReplicas(cfg *config.Config) map[string]int {
	out := map[string]int{}
	for _, name := range cfg.StreamNames() {
		out[name] = cfg.Streams[name].Replicas
	}
	for name := range cfg.DeadLetterStreams() {
		out[name] = cfg.DeadLetterReplicas(name)
	}
	return out
}

// configuredGroupCommit returns whether the config has group commit on
// for each stream: a restore gives the stream the subjects that go with
// it, as the bootstrap would have.
func configuredGroupCommit(cfg *config.Config) map[string]bool {
	out := map[string]bool{}
	for _, name := range cfg.StreamNames() {
		out[name] = cfg.Streams[name].GroupCommit
	}
	return out
}

// printRestored lists the restored streams next to the manifest.
func printRestored(w io.Writer, m *backup.Manifest, restored []backup.Restored) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STREAM\tMESSAGES\tLAST SEQ\tCONSUMERS (ACK FLOOR)\tREPLACED")
	for _, r := range restored {
		e := m.Stream(r.Name)
		var cons []string
		for _, n := range slices.Sorted(maps.Keys(r.AckFloors)) {
			s := fmt.Sprintf("%s (%d", n, r.AckFloors[n])
			if c := e.Consumer(n); c != nil && c.AckFloor != r.AckFloors[n] {
				s += fmt.Sprintf(", %d in the backup", c.AckFloor)
			}
			cons = append(cons, s+")")
		}
		replaced := "-"
		if r.Replaced {
			replaced = fmt.Sprintf("yes (%d messages deleted, last sequence %d)", r.ReplacedMessages, r.ReplacedLastSeq)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\n", r.Name, r.Messages, r.LastSeq, strings.Join(cons, ", "), replaced)
	}
	tw.Flush()
}

// checkBackupAgainstConfig refuses, before anything changes, a backup
// whose streams or consumers differ from the config in a field the server
// cannot change in place (a stream's retention or storage, a consumer's
// ack or deliver policy): the restore would succeed, and holdfast would
// then refuse to start at its next start (e.g. a workqueue stream restored
// into a holdfast configured with limits retention).
func checkBackupAgainstConfig(cfg *config.Config, dir string, m *backup.Manifest, only []string) error {
	todo, err := m.Select(only)
	if err != nil {
		return usageError(err)
	}
	var problems []error
	for _, e := range todo {
		cs, err := backup.ReadConfigs(dir, e)
		if err != nil {
			return runtimeError(fmt.Errorf("backup %s, stream %s: %w", dir, e.Name, err))
		}
		var sc jetstream.StreamConfig
		if err := json.Unmarshal(cs.Stream, &sc); err != nil {
			return runtimeError(fmt.Errorf("backup %s, stream %s: %w", dir, e.Name, err))
		}
		if derr := bootstrap.StreamDrift(cfg, sc); derr != nil {
			problems = append(problems, backupDrift(derr))
		}
		for _, name := range slices.Sorted(maps.Keys(cs.Consumers)) {
			var cc jetstream.ConsumerConfig
			if err := json.Unmarshal(cs.Consumers[name], &cc); err != nil {
				return runtimeError(fmt.Errorf("backup %s, consumer %s of stream %s: %w", dir, name, e.Name, err))
			}
			if cc.Durable == "" {
				cc.Durable = name
			}
			if derr := bootstrap.ConsumerDrift(cfg, e.Name, cc); derr != nil {
				problems = append(problems, backupDrift(derr))
			}
		}
	}
	if len(problems) == 0 {
		return nil
	}
	return runtimeError(fmt.Errorf("backup %s does not match the config, nothing was restored: the server cannot change these in place, so "+
		"holdfast would refuse to start after the restore:\n%w\nRestore a backup taken with this config, or first make the config say what the "+
		"backup has (a running holdfast keeps its settings until it restarts), or leave those streams out with --stream", dir, errors.Join(problems...)))
}

// backupDrift words a difference between a backup and the config.
func backupDrift(err error) error {
	var de *bootstrap.DriftError
	if !errors.As(err, &de) {
		return err
	}
	return fmt.Errorf("  %s %s: %s is %s in the backup, %s in the config ([%ss.%s])", de.Kind, de.Name, de.Field, de.Have, de.Want, de.Kind, de.Name)
}
