package embedded

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/holdfast-io/holdfast/embedded/store"
)

// The start-up data-loss check and the recorder of the stream positions.
// The state file and its comparison are embedded/store's (StoreState,
// CompareStoreState); the Server reads the positions through its
// JetStream connection, records them while it runs and checks them at
// Open.

// DefaultStateInterval is how often a running holdfast looks whether the
// positions changed (StoreActivity), and reads and records them when they
// did.
// Acknowledged messages stored after the last record and lost with a sync
// interval are detected only when they take the stream's definition
// with them; the record is also written at once when a stream or a
// consumer is created, updated or deleted, and at Close.
const DefaultStateInterval = time.Second

// DataLosses returns what the start-up check found missing (nil when
// nothing): for /healthz, metrics and status.
func (s *Server) DataLosses() []store.DataLoss {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]store.DataLoss(nil), s.losses...)
}

// checkDataLoss compares the recorded state with the store just opened.
// Every loss is logged; with on_data_loss = "refuse" (and no
// AcceptDataLoss) a lost acknowledged message stops start-up, otherwise
// the data directory of a vanished stream is moved aside so the bootstrap
// can create the stream anew.
func (s *Server) checkDataLoss(ctx context.Context) error {
	dir := s.store.Path
	recorded, err := store.ReadStoreState(dir)
	if err != nil {
		return err
	}
	if recorded == nil {
		return nil
	}
	now, err := s.collectForCheck(ctx, recorded)
	if err != nil {
		return fmt.Errorf("cannot check the store for data loss: %w", err)
	}
	for _, key := range slices.Sorted(maps.Keys(now.Unavailable)) {
		if _, stream := recorded.Streams[key]; stream {
			s.log.Warn("stream not checked for data loss at start-up: its leader does not answer; the cluster keeps its data, and this node's replica catches up from the others once the stream has a leader",
				"stream", key, "reason", now.Unavailable[key], "recorded_last_seq", recorded.Streams[key].LastSeq)
		}
	}
	losses := store.CompareStoreState(recorded, now)
	if len(losses) == 0 {
		return nil
	}
	clustered := s.cfg.Cluster.Enabled()
	if clustered {
		for i, l := range losses {
			losses[i].ByCluster = l.Consumer == "" && (l.Vanished || l.Recreated)
		}
	}
	refuse := s.cfg.JetStream.OnDataLoss == "refuse" && !s.AcceptDataLoss
	lost := false
	for _, l := range losses {
		lost = lost || l.Lost()
	}
	if refuse && lost {
		for _, l := range losses {
			s.logLoss(l, recorded.Written)
		}
		return &store.DataLossError{Losses: losses, StateFile: filepath.Join(dir, store.StateFileName)}
	}
	at := time.Now()
	for i, l := range losses {
		// In a cluster the server owns every replica's directory: a stream
		// the meta group no longer knows is removed by the server itself,
		// and moving a directory it may be recovering breaks the replica.
		if l.Vanished && l.Consumer == "" && !clustered {
			moved, err := store.MoveOrphan(dir, l.Stream, at)
			if err != nil {
				return err
			}
			if moved == "" {
				moved = s.rescued[l.Stream] // deleted by the server, its files kept
			}
			losses[i].MovedTo = moved
		}
		s.logLoss(losses[i], recorded.Written)
	}
	s.losses = losses
	return nil
}

// checkStoreCluster refuses, before the server starts, a store whose
// streams were recorded in a cluster of another name. nats-server keeps
// each stream placed in the cluster that created it: such a stream runs
// on while its replicas stay the same, but any change of replicas (a
// node's config or a reload) fails with "no suitable peers for placement"
// ("not target cluster" in the server's debug log), at start-up for
// every node until it gives up, and the old cluster's streams join the
// new cluster's.
func (s *Server) checkStoreCluster() error {
	if !s.cfg.Cluster.Enabled() {
		return nil
	}
	recorded, err := store.ReadStoreState(s.store.Path)
	if err != nil || recorded == nil || recorded.Cluster == "" || recorded.Cluster == s.cfg.Cluster.Name || len(recorded.Streams) == 0 {
		return err
	}
	return fmt.Errorf("%w: store dir %s holds %d stream(s) (%s) of cluster %q, recorded %s, but cluster.name is %q: nats-server keeps a stream placed in the cluster "+
		"that created it, so these could never change their replicas here (\"no suitable peers for placement\") and would join this cluster's streams; "+
		"set cluster.name = %q again (on every node), move the data with holdfast backup and restore, or move this store dir away to start the node empty",
		store.ErrStoreOfAnotherCluster, s.store.Path, len(recorded.Streams), strings.Join(slices.Sorted(maps.Keys(recorded.Streams)), ", "),
		recorded.Cluster, recorded.Written.UTC().Format(time.RFC3339), s.cfg.Cluster.Name, recorded.Cluster)
}

// logLoss logs one difference found by the start-up check: a lost
// acknowledged message at error level, the rest as warnings.
func (s *Server) logLoss(l store.DataLoss, recordedAt time.Time) {
	switch {
	case l.ByCluster:
		s.log.Warn(l.String(), "stream", l.Stream, "recorded_last_seq", l.RecordedLast, "found_last_seq", l.FoundLast, "recorded_at", recordedAt)
	case l.Lost():
		s.log.Error("data loss: "+l.String(), "stream", l.Stream, "lost_messages", l.Messages,
			"recorded_last_seq", l.RecordedLast, "found_last_seq", l.FoundLast,
			"on_data_loss", s.cfg.JetStream.OnDataLoss, "recorded_at", recordedAt)
	default:
		s.log.Warn("store state lost: "+l.String(), "stream", l.Stream, "consumer", l.Consumer, "recorded_at", recordedAt)
	}
}

