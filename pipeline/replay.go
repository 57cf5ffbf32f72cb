package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/jsm.go/api"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/internal/subjects"
	"github.com/holdfast-io/holdfast/pipeline/handler"
)

// Replaying a dead letter hands it to the handler of the consumer that
// failed it, and to no other: `holdfast dlq replay` asks that consumer's
// workers, in the running daemon, on subjects.Replay(consumer). The workers
// read the dead letter, run their handler on the original message (its
// subject, headers, payload and idempotency key), and delete the dead
// letter only after the handler succeeded; otherwise it stays where it is.
// Nothing is republished, so other consumers of the stream never see it
// again.

// HeaderReplayedFrom is set on the message a handler sees when it replays
// a dead letter: "DLQSTREAM:seq" of the dead letter.
const HeaderReplayedFrom = "Holdfast-Replayed-From"

// replayQueue makes one set of workers answer a request when two run for a
// moment (a reload).
const replayQueue = "holdfast"

// replaysRunning holds "STREAM:seq" of each dead letter being replayed in
// this process, by any set of workers.
var replaysRunning sync.Map

// errReplayBusy is a dead letter another replay or resume is handling.
var errReplayBusy = errors.New("being handled right now")

// claimTTL bounds a cluster-wide claim (see claimReplay) whose node died
// before releasing it: the server deletes the claim consumer after that
// long. No replay's handler runs that long: `holdfast dlq replay` waits
// for the longest handler timeout plus 30 s.
const claimTTL = time.Hour

// claimReplay claims the dead letter stream:seq for one replay or resume,
// and returns its release. The claim comes before the read, and the dead
// letter is deleted before the claim is released: a request that gets the
// claim afterwards finds it gone. In this process the claim is an entry
// of replaysRunning; in a cluster also a consumer on the dead-letter
// stream named after the sequence, created through the meta leader's Raft
// log, which only one node's create can win: every node of a cluster
// runs workers of the same consumers, each resumes every parked message
// at a whole-cluster restart and answers `holdfast dlq replay` through
// itself, so without the claim several of them would run the handler on
// the same dead letter. A claim that cannot be taken is an error: the
// dead letter stays for a later replay or start.
func (w *Workers) claimReplay(ctx context.Context, stream string, seq uint64) (release func(), err error) {
	local := stream + ":" + strconv.FormatUint(seq, 10)
	if _, busy := replaysRunning.LoadOrStore(local, struct{}{}); busy {
		return nil, fmt.Errorf("dead letter %s #%d is %w (by another dlq replay, or by the workers resuming it after a restart): its handler runs once; see holdfast dlq ls afterwards", stream, seq, errReplayBusy)
	}
	if w.nc.ConnectedClusterName() == "" {
		return func() { replaysRunning.Delete(local) }, nil
	}
	name := subjects.ReplayClaim(seq)
	node := w.nc.ConnectedServerName()
	_, err = w.js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{
		Durable: name,
		// Unique per claim: a create with the same config would succeed
		// again (the server treats it as idempotent).
		Description:       fmt.Sprintf("holdfast: dead letter #%d being replayed on %s (%s)", seq, node, nats.NewInbox()),
		DeliverPolicy:     jetstream.DeliverNewPolicy,
		AckPolicy:         jetstream.AckNonePolicy,
		MemoryStorage:     true,
		Replicas:          1,
		InactiveThreshold: claimTTL,
	})
	if err != nil {
		replaysRunning.Delete(local)
		if errors.Is(err, jetstream.ErrConsumerExists) {
			holder := "another node"
			if c, ierr := w.js.Consumer(ctx, stream, name); ierr == nil {
				holder = c.CachedInfo().Config.Description
			}
			return nil, fmt.Errorf("dead letter %s #%d is %w on another node of the cluster (%s): its handler runs once; see holdfast dlq ls afterwards "+
				"(a node that died while replaying it holds it for up to %s: nats consumer rm %s %s)", stream, seq, errReplayBusy, holder, claimTTL, stream, name)
		}
		return nil, fmt.Errorf("dead letter %s #%d: cannot claim it for this node (consumer %s on %s): %w; it is kept for a later replay or start", stream, seq, name, stream, err)
	}
	return func() {
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := w.js.DeleteConsumer(dctx, stream, name); err != nil {
			w.log.Warn("cannot release the claim on a dead letter: the server removes it within the hour", "dead_letter", local, "consumer", name, "err", err)
		}
		replaysRunning.Delete(local)
	}, nil
}

