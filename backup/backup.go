package backup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/jsm.go"
	"github.com/nats-io/jsm.go/api"
	jsmbackup "github.com/nats-io/jsm.go/backup"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/holdfast-io/holdfast/internal/subjects"
)

// Progress reports how far the backup or restore of one stream is.
type Progress struct {
	Stream string
	// Index is the stream's position (from 1) among Count streams.
	Index, Count int
	// Done of Total bytes; Total is an estimate (0 when unknown).
	Done, Total uint64
}

// Options configure Create.
type Options struct {
	// Streams to back up, in this order; a name given twice is backed up
	// once.
	Streams []string
	// HoldfastVersion is written into the manifest.
	HoldfastVersion string
	// Progress, when set, is called as data arrives: one call at a time,
	// and none once Create has returned.
	Progress func(Progress)
	// Timeout of each JetStream API request; 30 s when zero.
	Timeout time.Duration
}

// apiTimeout is the timeout of each JetStream API request of a backup or
// restore: d, or 30 s when d is not set.
func apiTimeout(d time.Duration) time.Duration {
	if d <= 0 {
		return 30 * time.Second
	}
	return d
}

// Create writes a backup of opts.Streams into dir while the server runs:
// publishing and consuming go on. Each stream is snapshotted with its
// consumers and their state through the JetStream snapshot API, one after
// the other; each snapshot is a consistent point of its own stream (the
// streams' points differ by the time the others took). dir must not exist
// or be empty; on failure Create removes what it wrote.
func Create(ctx context.Context, nc *nats.Conn, dir string, opts Options) (m *Manifest, err error) {
	streams := distinct(opts.Streams)
	if len(streams) == 0 {
		return nil, errors.New("no stream to back up")
	}
	created, err := prepareDir(dir)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err == nil {
			return
		}
		// Also when interrupted: the snapshot stops with ctx.
		if created {
			os.RemoveAll(dir)
			return
		}
		// dir was empty: all it holds is what this backup wrote, the
		// temporary files of writeFileSync included.
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}()
	// Closed before the cleanup above runs (defers run last first).
	if opts.Progress != nil {
		gate := &progressGate{fn: opts.Progress}
		defer gate.close()
		opts.Progress = gate.call
	}
	mgr, err := jsm.New(nc, jsm.WithTimeout(apiTimeout(opts.Timeout)))
	if err != nil {
		return nil, err
	}
	m = &Manifest{
		Format:            FormatVersion,
		Created:           time.Now().UTC(),
		HoldfastVersion:   opts.HoldfastVersion,
		NATSServerVersion: nc.ConnectedServerVersion(),
		ServerName:        nc.ConnectedServerName(),
		Streams:           []StreamEntry{},
		Files:             []File{},
	}
	for i, name := range streams {
		st, err := mgr.LoadStream(name)
		if err != nil {
			if jsm.IsNatsError(err, 10059) {
				return nil, fmt.Errorf("stream %s does not exist on the server (%s): is holdfast running with this config?", name, nc.ConnectedUrlRedacted())
			}
			return nil, fmt.Errorf("stream %s: %w", name, err)
		}
		if from, ok := subjects.Restoring(name, st.Subjects(), st.Metadata()); ok {
			m.Skipped = append(m.Skipped, SkippedStream{Name: name, Reason: fmt.Sprintf(
				"an unfinished restore of the backup %s, closed to publishers, holding part of it at most: finish it with `holdfast restore --replace --stream %s %s`, then back it up", from, name, from)})
			continue
		}
		if st.Storage() == api.MemoryStorage {
			m.Skipped = append(m.Skipped, SkippedStream{Name: name, Reason: "memory storage: JetStream cannot snapshot it (its messages do not survive a restart either)"})
			continue
		}
		rel := filepath.Join(streamsDir, name)
		sdir := filepath.Join(dir, rel)
		snapOpts := []jsm.SnapshotOption{jsm.SnapshotConsumers()}
		if opts.Progress != nil {
			idx := i + 1
			snapOpts = append(snapOpts, jsm.SnapshotNotify(func(p jsm.SnapshotProgress) {
				opts.Progress(Progress{Stream: name, Index: idx, Count: len(streams),
					Done: p.UncompressedBytesReceived(), Total: p.BytesExpected()})
			}))
		}
		entry, err := snapshot(ctx, st, dir, rel, snapOpts)
		if err != nil {
			return nil, err
		}
		m.Streams = append(m.Streams, entry)
		if opts.Progress != nil { // done: the last notification may be short of it
			opts.Progress(Progress{Stream: name, Index: i + 1, Count: len(streams), Done: entry.Bytes, Total: entry.Bytes})
		}
		for _, f := range []string{jsm.SnapshotMetaFile, jsm.SnapshotDataFile} {
			// jsm.go creates them 0644 (less the umask): the messages are
			// in clear text even from an encrypted store; mode as the manifest.
			if err := os.Chmod(filepath.Join(sdir, f), 0o640); err != nil {
				return nil, err
			}
			if err := syncPath(filepath.Join(sdir, f)); err != nil {
				return nil, err
			}
			fe, err := hashFile(dir, filepath.Join(rel, f), -1)
			if err != nil {
				return nil, err
			}
			m.Files = append(m.Files, fe)
		}
		if err := syncPath(sdir); err != nil {
			return nil, err
		}
	}
	if err := syncPath(filepath.Join(dir, streamsDir)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	m.Finished = time.Now().UTC()
	raw, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := writeFileSync(filepath.Join(dir, ManifestFile), append(raw, '\n')); err != nil {
		return nil, err
	}
	mf, err := hashFile(dir, ManifestFile, -1)
	if err != nil {
		return nil, err
	}
	if err := writeSums(filepath.Join(dir, SumsFile), append(append([]File{}, m.Files...), mf)); err != nil {
		return nil, err
	}
	return m, nil
}

