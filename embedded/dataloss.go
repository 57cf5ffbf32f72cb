package embedded

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/embedded/store"
)

// The server itself restarts "ready" after losing a stream to a power cut
// (its meta file and message blocks were never synced with a sync
// interval): it logs one warning and the stream is gone, or shorter, and
// a bootstrap would silently create it anew with sequences from 1.
// holdfast therefore records, durably, what every file stream held and
// where every consumer stood, and compares at the next start, before the
// bootstrap.

// DefaultStateInterval is how often a running holdfast looks whether the
// positions changed (StoreActivity), and reads and records them when they
// did.
// Acknowledged messages stored after the last record and lost with a sync
// interval are detected only when they take the stream's definition
// with them; the record is also written at once when a stream or a
// consumer is created, updated or deleted, and at Close.
const DefaultStateInterval = time.Second

// ErrDataLoss is the sentinel a start-up refused for lost data unwraps to.
var ErrDataLoss = errors.New("data loss detected at start-up")

// StoreState is what holdfast recorded about the streams and consumers on
// the file store.
type StoreState struct {
	Version int       `json:"version"`
	Written time.Time `json:"written"`
	// Cluster is the cluster.name of the cluster the node ran in; empty
	// outside a cluster (and in files written before it was recorded).
	Cluster string `json:"cluster,omitempty"`
	// Streams by name: only streams with file storage.
	Streams map[string]StreamRecord `json:"streams"`
	// Consumers by "STREAM/CONSUMER": durable consumers of those streams.
	Consumers map[string]ConsumerRecord `json:"consumers"`
	// Unavailable names the streams and consumers ("STREAM/CONSUMER") the
	// cluster knows but whose leader did not answer, with the reason:
	// their positions are unknown, so they are neither compared nor
	// recorded anew (never written).
	Unavailable map[string]string `json:"-"`
}

// keepUnavailable copies from old the records of what is unavailable in
// st: a stream whose leader does not answer keeps its recorded position
// instead of losing it.
func (st *StoreState) keepUnavailable(old *StoreState) {
	if old == nil {
		return
	}
	for key := range st.Unavailable {
		if rec, ok := old.Streams[key]; ok {
			st.Streams[key] = rec
			for ckey, crec := range old.Consumers {
				if crec.Stream == key {
					st.Consumers[ckey] = crec
				}
			}
		}
		if rec, ok := old.Consumers[key]; ok {
			st.Consumers[key] = rec
		}
	}
}

// StreamRecord is one stream's position when the state was recorded.
type StreamRecord struct {
	Created  time.Time `json:"created"`
	FirstSeq uint64    `json:"first_seq"`
	LastSeq  uint64    `json:"last_seq"`
	Msgs     uint64    `json:"msgs"`
}

// ConsumerRecord is one durable consumer's position.
type ConsumerRecord struct {
	Stream   string `json:"stream"`
	Name     string `json:"name"`
	AckFloor uint64 `json:"ack_floor"` // stream sequence
}

// DataLoss is one difference between the recorded state and the store.
type DataLoss struct {
	Stream   string
	Consumer string // set for a consumer that vanished or went backwards
	// Vanished: the stream (or consumer) is not on the server any more.
	Vanished bool
	// RecordedLast and FoundLast are the stream's last sequences (for a
	// consumer: its ack floors) recorded and found now.
	RecordedLast, FoundLast uint64
	// Messages is how many acknowledged messages are gone at least
	// (RecordedLast - FoundLast, or RecordedLast for a vanished stream).
	Messages uint64
	// Recreated: the stream found is another one of the same name (created
	// at another time) than the one recorded.
	Recreated bool
	// ByCluster: a cluster node found the stream vanished or recreated.
	// The meta group deleted or replaced it, by an operator's decision
	// while this node was down or through a loss of the whole cluster:
	// one node cannot tell which, so it reports and never refuses.
	ByCluster bool
	// MovedTo is where the orphaned data directory of a vanished stream
	// was moved, if it was.
	MovedTo string
}

// Lost reports whether a stream lost data: it vanished, or acknowledged
// messages are gone. A consumer that lost its position only redelivers,
// and a stream the cluster deleted or replaced is reported, not lost.
func (d DataLoss) Lost() bool {
	return d.Consumer == "" && !d.ByCluster && (d.Vanished || d.Messages > 0)
}