// ReplayRequest asks a consumer's workers to run their handler on one of
// its dead letters.
type ReplayRequest struct {
	// Stream and Seq locate the dead letter.
	Stream string `json:"stream"`
	Seq    uint64 `json:"seq"`
	// MsgID is the dead letter's Nats-Msg-Id: the request is for that
	// message only, not for whatever has that sequence now.
	MsgID string `json:"msg_id"`
}

// ReplayReply is the workers' answer.
type ReplayReply struct {
	// Outcome is the handler's verdict ("success", "retry", "permanent"),
	// or "" when the replay could not run.
	Outcome string `json:"outcome,omitempty"`
	// Error says why the replay failed; the dead letter is kept.
	Error string `json:"error,omitempty"`
}

func (w *Workers) subscribeReplay() (*nats.Subscription, error) {
	sub, err := w.nc.QueueSubscribe(subjects.Replay(w.opts.Consumer), replayQueue, w.onReplay)
	if err != nil {
		return nil, fmt.Errorf("consumer %s: cannot subscribe to replay requests: %w", w.opts.Consumer, err)
	}
	return sub, nil
}

func (w *Workers) onReplay(nm *nats.Msg) {
	run := func() {
		rep := w.replay1(nm.Data)
		data, _ := json.Marshal(rep)
		if err := nm.Respond(data); err != nil {
			w.log.Warn("cannot answer a replay request", "err", err)
		}
	}
	if !w.spawn(run) {
		run()
	}
}

