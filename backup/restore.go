package backup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/jsm.go"
	"github.com/nats-io/jsm.go/api"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// RestoreOptions configure Restore.
type RestoreOptions struct {
	// Streams to restore; all of the backup's when empty. A name given
	// twice is restored once.
	Streams []string
	// Replace deletes a stream that exists and holds (or held) messages
	// before restoring it. Without it such a stream is an *ExistsError.
	Replace bool
	// Progress, when set, is called as data is sent.
	Progress func(Progress)
	// Notice, when set, is told about steps an operator should know of
	// (an existing stream deleted, a retry).
	Notice func(msg string)
	// Timeout of each JetStream API request; 30 s when zero.
	Timeout time.Duration
	// Verified is the manifest of dir when the caller has just checked it
	// with Verify; when nil, Restore verifies dir itself.
	Verified *Manifest
}

// ExistingStream is a stream on the server that a restore would replace.
type ExistingStream struct {
	Name     string
	Messages uint64
	LastSeq  uint64
}

// ExistsError is returned by Restore, before anything changed, when
// streams of the backup exist on the server and have held messages.
type ExistsError struct {
	Streams []ExistingStream
}

func (e *ExistsError) Error() string {
	var parts []string
	for _, s := range e.Streams {
		parts = append(parts, fmt.Sprintf("%s (%d messages, last sequence %d)", s.Name, s.Messages, s.LastSeq))
	}
	return fmt.Sprintf("stream(s) already exist and have held messages: %s; nothing was restored: pass --replace to delete them and restore the backup (their messages are lost), or --stream to restore others",
		strings.Join(parts, ", "))
}

// Restored is one stream as restored, next to the backup's manifest.
type Restored struct {
	Name string
	// Replaced tells that an existing stream was deleted first; it held
	// ReplacedMessages messages.
	Replaced         bool
	ReplacedMessages uint64
	// Messages and LastSeq right after the restore.
	Messages, LastSeq uint64
	// AckFloors are the consumers' ack floors (stream sequences) read
	// right after the restore; running workers may have moved them on.
	AckFloors map[string]uint64
}

// errNameInUse matches the server's refusal to restore over an existing
// stream (err_code 10130), in the API response or in the restore's result.
func errNameInUse(err error) bool {
	return jsm.IsNatsError(err, 10130) || (err != nil && strings.Contains(err.Error(), "stream name already in use"))
}

// afterDelete, set by tests, runs between deleting a stream and restoring
// it: where the running holdfast may create it again.
var afterDelete func(stream string)

// restoreAttempts bounds the retries when the running holdfast creates a
// stream again (empty) between its deletion and the restore.
const restoreAttempts = 5

