package backup

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/jsm.go/api"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/internal/subjects"
)

// closedSubject is the only subject of a stream that a restore is about to
// replace: no publisher sends to it, so the stream acknowledges no more
// messages, and the stream's own subjects can be given back. nats-server's
// sealed streams cannot be unsealed, and a stream without subjects takes
// its name as its subject.
func closedSubject(stream string) string { return subjects.Replacing(stream) }

// hold closes a stream's configuration (its name, subjects and metadata):
// its only subject becomes closedSubject, its own are kept in its metadata
// under subjects.HeldMeta, where a copy saved of it, and the stream itself
// should the restore be killed, tell what they were. It returns the
// subjects held back (nil for a stream without subjects: a mirror takes no
// publishes).
func hold(name string, subj *[]string, meta *map[string]string) []string {
	if len(*subj) == 0 {
		return nil
	}
	held := slices.Clone(*subj)
	*subj = []string{closedSubject(name)}
	*meta = maps.Clone(*meta)
	if *meta == nil {
		*meta = map[string]string{}
	}
	(*meta)[subjects.HeldMeta] = strings.Join(held, " ")
	return held
}

// release gives a configuration that hold closed its subjects held back,
// and drops the marks of the hold.
func release(held []string, subj *[]string, meta *map[string]string) {
	*subj = held
	*meta = maps.Clone(*meta)
	delete(*meta, subjects.HeldMeta)
	delete(*meta, subjects.RestoringMeta)
}

// reopenConfig gives the configuration of a stream that closeStream
// closed its own subjects back: a restore of a copy saved while it was
// closed creates it open.
func reopenConfig(c *api.StreamConfig) {
	if held, ok := subjects.Held(c.Name, c.Subjects, c.Metadata); ok {
		release(held, &c.Subjects, &c.Metadata)
	}
}

// holdSubjects closes the configuration c of a stream about to be
// restored from the backup in dir, as closeStream closes a stream, marked
// as being restored (subjects.RestoringMeta: the running holdfast keeps
// it closed should the restore stop before its end), and returns the
// subjects held back.
func holdSubjects(c *api.StreamConfig, dir string) []string {
	held := hold(c.Name, &c.Subjects, &c.Metadata)
	if held != nil {
		c.Metadata[subjects.RestoringMeta] = dir
	}
	return held
}

// closeStream makes stream take no more publishes by replacing its
// subjects with closedSubject, and returns the subjects to give back with
// reopenStream (nil for a stream without subjects: a mirror takes no
// publishes).
func closeStream(ctx context.Context, js jetstream.JetStream, name string) ([]string, error) {
	s, err := js.Stream(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("cannot read stream %s: %w", name, err)
	}
	cfg := s.CachedInfo().Config
	if held, ok := subjects.Held(name, cfg.Subjects, cfg.Metadata); ok {
		return held, nil // closed by a restore that was killed
	}
	held := hold(name, &cfg.Subjects, &cfg.Metadata)
	if held == nil {
		return nil, nil
	}
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		return nil, fmt.Errorf("cannot stop stream %s from taking publishes (by holding its subjects %v back) before it is saved: %w", name, held, err)
	}
	return held, nil
}

// reopenStream gives a stream that closeStream closed its subjects back.
// A stream that is gone, or has other subjects now (one the running
// holdfast created again), is left alone; so is one a restore created
// (marked subjects.RestoringMeta: what a failed restore left in place of
// the closed one) unless restored tells that it is this restore's,
// checked.
func reopenStream(ctx context.Context, js jetstream.JetStream, name string, held []string, restored bool) error {
	if held == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	cfg := s.CachedInfo().Config
	if _, ok := subjects.Held(name, cfg.Subjects, cfg.Metadata); !ok {
		return nil
	}
	if _, restoring := subjects.Restoring(name, cfg.Subjects, cfg.Metadata); restoring && !restored {
		return nil
	}
	release(held, &cfg.Subjects, &cfg.Metadata)
	_, err = js.UpdateStream(ctx, cfg)
	return err
}

// heldBack tells that stream still takes no publishes because giving its
// subjects back failed (err), and how to give them back.
func heldBack(stream string, subjects []string, err error) string {
	return fmt.Sprintf("stream %s takes no publishes: giving its subjects %v back failed (%v); give them back with: nats stream edit %s --subjects %s (or restart holdfast)",
		stream, subjects, err, stream, strings.Join(subjects, ","))
}