// replay1 runs one replay request.
func (w *Workers) replay1(data []byte) ReplayReply {
	var req ReplayRequest
	if err := json.Unmarshal(data, &req); err != nil {
		return ReplayReply{Error: fmt.Sprintf("unreadable replay request: %v", err)}
	}
	// Any stream of this consumer's dead letters: the one it dead-letters
	// to now, or one it did before (a changed dead_letter). Only holdfast
	// publishes on dlq.<CONSUMER>.> (checked below), whatever the stream.
	if w.stopping.Load() {
		return ReplayReply{Error: fmt.Sprintf("consumer %s is shutting down: try again when holdfast runs", w.opts.Consumer)}
	}
	// One replay of a dead letter at a time in this process, so that two
	// replays at once (two `dlq replay --all`) do not both run the
	// handler on it. The claim comes before the read, and the dead letter
	// is deleted before the claim is released: a request that gets the
	// claim afterwards finds it gone.
	ctx, cancel := context.WithTimeout(w.handlerCtx, 10*time.Second)
	defer cancel()
	release, err := w.claimReplay(ctx, req.Stream, req.Seq)
	if err != nil {
		return ReplayReply{Error: err.Error()}
	}
	defer release()
	s, err := w.js.Stream(ctx, req.Stream)
	if err != nil {
		return ReplayReply{Error: fmt.Sprintf("dead-letter stream %s: %v", req.Stream, err)}
	}
	raw, err := s.GetMsg(ctx, req.Seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return ReplayReply{Error: fmt.Sprintf("dead letter %s #%d is gone (replayed or purged already?)", req.Stream, req.Seq)}
	}
	if err != nil {
		return ReplayReply{Error: fmt.Sprintf("dead letter %s #%d: %v", req.Stream, req.Seq, err)}
	}
	if id := raw.Header.Get(nats.MsgIdHdr); req.MsgID == "" || id != req.MsgID {
		return ReplayReply{Error: fmt.Sprintf("dead letter %s #%d has Nats-Msg-Id %q, not %q as asked: list them again with holdfast dlq ls", req.Stream, req.Seq, id, req.MsgID)}
	}
	dl := ParseDeadLetter(req.Stream, raw)
	if dl.Consumer != w.opts.Consumer {
		return ReplayReply{Error: fmt.Sprintf("dead letter %s #%d belongs to consumer %q, not %s", req.Stream, req.Seq, dl.Consumer, w.opts.Consumer)}
	}
	m, err := ReplayMessage(dl)
	if err != nil {
		return ReplayReply{Error: err.Error()}
	}
	m.Consumer = w.opts.Consumer
	from := req.Stream + ":" + strconv.FormatUint(req.Seq, 10)

	res := w.handleOutOfBand(m)
	dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer dcancel()
	if res.Outcome != handler.Success {
		reply := ReplayReply{Outcome: res.Outcome.String(), Error: fmt.Sprintf("the handler failed (%s): %s; the dead letter is kept", res.Outcome, res.Reason)}
		if dl.Header.Get(HeaderInterrupted) == "" || w.handlerCtx.Err() != nil {
			w.log.Warn("replayed dead letter failed again: it stays in the dead-letter stream", "dead_letter", from,
				"seq", m.Sequence, "outcome", res.Outcome.String(), "reason", res.Reason)
			return reply
		}
		// A parked message has its verdict now: an ordinary dead letter,
		// as the workers' resume makes it. Left parked, the next start
		// would hand it to the handler again.
		if err := w.deadLetterParked(dctx, m, dl, res.Reason); err != nil {
			w.log.Error("replayed parked message failed, and its dead letter could not be stored: it stays parked", "dead_letter", from, "err", err)
			reply.Error += fmt.Sprintf(" (still parked: its dead letter could not be stored: %v)", err)
			return reply
		}
		if _, err := deleteDeadLetter(dctx, s, req.Seq); err != nil {
			w.log.Error("replayed parked message dead-lettered, but its parked copy could not be removed: the next start hands it to the handler again",
				"dead_letter", from, "err", err)
		}
		w.stats.DeadLettered.Add(1)
		w.log.Warn("replayed parked message failed: now an ordinary dead letter", "dead_letter", from,
			"seq", m.Sequence, "outcome", res.Outcome.String(), "reason", res.Reason)
		reply.Error = fmt.Sprintf("the handler failed (%s): %s; the parked message is now an ordinary dead letter with this reason", res.Outcome, res.Reason)
		return reply
	}
	if _, err := deleteDeadLetter(dctx, s, req.Seq); err != nil {
		w.log.Error("replayed dead letter handled, but it could not be removed: a next replay runs the handler again", "dead_letter", from, "err", err)
		return ReplayReply{Outcome: res.Outcome.String(), Error: fmt.Sprintf("handled, but the dead letter could not be removed: %v", err)}
	}
	w.log.Info("dead letter replayed", "dead_letter", from, "seq", m.Sequence, "subject", m.Subject, "idempotency_key", m.IdempotencyKey)
	return ReplayReply{Outcome: res.Outcome.String()}
}

// handleOutOfBand runs the handler on a message that did not come from
// the fetcher (a replayed dead letter, a resumed interrupted message),
// counted like one that did.
func (w *Workers) handleOutOfBand(m *handler.Message) handler.Result {
	m.OutOfBand = true
	w.stats.InFlight.Add(1)
	start := time.Now()
	res := w.handleReplay(m)
	took := time.Since(start)
	w.stats.InFlight.Add(-1)
	w.stats.Processed.Add(1)
	if w.opts.OnResult != nil {
		w.opts.OnResult(w.opts.Consumer, res, took)
	}
	return res
}

// handleReplay calls the handler, turning a panic into a retry.
func (w *Workers) handleReplay(m *handler.Message) (res handler.Result) {
	defer func() {
		if r := recover(); r != nil {
			w.log.Error("handler panicked", "seq", m.Sequence, "panic", r, "stack", string(debug.Stack()))
			res = handler.RetryLater(fmt.Sprintf("handler panicked: %v", r))
		}
		res.Reason = handler.OneLine(res.Reason, maxReason)
	}()
	return w.opts.Handler.Handle(w.handlerCtx, m)
}