func (d DataLoss) String() string {
	if d.Consumer != "" {
		if d.Vanished {
			return fmt.Sprintf("consumer %s on stream %s vanished (its ack floor was %d): it is created anew and the stream's messages are delivered again", d.Consumer, d.Stream, d.RecordedLast)
		}
		return fmt.Sprintf("consumer %s on stream %s went back from ack floor %d to %d: %d messages are delivered again", d.Consumer, d.Stream, d.RecordedLast, d.FoundLast, d.RecordedLast-d.FoundLast)
	}
	if d.ByCluster {
		what := "is not in the cluster any more"
		if d.Recreated {
			what = fmt.Sprintf("was created anew in the cluster (last sequence %d recorded, %d found)", d.RecordedLast, d.FoundLast)
		}
		return fmt.Sprintf("stream %s %s: deleted while this node was down, or lost by the whole cluster (a jetstream.sync interval and a power cut of most nodes); "+
			"this node cannot tell which: the other nodes' logs at their start-up say if it was lost", d.Stream, what)
	}
	var s string
	if d.Vanished {
		s = fmt.Sprintf("stream %s vanished with every message it held (it was recorded at last sequence %d; messages stored after that record are gone too)", d.Stream, d.RecordedLast)
	} else {
		s = fmt.Sprintf("stream %s went backwards: last sequence %d recorded, %d found, at least %d acknowledged messages (sequences %d-%d) are lost",
			d.Stream, d.RecordedLast, d.FoundLast, d.Messages, d.FoundLast+1, d.RecordedLast)
	}
	if d.MovedTo != "" {
		s += "; its data directory was moved to " + d.MovedTo
	}
	return s
}

// DataLossError refuses a start-up (jetstream.on_data_loss = "refuse")
// and says how to accept the loss.
type DataLossError struct {
	Losses    []DataLoss
	StateFile string
}

func (e *DataLossError) Error() string {
	var parts []string
	for _, l := range e.Losses {
		if l.Lost() {
			parts = append(parts, l.String())
		}
	}
	return fmt.Sprintf("%s (jetstream.on_data_loss = \"refuse\"): %s; the store may have lost writes that were not synced (power cut with a jetstream.sync interval, or a damaged disk). "+
		"Inspect the store, restore a backup if you have one, then accept the loss: start once with jetstream.on_data_loss = \"warn\", or remove %s",
		ErrDataLoss, strings.Join(parts, "; "), e.StateFile)
}

// Unwrap returns ErrDataLoss.
func (e *DataLossError) Unwrap() error { return ErrDataLoss }

// ReadStoreState reads the recorded state in dir; it returns nil and no
// error when nothing was recorded yet.
func ReadStoreState(dir string) (*StoreState, error) {
	path := filepath.Join(dir, store.StateFileName)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cannot read %s: %w", path, err)
	}
	var st StoreState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("cannot parse %s (remove it to start afresh): %w", path, err)
	}
	// holdfast writes only names the server accepted: another one means
	// the file was edited or damaged (and ".." would name a directory
	// outside the streams' when a vanished stream's files are moved aside).
	for name := range st.Streams {
		if !validStreamName(name) {
			return nil, fmt.Errorf("%s records a stream named %q, which no stream can be: the file was edited or damaged; remove it to start afresh", path, name)
		}
	}
	for key, c := range st.Consumers {
		if !validStreamName(c.Stream) || c.Name == "" || key != c.Stream+"/"+c.Name {
			return nil, fmt.Errorf("%s records a consumer %q (stream %q, name %q) that does not match its key: the file was edited or damaged; remove it to start afresh", path, key, c.Stream, c.Name)
		}
	}
	return &st, nil
}

// validStreamName reports whether name can be a stream's (and so a
// directory's in the store).
func validStreamName(name string) bool {
	return name != "" && name != "." && name != ".." && !strings.ContainsAny(name, "/\\ \t\r\n*>")
}

// WriteStoreState records st in dir atomically and durably: a temp file,
// written and fsynced, renamed over the old one, and the directory
// fsynced, so a power cut leaves the old or the new state, never a part.
func WriteStoreState(dir string, st *StoreState) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(dir, store.StateFileName)
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o640)
	if err != nil {
		return fmt.Errorf("cannot record state: %w", err)
	}
	_, werr := f.Write(append(b, '\n'))
	serr := f.Sync()
	cerr := f.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("cannot record state in %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("cannot record state: %w", err)
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("cannot sync directory %s: %w", dir, err)
	}
	return nil
}