// reopenAfter gives stream, closed by closeStream, its subjects back
// after err stopped the restore of it, and returns err, with how to give
// them back by hand when that failed.
func reopenAfter(ctx context.Context, js jetstream.JetStream, stream string, held []string, err error) error {
	if rerr := reopenStream(context.WithoutCancel(ctx), js, stream, held, false); rerr != nil {
		return fmt.Errorf("%w; %s", err, heldBack(stream, held, rerr))
	}
	return err
}

// saveAttempts bounds how often saveClosed takes its copy again.
const saveAttempts = 3

// saveClosed saves stream, which closeStream closed, with saveReplaced
// and returns the copy, its entry (nil when skipped) and the stream's
// state right after it was saved. A publish on its way when the stream
// was closed may be stored after the copy was taken: the stream's last
// sequence then moved, and the copy is taken again.
func saveClosed(ctx context.Context, js jetstream.JetStream, nc *nats.Conn, dir, stream string, opts RestoreOptions) (string, *StreamEntry, jetstream.StreamState, error) {
	for attempt := 1; ; attempt++ {
		saved, entry, err := saveReplaced(ctx, nc, dir, stream, opts)
		if err != nil {
			return "", nil, jetstream.StreamState{}, err
		}
		now, ok, err := streamState(ctx, js, stream)
		if err == nil && !ok {
			err = fmt.Errorf("stream %s disappeared while it was being saved", stream)
		}
		if err != nil {
			os.RemoveAll(saved)
			return "", nil, jetstream.StreamState{}, err
		}
		if entry == nil || now.LastSeq == entry.LastSeq {
			return saved, entry, now, nil
		}
		os.RemoveAll(saved)
		if attempt == saveAttempts {
			return "", nil, jetstream.StreamState{}, fmt.Errorf("stream %s still stores messages after its subjects were held back (last sequence %d, %d in the copy): does a source feed it?",
				stream, now.LastSeq, entry.LastSeq)
		}
	}
}

// putBack puts a stream that a failed restore (err) replaced back as it
// was before, from the copy in saved (entry nil when nothing was saved: a
// memory stream), with its subjects; also when the restore was
// interrupted, and a further interrupt is ignored meanwhile: left now, it
// would have neither its messages nor the backup's. It returns err with
// what was done.
func putBack(ctx context.Context, js jetstream.JetStream, nc *nats.Conn, name string, idx, count int,
	saved string, entry *StreamEntry, subjects []string, opts RestoreOptions, err error) error {
	back := context.WithoutCancel(ctx)
	reopen := func(err error) error { return reopenAfter(back, js, name, subjects, err) }
	if entry == nil {
		os.RemoveAll(saved)
		return reopen(err)
	}
	noticeFunc(opts)("putting stream %s back as it was before the restore (%d messages, saved in %s)", name, entry.Messages, saved)
	now, ok, serr := streamState(back, js, name)
	switch {
	case serr != nil:
		return reopen(fmt.Errorf("%w; stream %s was not put back (%v): its previous messages are kept in %s: holdfast restore --replace %s", err, name, serr, saved, saved))
	case ok && now.LastSeq > 0:
		// Not deleted (the delete failed or was interrupted), or created
		// again and published into: left as it is.
		return reopen(fmt.Errorf("%w; stream %s holds messages now (last sequence %d; not deleted, or published into since): it is left as it is, and what it held before the restore is kept in %s (holdfast restore --replace %s puts that back)", err, name, now.LastSeq, saved, saved))
	}
	cur := map[string]jetstream.StreamState{}
	if ok {
		cur[name] = now
	}
	prev := RestoreOptions{Timeout: opts.Timeout, Notice: opts.Notice}
	if _, perr := restoreFrom(back, js, nc, saved, *entry, idx, count, cur, prev, nil); perr != nil {
		return fmt.Errorf("%w; putting stream %s back failed too (%v): its previous messages are kept in %s: holdfast restore --replace %s", err, name, perr, saved, saved)
	}
	os.RemoveAll(saved)
	return fmt.Errorf("%w; stream %s was put back as it was (%d messages, last sequence %d)", err, name, entry.Messages, entry.LastSeq)
}