// progressGate passes progress calls on one at a time until it is
// closed. The snapshot library reports progress from goroutines of its
// own, some of them after the snapshot returned (a ticker, the end of its
// decompression): without the gate a caller's callback ran concurrently,
// and after Create had returned (and cleaned up a failed backup).
type progressGate struct {
	mu     sync.Mutex
	fn     func(Progress)
	closed bool
}

func (g *progressGate) call(p Progress) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.closed {
		g.fn(p)
	}
}

// close waits for a call under way and lets none through after it.
func (g *progressGate) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
}

// snapshotConsumersWait bounds how long snapshot waits for the stream's
// leader to hold every durable consumer the API lists.
const snapshotConsumersWait = 15 * time.Second

// snapshot writes stream st's snapshot into dir/rel and describes it. In
// a cluster the snapshot comes from the stream's leader, which may not
// hold a consumer created a moment before yet (the create was answered by
// the consumer's own leader): a backup without it would restore the
// stream with that consumer created anew, from the first message. So the
// snapshot is taken again until it holds every durable consumer the API
// listed before it, for up to snapshotConsumersWait.
func snapshot(ctx context.Context, st *jsm.Stream, dir, rel string, opts []jsm.SnapshotOption) (StreamEntry, error) {
	name, sdir := st.Name(), filepath.Join(dir, rel)
	var durable []string
	if _, _, err := st.EachConsumer(func(c *jsm.Consumer) {
		if c.IsDurable() {
			durable = append(durable, c.Name())
		}
	}); err != nil {
		return StreamEntry{}, fmt.Errorf("consumers of stream %s: %w", name, err)
	}
	deadline := time.Now().Add(snapshotConsumersWait)
	for {
		if _, err := st.SnapshotToDirectory(ctx, sdir, opts...); err != nil {
			return StreamEntry{}, fmt.Errorf("snapshot of stream %s: %w", name, err)
		}
		entry, err := describe(dir, rel, name)
		if err != nil {
			return StreamEntry{}, fmt.Errorf("snapshot of stream %s is not readable: %w", name, err)
		}
		var missing []string
		for _, c := range durable {
			if entry.Consumer(c) == nil {
				missing = append(missing, c)
			}
		}
		if len(missing) == 0 {
			return entry, nil
		}
		if time.Now().After(deadline) {
			return StreamEntry{}, fmt.Errorf("snapshot of stream %s: its leader did not hold consumer(s) %s within %s (just created, or being moved?); try the backup again",
				name, strings.Join(missing, ", "), snapshotConsumersWait)
		}
		if err := os.RemoveAll(sdir); err != nil {
			return StreamEntry{}, err
		}
		select {
		case <-ctx.Done():
			return StreamEntry{}, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// distinct returns names without repeats, in the order of their first
// appearance.
func distinct(names []string) []string {
	var out []string
	for _, n := range names {
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// ErrDirNotEmpty means the backup directory given holds something: a
// backup is not started there, and what it holds is left alone.
var ErrDirNotEmpty = errors.New("the backup directory is not empty")

// prepareDir creates dir, or accepts it when it is an empty directory;
// created tells which.
func prepareDir(dir string) (created bool, err error) {
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return false, fmt.Errorf("cannot create the backup directory: %w", err)
		}
		return true, nil
	case err != nil:
		return false, fmt.Errorf("backup directory: %w", err)
	case len(entries) > 0:
		return false, fmt.Errorf("%w: %s holds %d entries; a backup goes into a new or empty directory", ErrDirNotEmpty, dir, len(entries))
	}
	return false, nil
}

// describe reads a stream's snapshot back: what a restore will create.
func describe(dir, rel, name string) (StreamEntry, error) {
	sdir := filepath.Join(dir, rel)
	info, err := jsmbackup.Info(sdir)
	if err != nil {
		return StreamEntry{}, err
	}
	e := StreamEntry{
		Name:      name,
		Dir:       filepath.ToSlash(rel),
		Messages:  info.Messages,
		Bytes:     info.Bytes,
		FirstSeq:  info.FirstSeq,
		LastSeq:   max(info.LastSeq, info.Declared.LastSeq),
		Consumers: []ConsumerEntry{},
	}
	if e.Messages == 0 {
		e.FirstSeq = info.Declared.FirstSeq
	}
	f, err := os.Open(filepath.Join(sdir, jsm.SnapshotDataFile))
	if err != nil {
		return StreamEntry{}, err
	}
	defer f.Close()
	dec := jsmbackup.NewDecoder(f)
	for {
		item, err := dec.Next()
		if err != nil {
			return StreamEntry{}, err
		}
		switch it := item.(type) {
		case *jsmbackup.State:
			e.SnapshotAt = time.Unix(0, it.Ts).UTC()
			continue
		case *jsmbackup.Consumer:
			// The decoder checked that it parses and holds a state.
			var scs server.SnapshotConsumerState
			if err := json.Unmarshal(it.Data, &scs); err != nil || scs.ConsumerState == nil {
				return StreamEntry{}, fmt.Errorf("consumer %s: no state in the snapshot (%v)", it.Name, err)
			}
			st := scs.ConsumerState
			e.Consumers = append(e.Consumers, ConsumerEntry{
				Name:             it.Name,
				AckFloor:         st.AckFloor.Stream,
				AckFloorConsumer: st.AckFloor.Consumer,
				Delivered:        st.Delivered.Stream,
				AckPending:       len(st.Pending),
			})
			continue
		}
		// The consumers precede the messages.
		return e, nil
	}
}
