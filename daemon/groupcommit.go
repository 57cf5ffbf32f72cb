package daemon

import (
	"context"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/embedded/bootstrap"
	"github.com/holdfast-io/holdfast/ingest"
)

// groupCommit runs the ingest of the streams with group_commit on one
// in-process connection of its own.
type groupCommit struct {
	nc         *nats.Conn
	metrics    *ingest.Metrics
	mu         sync.Mutex // guards nc and committers: status and the watch read them
	committers map[string]*ingest.Committer
}

// openGroupCommit starts the ingest of stream name (its stream exists with
// the prefixed subjects).
func (d *Daemon) openGroupCommit(ctx context.Context, cfg *config.Config, name string) error {
	g := &d.gc
	g.mu.Lock()
	nc := g.nc
	g.mu.Unlock()
	if nc == nil {
		var err error
		if nc, err = d.srv.Connect("holdfast-ingest"); err != nil {
			return fmt.Errorf("group commit: %w", err)
		}
		g.mu.Lock()
		g.nc = nc
		g.mu.Unlock()
	}
	if g.metrics == nil && d.metrics != nil {
		g.metrics = ingest.NewMetrics(d.metrics.Registry())
	}
	opts := ingest.OptionsFor(cfg, name)
	opts.Metrics = g.metrics
	if cfg.CommitWindowOn() {
		opts.Flush = d.srv.Flush
	}
	c := ingest.New(nc, opts, d.log)
	if err := c.Open(ctx); err != nil {
		return err
	}
	g.mu.Lock()
	if g.committers == nil {
		g.committers = make(map[string]*ingest.Committer)
	}
	g.committers[name] = c
	g.mu.Unlock()
	return nil
}

// closeGroupCommit stops the ingest of stream name, answering what it took.
func (d *Daemon) closeGroupCommit(ctx context.Context, name string) {
	d.gc.mu.Lock()
	c, ok := d.gc.committers[name]
	delete(d.gc.committers, name)
	d.gc.mu.Unlock()
	if !ok {
		return
	}
	if err := c.Close(ctx); err != nil {
		d.log.Warn("group commit stopped", "stream", name, "err", err)
	}
}

// closeAllGroupCommit stops every ingest and closes their connection.
func (d *Daemon) closeAllGroupCommit(ctx context.Context) {
	d.gc.mu.Lock()
	names := slices.Sorted(maps.Keys(d.gc.committers))
	d.gc.mu.Unlock()
	for _, name := range names {
		d.closeGroupCommit(ctx, name)
	}
	d.gc.mu.Lock()
	nc := d.gc.nc
	d.gc.nc = nil
	d.gc.mu.Unlock()
	if nc != nil {
		nc.Close()
	}
}

// groupCommitChanged lists the streams whose ingest a reload from cur to
// next must stop before the streams are updated (group commit switched
// off, or what its ingest is built from changed) and start after.
func groupCommitChanged(cur, next *config.Config) (stop, start []string) {
	for _, name := range next.StreamNames() {
		was, is := cur.Streams[name], next.Streams[name]
		on, onNext := was != nil && was.GroupCommit, is.GroupCommit
		same := on && onNext && reflect.DeepEqual(ingest.OptionsFor(cur, name), ingest.OptionsFor(next, name))
		if on && !same {
			stop = append(stop, name)
		}
		if onNext && !same {
			start = append(start, name)
		}
	}
	for _, name := range cur.StreamNames() {
		if next.Streams[name] == nil && cur.Streams[name].GroupCommit {
			stop = append(stop, name) // left out of the config
		}
	}
	return stop, start
}

// reopenGroupCommit starts the ingest of the streams names (those a
// reload stopped or meant to start) after the reload's bootstrap failed,
// as each stream now is on the server: the bootstrap updates the streams
// one by one and stops at the first the server refuses, so a stream
// before that one has next's subjects already — group commit switched on
// or off — and one after it still cur's. An ingest started from the
// config alone answered nothing on a stream switched on (every publish
// got "no responders" until a restart) and answered beside a stream
// switched off. It returns cur's streams with the ones that were updated
// taken from next, so that the next reload starts from what runs.
func (d *Daemon) reopenGroupCommit(ctx context.Context, cur, next *config.Config, names []string) map[string]*config.StreamConfig {
	streams := maps.Clone(cur.Streams)
	done := map[string]bool{}
	for _, name := range names {
		if done[name] {
			continue
		}
		done[name] = true
		cfg := cur
		if d.streamUpdatedTo(ctx, next, name) {
			streams[name], cfg = next.Streams[name], next
		}
		if !cfg.Streams[name].GroupCommit {
			if cur.Streams[name] != nil && cur.Streams[name].GroupCommit {
				d.log.Info("reload: group commit off", "stream", name)
			}
			continue
		}
		if err := d.openGroupCommit(ctx, cfg, name); err != nil {
			d.log.Error("reload: group commit not restarted", "stream", name, "err", err)
		}
	}
	return streams
}

// streamUpdatedTo reports whether stream name on the server has what
// cfg's group commit depends on: its subjects, transform and duplicate
// window.
func (d *Daemon) streamUpdatedTo(ctx context.Context, cfg *config.Config, name string) bool {
	s, err := d.srv.JetStream().Stream(ctx, name)
	if err != nil {
		d.log.Warn("reload: cannot read the stream to restart its group commit as it is", "stream", name, "err", err)
		return false
	}
	have, want := s.CachedInfo().Config, bootstrap.StreamSpec(cfg, name)
	return slices.Equal(have.Subjects, want.Subjects) && reflect.DeepEqual(have.SubjectTransform, want.SubjectTransform) &&
		(want.Duplicates == 0 || have.Duplicates == want.Duplicates)
}

// groupCommitStats returns the counters of each running ingest.
func (d *Daemon) groupCommitStats() map[string]ingest.Stats {
	d.gc.mu.Lock()
	defer d.gc.mu.Unlock()
	if len(d.gc.committers) == 0 {
		return nil
	}
	out := make(map[string]ingest.Stats, len(d.gc.committers))
	for name, c := range d.gc.committers {
		out[name] = c.Stats()
	}
	return out
}