// ReplayMessage rebuilds the message a dead letter was made from, as its
// handler saw it: original subject, stream, sequence and headers (the
// Holdfast-* headers of the dead letter removed, Holdfast-Replayed-From
// added), its Nats-Msg-Id back, and the same idempotency key (that
// Nats-Msg-Id, else "STREAM:seq" of the original).
func ReplayMessage(dl DeadLetter) (*handler.Message, error) {
	if dl.OriginalSubject == "" || dl.OriginalStream == "" || dl.OriginalSeq == 0 {
		return nil, fmt.Errorf("dead letter %s #%d lacks %s, %s or %s: not a holdfast dead letter", dl.Stream, dl.Seq,
			HeaderOriginalSubject, HeaderOriginalStream, HeaderOriginalSeq)
	}
	h := nats.Header{}
	for k, vs := range dl.Header {
		if isDeadLetterHeader(k) || k == nats.MsgIdHdr {
			continue
		}
		h[k] = append([]string(nil), vs...)
	}
	key := dl.OriginalStream + ":" + strconv.FormatUint(dl.OriginalSeq, 10)
	if id := dl.Header.Get(HeaderOriginalMsgID); id != "" {
		h.Set(nats.MsgIdHdr, id)
		key = id
	}
	h.Set(HeaderReplayedFrom, dl.Stream+":"+strconv.FormatUint(dl.Seq, 10))
	published := dl.OriginalTime
	if published.IsZero() {
		published = dl.FailedAt // a dead letter that does not say
	}
	return &handler.Message{
		Subject:        dl.OriginalSubject,
		Stream:         dl.OriginalStream,
		Consumer:       dl.Consumer,
		Sequence:       dl.OriginalSeq,
		Delivery:       dl.Deliveries + 1,
		IdempotencyKey: key,
		Header:         h,
		Data:           dl.Data,
		Published:      published,
		StreamCreated:  dl.OriginalStreamCreated,
	}, nil
}

// ErrNoReplayWorkers means no workers of the consumer answer replay
// requests: holdfast is not running, or the consumer has no in-process
// workers.
var ErrNoReplayWorkers = errors.New("no holdfast workers answer")

// RequestReplay asks the workers of the dead letter's consumer, over nc, to
// run their handler on it, and waits up to timeout for the verdict. It
// returns nil when the handler succeeded and the dead letter was removed.
func RequestReplay(ctx context.Context, nc *nats.Conn, dl DeadLetter, timeout time.Duration) error {
	from := dl.Stream + " #" + strconv.FormatUint(dl.Seq, 10)
	if dl.Consumer == "" {
		return fmt.Errorf("dead letter %s is on %s, not on dlq.<CONSUMER>.>: not a holdfast dead letter", from, dl.Subject)
	}
	id := dl.Header.Get(nats.MsgIdHdr)
	if id == "" {
		return fmt.Errorf("dead letter %s has no Nats-Msg-Id: not a holdfast dead letter", from)
	}
	data, err := json.Marshal(ReplayRequest{Stream: dl.Stream, Seq: dl.Seq, MsgID: id})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	subj := subjects.Replay(dl.Consumer)
	msg, err := nc.RequestWithContext(ctx, subj, data)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return fmt.Errorf("replay %s: %w on %s: is holdfast running, and does consumer %s have workers (> 0)? The dead letter is kept",
			from, ErrNoReplayWorkers, subj, dl.Consumer)
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout):
		return fmt.Errorf("replay %s: no verdict within %s: the handler may still be running (see the holdfast log); the dead letter is removed only once it succeeded", from, timeout)
	case err != nil:
		return fmt.Errorf("replay %s: %w", from, err)
	}
	var rep ReplayReply
	if err := json.Unmarshal(msg.Data, &rep); err != nil {
		return fmt.Errorf("replay %s: unreadable answer: %v", from, err)
	}
	if rep.Error != "" {
		return fmt.Errorf("replay %s: %s", from, rep.Error)
	}
	return nil
}