// Restore verifies the backup in dir (see Verify) and restores its streams
// with their consumers into the server nc is connected to, through the
// JetStream restore API. A stream that does not exist is created from the
// backup. One that exists but never held a message (last sequence 0: the
// empty stream a fresh holdfast's bootstrap created) is deleted and
// restored. One that has held messages is refused, all of them listed in
// an *ExistsError before anything changes, unless opts.Replace.
//
// A restore that fails halfway deletes the partial stream (the running
// holdfast then creates it again, empty); the backup is never changed.
func Restore(ctx context.Context, nc *nats.Conn, dir string, opts RestoreOptions) (*Manifest, []Restored, error) {
	m := opts.Verified
	if m == nil {
		var err error
		if m, err = Verify(dir); err != nil {
			return nil, nil, err
		}
	}
	todo, err := m.Select(opts.Streams)
	if err != nil {
		return m, nil, fmt.Errorf("backup %s: %w", dir, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return m, nil, err
	}
	mgr, err := jsm.New(nc, jsm.WithTimeout(apiTimeout(opts.Timeout)))
	if err != nil {
		return m, nil, err
	}

	existing := map[string]jetstream.StreamState{}
	var conflicts []ExistingStream
	for _, e := range todo {
		st, ok, err := streamState(ctx, js, e.Name)
		if err != nil {
			return m, nil, err
		}
		if !ok {
			continue
		}
		existing[e.Name] = st
		if st.LastSeq > 0 && !opts.Replace {
			conflicts = append(conflicts, ExistingStream{Name: e.Name, Messages: st.Msgs, LastSeq: st.LastSeq})
		}
	}
	if len(conflicts) > 0 {
		return m, nil, &ExistsError{Streams: conflicts}
	}

	var out []Restored
	for i, e := range todo {
		r, err := restoreStream(ctx, js, mgr, dir, e, i+1, len(todo), existing, opts)
		if err != nil {
			return m, out, err
		}
		out = append(out, r)
	}
	return m, out, nil
}

// restoreStream restores one stream and checks it against the manifest.
func restoreStream(ctx context.Context, js jetstream.JetStream, mgr *jsm.Manager, dir string, e StreamEntry,
	idx, count int, existing map[string]jetstream.StreamState, opts RestoreOptions) (Restored, error) {
	notice := func(format string, args ...any) {
		if opts.Notice != nil {
			opts.Notice(fmt.Sprintf(format, args...))
		}
	}
	r := Restored{Name: e.Name, AckFloors: map[string]uint64{}}
	sdir := filepath.Join(dir, filepath.FromSlash(e.Dir))
	dataPath := filepath.Join(sdir, jsm.SnapshotDataFile)
	var total uint64
	if fi, err := os.Stat(dataPath); err == nil {
		total = uint64(fi.Size())
	}
	restore := func() (*api.StreamState, error) {
		df, err := os.Open(dataPath)
		if err != nil {
			return nil, err
		}
		mf, err := os.Open(filepath.Join(sdir, jsm.SnapshotMetaFile))
		if err != nil {
			df.Close()
			return nil, err
		}
		pr := &pacedReader{r: df, size: firstChunk}
		if opts.Progress != nil {
			pr.progress = func(done uint64) {
				opts.Progress(Progress{Stream: e.Name, Index: idx, Count: count, Done: done, Total: total})
			}
		}
		return mgr.RestoreSnapshotFromBuffer(ctx, e.Name, pr, mf)
	}
	st, exists := existing[e.Name]
	for attempt := 1; ; attempt++ {
		if exists {
			if err := js.DeleteStream(ctx, e.Name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
				return r, fmt.Errorf("cannot delete the existing stream %s: %w", e.Name, err)
			}
			if afterDelete != nil {
				afterDelete(e.Name)
			}
			if st.LastSeq > 0 && !r.Replaced {
				r.Replaced, r.ReplacedMessages = true, st.Msgs
				notice("deleted the existing stream %s (%d messages, last sequence %d)", e.Name, st.Msgs, st.LastSeq)
			}
		}
		state, err := restore()
		if err == nil && opts.Progress != nil {
			opts.Progress(Progress{Stream: e.Name, Index: idx, Count: count, Done: total, Total: total})
		}
		if err == nil {
			r.Messages, r.LastSeq = state.Msgs, state.LastSeq
			err = checkRestored(ctx, js, e, sdir, &r)
			if err == nil {
				return r, nil
			}
		}
		if attempt < restoreAttempts && ctx.Err() == nil && collided(err) {
			// The running holdfast noticed the stream or its consumer
			// missing and created it again (empty) while the restore ran:
			// delete it again and retry, unless something was published
			// into it meanwhile.
			now, ok, serr := streamState(ctx, js, e.Name)
			if serr != nil {
				return r, serr
			}
			// When the name was taken, the stream there is not the
			// restore's: refuse to delete it once it holds messages. After
			// a mismatch it is the restored one: refuse once it holds more
			// than the backup's, published into it since.
			switch {
			case !ok || opts.Replace:
			case errNameInUse(err) && now.LastSeq > 0:
				return r, fmt.Errorf("stream %s was created again and received messages (last sequence %d) while it was being restored: nothing of the backup is in it; run the restore again, with --replace to delete them", e.Name, now.LastSeq)
			case !errNameInUse(err) && now.LastSeq > e.LastSeq:
				return r, fmt.Errorf("stream %s holds the backup but differs from it (%v) and has received messages since (last sequence %d, the backup's %d): it is left as it is; run the restore again, with --replace to delete them", e.Name, err, now.LastSeq, e.LastSeq)
			}
			notice("stream %s: the running holdfast created it or its consumers again while the restore ran (%v): deleting it and retrying", e.Name, err)
			st, exists = jetstream.StreamState{}, ok
			continue
		}
		// Whatever the failed restore left is partial: delete it, also
		// when the restore was interrupted (ctx cancelled). When the name
		// was taken, the restore created nothing: the stream there is
		// someone else's, and may hold messages published since.
		if !errNameInUse(err) {
			cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			derr := js.DeleteStream(cleanup, e.Name)
			cancel()
			if derr == nil {
				notice("deleted what the failed restore of %s left", e.Name)
			}
		}
		return r, fmt.Errorf("restore of stream %s from %s failed (the backup is unchanged): %w", e.Name, sdir, err)
	}
}

// errMismatch marks a restored stream or consumer that differs from the
// manifest.
var errMismatch = errors.New("differs from the backup")

// collided tells whether a failed restore may have raced with the running
// holdfast creating the stream or its consumers again: the name was taken,
// a consumer existed, or the result differs from the manifest.
func collided(err error) bool {
	return errNameInUse(err) || errors.Is(err, errMismatch) ||
		(err != nil && strings.Contains(err.Error(), "consumer already exists"))
}

// checkRestored compares the restored stream with the manifest and records
// its consumers' ack floors.
func checkRestored(ctx context.Context, js jetstream.JetStream, e StreamEntry, sdir string, r *Restored) error {
	if r.LastSeq != e.LastSeq {
		return fmt.Errorf("restored stream %s ends at sequence %d, the manifest says %d: %w", e.Name, r.LastSeq, e.LastSeq, errMismatch)
	}
	if limitsRetention(sdir) && r.Messages != e.Messages {
		return fmt.Errorf("restored stream %s holds %d messages, the manifest says %d: %w", e.Name, r.Messages, e.Messages, errMismatch)
	}
	for _, c := range e.Consumers {
		cons, err := js.Consumer(ctx, e.Name, c.Name)
		if err != nil {
			return fmt.Errorf("consumer %s of stream %s after the restore: %w", c.Name, e.Name, err)
		}
		floor := cons.CachedInfo().AckFloor.Stream
		if floor < c.AckFloor {
			return fmt.Errorf("restored consumer %s of stream %s has ack floor %d, the manifest says %d: %w", c.Name, e.Name, floor, c.AckFloor, errMismatch)
		}
		r.AckFloors[c.Name] = floor
	}
	return nil
}

// streamState returns a stream's state and whether it exists.
func streamState(ctx context.Context, js jetstream.JetStream, name string) (jetstream.StreamState, bool, error) {
	s, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return jetstream.StreamState{}, false, nil
	}
	if err != nil {
		return jetstream.StreamState{}, false, fmt.Errorf("stream %s: %w", name, err)
	}
	return s.CachedInfo().State, true, nil
}