// unavailableWait is how long the start-up check waits
// for the leaders of recorded streams that do not answer yet (an election
// after a node restarted takes a few seconds) before it leaves them
// unchecked.
const unavailableWait = 15 * time.Second

// collectForCheck collects the store state for the start-up check. While
// a recorded stream's leader does not answer it asks again, for up to
// unavailableWait; then a cluster node leaves the stream unchecked, and
// a single node fails (it answers for its own streams).
func (s *Server) collectForCheck(ctx context.Context, recorded *store.StoreState) (*store.StoreState, error) {
	deadline := time.Now().Add(unavailableWait)
	for {
		now, err := store.CollectStoreState(ctx, s.js)
		if err != nil {
			return nil, err
		}
		waiting := false
		for key, reason := range now.Unavailable {
			_, stream := recorded.Streams[key]
			waiting = waiting || (stream && reason != store.OfflineReason)
		}
		if !waiting {
			return now, nil
		}
		if time.Now().After(deadline) {
			if s.cfg.Cluster.Enabled() {
				return now, nil // left unchecked, with a warning
			}
			// One node answers for its own streams once it recovered
			// them: not an election to wait out.
			for _, key := range slices.Sorted(maps.Keys(now.Unavailable)) {
				if _, stream := recorded.Streams[key]; stream {
					return nil, fmt.Errorf("stream %s does not answer: %s", key, now.Unavailable[key])
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// stateRecheck is how long the recorder goes at most without reading the
// positions through the JetStream API while StoreActivity reports no
// change: in a cluster, a stream whose leader did not answer changes
// nothing on this node when it does again.
const stateRecheck = time.Minute

// startRecorder records the store state every StateInterval until Close,
// when StoreActivity says that something changed.
func (s *Server) startRecorder() {
	interval := s.StateInterval
	if interval <= 0 {
		interval = DefaultStateInterval
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.stopRecord = cancel
	s.recordDone = make(chan struct{})
	// Streams and consumers created, updated or deleted (the bootstrap,
	// an operator with the nats CLI) are recorded at once.
	changed := make(chan struct{}, 1)
	var subs []*nats.Subscription
	for _, subj := range []string{"$JS.EVENT.ADVISORY.STREAM.*.*", "$JS.EVENT.ADVISORY.CONSUMER.CREATED.>", "$JS.EVENT.ADVISORY.CONSUMER.DELETED.>"} {
		sub, err := s.nc.Subscribe(subj, func(*nats.Msg) {
			select {
			case changed <- struct{}{}:
			default:
			}
		})
		if err != nil {
			s.log.Warn("cannot follow stream changes; recording positions every interval only", "err", err)
			continue
		}
		subs = append(subs, sub)
	}
	go func() {
		defer close(s.recordDone)
		defer func() {
			for _, sub := range subs {
				_ = sub.Unsubscribe()
			}
		}()
		t := time.NewTicker(interval)
		defer t.Stop()
		var activity uint64
		var collected time.Time
		for {
			select {
			case <-ctx.Done():
				return
			case <-changed:
				activity = 0
			case <-t.C:
			}
			if s.guardLeft != "" && s.CheckStore() == nil && os.RemoveAll(s.guardLeft) == nil {
				s.log.Info("links to the streams' files removed", "dir", s.guardLeft)
				s.guardLeft = ""
			}
			// Reading the positions through the JetStream API costs a few
			// requests: skipped while the server's own fingerprint of them
			// stays the same (an idle appliance).
			// Not in a cluster: this node's fingerprint does not see the
			// streams other nodes host, whose positions it records too.
			now := s.StoreActivity()
			if !s.cfg.Cluster.Enabled() && now != 0 && now == activity && time.Since(collected) < stateRecheck {
				continue
			}
			if err := s.recordStateIfChanged(ctx); err != nil {
				if ctx.Err() == nil {
					s.log.Warn("cannot record stream positions for the start-up data-loss check", "err", err)
				}
				activity = 0
			} else {
				activity, collected = now, time.Now()
			}
		}
	}()
}

// recordState records the positions of every file stream and consumer
// now (at Close; while running, startRecorder records them on every
// stream or consumer change and every StateInterval).
func (s *Server) recordState(ctx context.Context) error {
	return s.writeState(ctx, true)
}

// recordStateIfChanged records the state only when it differs from the
// one in the state file: an idle appliance does not rewrite and fsync the
// file every interval (flash wear).
func (s *Server) recordStateIfChanged(ctx context.Context) error {
	return s.writeState(ctx, false)
}

func (s *Server) writeState(ctx context.Context, always bool) error {
	s.recordMu.Lock()
	defer s.recordMu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := store.CollectStoreState(ctx, s.js)
	if err != nil {
		return err
	}
	// Positions recorded are positions flushed: a power cut must not
	// find a stream shorter than recorded for what no one was told was
	// stored.
	if err := s.Flush(); err != nil {
		return err
	}
	if s.cfg.Cluster.Enabled() {
		st.Cluster = s.cfg.Cluster.Name
	}
	// What was last read or written is kept: the file is read again only
	// when the positions differ from it.
	if !always && len(st.Unavailable) == 0 && s.recorded != nil && store.SameStoreState(s.recorded, st) {
		return nil
	}
	// The file is read from the page cache: no write, no wear.
	old, err := store.ReadStoreState(s.store.Path)
	if err == nil {
		st.KeepUnavailable(old)
		if !always && store.SameStoreState(old, st) {
			s.recorded = old
			return nil
		}
	}
	// Never into a directory that took the store's place.
	if err := s.CheckStore(); err != nil {
		return err
	}
	if err := store.WriteStoreState(s.store.Path, st); err != nil {
		return err
	}
	s.recorded = st
	return nil
}