// Purged is what PurgeDeadLetters did.
type Purged struct {
	// Deleted is how many dead letters it deleted.
	Deleted uint64 `json:"purged"`
	// Parked is how many parked messages it kept among them: messages
	// interrupted on their last delivery, not failed, which the workers
	// hand to the handler when they start (see HeaderInterrupted).
	Parked uint64 `json:"kept_parked"`
}

// PurgeDeadLetters deletes for good the dead letters in stream, only
// consumer's when it is not "", up to sequence upto, or up to the last
// one stored when it was called when upto is 0: those stored since
// stay. Parked messages stay too: they wait for their handler, not for
// an operator's verdict. It reads the dead letters first to find them;
// the dead letters before the oldest parked one go in one purge, those
// after it one by one.
func PurgeDeadLetters(ctx context.Context, js jetstream.JetStream, stream, consumer string, upto uint64) (Purged, error) {
	errPast := errors.New("past upto")
	var last uint64
	var parked, after []uint64 // after: dead letters after the oldest parked message
	err := ListDeadLetters(ctx, js, stream, consumer, func(dl DeadLetter) error {
		if upto > 0 && dl.Seq > upto {
			return errPast
		}
		last = dl.Seq
		switch {
		case dl.Header.Get(HeaderInterrupted) != "":
			parked = append(parked, dl.Seq)
		case len(parked) > 0:
			after = append(after, dl.Seq)
		}
		return nil
	})
	if err != nil && !errors.Is(err, errPast) {
		return Purged{}, err
	}
	res := Purged{Parked: uint64(len(parked))}
	if last == 0 {
		return res, nil
	}
	if len(parked) > 0 {
		last = parked[0] - 1
	}
	if last > 0 {
		if res.Deleted, err = purgeBelow(ctx, js.Conn(), stream, consumer, last+1); err != nil {
			return res, err
		}
	}
	if len(after) == 0 {
		return res, nil
	}
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return res, fmt.Errorf("dead-letter stream %s: %w", stream, err)
	}
	for _, seq := range after {
		gone, err := deleteDeadLetter(ctx, s, seq)
		if err != nil {
			return res, fmt.Errorf("dead letter %s #%d: %w", stream, seq, err)
		}
		if !gone {
			res.Deleted++
		}
	}
	return res, nil
}

// purgeTimeout bounds each request of PurgeDeadLetters that deletes.
const purgeTimeout = 30 * time.Second

// deleteDeadLetter deletes the dead letter seq of s; gone says it was
// removed already (replayed or purged meanwhile), which is no error:
// gone is what the caller asked for.
func deleteDeadLetter(ctx context.Context, s jetstream.Stream, seq uint64) (gone bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, purgeTimeout)
	defer cancel()
	if err = s.DeleteMsg(ctx, seq); err == nil {
		return false, nil
	}
	// The server answers the delete of a missing message with a failure
	// that only its text tells apart: read it back.
	if _, gerr := s.GetMsg(ctx, seq); errors.Is(gerr, jetstream.ErrMsgNotFound) {
		return true, nil
	}
	return false, err
}

// purgeBelow purges the messages of stream below sequence seq, only
// consumer's dead letters when it is not "", and returns how many.
func purgeBelow(ctx context.Context, nc *nats.Conn, stream, consumer string, seq uint64) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, purgeTimeout)
	defer cancel()
	req := api.JSApiStreamPurgeRequest{Sequence: seq}
	if consumer != "" {
		req.Subject = subjects.DeadLetters(consumer)
	}
	body, err := json.Marshal(req)
	if err != nil {
		return 0, err
	}
	msg, err := nc.RequestWithContext(ctx, fmt.Sprintf(api.JSApiStreamPurgeT, stream), body)
	if err != nil {
		return 0, err
	}
	var resp api.JSApiStreamPurgeResponse
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return 0, fmt.Errorf("unreadable answer %q: %w", msg.Data, err)
	}
	if resp.IsError() {
		return 0, resp.ToError()
	}
	return resp.Purged, nil
}