// CollectStoreState reads the position of every file stream and of its
// durable consumers from the server.
//
// In a cluster a stream's position is its leader's: a stream the meta
// group knows but whose leader does not answer (being elected, its peers
// offline, or too slow for the meta leader's stream list under load) is
// neither vanished nor empty. It is left out of Streams and named in
// Unavailable with the reason, and so is a consumer whose leader does not
// answer: its position is unknown.
func CollectStoreState(ctx context.Context, js jetstream.JetStream) (*StoreState, error) {
	st := &StoreState{Version: 1, Written: time.Now().UTC(),
		Streams: map[string]StreamRecord{}, Consumers: map[string]ConsumerRecord{}, Unavailable: map[string]string{}}
	// Names come from the meta group's assignments: a stream is known
	// whether or not its leader answers.
	lister := js.StreamNames(ctx)
	var names []string
	for name := range lister.Name() {
		names = append(names, name)
	}
	if err := lister.Err(); err != nil {
		return nil, fmt.Errorf("cannot list streams: %w", err)
	}
	for _, name := range names {
		if err := collectStream(ctx, js, name, st); err != nil {
			return nil, err
		}
	}
	return st, nil
}

// streamAnswerTimeout bounds the wait for one stream's (or its consumers')
// leader, the meta leader's own wait for a stream list.
const streamAnswerTimeout = 4 * time.Second

// offlineReason is the Unavailable reason of a stream none of whose
// replicas is online: no leader is elected for it until one comes back.
const offlineReason = "every replica of the stream is offline"

func isStreamOffline(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && uint16(apiErr.ErrorCode) == uint16(server.JSStreamOfflineErr)
}

func collectStream(ctx context.Context, js jetstream.JetStream, name string, st *StoreState) error {
	sctx, cancel := context.WithTimeout(ctx, streamAnswerTimeout)
	defer cancel()
	s, err := js.Stream(sctx, name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil // deleted meanwhile
	case ctx.Err() != nil:
		return fmt.Errorf("cannot read stream %s: %w", name, ctx.Err())
	case isStreamOffline(err):
		st.Unavailable[name] = offlineReason
		return nil
	case err != nil:
		st.Unavailable[name] = err.Error()
		return nil
	}
	info := s.CachedInfo()
	if info.Config.Storage != jetstream.FileStorage {
		return nil
	}
	if info.Cluster != nil && info.Cluster.Leader == "" {
		// A replica without a leader answers with its own state.
		st.Unavailable[name] = "the stream has no leader"
		return nil
	}
	st.Streams[name] = StreamRecord{Created: info.Created.UTC(),
		FirstSeq: info.State.FirstSeq, LastSeq: info.State.LastSeq, Msgs: info.State.Msgs}

	durables := map[string]bool{}
	cnames := s.ConsumerNames(sctx)
	for c := range cnames.Name() {
		durables[c] = true
	}
	if err := cnames.Err(); err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			delete(st.Streams, name)
			return nil
		}
		st.Unavailable[name] = "cannot list its consumers: " + err.Error()
		return nil
	}
	consumers := s.ListConsumers(sctx)
	for ci := range consumers.Info() {
		// A consumer keeping its state in memory has no position to lose
		// (the workers' claims on dead letters being replayed are such
		// consumers, deleted when the replay ends): recorded, its absence
		// at the next start would read as a vanished consumer.
		if ci.Config.Durable == "" || ci.Config.MemoryStorage || !durables[ci.Name] {
			delete(durables, ci.Name)
			continue
		}
		key := name + "/" + ci.Name
		if ci.Cluster != nil && ci.Cluster.Leader == "" {
			st.Unavailable[key] = "the consumer has no leader"
		} else {
			st.Consumers[key] = ConsumerRecord{Stream: name, Name: ci.Name, AckFloor: ci.AckFloor.Stream}
		}
		delete(durables, ci.Name)
	}
	if err := consumers.Err(); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		st.Unavailable[name] = "cannot list its consumers: " + err.Error()
		return nil
	}
	// Known to the meta group, left out of the list: its leader did not
	// answer in time.
	for c := range durables {
		st.Unavailable[name+"/"+c] = "the consumer's leader did not answer"
	}
	return nil
}

