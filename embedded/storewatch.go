package embedded

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/holdfast-io/holdfast/embedded/store"
)

// DefaultStoreCheckInterval is how often WatchStore compares the store
// directory with the one the server opened when no event made it do so:
// inotify and the mount table report what happens to the store at once.
// FallbackStoreCheckInterval is the interval where they cannot be
// watched.
const (
	DefaultStoreCheckInterval  = time.Minute
	FallbackStoreCheckInterval = time.Second
)

// recordStoreIdentity notes the identity of the store once the server
// runs on it (store.RecordIdentity), for CheckStore.
func (s *Server) recordStoreIdentity() error {
	id, err := store.RecordIdentity(s.store.Path, s.lock)
	if err != nil || id == nil {
		return err
	}
	s.identity = id
	return nil
}

// holdsFileStreams reports whether the server holds a stream on file in
// the account (a replica, in a cluster). When it cannot tell, it says yes.
func (s *Server) holdsFileStreams(account string) bool {
	if s.ns == nil {
		return true
	}
	jsz, err := s.ns.Jsz(&server.JSzOptions{Account: account, Streams: true, Config: true})
	if err != nil {
		return true
	}
	for _, a := range jsz.AccountDetails {
		if a.Name != account && a.Id != account {
			continue
		}
		for _, st := range a.Streams {
			if st.Config == nil || st.Config.Storage == server.FileStorage {
				return true
			}
		}
	}
	return false
}

// CheckStore reports, wrapping store.ErrStoreLost, when the store is no
// longer the one the server opened or can no longer be written
// (store.Identity.Check). It only reads metadata: nothing is written.
func (s *Server) CheckStore() error {
	id := s.identity
	if id == nil {
		return nil
	}
	return id.Check(s.holdsFileStreams)
}

// WatchStore checks the store until ctx ends: at once when inotify
// reports that the store directory, JetStream's directory, an account's
// directory or its streams directory, or an entry of one of them was
// deleted, moved or changed its attributes (owner, mode), or when the
// mount table changes (a remount read-only, a file system mounted over
// the store); and every interval (DefaultStoreCheckInterval when zero)
// in any case, for what neither event shows (a parent directory of the
// store moved). Where inotify is not available it checks every
// FallbackStoreCheckInterval instead. At the first failed check it stops
// JetStream at once — publishes get no PubAck from then on, so nothing
// more is acknowledged into files that are gone — stops recording stream
// positions (the path may now be another directory) and calls onLost with
// the reason, once.
func (s *Server) WatchStore(ctx context.Context, interval time.Duration, onLost func(error)) {
	if interval <= 0 {
		interval = DefaultStoreCheckInterval
	}
	changed := make(chan struct{}, 1)
	w, err := store.NotifyChanges(s.store.Path, changed)
	if err != nil {
		interval = min(interval, FallbackStoreCheckInterval)
		s.log.Warn("cannot watch the store directory with inotify: checking it every interval only", "interval", interval, "err", err)
	} else {
		defer w.Close()
	}
	if stop, err := store.NotifyMountChanges(changed); err != nil {
		interval = min(interval, FallbackStoreCheckInterval)
		s.log.Warn("cannot watch the mount table: checking the store every interval", "interval", interval, "err", err)
	} else {
		defer stop()
	}
	// A first check once the watches are set: what changed before they
	// were raises no event.
	select {
	case changed <- struct{}{}:
	default:
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-changed:
		}
		err := s.CheckStore()
		if err == nil {
			if w != nil {
				w.WatchAccounts(store.AccountDirs(s.store.Path))
			}
			continue
		}
		s.storeLost(err)
		onLost(err)
		return
	}
}

// storeLost stops JetStream and the position recorder after the store was
// lost. Safe to call more than once.
func (s *Server) storeLost(err error) {
	if !s.lost.CompareAndSwap(false, true) {
		return
	}
	s.log.Error("the store directory changed under the running server: JetStream stopped, no publish is acknowledged any more",
		"err", err)
	if s.stopRecord != nil {
		s.stopRecord()
	}
	if s.ns != nil {
		if err := s.ns.ShutdownJetStream(); err != nil {
			s.log.Warn("stopping JetStream after the store was lost", "err", err)
		}
	}
}

// StoreLost reports whether WatchStore found the store lost.
func (s *Server) StoreLost() bool { return s.lost.Load() }

// ProbeStoreWritable writes, syncs, renames and removes a small file in
// JetStream's directory of the store (the start-up probe), to name the
// cause when the store misbehaves (a file system shut down or remounted
// read-only). It writes to the disk: call it only when something is
// already wrong.
func (s *Server) ProbeStoreWritable() error {
	dir := filepath.Join(s.StoreDir(), server.JetStreamStoreDir)
	if err := store.ProbeWrite(dir); err != nil {
		return fmt.Errorf("%w: cannot write a file in %s: %w", ErrStoreWrite, dir, err)
	}
	return nil
}