// limitsRetention tells whether the stream in a snapshot directory keeps
// its messages until limits remove them (the default): only then does
// the restored count have to equal the backup's at once, as workers acking
// on an interest or work-queue stream remove messages right away.
func limitsRetention(sdir string) bool {
	raw, err := os.ReadFile(filepath.Join(sdir, jsm.SnapshotMetaFile))
	if err != nil {
		return false
	}
	var meta struct {
		Config struct {
			Retention string `json:"retention"`
		} `json:"config"`
	}
	if json.Unmarshal(raw, &meta) != nil {
		return false
	}
	return slices.Contains([]string{"", "limits"}, meta.Config.Retention)
}

// Chunk sizes of a restore: jsm.go sends what one Read returns, at most
// 64 KiB.
const (
	minChunk   = 512
	firstChunk = 4 << 10
	maxChunk   = 64 << 10
	// chunkTarget is how long the server should take for one chunk. It
	// fails a restore that gets no chunk for 5 s, and it answers a chunk
	// only once it has stored the messages in it: into a store with
	// sync = "always" (a flush per message) a 64 KiB chunk of well
	// compressed small messages takes longer than that.
	chunkTarget = 500 * time.Millisecond
)

// pacedReader hands a restore its data in chunks sized after how long the
// server took for the previous one (the time between two Reads), so that
// each takes about chunkTarget.
type pacedReader struct {
	r        io.ReadCloser
	size     int
	last     time.Time
	done     uint64
	progress func(done uint64)
	now      func() time.Time // time.Now when nil
}

func (p *pacedReader) clock() time.Time {
	if p.now != nil {
		return p.now()
	}
	return time.Now()
}

func (p *pacedReader) Read(b []byte) (int, error) {
	if !p.last.IsZero() {
		took := max(p.clock().Sub(p.last), time.Millisecond)
		size := int(float64(p.size) * float64(chunkTarget) / float64(took))
		p.size = min(max(size, minChunk), maxChunk, 2*p.size)
	}
	n, err := p.r.Read(b[:min(len(b), p.size)])
	p.done += uint64(n)
	if p.progress != nil && n > 0 {
		p.progress(p.done)
	}
	p.last = p.clock()
	return n, err
}

func (p *pacedReader) Close() error { return p.r.Close() }