// CompareStoreState lists what the store lost against what was recorded:
// streams that vanished or whose last sequence went backwards (or that
// were created anew), and consumers that vanished or went backwards.
func CompareStoreState(recorded, now *StoreState) []DataLoss {
	if recorded == nil {
		return nil
	}
	var losses []DataLoss
	for _, name := range slices.Sorted(maps.Keys(recorded.Streams)) {
		if _, unknown := now.Unavailable[name]; unknown {
			continue
		}
		rec := recorded.Streams[name]
		cur, ok := now.Streams[name]
		switch {
		case !ok:
			losses = append(losses, DataLoss{Stream: name, Vanished: true, RecordedLast: rec.LastSeq, Messages: rec.LastSeq})
			continue
		case cur.LastSeq < rec.LastSeq:
			recreated := !rec.Created.IsZero() && !cur.Created.IsZero() && !rec.Created.Equal(cur.Created)
			losses = append(losses, DataLoss{Stream: name, RecordedLast: rec.LastSeq, FoundLast: cur.LastSeq, Messages: rec.LastSeq - cur.LastSeq,
				Recreated: recreated})
			continue
		}
	}
	for _, key := range slices.Sorted(maps.Keys(recorded.Consumers)) {
		rec := recorded.Consumers[key]
		if _, ok := now.Streams[rec.Stream]; !ok {
			continue // the stream's loss is reported, or it is unavailable
		}
		if _, unknown := now.Unavailable[key]; unknown {
			continue
		}
		cur, ok := now.Consumers[key]
		switch {
		case !ok:
			losses = append(losses, DataLoss{Stream: rec.Stream, Consumer: rec.Name, Vanished: true, RecordedLast: rec.AckFloor})
		case cur.AckFloor < rec.AckFloor:
			losses = append(losses, DataLoss{Stream: rec.Stream, Consumer: rec.Name, RecordedLast: rec.AckFloor, FoundLast: cur.AckFloor})
		}
	}
	return losses
}

// moveOrphan moves the data directory a vanished stream left in the store
// (the server could not load it) out of the server's way, so that the
// bootstrap does not create the stream over it. It returns where it went,
// or "" when there was nothing to move.
func moveOrphan(storeDir, stream string, now time.Time) (string, error) {
	dirs, err := orphanDirs(storeDir, stream)
	if err != nil {
		return "", err
	}
	var moved []string
	for _, dir := range dirs {
		account := filepath.Base(filepath.Dir(filepath.Dir(dir)))
		destDir := filepath.Join(storeDir, store.OrphanDirName)
		if err := os.MkdirAll(destDir, 0o750); err != nil {
			return "", err
		}
		// Losses can follow each other within a second: never reuse a name.
		base := filepath.Join(destDir, fmt.Sprintf("%s.%s.%s", account, stream, now.UTC().Format("20060102T150405Z")))
		dest := base
		for i := 1; ; i++ {
			if _, err := os.Lstat(dest); errors.Is(err, os.ErrNotExist) {
				break
			}
			dest = fmt.Sprintf("%s.%d", base, i)
		}
		if err := os.Rename(dir, dest); err != nil {
			return "", fmt.Errorf("cannot move the data directory of vanished stream %s aside: %w", stream, err)
		}
		if err := syncDir(filepath.Dir(dir)); err != nil {
			return "", err
		}
		if err := syncDir(destDir); err != nil {
			return "", err
		}
		moved = append(moved, dest)
	}
	sort.Strings(moved)
	return strings.Join(moved, ", "), nil
}

