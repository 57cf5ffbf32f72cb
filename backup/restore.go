package backup

import (
	"bytes"
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

	"github.com/klauspost/compress/s2"
	"github.com/nats-io/jsm.go"
	"github.com/nats-io/jsm.go/api"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/internal/settle"
	"github.com/holdfast-io/holdfast/internal/subjects"
)

// RestoreOptions configure Restore.
type RestoreOptions struct {
	// Streams to restore; all of the backup's when empty. A name given
	// twice is restored once.
	Streams []string
	// Replace deletes a stream that exists and holds (or held) messages
	// before restoring it, once it takes no more publishes and is saved
	// (see SaveDir). Without it such a stream is an *ExistsError.
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
	// SaveDir is where an existing stream that Replace deletes is saved
	// first, to be put back should the restore fail: a new directory
	// holdfast-replaced-STREAM-* in it, removed once the restore or the
	// putting back succeeded. Default: the parent of the backup directory.
	SaveDir string
	// Replicas gives the streams it names the replicas they are restored
	// with, in place of the backup's, and no placement: those the running
	// config gives them. The others keep the backup's.
	Replicas map[string]int
	// GroupCommit says, for the streams it names, whether the running
	// config has group commit on for them: a stream backed up with it on
	// is restored with its configured subjects (nothing else would answer
	// them), one backed up without it behind group commit's prefix (else
	// both the stream and the committer take each publish). The others
	// keep the backup's subjects.
	GroupCommit map[string]bool
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
	// ReplacedMessages messages, up to sequence ReplacedLastSeq.
	Replaced                          bool
	ReplacedMessages, ReplacedLastSeq uint64
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

// errStoreNotReady reports a store the server could not create for the
// restored stream, transient right after a stream of the same name was
// deleted: in a cluster "error creating store for stream" (10049), a
// replica still removing the old stream's files; on one server "could not
// create storage directory" for a directory that went away under it
// (nats-server's account set-up removes an account's empty streams
// directory).
func errStoreNotReady(err error, clustered bool) bool {
	if err == nil {
		return false
	}
	if clustered && (jsm.IsNatsError(err, 10049) || strings.Contains(err.Error(), "error creating store for stream")) {
		return true
	}
	return strings.Contains(err.Error(), "could not create storage directory") && strings.Contains(err.Error(), "no such file or directory")
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
// holdfast then creates it again, empty); the backup is never changed. A
// stream that Replace deleted is put back as it was when its restore
// fails or is interrupted (see restoreStream).
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
	if err := checkOverlaps(ctx, js, dir, todo); err != nil {
		return m, nil, err
	}
	if err := checkReplicas(nc, dir, todo); err != nil {
		return m, nil, err
	}

	var out []Restored
	for i, e := range todo {
		r, err := restoreStream(ctx, js, nc, dir, e, i+1, len(todo), existing, opts)
		if err != nil {
			return m, out, err
		}
		out = append(out, r)
	}
	return m, out, nil
}

// restoreStream restores one stream and checks it against the manifest.
// An existing stream that has held messages and is to be replaced first
// stops taking publishes (closeStream), so that the copy of it saved next
// (a backup, in opts.SaveDir) holds every message acknowledged until it
// is deleted; that copy is put back when the restore fails or is
// interrupted (putBack).
func restoreStream(ctx context.Context, js jetstream.JetStream, nc *nats.Conn, dir string, e StreamEntry,
	idx, count int, existing map[string]jetstream.StreamState, opts RestoreOptions) (Restored, error) {
	st, exists := existing[e.Name]
	adjust := configured(opts, e.Name)
	if exists && st.LastSeq == 0 {
		return restoreEmpty(ctx, js, nc, dir, e, idx, count, existing, opts)
	}
	if !opts.Replace || !exists {
		return restoreFrom(ctx, js, nc, dir, e, idx, count, existing, opts, adjust)
	}
	notice := noticeFunc(opts)
	subjects, err := closeStream(ctx, js, e.Name)
	if err != nil {
		return Restored{Name: e.Name}, fmt.Errorf("stream %s was not replaced, nothing changed: %w", e.Name, err)
	}
	if subjects != nil {
		notice("stream %s takes no publishes until it is replaced: its subjects %v are held back (publishers get errors meanwhile)", e.Name, subjects)
	}
	saved, entry, now, err := saveClosed(ctx, js, nc, dir, e.Name, opts)
	if err != nil {
		err = fmt.Errorf("stream %s was not replaced: its messages could not be saved first (to be put back should the restore fail): %w", e.Name, err)
		if rerr := reopenStream(context.WithoutCancel(ctx), js, e.Name, subjects, false); rerr != nil {
			return Restored{Name: e.Name}, fmt.Errorf("%w; %s", err, heldBack(e.Name, subjects, rerr))
		}
		return Restored{Name: e.Name}, fmt.Errorf("%w; nothing changed", err)
	}
	existing[e.Name] = now
	if entry != nil {
		// Said before the delete: a restore killed from now on (kill -9,
		// a lost session) cannot put the stream back itself.
		notice("stream %s saved in %s (%d messages, last sequence %d) before it is replaced: should this restore be stopped before it ends, `holdfast restore --replace %s` puts it back",
			e.Name, saved, entry.Messages, entry.LastSeq, saved)
	}
	r, err := restoreFrom(ctx, js, nc, dir, e, idx, count, existing, opts, adjust)
	if err == nil {
		os.RemoveAll(saved)
		return r, nil
	}
	return r, putBack(ctx, js, nc, e.Name, idx, count, saved, entry, subjects, opts, err)
}

// restoreEmpty restores a stream that held no message when the restore
// began (the empty stream a fresh holdfast's bootstrap created), deleting
// it only while it still holds none: it is closed first (closeStream), so
// that nothing is acknowledged into it from then on, and looked at again.
// One that received messages meanwhile is replaced as one that held them
// with opts.Replace; without, it gets its subjects back and is refused.
// A restore that fails gives it its subjects back when it is still there.
func restoreEmpty(ctx context.Context, js jetstream.JetStream, nc *nats.Conn, dir string, e StreamEntry,
	idx, count int, existing map[string]jetstream.StreamState, opts RestoreOptions) (Restored, error) {
	held, err := closeStream(ctx, js, e.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		delete(existing, e.Name)
		return restoreStream(ctx, js, nc, dir, e, idx, count, existing, opts)
	}
	if err != nil {
		return Restored{Name: e.Name}, fmt.Errorf("stream %s was not restored, nothing changed: %w", e.Name, err)
	}
	reopen := func(err error) error { return reopenAfter(ctx, js, e.Name, held, err) }
	now, ok, err := streamState(ctx, js, e.Name)
	switch {
	case err != nil:
		return Restored{Name: e.Name}, reopen(fmt.Errorf("stream %s was not restored, nothing changed: %w", e.Name, err))
	case ok && now.LastSeq > 0 && !opts.Replace:
		return Restored{Name: e.Name}, reopen(fmt.Errorf("stream %s received messages since this restore began (%d messages, last sequence %d): it is left as it is, without the backup's; "+
			"run the restore again with --stream %s --replace to delete them and restore the backup's (their messages are lost)", e.Name, now.Msgs, now.LastSeq, e.Name))
	case ok:
		existing[e.Name] = now
	default:
		delete(existing, e.Name)
	}
	if now.LastSeq > 0 {
		return restoreStream(ctx, js, nc, dir, e, idx, count, existing, opts)
	}
	r, err := restoreFrom(ctx, js, nc, dir, e, idx, count, existing, opts, configured(opts, e.Name))
	if err != nil {
		return r, reopen(err)
	}
	return r, nil
}

// saveReplaced backs up stream, which a restore from dir is to replace,
// into a new directory in opts.SaveDir (default: dir's parent) and
// returns it and the stream's entry (nil when the stream was skipped).
func saveReplaced(ctx context.Context, nc *nats.Conn, dir, stream string, opts RestoreOptions) (string, *StreamEntry, error) {
	parent := opts.SaveDir
	if parent == "" {
		abs, err := filepath.Abs(dir)
		if err != nil {
			return "", nil, err
		}
		parent = filepath.Dir(abs)
	}
	saved, err := os.MkdirTemp(parent, "holdfast-replaced-"+stream+"-")
	if err != nil {
		return "", nil, fmt.Errorf("%w (the copy goes beside the backup: make %s writable, or copy the backup to a writable place)", err, parent)
	}
	m, err := Create(ctx, nc, saved, Options{Streams: []string{stream}, HoldfastVersion: "saved by holdfast restore --replace", Timeout: opts.Timeout})
	if err != nil {
		os.RemoveAll(saved)
		return "", nil, err
	}
	return saved, m.Stream(stream), nil
}

func noticeFunc(opts RestoreOptions) func(format string, args ...any) {
	return func(format string, args ...any) {
		if opts.Notice != nil {
			opts.Notice(fmt.Sprintf(format, args...))
		}
	}
}

// restoreFrom restores one stream from dir and checks it against e.
// adjust, when set, changes the stream's configuration the restore
// creates it with (the backup's).
func restoreFrom(ctx context.Context, js jetstream.JetStream, nc *nats.Conn, dir string, e StreamEntry,
	idx, count int, existing map[string]jetstream.StreamState, opts RestoreOptions, adjust func(*api.StreamConfig)) (Restored, error) {
	timeout := apiTimeout(opts.Timeout)
	notice := noticeFunc(opts)
	r := Restored{Name: e.Name, AckFloors: map[string]uint64{}}
	sdir := filepath.Join(dir, filepath.FromSlash(e.Dir))
	dataPath := filepath.Join(sdir, jsm.SnapshotDataFile)
	var total uint64
	if fi, err := os.Stat(dataPath); err == nil {
		total = uint64(fi.Size())
	}
	// The stream is restored with its subjects held back (as closeStream
	// holds them), and given them once it is checked: a restore killed
	// midway (kill -9, a lost connection) leaves part of the backup that
	// takes no publishes, instead of one that acknowledges them.
	var held []string
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
		var progress func(uint64)
		if opts.Progress != nil {
			progress = func(done uint64) {
				opts.Progress(Progress{Stream: e.Name, Index: idx, Count: count, Done: done, Total: total})
			}
		}
		state, err := restoreSnapshot(ctx, nc, timeout, e.Name, newRestoreReader(df, progress), mf, func(c *api.StreamConfig) {
			if adjust != nil {
				adjust(c)
			}
			held = holdSubjects(c, dir)
		})
		if err != nil && (strings.Contains(err.Error(), "closed pipe") || strings.Contains(err.Error(), "is stalled")) {
			err = fmt.Errorf("%w: the server gave up the restore, as it does when storing one chunk of it takes over 5 s (is the store's disk that slow?)", err)
		}
		return state, err
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
				r.Replaced, r.ReplacedMessages, r.ReplacedLastSeq = true, st.Msgs, st.LastSeq
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
				if rerr := reopenStream(ctx, js, e.Name, held, true); rerr != nil {
					return r, fmt.Errorf("stream %s was restored; %s", e.Name, heldBack(e.Name, held, rerr))
				}
				dropReplayClaims(ctx, js, e, notice)
				return r, nil
			}
		}
		if attempt < restoreAttempts && ctx.Err() == nil && errStoreNotReady(err, nc.ConnectedClusterName() != "") {
			notice("stream %s: the server could not create its store yet (%v), as happens right after a stream of that name was deleted: deleting what the attempt left and restoring once more", e.Name, err)
			st, exists = jetstream.StreamState{}, true
			select {
			case <-time.After(time.Second):
			case <-ctx.Done():
			}
			continue
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
			// restore's: refuse to delete it once it holds messages, with
			// Replace too (they are in no saved copy). After a mismatch it
			// is the restored one: refuse once it holds more than the
			// backup's, published into it since.
			switch {
			case !ok:
			case errNameInUse(err) && now.LastSeq > 0:
				return r, fmt.Errorf("stream %s was created again and received messages (last sequence %d) while it was being restored (by the running holdfast, or another restore): it is left as it is, without this restore's data; run the restore again, with --replace to delete them", e.Name, now.LastSeq)
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

// dropReplayClaims deletes the replay claims a backup taken while dead
// letters were being replayed in a cluster holds (subjects.ReplayClaim):
// restored, no replay holds them, and each would refuse every replay of
// its dead letter until the server removed it an hour later. A dead letter
// whose replay had not ended when the backup was taken is in the restored
// stream, to be replayed again.
func dropReplayClaims(ctx context.Context, js jetstream.JetStream, e StreamEntry, notice func(string, ...any)) {
	for _, c := range e.Consumers {
		if !subjects.IsReplayClaim(c.Name) {
			continue
		}
		if err := js.DeleteConsumer(ctx, e.Name, c.Name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			notice("stream %s: cannot delete %s, the claim of a replay that ran while the backup was taken (%v): its dead letter cannot be replayed until it is gone (nats consumer rm %s %s, or within the hour)",
				e.Name, c.Name, err, e.Name, c.Name)
			continue
		}
		notice("stream %s: deleted %s, the claim of a replay that ran while the backup was taken: its dead letter can be replayed again", e.Name, c.Name)
	}
}

// placementWait bounds how long a restore request refused while a cluster
// settles is asked again.
const placementWait = 30 * time.Second

// requestRestore sends the restore request, again (every half second, up
// to placementWait) while a cluster answers that it is settling
// (settle.ClusterSettling; e.g. no suitable peers, 10005: right after a
// stream is deleted under load the meta leader may count a peer
// offline). Nothing was sent yet, so asking again is safe; any
// other refusal, any refusal by a single server, and the last one when
// the wait is over are returned.
func requestRestore(ctx context.Context, nc *nats.Conn, timeout time.Duration, stream string, body []byte) (*api.JSApiStreamRestoreResponse, error) {
	deadline := time.Now().Add(placementWait)
	for {
		msg, err := nc.Request(fmt.Sprintf(api.JSApiStreamRestoreT, stream), body, timeout)
		if err != nil {
			return nil, err
		}
		var resp api.JSApiStreamRestoreResponse
		if err := json.Unmarshal(msg.Data, &resp); err != nil {
			return nil, fmt.Errorf("restore request: %w", err)
		}
		if !resp.IsError() {
			return &resp, nil
		}
		if nc.ConnectedClusterName() == "" || !settle.ClusterSettling(resp.Error.ErrCode) || !time.Now().Before(deadline) {
			return nil, resp.ToError()
		}
		select {
		case <-ctx.Done():
			return nil, errors.Join(ctx.Err(), resp.ToError())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// firstChunkWait bounds how long the first chunk of a restore is sent
// again while nobody takes it.
const firstChunkWait = 3 * time.Second

// restoreSnapshot runs nats-server's restore protocol for stream as jsm.go's
// RestoreSnapshotFromBuffer does: the request with the snapshot's metadata
// (stream configuration and state), each chunk data returns as a request
// to the subject the server named, answered once stored, then an empty
// one answered with the restored stream. Unlike jsm.go it sends the first
// chunk again while no one receives it: in a cluster the stream's leader
// answers the request through one route and announces its subscription to
// the chunks through another, and the answer may arrive first ("no
// responders" for the first chunk, through a node that is not the new
// stream's leader); the server would then wait 5 s for a chunk, give up
// without its RESTORE_COMPLETE advisory, and fail the restore. A stream
// saved while closed (closeStream) is created with its own subjects;
// adjust, when set, changes the configuration further. The
// server creates the stream with the request's configuration, not the one
// in the data.
func restoreSnapshot(ctx context.Context, nc *nats.Conn, timeout time.Duration, stream string, data io.ReadCloser, meta io.ReadCloser,
	adjust func(*api.StreamConfig)) (*api.StreamState, error) {
	defer data.Close()
	defer meta.Close()
	raw, err := io.ReadAll(meta)
	if err != nil {
		return nil, err
	}
	var req api.JSApiStreamRestoreRequest
	if err := json.Unmarshal(raw, &req); err != nil {
		return nil, fmt.Errorf("%s: %w", jsm.SnapshotMetaFile, err)
	}
	if req.Config.Name != stream {
		return nil, fmt.Errorf("%s names stream %q, not %s", jsm.SnapshotMetaFile, req.Config.Name, stream)
	}
	if req.Config.Storage == api.MemoryStorage {
		return nil, jsm.ErrMemoryStreamNotSupported
	}
	reopenConfig(&req.Config)
	if adjust != nil {
		adjust(&req.Config)
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	resp, err := requestRestore(ctx, nc, timeout, stream, body)
	if err != nil {
		return nil, err
	}
	if err := sendChunks(ctx, nc, timeout, resp.DeliverSubject, data); err != nil {
		endRestore(nc, timeout, resp.DeliverSubject)
		return nil, err
	}
	// The empty chunk ends the data. The server stores what it received
	// before it answers: any time. Interrupted meanwhile, it still
	// completes the restore: wait for that too (up to timeout), so that
	// the caller can delete what it restored.
	inbox, err := nc.SubscribeSync(nc.NewInbox())
	if err != nil {
		return nil, err
	}
	defer inbox.Unsubscribe()
	if err := nc.PublishRequest(resp.DeliverSubject, inbox.Subject, nil); err != nil {
		return nil, err
	}
	final, cancel := context.WithTimeout(ctx, time.Hour)
	defer cancel()
	msg, err := inbox.NextMsgWithContext(final)
	if err != nil && ctx.Err() != nil {
		_, _ = inbox.NextMsg(timeout)
		return nil, err
	}
	if err != nil {
		return nil, err
	}
	if settle.NoResponders(msg) {
		return nil, nats.ErrNoResponders
	}
	var created api.JSApiStreamCreateResponse
	if err := json.Unmarshal(msg.Data, &created); err != nil {
		return nil, fmt.Errorf("restore result: %w", err)
	}
	if created.IsError() {
		return nil, created.ToError()
	}
	if created.StreamInfo == nil {
		return nil, fmt.Errorf("restore result without the stream: %q", msg.Data)
	}
	return &created.State, nil
}

// sendChunks sends the snapshot's data to the server's restore, each
// chunk answered once stored.
func sendChunks(ctx context.Context, nc *nats.Conn, timeout time.Duration, subject string, data io.Reader) error {
	chunk := make([]byte, 64<<10)
	for first := true; ; first = false {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, err := data.Read(chunk)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		reply, err := nc.Request(subject, chunk[:n], timeout)
		for deadline := time.Now().Add(firstChunkWait); first && errors.Is(err, nats.ErrNoResponders) && time.Now().Before(deadline); {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
			reply, err = nc.Request(subject, chunk[:n], timeout)
		}
		if err != nil {
			return err
		}
		if jsm.IsErrorResponse(reply) {
			return fmt.Errorf("restore failed: %q", reply.Data)
		}
	}
}

// endRestore ends a restore given up halfway (interrupted, or failed on
// this side) and waits, up to timeout, for the server to say it ended.
// Left alone, the server waits 5 s for the next chunk, then gives
// the restore up without announcing its end (no RESTORE_COMPLETE: the
// running holdfast would wait 30 min before it creates the stream again)
// and keeps the stream it registered at the first chunk with what it had
// stored — after the caller's clean-up delete found nothing to delete.
// The empty chunk ends the data: the server finishes the restore (an
// error for a cut snapshot, or a stream that the caller deletes), says
// so, and answers. A restore the server already ended does not answer.
func endRestore(nc *nats.Conn, timeout time.Duration, subject string) {
	_, _ = nc.Request(subject, nil, timeout)
}

// errMismatch marks a restored consumer that differs from the manifest.
var errMismatch = errors.New("differs from the backup")

// errSnapshotMismatch marks a restored stream whose messages, as the
// server's answer to the restore gives them, differ from the manifest: the
// backup's snapshot is not what its manifest describes. Restoring it again
// gives the same stream.
var errSnapshotMismatch = errors.New("the backup's snapshot is not what its manifest describes (the backup was changed after it was written, or its manifest is another's): restore another backup")

// collided tells whether a failed restore may have raced with the running
// holdfast creating the stream or its consumers again: the name was taken,
// a consumer existed, or a restored consumer differs from the manifest.
func collided(err error) bool {
	return errNameInUse(err) || errors.Is(err, errMismatch) ||
		(err != nil && strings.Contains(err.Error(), "consumer already exists"))
}

// checkRestored compares the restored stream with the manifest and records
// its consumers' ack floors.
func checkRestored(ctx context.Context, js jetstream.JetStream, e StreamEntry, sdir string, r *Restored) error {
	if r.LastSeq != e.LastSeq {
		return fmt.Errorf("restored stream %s ends at sequence %d, the manifest says %d: %w", e.Name, r.LastSeq, e.LastSeq, errSnapshotMismatch)
	}
	if limitsRetention(sdir) && r.Messages != e.Messages {
		return fmt.Errorf("restored stream %s holds %d messages, the manifest says %d: %w", e.Name, r.Messages, e.Messages, errSnapshotMismatch)
	}
	clustered := false
	if len(e.Consumers) > 0 {
		s, err := js.Stream(ctx, e.Name)
		if err != nil {
			return fmt.Errorf("stream %s after the restore: %w", e.Name, err)
		}
		// A clustered server names its cluster in every stream's info.
		clustered = s.CachedInfo().Cluster != nil && s.CachedInfo().Cluster.Name != ""
	}
	for _, c := range e.Consumers {
		info, err := restoredConsumer(ctx, js, e.Name, c.Name, c.AckFloor, clustered)
		if err != nil {
			return fmt.Errorf("consumer %s of stream %s after the restore: %w", c.Name, e.Name, err)
		}
		floor := info.AckFloor.Stream
		if floor < c.AckFloor {
			return fmt.Errorf("restored consumer %s of stream %s has ack floor %d, the manifest says %d: %w", c.Name, e.Name, floor, c.AckFloor, errMismatch)
		}
		r.AckFloors[c.Name] = floor
	}
	return nil
}

// consumerWait bounds how long a restored consumer may take to appear
// and elect its leader; unassignedWait how long one without cluster
// information may take to show the backup's ack floor.
const (
	consumerWait   = 30 * time.Second
	unassignedWait = 5 * time.Second
)

// restoredConsumer looks up a consumer of a stream just restored, whose
// ack floor should be at least floor. In a cluster nats-server answers the
// restore before the consumers are assigned: the stream's leader proposes
// them to the meta leader only once its restore is done. Until then a
// consumer is "not found", or answered by the stream leader's unassigned
// copy (no cluster information, ack floor 0), or by a replica while no
// leader is elected. Each of these is asked again: the first and last for
// up to consumerWait, the unassigned copy, when clustered, for up to
// unassignedWait (on a single server no consumer has cluster
// information).
func restoredConsumer(ctx context.Context, js jetstream.JetStream, stream, name string, floor uint64, clustered bool) (*jetstream.ConsumerInfo, error) {
	start := time.Now()
	for {
		var info *jetstream.ConsumerInfo
		// A consumer not yet assigned may be left unanswered.
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		cons, err := js.Consumer(rctx, stream, name)
		cancel()
		waited := time.Since(start)
		switch {
		case err == nil:
			info = cons.CachedInfo()
			switch {
			case clustered && info.Cluster == nil && info.AckFloor.Stream < floor && waited < unassignedWait:
			case info.Cluster != nil && info.Cluster.Leader == "":
				err = fmt.Errorf("no leader elected %s after the restore", consumerWait)
			default:
				return info, nil
			}
		case errors.Is(err, jetstream.ErrConsumerNotFound):
			err = fmt.Errorf("%w: not there %s after the restore", err, consumerWait)
		case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
			err = fmt.Errorf("unanswered %s after the restore: %w", consumerWait, err)
		default:
			return nil, err
		}
		if waited >= consumerWait {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
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

// Chunk sizes of a restore, in bytes of the backup's decompressed data.
// jsm.go sends what one Read returns as one chunk (at most 64 KiB) and
// waits for the server's answer before it reads the next.
const (
	minChunk   = 512
	firstChunk = 4 << 10
	// maxChunk is the server's own block size: no chunk asks more of it
	// than one block of the backup's.
	maxChunk = 1 << 20
	// blockSize is the s2 block size of the data sent: the server decodes
	// a block only once it has all of it, then stores its messages.
	blockSize = 4 << 10
	// maxBlock is the most one block takes once compressed: s2 stores a
	// block that does not compress as it is, with a header of 8 bytes, and
	// starts the stream with one of 10.
	maxBlock = blockSize + 8 + 10
	// chunkTarget is how long the server should take for one chunk.
	// nats-server fails a restore with "stalled" ("io: read/write on
	// closed pipe" at the client) when 5 s pass between a chunk's arrival
	// and the end of its write into the restore, or between two chunks:
	// and a chunk's write ends only when the restore has taken all of it,
	// that is after it stored every message of the blocks before the
	// chunk's last. A quarter of a second leaves a factor of 20 for a
	// store that slows down from one chunk to the next.
	chunkTarget = 250 * time.Millisecond
)

// restoreReader hands a restore the backup's data (an s2 stream) again
// s2-compressed, in chunks of whole small blocks, each sized after how
// long the server took for the previous one (the time between two Reads)
// so that each takes about chunkTarget.
//
// The backup's own blocks are the server's, of 1 MiB decompressed: the
// server stores all the messages of such a block (60,000 of zero-byte
// payload) before it takes any byte of the next, which into a store with
// sync = "always" (a flush per message) can take more than the 5 s the
// server allows, however small the chunks sent.
type restoreReader struct {
	file     io.ReadCloser
	read     uint64 // bytes of file read, for the progress
	dec      *s2.Reader
	enc      *s2.Writer
	out      bytes.Buffer // compressed, not yet handed out
	buf      []byte
	size     int // decompressed bytes the next chunk should hold
	sent     int // decompressed bytes of the last chunk
	eof      bool
	last     time.Time
	progress func(done uint64)
	now      func() time.Time // time.Now when nil
}

// newRestoreReader returns a restoreReader of the backup data in file.
func newRestoreReader(file io.ReadCloser, progress func(done uint64)) *restoreReader {
	r := &restoreReader{file: file, size: firstChunk, buf: make([]byte, blockSize), progress: progress}
	r.dec = s2.NewReader(countingReader{r: file, n: &r.read})
	r.enc = s2.NewWriter(&r.out, s2.WriterBlockSize(blockSize), s2.WriterConcurrency(1))
	return r
}

// countingReader counts the bytes read through it into n.
type countingReader struct {
	r io.Reader
	n *uint64
}

func (c countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	*c.n += uint64(n)
	return n, err
}

func (r *restoreReader) clock() time.Time {
	if r.now != nil {
		return r.now()
	}
	return time.Now()
}

func (r *restoreReader) Read(b []byte) (int, error) {
	if r.out.Len() == 0 {
		if r.eof {
			return 0, io.EOF
		}
		if !r.last.IsZero() {
			took := max(r.clock().Sub(r.last), time.Millisecond)
			size := int(float64(r.sent) * float64(chunkTarget) / float64(took))
			r.size = min(max(size, minChunk), maxChunk, 2*r.sent)
		}
		// Whole blocks, until the chunk holds r.size bytes or another
		// block might not fit into b. Flush ends each block: the server
		// can store all of a chunk once it has it.
		r.sent = 0
		for r.sent < r.size && !r.eof && (r.sent == 0 || r.out.Len()+maxBlock <= len(b)) {
			n, err := io.ReadFull(r.dec, r.buf[:min(blockSize, r.size-r.sent)])
			switch {
			case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
				r.eof = true
			case err != nil:
				return 0, fmt.Errorf("cannot read the backup data: %w", err)
			}
			if n == 0 {
				break
			}
			if _, err := r.enc.Write(r.buf[:n]); err != nil {
				return 0, err
			}
			if err := r.enc.Flush(); err != nil {
				return 0, err
			}
			r.sent += n
		}
		if r.progress != nil {
			r.progress(r.read)
		}
		if r.out.Len() == 0 {
			return 0, io.EOF
		}
	}
	n, _ := r.out.Read(b)
	r.last = r.clock()
	return n, nil
}

func (r *restoreReader) Close() error {
	r.enc.Close()
	return r.file.Close()
}

// snapshotConfig returns the configuration of the stream in a snapshot
// directory.
func snapshotConfig(sdir string) (api.StreamConfig, error) {
	raw, err := os.ReadFile(filepath.Join(sdir, jsm.SnapshotMetaFile))
	if err != nil {
		return api.StreamConfig{}, err
	}
	var meta struct {
		Config api.StreamConfig `json:"config"`
	}
	if err := json.Unmarshal(raw, &meta); err != nil {
		return api.StreamConfig{}, fmt.Errorf("%s: %w", filepath.Join(sdir, jsm.SnapshotMetaFile), err)
	}
	return meta.Config, nil
}

// snapshotSubjects returns the subjects of the stream in a snapshot
// directory.
func snapshotSubjects(sdir string) ([]string, error) {
	cfg, err := snapshotConfig(sdir)
	return cfg.Subjects, err
}

// configured returns what makes stream take the replicas opts.Replicas
// gives it when restored, without the backup's placement (a cluster's
// name or tags there need not exist here); nil when opts.Replicas does
// not name it.
//
// It also puts the stream's subjects behind group commit's prefix, or
// takes them from behind it, as opts.GroupCommit says.
func configured(opts RestoreOptions, stream string) func(*api.StreamConfig) {
	r, replicas := opts.Replicas[stream]
	gcOn, gc := opts.GroupCommit[stream]
	if (!replicas || r < 1) && !gc {
		return nil
	}
	return func(c *api.StreamConfig) {
		if replicas && r >= 1 {
			c.Replicas = r
			c.Placement = nil
		}
		if gc {
			setGroupCommit(c, gcOn)
		}
	}
}

// setGroupCommit makes c's subjects those of a stream with group commit
// on or off, as embedded/bootstrap's StreamSpec does.
func setGroupCommit(c *api.StreamConfig, on bool) {
	isOn := c.SubjectTransform != nil && subjects.IsGroupCommit(c.SubjectTransform.Source)
	switch {
	case on && !isOn:
		c.Subjects = subjects.GroupCommitSubjects(c.Name, c.Subjects)
		c.SubjectTransform = &api.SubjectTransformConfig{Source: subjects.GroupCommit(c.Name, ">"), Destination: ">"}
		c.AllowAtomicPublish = true
	case !on && isOn:
		c.Subjects = subjects.ConfiguredSubjects(c.Name, c.Subjects)
		c.SubjectTransform = nil
	}
}

// checkReplicas refuses, before anything changed, a stream the backup
// holds with more than one replica when the server nc is connected to is
// not part of a cluster: nats-server refuses it ("replicas > 1 not
// supported in non-clustered mode") only once its restore started, after
// a Replace deleted the stream there.
func checkReplicas(nc *nats.Conn, dir string, todo []StreamEntry) error {
	if nc.ConnectedClusterName() != "" {
		return nil
	}
	var problems []string
	for _, e := range todo {
		cfg, err := snapshotConfig(filepath.Join(dir, filepath.FromSlash(e.Dir)))
		if err != nil {
			return fmt.Errorf("stream %s of the backup: %w", e.Name, err)
		}
		if cfg.Replicas > 1 {
			problems = append(problems, fmt.Sprintf("%s has %d replicas in the backup", e.Name, cfg.Replicas))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("stream(s) of the backup come from a cluster: %s, and this server, not part of a cluster, holds one copy of a stream only; "+
			"nothing was restored: restore the backup into a cluster of at least that many nodes, or leave those streams out with --stream",
			strings.Join(problems, "; "))
	}
	return nil
}

// checkOverlaps refuses, before anything changed, a restore of a stream
// whose subjects overlap those of a stream on the server that the restore
// keeps (another name): the server would refuse that stream halfway, with
// the streams before it restored and the others not ("subjects overlap
// with an existing stream", naming neither).
func checkOverlaps(ctx context.Context, js jetstream.JetStream, dir string, todo []StreamEntry) error {
	restoring := map[string]bool{}
	for _, e := range todo {
		restoring[e.Name] = true
	}
	type onServer struct {
		name     string
		subjects []string
	}
	var others []onServer
	lister := js.ListStreams(ctx)
	for info := range lister.Info() {
		if !restoring[info.Config.Name] {
			others = append(others, onServer{info.Config.Name, info.Config.Subjects})
		}
	}
	if err := lister.Err(); err != nil {
		return fmt.Errorf("cannot list the streams on the server: %w", err)
	}
	var problems []string
	for _, e := range todo {
		subjects, err := snapshotSubjects(filepath.Join(dir, filepath.FromSlash(e.Dir)))
		if err != nil {
			return fmt.Errorf("stream %s of the backup: %w", e.Name, err)
		}
		for _, o := range others {
			for _, a := range subjects {
				for _, b := range o.subjects {
					if server.SubjectsCollide(a, b) {
						problems = append(problems, fmt.Sprintf("%s (subject %s) overlaps stream %s on the server (subject %s)", e.Name, a, o.name, b))
					}
				}
			}
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("the server cannot hold stream(s) of the backup beside its own: %s; nothing was restored: "+
			"delete or change the server's stream (nats stream edit/rm), or restore the others with --stream",
			strings.Join(problems, "; "))
	}
	return nil
}
