package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
)

// The server itself restarts "ready" after losing a stream to a power cut
// (its meta file and message blocks were never synced with a sync
// interval): it logs one warning and the stream is gone, or shorter, and
// a bootstrap would silently create it anew with sequences from 1.
// holdfast therefore records, durably, what every file stream held and
// where every consumer stood, and compares at the next start, before the
// bootstrap.

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

// KeepUnavailable copies from old the records of what is unavailable in
// st: a stream whose leader does not answer keeps its recorded position
// instead of losing it.
func (st *StoreState) KeepUnavailable(old *StoreState) {
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

// ReadStoreState reads the recorded state in dir; it returns nil and no
// error when nothing was recorded yet.
func ReadStoreState(dir string) (*StoreState, error) {
	path := filepath.Join(dir, StateFileName)
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

// WriteStoreState records st in dir atomically and durably (writeFile).
func WriteStoreState(dir string, st *StoreState) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	if err := writeFile(dir, StateFileName, append(b, '\n')); err != nil {
		return fmt.Errorf("cannot record state: %w", err)
	}
	return nil
}

// writeFile writes b to the file name in dir atomically and durably: a
// temp file, written and fsynced, renamed over the old one, and the
// directory fsynced, so a power cut leaves the old or the new file, never
// a part.
func writeFile(dir, name string, b []byte) error {
	path := filepath.Join(dir, name)
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o640)
	if err != nil {
		return err
	}
	_, werr := f.Write(b)
	serr := f.Sync()
	cerr := f.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("cannot write %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return SyncDir(dir)
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

// OfflineReason is the Unavailable reason of a stream none of whose
// replicas is online: no leader is elected for it until one comes back.
const OfflineReason = "every replica of the stream is offline"

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
		st.Unavailable[name] = OfflineReason
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

// SameStoreState reports whether a and b record the same positions (the
// time they were written aside).
func SameStoreState(a, b *StoreState) bool {
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
