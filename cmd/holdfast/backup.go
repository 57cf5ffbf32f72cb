package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/holdfast-io/holdfast/backup"
	"github.com/holdfast-io/holdfast/config"
)

func backupCommand() *cli.Command {
	return &cli.Command{
		Name:      "backup",
		Usage:     "write every configured stream (and its dead-letter stream) with its consumers' state to DIR, while holdfast runs",
		ArgsUsage: "DIR",
		Description: "Takes a snapshot of each stream through the JetStream snapshot API of the running holdfast: publishing and\n" +
			"processing go on. DIR must be new or empty; it receives one snapshot per stream, manifest.json (streams,\n" +
			"sequences, message counts, consumer ack floors, versions, SHA-256 of every file) and SHA256SUMS.",
		Flags: []cli.Flag{serverFlag,
			&cli.StringSliceFlag{Name: "stream", Usage: "back up only this stream (repeatable; default: every configured stream and dead-letter stream)"}},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return usageError(errors.New("usage: holdfast backup [flags] DIR"))
			}
			dir := c.Args().First()
			if dir == "" {
				return usageError(errors.New("DIR is empty: name a new or empty directory for the backup (usage: holdfast backup [flags] DIR)"))
			}
			if fi, err := os.Stat(dir); err == nil && !fi.IsDir() {
				return usageError(fmt.Errorf("%s is not a directory: name a new or empty directory for the backup", dir))
			}
			cfg, nc, _, err := connectJetStream(c)
			if err != nil {
				return err
			}
			defer nc.Close()
			streams := cfg.AllStreamNames()
			if only := c.StringSlice("stream"); len(only) > 0 {
				for _, s := range only {
					if !slices.Contains(streams, s) {
						return usageError(fmt.Errorf("--stream %s: not a configured stream (configured: %s)", s, strings.Join(streams, ", ")))
					}
				}
				streams = only
			}
			// Interrupted (Ctrl-C, systemctl stop, a closed terminal), the
			// backup stops and removes what it wrote.
			ctx, stop := interruptible(c.Context)
			defer stop()
			bar := newProgressBar(os.Stderr, "backing up")
			start := time.Now()
			m, err := backup.Create(ctx, nc, dir, backup.Options{
				Streams:         streams,
				HoldfastVersion: versionString(),
				Progress:        bar.update,
			})
			bar.done()
			if errors.Is(err, backup.ErrDirNotEmpty) {
				return runtimeError(fmt.Errorf("backup not started, %s left as it is: %w", dir, err))
			}
			if err != nil {
				return runtimeError(fmt.Errorf("backup failed, nothing kept in %s: %w", dir, err))
			}
			w := c.App.Writer
			printManifest(w, m)
			var size int64
			for _, f := range m.Files {
				size += f.Size
			}
			fmt.Fprintf(w, "backup of %d stream(s) written to %s (%s) in %s; check it with: holdfast restore --verify-only %s\n",
				len(m.Streams), dir, config.FormatBytes(size), time.Since(start).Round(time.Millisecond), dir)
			if cfg.JetStream.EncryptionKeyFile != "" {
				fmt.Fprintf(c.App.ErrWriter, "note: the store is encrypted at rest (jetstream.encryption_key_file), the backup is not: "+
					"the server's snapshots hold the messages in clear text; keep %s on encrypted storage or encrypt it (a restore into "+
					"an encrypted holdfast stores them encrypted again, under its key)\n", dir)
			}
			return nil
		},
	}
}

// printManifest lists a backup's streams and consumers.
func printManifest(w io.Writer, m *backup.Manifest) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STREAM\tMESSAGES\tBYTES\tFIRST SEQ\tLAST SEQ\tCONSUMERS (ACK FLOOR)")
	for _, s := range m.Streams {
		var cons []string
		for _, c := range s.Consumers {
			cons = append(cons, fmt.Sprintf("%s (%d)", c.Name, c.AckFloor))
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%s\n", s.Name, s.Messages, config.FormatBytes(int64(s.Bytes)), s.FirstSeq, s.LastSeq, strings.Join(cons, ", "))
	}
	tw.Flush()
	for _, s := range m.Skipped {
		fmt.Fprintf(w, "skipped %s: %s\n", s.Name, s.Reason)
	}
}

// progressBar draws one line on a terminal, redrawn at most ten times a
// second; it draws nothing when the writer is not a terminal.
type progressBar struct {
	mu    sync.Mutex
	f     *os.File
	verb  string
	on    bool
	last  time.Time
	drawn bool
}

func newProgressBar(f *os.File, verb string) *progressBar {
	return &progressBar{f: f, verb: verb, on: isTerminal(f)}
}

func (b *progressBar) update(p backup.Progress) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.on { // not a terminal, or done: jsm.go reports late, from its goroutines
		return
	}
	now := time.Now()
	if now.Sub(b.last) < 100*time.Millisecond && p.Done < p.Total {
		return
	}
	b.last = now
	if p.Total == 0 { // an empty stream: nothing to measure against
		fmt.Fprintf(b.f, "\r\033[K%s %s (%d/%d) %s", b.verb, p.Stream, p.Index, p.Count, config.FormatBytes(int64(p.Done)))
		b.drawn = true
		return
	}
	const width = 30
	frac := min(1, float64(p.Done)/float64(p.Total))
	fill := int(frac * width)
	fmt.Fprintf(b.f, "\r\033[K%s %s (%d/%d) [%s%s] %3.0f%% %s", b.verb, p.Stream, p.Index, p.Count,
		strings.Repeat("#", fill), strings.Repeat(".", width-fill), frac*100, config.FormatBytes(int64(p.Done)))
	b.drawn = true
}

// clear erases the bar's line, for a message in between; the next update
// draws it again.
func (b *progressBar) clear() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.drawn {
		fmt.Fprint(b.f, "\r\033[K")
		b.drawn = false
	}
}

// done erases the bar's line for good.
func (b *progressBar) done() {
	b.clear()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.on = false
}