// orphanDirs lists the data directories named exactly stream, in every
// account of the store (jetstream/<account>/streams/<stream>). Names are
// compared as they are, never as patterns: a stream may be called "A?" or
// "A[1]" and must not take "AB"'s or "A1"'s directory with it.
func orphanDirs(storeDir, stream string) ([]string, error) {
	if stream == "" || stream == "." || stream == ".." || strings.ContainsAny(stream, `/\`) {
		return nil, fmt.Errorf("cannot look for the data directory of stream %q: not a valid stream name", stream)
	}
	root := filepath.Join(storeDir, "jetstream")
	accounts, err := store.Accounts(root)
	if err != nil {
		return nil, fmt.Errorf("cannot look for the data directory of vanished stream %s: %w", stream, err)
	}
	var dirs []string
	for _, a := range accounts {
		dir := filepath.Join(root, a, "streams", stream)
		fi, err := os.Lstat(dir)
		switch {
		case errors.Is(err, os.ErrNotExist):
			continue
		case err != nil:
			return nil, fmt.Errorf("cannot look for the data directory of vanished stream %s: %w", stream, err)
		case fi.IsDir():
			dirs = append(dirs, dir)
		}
	}
	return dirs, nil
}

// DataLosses returns what the start-up check found missing (nil when
// nothing): for /healthz, metrics and status.
func (s *Server) DataLosses() []DataLoss {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]DataLoss(nil), s.losses...)
}

// checkDataLoss compares the recorded state with the store just opened.
// Every loss is logged; with on_data_loss = "refuse" (and no
// AcceptDataLoss) a lost acknowledged message stops start-up, otherwise
// the data directory of a vanished stream is moved aside so the bootstrap
// can create the stream anew.
func (s *Server) checkDataLoss(ctx context.Context) error {
	dir := s.store.Path
	recorded, err := ReadStoreState(dir)
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
	losses := CompareStoreState(recorded, now)
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
		return &DataLossError{Losses: losses, StateFile: filepath.Join(dir, store.StateFileName)}
	}
	at := time.Now()
	for i, l := range losses {
		// In a cluster the server owns every replica's directory: a stream
		// the meta group no longer knows is removed by the server itself,
		// and moving a directory it may be recovering breaks the replica.
		if l.Vanished && l.Consumer == "" && !clustered {
			moved, err := moveOrphan(dir, l.Stream, at)
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

// ErrStoreOfAnotherCluster is the sentinel the start-up refusal of a store
// recorded in another cluster unwraps to.
var ErrStoreOfAnotherCluster = errors.New("the store dir belongs to another cluster")

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
	recorded, err := ReadStoreState(s.store.Path)
	if err != nil || recorded == nil || recorded.Cluster == "" || recorded.Cluster == s.cfg.Cluster.Name || len(recorded.Streams) == 0 {
		return err
	}
	return fmt.Errorf("%w: store dir %s holds %d stream(s) (%s) of cluster %q, recorded %s, but cluster.name is %q: nats-server keeps a stream placed in the cluster "+
		"that created it, so these could never change their replicas here (\"no suitable peers for placement\") and would join this cluster's streams; "+
		"set cluster.name = %q again (on every node), move the data with holdfast backup and restore, or move this store dir away to start the node empty",
		ErrStoreOfAnotherCluster, s.store.Path, len(recorded.Streams), strings.Join(slices.Sorted(maps.Keys(recorded.Streams)), ", "),
		recorded.Cluster, recorded.Written.UTC().Format(time.RFC3339), s.cfg.Cluster.Name, recorded.Cluster)
}

// logLoss logs one difference found by the start-up check: a lost
// acknowledged message at error level, the rest as warnings.
func (s *Server) logLoss(l DataLoss, recordedAt time.Time) {
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
func (s *Server) collectForCheck(ctx context.Context, recorded *StoreState) (*StoreState, error) {
	deadline := time.Now().Add(unavailableWait)
	for {
		now, err := CollectStoreState(ctx, s.js)
		if err != nil {
			return nil, err
		}
		waiting := false
		for key, reason := range now.Unavailable {
			_, stream := recorded.Streams[key]
			waiting = waiting || (stream && reason != offlineReason)
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
	st, err := CollectStoreState(ctx, s.js)
	if err != nil {
		return err
	}
	if s.cfg.Cluster.Enabled() {
		st.Cluster = s.cfg.Cluster.Name
	}
	// What was last read or written is kept: the file is read again only
	// when the positions differ from it.
	if !always && len(st.Unavailable) == 0 && s.recorded != nil && sameStoreState(s.recorded, st) {
		return nil
	}
	// The file is read from the page cache: no write, no wear.
	old, err := ReadStoreState(s.store.Path)
	if err == nil {
		st.keepUnavailable(old)
		if !always && sameStoreState(old, st) {
			s.recorded = old
			return nil
		}
	}
	// Never into a directory that took the store's place.
	if err := s.CheckStore(); err != nil {
		return err
	}
	if err := WriteStoreState(s.store.Path, st); err != nil {
		return err
	}
	s.recorded = st
	return nil
}

// sameStoreState reports whether a and b record the same positions (the
// time they were written aside).
func sameStoreState(a, b *StoreState) bool {
	if a == nil || b == nil || a.Version != b.Version || a.Cluster != b.Cluster || len(a.Streams) != len(b.Streams) || len(a.Consumers) != len(b.Consumers) {
		return false
	}
	for name, x := range a.Streams {
		y, ok := b.Streams[name]
		if !ok || !x.Created.Equal(y.Created) || x.FirstSeq != y.FirstSeq || x.LastSeq != y.LastSeq || x.Msgs != y.Msgs {
			return false
		}
	}
	for key, x := range a.Consumers {
		if y, ok := b.Consumers[key]; !ok || x != y {
			return false
		}
	}
	return true
}
