// Package forward links an edge to its hub: the forward handler that
// publishes each message of a consumer to the hub's stream across a
// leafnode link (Forwarder), the hub-side tracking of the edges it hears
// from (EdgeTracker), and the view of links, forwarders and stream sources
// that /healthz, /metrics and `holdfast status` read (EdgeView).
package forward

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/holdfast-io/holdfast/internal/subjects"
	"github.com/holdfast-io/holdfast/pipeline/handler"
)

// Headers a forwarded message carries: where it came from.
const (
	HeaderOriginServer        = "Holdfast-Origin-Server"
	HeaderOriginStream        = "Holdfast-Origin-Stream"
	HeaderOriginStreamCreated = "Holdfast-Origin-Stream-Created"
	HeaderOriginSeq           = "Holdfast-Origin-Seq"
	HeaderOriginSubject       = "Holdfast-Origin-Subject"
	HeaderOriginTime          = "Holdfast-Origin-Time"
	HeaderOriginMsgID         = "Holdfast-Origin-Msg-Id"
	// HeaderOriginPending is how many messages were waiting on the edge
	// behind this one when it was forwarded: the hub's view of each
	// edge's backlog, as of its last message.
	HeaderOriginPending = "Holdfast-Origin-Pending"
	// HeaderOriginResent marks a message sent again because the hub had
	// acknowledged it and lost it (its store wiped or put back).
	HeaderOriginResent = "Holdfast-Origin-Resent"
	// HeaderOriginLost is how many messages the hub lost that the edge no
	// longer held either, since the edge's start: lost on both sides.
	HeaderOriginLost = "Holdfast-Origin-Lost"
)

// MsgID is the Nats-Msg-Id of a forwarded message: unique per edge,
// stream, sequence and the time the edge stored the message, so that the
// hub's stream stores each message once however often it is sent. The
// stored time tells apart messages with the same sequence: those of a
// stream recreated on the edge (sequences from 1 again) and those
// published after a store was put back from an older backup (the backup's
// sequences used again). It names no stream creation time: a restore
// (holdfast restore) gives the stream a new one but keeps its messages,
// which are then sent again under the same ids.
func MsgID(server, stream string, seq uint64, stored time.Time) string {
	return server + ":" + stream + ":" + strconv.FormatUint(seq, 10) + ":" + strconv.FormatInt(stored.UnixNano(), 10)
}

// Subject fills a destination template: {server} is the edge's
// name, {subject} the original subject.
func Subject(template, server, subject string) string {
	return strings.NewReplacer("{server}", server, "{subject}", subject).Replace(template)
}

// ErrDuplicateWindow is returned when the hub's stream deduplicates over a
// shorter time than forwarding must be free of duplicates for.
var ErrDuplicateWindow = errors.New("the hub's stream duplicate window is too short")

// Options configures a Forwarder.
type Options struct {
	// ServerName is this edge's server.name.
	ServerName string
	// Stream and Consumer are the local consumer whose messages are
	// forwarded (for the backlog).
	Stream, Consumer string
	// Subject is the destination template (see Subject).
	Subject string
	// Domain is the hub's JetStream domain; "" uses the JetStream nc
	// reaches without one.
	Domain string
	// Timeout bounds one publish, waiting for the hub's PubAck.
	Timeout time.Duration
	// MinDuplicateWindow is the shortest duplicate window the hub's stream
	// may have when the hub's position cannot be read (a Subject template
	// without {server} or {subject}): the longest outage forwarding stays
	// free of duplicates through. With the position, the window only
	// guards a publish still on its way while it is sent again, and twice
	// Timeout is enough.
	MinDuplicateWindow time.Duration
	// LinkUp reports whether a leafnode link to the hub is up; nil means
	// always.
	LinkUp func() bool
	// Clustered is set on a node of an edge cluster: every node's workers
	// pull from the consumer, so the messages do not go out in order and
	// the hub's position cannot decide (see MinDuplicateWindow).
	Clustered bool
	// StartBy is when Open stops waiting for the link to the hub (zero:
	// StartWait after Open began): the forwarders opened at one start
	// share one wait for an unreachable hub.
	StartBy time.Time
	// Domains returns the JetStream domains reachable over the leafnode
	// links now (nil: none but Domain). The check refuses to forward
	// while a stream of another of them takes the destination subjects
	// too: a JetStream publish goes to every stream that takes its
	// subject, so each message would also be stored there.
	Domains func() []string
	// IdleCheck is how often the hub's streams are looked at again while
	// nothing is forwarded (0: 30 s): a stream deleted and created anew,
	// or put back from an older copy, while the link stayed up and no
	// publish failed, is noticed then and what it lost is sent again.
	IdleCheck time.Duration
}

// Stats counts what a Forwarder did since start.
type Stats struct {
	Forwarded  atomic.Uint64 // messages the hub stored (PubAck)
	Duplicates atomic.Uint64 // PubAcks saying the hub had it already
	Refused    atomic.Uint64 // messages failed at once (too large, refused by the hub)
	Skipped    atomic.Uint64 // messages not sent again: the hub's position shows it holds them
	// Untrusted counts hub positions not taken: the last message on the
	// hub for this edge was not one the edge sent.
	Untrusted atomic.Uint64
	Errors    atomic.Uint64 // publishes that failed and were retried
	Batches   atomic.Uint64 // atomic batches the hub committed
	// Resent counts messages the hub acknowledged and then lost (its
	// store wiped or put back from an older copy), sent again from the
	// edge's stream; Gone those lost on both sides: the edge's stream no
	// longer held them.
	Resent atomic.Uint64
	Gone   atomic.Uint64
	// LastForward is when the hub last acknowledged a message (unix ns),
	// LastOriginTime when that message was stored on the edge.
	LastForward    atomic.Int64
	LastOriginTime atomic.Int64
}

// Forwarder is the forward handler: it publishes each message to the
// hub's JetStream and succeeds only on the hub's PubAck, so that the
// message is acked locally only once the hub has it.
//
// It sends in order: one worker calls Handle, and a publish that failed
// for a reason of the hub or the link is sent again in place, within the
// same delivery. So the hub holds every message of the consumer up to
// the highest origin sequence it holds (its position), but for those
// dead-lettered instead; after each reconnect the Forwarder reads that
// position back from the hub and does not send again what lies at or
// below it, however long the outage was. The Nats-Msg-Id is a second
// guard, for a publish still on its way while it is sent again.
type Forwarder struct {
	local jetstream.JetStream // this node's JetStream: stream incarnations, the backlog
	hub   jetstream.JetStream // the hub's, through the leafnode
	nc    *nats.Conn
	opts  Options
	log   *slog.Logger
	stats Stats

	mu           sync.Mutex
	incarnations map[string]incarnation
	// streamEvents counts the server's advisories about the local stream
	// (created, deleted, restored, updated...), which eventSub takes: an
	// incarnation looked up before the last of them is looked up again.
	// Without eventSub every message newer than the lookup is.
	streamEvents atomic.Uint64
	eventSub     *nats.Subscription
	hubStream    string   // the hub streams that take the destination subjects (comma-separated)
	hubMaxMsg    int32    // the largest max_msg_size of those streams, 0 when one is unlimited
	hubSubjects  []string // the subjects the hub's streams take (nil: not known)
	hubAtomic    bool     // the hub's one stream for the destination takes atomic batches
	noDirect     string   // the hub stream last warned of for lacking allow_direct
	checkErr     error    // why forwarding waits for the hub (nil: the hub passed the check)
	checkedDoms  string   // the other domains when the hub was last checked
	checkedDowns uint64   // downs when the last check that passed began
	// storeErr is why the hub's stream refused the last publish while it
	// cannot store for now (full with discard new, out of storage,
	// sealed), "" otherwise; forwarding waits until storeRetryAt and
	// tries again.
	storeErr     string
	storeRetryAt time.Time
	// pos is the hub's position for this consumer, read at each check of
	// the hub and moved on by each PubAck; ordered is set once Open has
	// set the consumer back to its ack floor, so that the messages go out
	// in order (and pos may be used).
	pos     position
	ordered bool
	// refused holds the messages the hub refused in this run (origin
	// sequence -> stored time): given back when their dead letter fails,
	// they come again after later ones went on, and are no sign that the
	// hub holds them, whatever the position says.
	refused map[uint64]time.Time
	// marks are what this forwarder saw of each hub stream: a stream
	// created anew, or whose last sequence went back below what it gave
	// this edge's messages, lost them. resendFrom..resendTo are then the
	// origin sequences to send again (of the incarnation resendCreated).
	// resendByPos is set while the hub's position tells how far the
	// resend went (it holds nothing of this edge after the lost ones);
	// otherwise resendFrom moves on with each message sent again.
	marks                map[string]hubMark
	resendFrom, resendTo uint64
	resendCreated        time.Time
	resendByPos          bool
	// wentBack is the origin sequence of the first message whose PubAck
	// gave a sequence not above what the same hub stream gave before (0:
	// none): the stream was created anew or put back between two
	// publishes, and holds this edge's messages from there on only. The
	// background check looks at the hub at once then.
	wentBack       uint64
	wentBackStream string

	// downs counts the times the link was seen down: a check that passed
	// before the link fell says nothing of the hub behind the link that
	// came back (restarted with another duplicate window, a store emptied).
	downs atomic.Uint64

	cancel context.CancelFunc
	done   chan struct{}
}

// incarnation is a stream's creation time and when it was looked up: the
// stream under that creation time existed at seenAt, so every message
// stored between created and seenAt belongs to it. events is
// Forwarder.streamEvents before the lookup; lastSeq the highest sequence
// of a message stored after seenAt that was given this incarnation
// without a lookup.
type incarnation struct {
	created, seenAt time.Time
	events          uint64
	lastSeq         uint64
}

// incarnationRecheck is how long a lookup of the local stream serves
// messages stored after it while the server announced no change of the
// stream and their sequences only went up: a backstop for an advisory the
// connection dropped.
const incarnationRecheck = 10 * time.Second

// position is what the hub holds of the consumer's messages: the last
// one it stored, at origin sequence seq, stored on the edge at stored, in
// the local stream's incarnation created at created. The messages go out
// in order, so the hub holds every message of that incarnation up to seq
// stored by then (but for those dead-lettered instead). One stored later
// with a sequence up to seq is not among them: the edge's store was put
// back from a backup older than what it forwarded, and the sequences
// after the backup's are used again.
type position struct {
	known   bool
	created time.Time
	seq     uint64
	stored  time.Time
}

// hubMark is a hub stream's creation time and the highest sequence it
// gave one of this consumer's messages.
type hubMark struct {
	created time.Time
	seq     uint64
}

// New returns a forward handler publishing on nc (the in-process
// connection); Open checks the hub and must be called before use.
func New(nc *nats.Conn, opts Options, log *slog.Logger) (*Forwarder, error) {
	if log == nil {
		log = slog.Default()
	}
	local, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	// No domain: the JetStream nc reaches directly (a program that embeds
	// holdfast and connects to the hub itself).
	hub := local
	if opts.Domain != "" {
		if hub, err = jetstream.NewWithDomain(nc, opts.Domain); err != nil {
			return nil, err
		}
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 10 * time.Second
	}
	return &Forwarder{
		local: local, hub: hub, nc: nc, opts: opts,
		log:          log.With("component", "forward", "consumer", opts.Consumer, "domain", opts.Domain),
		incarnations: map[string]incarnation{},
		marks:        map[string]hubMark{},
		refused:      map[uint64]time.Time{},
		checkErr:     errors.New("the hub has not been checked yet"),
	}, nil
}

// StartWait is how long Open waits for the link to the hub, to check the
// hub's stream before the daemon reports ready (see Options.StartBy).
const StartWait = 5 * time.Second

// Open checks the hub's stream when the link comes up by Options.StartBy;
// while the check fails (the hub unreachable, its stream missing or
// deduplicating over too short a window) it is repeated in the
// background until it passes, forwarding waits, and Problem says why:
// the hub's state never stops the edge. Open starts that background
// check; it fails only when ctx ends.
func (f *Forwarder) Open(ctx context.Context) error {
	f.watchStream(ctx)
	if !f.opts.Clustered {
		// The messages an earlier run of the workers took and did not
		// ack come again only after ack_wait, behind newer ones: the hub
		// would store those newer ones first, and its position would pass
		// over the older ones. Set back to its ack floor, the consumer
		// delivers them first, in order.
		if _, err := f.local.ResetConsumer(ctx, f.opts.Stream, f.opts.Consumer); err != nil {
			f.log.Warn("cannot set the consumer back to its ack floor: forwarding goes on without the hub's position, and the hub's duplicate window must cover leafnodes.unreachable_after", "err", err)
		} else {
			f.ordered = true
		}
	}
	deadline := f.opts.StartBy
	if deadline.IsZero() {
		deadline = time.Now().Add(StartWait)
	}
	for !f.linkUp() && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	if f.linkUp() {
		// The hub's JetStream may need a moment after the link is up.
		for {
			err := f.checkHub(ctx)
			if err == nil || errors.Is(err, ErrDuplicateWindow) || time.Now().After(deadline) {
				break
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
	} else if ds := f.domains(); len(ds) > 0 {
		f.log.Warn("no hub connected at start serves the forward domain: forwarding waits (local publishing goes on); check forward.domain against the hub's jetstream.domain", "served", ds)
	} else {
		f.log.Warn("the hub is not reachable at start: forwarding waits for the link (local publishing goes on)")
	}
	bctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	f.done = make(chan struct{})
	go f.recheck(bctx)
	return nil
}

// Close stops the background check; it is idempotent.
func (f *Forwarder) Close() {
	if f.cancel != nil {
		f.cancel()
		<-f.done
		f.cancel = nil
	}
	if f.eventSub != nil {
		_ = f.eventSub.Unsubscribe()
	}
}

// watchStream subscribes to the server's advisories about the local
// stream, so that its incarnation is looked up again when it changes and
// not for every message (see streamCreated). Without the subscription it
// is looked up for every message stored after the last lookup.
func (f *Forwarder) watchStream(ctx context.Context) {
	sub, err := f.nc.Subscribe("$JS.EVENT.ADVISORY.STREAM.*."+f.opts.Stream, func(*nats.Msg) { f.streamEvents.Add(1) })
	if err == nil {
		// In place at the server before the first lookup; within Open's
		// ctx (FlushWithContext wants a deadline: Flush's own 10 s).
		fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = f.nc.FlushWithContext(fctx)
		cancel()
		if err != nil {
			_ = sub.Unsubscribe()
		}
	}
	if err != nil {
		f.log.Warn("cannot watch the local stream's advisories: its creation time is looked up for each message", "stream", f.opts.Stream, "err", err)
		return
	}
	f.eventSub = sub
}

// recheck checks the hub again every second while the link is up and the
// last check failed, when the reachable domains changed, or when a PubAck
// showed a hub stream gone back; and every IdleCheck while nothing is
// forwarded, which notices a hub stream that lost this edge's messages
// while the edge had nothing to send.
func (f *Forwarder) recheck(ctx context.Context) {
	defer close(f.done)
	idle := f.opts.IdleCheck
	if idle <= 0 {
		idle = 30 * time.Second
	}
	t := time.NewTicker(min(time.Second, idle))
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !f.linkUp() {
			continue
		}
		f.mu.Lock()
		same := f.checkedDoms == f.otherDomains()
		wentBack := f.wentBack > 0
		f.mu.Unlock()
		now := time.Now()
		quiet := now.Sub(time.Unix(0, f.stats.LastForward.Load())) >= idle && now.Sub(last) >= idle
		if f.Ready() && same && !wentBack && !quiet {
			continue
		}
		last = now
		_ = f.checkHub(ctx) // logs what changed
	}
}

// checkHub finds the hub's stream for the destination subjects and checks
// its duplicate window, recording the result for Ready and Problem.
func (f *Forwarder) checkHub(ctx context.Context) error {
	downs := f.downs.Load()
	err := f.lookupHub(ctx)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil {
		f.checkedDowns = downs
	}
	switch {
	case err == nil && f.checkErr != nil:
		f.log.Info("hub stream checked: forwarding", "hub_stream", f.hubStream, "subject", f.pattern())
	case err != nil && (f.checkErr == nil || f.checkErr.Error() != err.Error()):
		f.log.Error("forwarding waits: the hub's stream cannot take this edge's messages now", "err", err)
	}
	f.checkErr = err
	return err
}

func (f *Forwarder) pattern() string {
	return Subject(f.opts.Subject, f.opts.ServerName, ">")
}

// domains are the JetStream domains reachable over the links now.
func (f *Forwarder) domains() []string {
	if f.opts.Domains == nil {
		return nil
	}
	return f.opts.Domains()
}

// otherDomains are the reachable JetStream domains but the hub's, sorted,
// as one text.
func (f *Forwarder) otherDomains() string {
	if f.opts.Domains == nil {
		return ""
	}
	var out []string
	for _, d := range f.opts.Domains() {
		if d != f.opts.Domain {
			out = append(out, d)
		}
	}
	slices.Sort(out)
	return strings.Join(slices.Compact(out), ",")
}

// otherDomainTimeout bounds the question to each other domain: one that
// does not answer (an edge behind the hub going away) takes no stream.
const otherDomainTimeout = 2 * time.Second

func (f *Forwarder) lookupHub(ctx context.Context) error {
	subj := f.pattern()
	others := f.otherDomains()
	f.mu.Lock()
	f.checkedDoms = others
	f.mu.Unlock()
	for _, d := range strings.Split(others, ",") {
		if d == "" {
			continue
		}
		ojs, err := jetstream.NewWithDomain(f.nc, d)
		if err != nil {
			return err
		}
		octx, ocancel := context.WithTimeout(ctx, min(otherDomainTimeout, f.opts.Timeout))
		found, err := hubStreamNames(octx, ojs, subj)
		ocancel()
		if err == nil && len(found) > 0 {
			name := found[0]
			return fmt.Errorf("stream %s of JetStream domain %q (another hub, over another leafnode link) takes %s too: a publish reaches every stream that takes its subject, so each message would be stored there as well; "+
				"give forward.subject a destination only the hub %q stores, or remove %s's subjects there", name, d, subj, f.opts.Domain, name)
		}
	}
	whole := ctx // for sending again what the hub lost: as long as it takes
	ctx, cancel := context.WithTimeout(ctx, f.opts.Timeout)
	defer cancel()
	dests, positional, err := f.destinations(ctx)
	if err != nil {
		return err
	}
	need, why := f.opts.MinDuplicateWindow, fmt.Sprintf("this edge promises no duplicates through outages up to leafnodes.unreachable_after = %s (the hub's position cannot decide: forward.subject %q without {server} and {subject}, or an edge cluster)", f.opts.MinDuplicateWindow, f.opts.Subject)
	if positional {
		need, why = 2*f.opts.Timeout, fmt.Sprintf("a publish still on its way when it is sent again must be recognized for twice forward.timeout (%s)", f.opts.Timeout)
	}
	// Every stream that takes a part of the destination: each must
	// deduplicate long enough (not only the first the hub names).
	names, err := hubStreamNames(ctx, f.hub, subj)
	if errors.Is(err, nats.ErrNoResponders) {
		// The link is up: the request reached no JetStream.
		return fmt.Errorf("the hub (JetStream domain %q) does not answer: %w: is JetStream up there, and may this edge's leafnode user publish to $JS.%s.API.> (its publish_allow on the hub)?",
			f.opts.Domain, err, f.opts.Domain)
	}
	if err != nil {
		return fmt.Errorf("the hub (JetStream domain %q) does not answer: %w", f.opts.Domain, err)
	}
	if len(names) == 0 {
		return fmt.Errorf("the hub (JetStream domain %q) has no stream on %s: create one there on \"edge.>\" (see docs/edge-and-hub.md)", f.opts.Domain, subj)
	}
	var cfg jetstream.StreamConfig
	var hubSubjects []string
	var streams []jetstream.Stream
	// The largest max_msg_size of the streams (0: one takes any size): a
	// message over it fits none of them, so none can store it. Sent all
	// the same, one over the hub's max_payload would make the hub close
	// the link (Maximum Payload Violation), again at each reconnect.
	var maxMsg int32
	unlimited := false
	atomic := len(names) == 1
	for _, name := range names {
		s, err := f.hub.Stream(ctx, name)
		if err != nil {
			return fmt.Errorf("hub stream %s: %w", name, err)
		}
		streams = append(streams, s)
		cfg = s.CachedInfo().Config
		if cfg.MaxMsgSize <= 0 {
			unlimited = true
		}
		maxMsg = max(maxMsg, cfg.MaxMsgSize)
		for _, sub := range cfg.Subjects {
			// A holdfast hub with group commit answers the destination in
			// its ingest, which takes single publishes only.
			atomic = atomic && !strings.HasPrefix(sub, subjects.GroupCommit(name, ""))
			hubSubjects = append(hubSubjects, strings.TrimPrefix(sub, subjects.GroupCommit(name, "")))
		}
		atomic = atomic && cfg.AllowAtomicPublish
		if positional && cfg.Retention != jetstream.LimitsPolicy {
			// The position is the last message the hub holds of this
			// edge, which interest and work-queue retention remove once
			// consumed: only the duplicate window guards what is sent
			// again then.
			positional = false
			need, why = f.opts.MinDuplicateWindow, fmt.Sprintf("with %s retention the hub's stream removes what it consumed, so what it holds of this edge cannot be read: only the duplicate window keeps what is sent again after an outage (up to leafnodes.unreachable_after = %s) from being stored twice (or give the stream retention = \"limits\")", strings.ToLower(cfg.Retention.String()), f.opts.MinDuplicateWindow)
		}
	}
	for i, s := range streams {
		if d := s.CachedInfo().Config.Duplicates; d < need {
			return fmt.Errorf("%w: stream %s on the hub (domain %q) deduplicates over %s, but %s: "+
				"set duplicate_window = %q (or longer) on the hub's stream; forwarding waits until then (local publishing goes on)",
				ErrDuplicateWindow, names[i], f.opts.Domain, d, why, need.String())
		}
	}
	pos := position{}
	if positional {
		if pos, err = f.hubPosition(ctx, streams, dests); err != nil {
			return fmt.Errorf("the hub (JetStream domain %q) does not tell what it holds of this edge: %w", f.opts.Domain, err)
		}
	}
	name := strings.Join(names, ",")
	if unlimited {
		maxMsg = 0
	}
	lost := f.hubLost(streams)
	f.mu.Lock()
	f.hubStream, f.hubMaxMsg, f.hubSubjects, f.hubAtomic = name, maxMsg, hubSubjects, atomic
	if pos.seq > 0 && (pos.seq != f.pos.seq || !pos.created.Equal(f.pos.created)) {
		f.log.Info("hub position read: what the hub holds is not sent again", "hub_stream", name, "origin_seq", pos.seq, "origin_time", pos.stored)
	}
	if old := f.pos; lost != "" && old.known && pos.known && old.created.Equal(pos.created) {
		from, to, byPos := pos.seq+1, old.seq, true
		if f.wentBack > 0 {
			// Stored there from wentBack on: what the stream held of this
			// edge before it went back is what it lost.
			from, to, byPos = 1, min(old.seq, f.wentBack-1), false
		}
		if from <= to {
			f.log.Error("the hub lost messages of this edge that it had acknowledged: sending them again from this edge's stream",
				"hub_stream", name, "why", lost, "origin_seqs", fmt.Sprintf("%d..%d", from, to), "hub_holds_up_to", pos.seq, "acknowledged_up_to", old.seq)
			if !f.resendCreated.Equal(old.created) || to > f.resendTo {
				f.resendFrom, f.resendTo, f.resendCreated, f.resendByPos = from, to, old.created, byPos
			}
		}
	}
	f.wentBack = 0
	f.pos = pos
	from, to, created := f.resendFrom, f.resendTo, f.resendCreated
	if f.resendByPos {
		from = max(from, pos.seq+1)
	}
	f.mu.Unlock()
	if from <= to && to > 0 && created.Equal(pos.created) {
		// Before forwarding goes on: the lost messages go first, in order,
		// each within forward.timeout, all of them for as long as they take
		// (Problem says so meanwhile).
		f.mu.Lock()
		f.checkErr = fmt.Errorf("sending again what the hub lost of this edge (origin sequences %d..%d)", from, to)
		f.mu.Unlock()
		if err := f.resend(whole, from, to); err != nil {
			return fmt.Errorf("sending again what the hub lost of this edge (origin sequences %d..%d): %w", from, to, err)
		}
	}
	f.mu.Lock()
	f.resendFrom, f.resendTo = 0, 0
	f.mu.Unlock()
	return nil
}

// hubLost reports why the hub's streams lost what they gave this edge's
// messages ("" when they did not): one was created anew (its store wiped
// and the stream created again), or its last sequence is below the
// highest it gave (its store put back from an older copy). Messages a
// limit removed leave the last sequence where it was. It records the
// streams as they are now.
func (f *Forwarder) hubLost(streams []jetstream.Stream) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	why := ""
	for _, s := range streams {
		info := s.CachedInfo()
		name := info.Config.Name
		m, seen := f.marks[name]
		switch {
		case !seen:
		case !m.created.Equal(info.Created):
			why = fmt.Sprintf("stream %s was created anew (at %s)", name, info.Created.UTC().Format(time.RFC3339))
		case info.State.LastSeq < m.seq:
			why = fmt.Sprintf("stream %s's last sequence is %d, below the %d it gave this edge's messages", name, info.State.LastSeq, m.seq)
		case f.wentBack > 0 && name == f.wentBackStream:
			why = fmt.Sprintf("stream %s gave a message of this edge a sequence not above one it gave before", name)
		default:
			continue
		}
		f.marks[name] = hubMark{created: info.Created}
	}
	return why
}

// noteStored records that hub stream gave this edge's messages the
// sequences first..last, the first of them of origin sequence origin.
func (f *Forwarder) noteStored(stream string, first, last, origin uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, ok := f.marks[stream]
	if !ok {
		return
	}
	if first <= m.seq && f.wentBack == 0 {
		f.wentBack, f.wentBackStream = origin, stream
	}
	m.seq = max(m.seq, last)
	f.marks[stream] = m
}

// resend sends again, in order and one by one, the messages of the local
// stream from origin sequence from to to (those of this consumer), which
// the hub had acknowledged and lost. Those the edge's stream no longer
// holds are gone on both sides: counted and logged. A failure stops it;
// the next check of the hub goes on from the hub's position.
func (f *Forwarder) resend(ctx context.Context, from, to uint64) error {
	local, err := f.local.Stream(ctx, f.opts.Stream)
	if err != nil {
		return fmt.Errorf("local stream %s: %w", f.opts.Stream, err)
	}
	c, err := f.local.Consumer(ctx, f.opts.Stream, f.opts.Consumer)
	if err != nil {
		return fmt.Errorf("local consumer %s: %w", f.opts.Consumer, err)
	}
	filters := c.CachedInfo().Config.FilterSubjects
	if fs := c.CachedInfo().Config.FilterSubject; fs != "" {
		filters = []string{fs}
	}
	if first := local.CachedInfo().State.FirstSeq; from < first {
		gone := min(to+1, first) - from
		f.stats.Gone.Add(gone)
		f.log.Error("messages the hub lost are gone on both sides: this edge's stream no longer holds them (its limits removed them)",
			"origin_seqs", fmt.Sprintf("%d..%d", from, from+gone-1), "count", gone)
		from = first
	}
	resent := 0
	for seq := from; seq <= to; {
		sm, err := local.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(">"))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return err
		}
		if sm.Sequence > to {
			break
		}
		seq = sm.Sequence + 1
		if len(filters) > 0 && !slices.ContainsFunc(filters, func(fl string) bool { return subjectMatches(sm.Subject, fl) }) {
			continue
		}
		m := &handler.Message{Subject: sm.Subject, Stream: f.opts.Stream, Consumer: f.opts.Consumer, Sequence: sm.Sequence,
			Delivery: 1, Header: sm.Header, Data: sm.Data, Published: sm.Time}
		out, created, r := f.prepareMsg(ctx, m, false)
		if r != nil {
			if r.Outcome == handler.Retry {
				return errors.New(r.Reason)
			}
			f.log.Error("a message the hub lost cannot be sent again: lost", "origin_seq", m.Sequence, "reason", r.Reason)
			f.stats.Gone.Add(1)
			continue
		}
		out.Header.Set(HeaderOriginResent, "1")
		pctx, cancel := context.WithTimeout(ctx, f.opts.Timeout)
		ack, err := f.hub.PublishMsg(pctx, out)
		cancel()
		if err != nil {
			if reason, permanent := permanentForwardError(err); permanent {
				f.log.Error("a message the hub lost cannot be sent again: lost", "origin_seq", m.Sequence, "reason", reason)
				f.stats.Gone.Add(1)
				continue
			}
			return err
		}
		f.advance(created, m)
		if !ack.Duplicate {
			f.noteStored(ack.Stream, ack.Sequence, ack.Sequence, m.Sequence)
		}
		f.mu.Lock()
		f.resendFrom = m.Sequence + 1
		f.mu.Unlock()
		f.stats.Resent.Add(1)
		resent++
	}
	if resent > 0 {
		f.log.Info("sent again what the hub lost", "count", resent)
	}
	return nil
}

// destinations are the subjects on the hub that this consumer's messages
// go to: one pattern per subject of the consumer's filter, or of its
// stream when it has none. positional is false when those cannot be told
// apart from other edges' and other streams' (a Subject template without
// {server} or {subject}, a stream without subjects of its own) or a
// pattern is no valid filter: the hub's position cannot be read then.
func (f *Forwarder) destinations(ctx context.Context) (dests []string, positional bool, err error) {
	t := f.opts.Subject
	if !f.ordered || !strings.Contains(t, "{server}") || !strings.Contains(t, "{subject}") {
		return nil, false, nil
	}
	c, err := f.local.Consumer(ctx, f.opts.Stream, f.opts.Consumer)
	if err != nil {
		return nil, false, fmt.Errorf("local consumer %s: %w", f.opts.Consumer, err)
	}
	filters := c.CachedInfo().Config.FilterSubjects
	if fs := c.CachedInfo().Config.FilterSubject; fs != "" {
		filters = []string{fs}
	}
	if len(filters) == 0 {
		s, err := f.local.Stream(ctx, f.opts.Stream)
		if err != nil {
			return nil, false, fmt.Errorf("local stream %s: %w", f.opts.Stream, err)
		}
		filters = subjects.ConfiguredSubjects(f.opts.Stream, s.CachedInfo().Config.Subjects)
	}
	for _, filter := range filters {
		d := Subject(t, f.opts.ServerName, filter)
		if i := strings.Index(d, ">"); i >= 0 && i != len(d)-1 {
			return nil, false, nil
		}
		dests = append(dests, d)
	}
	return dests, len(dests) > 0, nil
}

// hubPosition reads the hub's position: the last message the hub's
// streams hold on each destination, kept when it came from this edge's
// stream as it is now (not from an earlier incarnation of it).
func (f *Forwarder) hubPosition(ctx context.Context, streams []jetstream.Stream, dests []string) (position, error) {
	local, err := f.local.Stream(ctx, f.opts.Stream)
	if err != nil {
		return position{}, fmt.Errorf("local stream %s: %w", f.opts.Stream, err)
	}
	pos := position{known: true, created: local.CachedInfo().Created}
	for _, s := range streams {
		f.warnNoDirect(s.CachedInfo().Config)
		for _, d := range dests {
			// With allow_direct, a direct get (the message as stored);
			// else the API's get, base64-encoded (warnNoDirect).
			m, err := s.GetLastMsgForSubject(ctx, d)
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				continue
			}
			if err != nil {
				return position{}, fmt.Errorf("last message of stream %s on %s: %w", s.CachedInfo().Config.Name, d, err)
			}
			if m.Header.Get(HeaderOriginServer) != f.opts.ServerName || m.Header.Get(HeaderOriginStream) != f.opts.Stream {
				continue
			}
			created, err := time.Parse(time.RFC3339Nano, m.Header.Get(HeaderOriginStreamCreated))
			if err != nil || !created.Equal(pos.created) {
				continue
			}
			seq, err := strconv.ParseUint(m.Header.Get(HeaderOriginSeq), 10, 64)
			if err != nil {
				continue
			}
			stored, err := time.Parse(time.RFC3339Nano, m.Header.Get(HeaderOriginTime))
			if err != nil {
				continue
			}
			sent, err := sentFrom(ctx, local, seq, stored)
			if err != nil {
				return position{}, fmt.Errorf("local stream %s, message %d: %w", f.opts.Stream, seq, err)
			}
			if !sent {
				// Anyone who may publish on the hub's edge subjects can
				// put a message there with this edge's headers: taken
				// as the position, it would have the edge skip (ack
				// without sending) every message up to it.
				f.log.Error("the last message on the hub for this edge is not one this edge sent (no such message in its stream): not taken as the hub's position; the messages it claims are sent again, to be deduplicated by the hub. A client on the hub may have published on this edge's subjects: allow only edges to publish there",
					"hub_stream", s.CachedInfo().Config.Name, "subject", d, "claimed_seq", seq, "claimed_time", stored)
				f.stats.Untrusted.Add(1)
				continue
			}
			// The last sent across the destinations (and the hub's
			// streams) is the one stored last on the edge: the edge's
			// clock decides, not those of a hub cluster's nodes. Should
			// that clock have been set back, the position only falls
			// short, and the Nats-Msg-Id guards what is sent again.
			if stored.After(pos.stored) || stored.Equal(pos.stored) && seq > pos.seq {
				pos.seq, pos.stored = seq, stored
			}
		}
	}
	return pos, nil
}

// warnNoDirect logs, once per stream, that the hub's stream cfg has no
// direct get: the edge reads the last message it forwarded there whole
// and base64-encoded, a third larger than stored, and one of more than
// about three quarters of max_payload breaks the edge's max_payload over
// the leafnode, which the edge's server then closes, again at every
// reconnect. A holdfast hub sets allow_direct on its streams of edge
// messages.
func (f *Forwarder) warnNoDirect(cfg jetstream.StreamConfig) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if cfg.AllowDirect || f.noDirect == cfg.Name {
		return
	}
	f.noDirect = cfg.Name
	f.log.Warn("the hub's stream has no allow_direct: the edge reads the last message it forwarded there through the JetStream API, base64-encoded, and one larger than about 3/4 of max_payload would break the leafnode link at each reconnect; "+
		"run holdfast on the hub at this version (it sets allow_direct on streams of edge messages) or set it there: nats stream edit "+cfg.Name+" --allow-direct",
		"hub_stream", cfg.Name)
}

// sentFrom reports whether the edge's stream local (as it is now) could
// have sent the message stored at seq at time stored: it holds that very
// message, or has removed everything up to seq (nothing left to skip).
// An error is one of reading the stream, not an answer.
func sentFrom(ctx context.Context, local jetstream.Stream, seq uint64, stored time.Time) (bool, error) {
	st := local.CachedInfo().State
	if seq < st.FirstSeq {
		return true, nil
	}
	if seq > st.LastSeq {
		return false, nil
	}
	m, err := local.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return m.Time.Equal(stored), nil
}

// onHub reports whether the hub's position shows it holds m, of the
// stream incarnation created at created.
func (f *Forwarder) onHub(created time.Time, m *handler.Message) bool {
	if m.OutOfBand {
		return false // a replayed dead letter was never sent: the hub passed over it
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if at, ok := f.refused[m.Sequence]; ok && at.Equal(m.Published) {
		return false
	}
	p := f.pos
	return p.known && p.created.Equal(created) && m.Sequence <= p.seq && !m.Published.After(p.stored)
}

// maxRefused bounds the messages Forwarder.refused keeps.
const maxRefused = 1024

// noteRefused records that the hub refused m, or, refused is false, that
// it stored it.
func (f *Forwarder) noteRefused(m *handler.Message, refused bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !refused {
		delete(f.refused, m.Sequence)
		return
	}
	if len(f.refused) >= maxRefused {
		delete(f.refused, slices.Min(slices.Collect(maps.Keys(f.refused))))
	}
	f.refused[m.Sequence] = m.Published
}

// Position is the origin sequence of the last message the hub holds
// from this consumer, as last read from the hub or acknowledged by it;
// known is false when it cannot be read (see Options.MinDuplicateWindow)
// or has not been yet.
func (f *Forwarder) Position() (seq uint64, known bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pos.seq, f.pos.known
}

// advance makes m, which the hub acknowledged, the position: it is the
// last the hub stored of this consumer.
func (f *Forwarder) advance(created time.Time, m *handler.Message) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pos.known && !m.OutOfBand {
		f.pos = position{known: true, created: created, seq: m.Sequence, stored: m.Published}
	}
}

// hubTakes reports whether a stream of the hub takes subject, as last
// checked (true while not known).
func (f *Forwarder) hubTakes(subject string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.hubSubjects == nil {
		return true
	}
	return slices.ContainsFunc(f.hubSubjects, func(filter string) bool { return subjectMatches(subject, filter) })
}

// notTaken is the dead-letter reason for subject, which no stream of the
// hub takes.
func (f *Forwarder) notTaken(subject string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return fmt.Sprintf("no stream of the hub (JetStream domain %q) takes %s: its stream(s) %s take %s; add the subject there (or a filter_subject here), then replay the dead letter",
		f.opts.Domain, subject, f.hubStream, strings.Join(f.hubSubjects, ", "))
}

// subjectMatches reports whether the literal subject matches filter
// (tokens, '*' for one, '>' for the rest).
func subjectMatches(subject, filter string) bool {
	st, ft := strings.Split(subject, "."), strings.Split(filter, ".")
	for i, f := range ft {
		if f == ">" {
			return len(st) > i
		}
		if i >= len(st) || (f != "*" && f != st[i]) {
			return false
		}
	}
	return len(st) == len(ft)
}

// hubStreamNames returns, sorted, the streams of js that take a part of
// subj: on subj itself, or, for a holdfast stream with group_commit, on
// its prefixed form (holdfast answers the publishes to subj and stores
// them there: subjects.GroupCommit).
func hubStreamNames(ctx context.Context, js jetstream.JetStream, subj string) ([]string, error) {
	var names []string
	for _, filter := range []string{subj, subjects.GroupCommit("*", subj)} {
		lister := js.StreamNames(ctx, jetstream.WithStreamListSubject(filter))
		for name := range lister.Name() {
			names = append(names, name)
		}
		if err := lister.Err(); err != nil {
			return nil, err
		}
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}

func (f *Forwarder) linkUp() bool {
	if f.opts.LinkUp == nil || f.opts.LinkUp() {
		return true
	}
	f.downs.Add(1)
	return false
}

// Ready reports whether forwarding can go on now: the link is up and the
// hub's stream passed the check since the link was last seen down. The
// workers pull nothing while it is false (ConsumerOptions.Paused), so an
// outage spends no deliveries.
func (f *Forwarder) Ready() bool {
	if !f.linkUp() {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.checkErr == nil && f.checkedDowns == f.downs.Load() && !time.Now().Before(f.storeRetryAt)
}

// Problem is why forwarding waits on a hub that is reachable, or "".
func (f *Forwarder) Problem() string {
	if !f.linkUp() {
		return ""
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.checkErr == nil {
		return f.storeErr
	}
	return f.checkErr.Error()
}

// storeRetry is how long forwarding waits before sending again to a hub
// stream that cannot store for now.
const storeRetry = time.Second

// hubCannotStore records that the hub's stream refused a message because
// it cannot store for now: forwarding waits storeRetry and tries again,
// and Problem names the cause.
func (f *Forwarder) hubCannotStore(reason, hint string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	msg := fmt.Sprintf("the hub's stream %s cannot store messages now: %s; messages wait on this edge (%s; forwarding tries again every %s)", f.hubStream, reason, hint, storeRetry)
	if f.storeErr != msg {
		f.log.Error("forwarding waits: the hub's stream refuses to store", "hub_stream", f.hubStream, "err", reason)
	}
	f.storeErr, f.storeRetryAt = msg, time.Now().Add(storeRetry)
}

// stored records that the hub holds the messages up to last (of the
// stream incarnation created), n of them stored just now: the position
// moves to last, and forwarding is known to go on.
func (f *Forwarder) stored(created time.Time, last *handler.Message, n uint64) {
	f.hubStores()
	f.advance(created, last)
	f.stats.Forwarded.Add(n)
	f.stats.LastForward.Store(time.Now().UnixNano())
	f.stats.LastOriginTime.Store(last.Published.UnixNano())
}

// hubStores records that the hub's stream stored a message.
func (f *Forwarder) hubStores() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.storeErr != "" {
		f.log.Info("the hub's stream stores again: forwarding", "hub_stream", f.hubStream)
		f.storeErr = ""
	}
}

// Stats returns the live counters.
func (f *Forwarder) Stats() *Stats { return &f.stats }

// streamCreated returns the creation time of stream as last looked up,
// looking it up again when the message is newer than that look and the
// stream may have been created again since: the server announced a change
// of it since the look, or the message's sequence is not above the last
// one given that incarnation without a look (a stream created again counts
// from 1), or the stream is not watched, or the look is older than
// incarnationRecheck. The announcement comes long before a message of a
// stream created again can reach the forwarder: the consumer went with the
// old stream and is created again after the stream. A message stored before that
// creation time is forwarded all the same, under the creation time looked
// up: a stream restored from a backup (holdfast restore) gets a new
// creation time and keeps its messages, older than it. The forwarded id
// does not depend on it (MsgID).
func (f *Forwarder) streamCreated(ctx context.Context, stream string, seq uint64, published time.Time) (time.Time, error) {
	events := f.streamEvents.Load()
	if created, ok := f.knownIncarnation(stream, seq, published, events); ok {
		return created, nil
	}
	at := time.Now()
	s, err := f.local.Stream(ctx, stream)
	if err != nil {
		return time.Time{}, fmt.Errorf("local stream %s: %w", stream, err)
	}
	inc := incarnation{created: s.CachedInfo().Created, seenAt: at, events: events}
	f.mu.Lock()
	f.incarnations[stream] = inc
	f.mu.Unlock()
	return inc.created, nil
}

// knownIncarnation returns the creation time of stream as last looked up
// when it is the one of a message of sequence seq stored at published
// (see streamCreated), events being streamEvents now; ok is false when the
// stream is to be looked up again.
func (f *Forwarder) knownIncarnation(stream string, seq uint64, published time.Time, events uint64) (created time.Time, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	inc, ok := f.incarnations[stream]
	switch {
	case !ok:
		return time.Time{}, false
	case !published.After(inc.seenAt):
		return inc.created, true
	case f.eventSub == nil || stream != f.opts.Stream || inc.events != events ||
		seq <= inc.lastSeq || time.Since(inc.seenAt) >= incarnationRecheck:
		return time.Time{}, false
	}
	inc.lastSeq = seq
	f.incarnations[stream] = inc
	return inc.created, true
}

// NewMsg builds the message sent to the hub: payload and headers
// kept, except the server's own Nats-* headers (the original Nats-Msg-Id
// moves to Holdfast-Origin-Msg-Id), and the origin headers added.
func NewMsg(subject, server string, m *handler.Message, streamCreated time.Time) *nats.Msg {
	out := nats.NewMsg(subject)
	out.Data = m.Data
	for k, vs := range m.Header {
		// The server's headers, and holdfast's own origin headers, which
		// only this edge sets: a local client's Holdfast-Origin-Lost would
		// have the hub report a loss that never happened.
		if lk := strings.ToLower(k); strings.HasPrefix(lk, "nats-") || strings.HasPrefix(lk, "holdfast-origin-") {
			continue
		}
		for _, v := range vs {
			handler.AddHeader(out.Header, k, v)
		}
	}
	if id := m.Header.Get(nats.MsgIdHdr); id != "" {
		out.Header.Set(HeaderOriginMsgID, id)
	}
	out.Header.Set(nats.MsgIdHdr, MsgID(server, m.Stream, m.Sequence, m.Published))
	out.Header.Set(HeaderOriginServer, server)
	out.Header.Set(HeaderOriginStream, m.Stream)
	out.Header.Set(HeaderOriginStreamCreated, streamCreated.UTC().Format(time.RFC3339Nano))
	out.Header.Set(HeaderOriginSeq, strconv.FormatUint(m.Sequence, 10))
	out.Header.Set(HeaderOriginSubject, m.Subject)
	out.Header.Set(HeaderOriginTime, m.Published.UTC().Format(time.RFC3339Nano))
	out.Header.Set(HeaderOriginPending, strconv.FormatUint(m.Pending, 10))
	return out
}

// Handle implements Handler: publish to the hub, succeed on its PubAck
// (a duplicate PubAck too: the hub has the message already). While the
// link is down it waits, within the same delivery, for the link to come
// back; a message the hub can never take (too large) fails at once.
func (f *Forwarder) Handle(ctx context.Context, m *handler.Message) handler.Result {
	out, created, res := f.prepare(ctx, m)
	if res != nil {
		return *res
	}
	return f.send(ctx, m, out, created)
}

// prepare builds the message sent to the hub for m, with the creation
// time of m's stream; a non-nil Result is m's verdict instead (the hub
// can never take it, or the workers stop).
func (f *Forwarder) prepare(ctx context.Context, m *handler.Message) (*nats.Msg, time.Time, *handler.Result) {
	return f.prepareMsg(ctx, m, true)
}

// prepareMsg is prepare; recheck checks the hub again for a subject its
// streams were not seen to take (not while checking it).
func (f *Forwarder) prepareMsg(ctx context.Context, m *handler.Message, recheck bool) (*nats.Msg, time.Time, *handler.Result) {
	verdict := func(r handler.Result) (*nats.Msg, time.Time, *handler.Result) { return nil, time.Time{}, &r }
	created, err := m.StreamCreated, error(nil)
	if created.IsZero() {
		created, err = f.streamCreated(ctx, m.Stream, m.Sequence, m.Published)
	}
	for err != nil {
		// In place, as for the hub: a later message must not go first.
		select {
		case <-ctx.Done():
			return verdict(handler.RetryLater(err.Error()))
		case <-time.After(storeRetry):
		}
		created, err = f.streamCreated(ctx, m.Stream, m.Sequence, m.Published)
	}
	out := NewMsg(Subject(f.opts.Subject, f.opts.ServerName, m.Subject), f.opts.ServerName, m, created)
	if gone := f.stats.Gone.Load(); gone > 0 {
		out.Header.Set(HeaderOriginLost, strconv.FormatUint(gone, 10))
	}
	if len(out.Subject) > handler.MaxPublishSubject {
		// The server would close the connection that publishes it.
		f.stats.Refused.Add(1)
		return verdict(handler.Fail(fmt.Sprintf("forward subject of %d bytes is too long to publish (at most %d)", len(out.Subject), handler.MaxPublishSubject)))
	}
	// Header block and data, as the server and the client count a
	// payload against max_payload and max_msg_size (not the subject).
	size := out.Size() - len(out.Subject) - len(out.Reply)
	if hdr := size - len(out.Data); hdr > handler.MaxStoredHeader {
		f.stats.Refused.Add(1)
		return verdict(handler.Fail(fmt.Sprintf("forwarded message's headers of %d bytes (the origin headers included) exceed the %d a stream stores", hdr, handler.MaxStoredHeader)))
	}
	if limit := f.nc.MaxPayload(); limit > 0 && int64(size) > limit {
		f.stats.Refused.Add(1)
		return verdict(handler.Fail(fmt.Sprintf("forwarded message of %d bytes exceeds max_payload %d", size, limit)))
	}
	if !f.hubTakes(out.Subject) {
		// Checked again first: the hub's streams may have changed.
		var err error
		if recheck {
			err = f.checkHub(ctx)
		}
		if err == nil && !f.hubTakes(out.Subject) {
			f.stats.Refused.Add(1)
			return verdict(handler.Fail(f.notTaken(out.Subject)))
		}
	}
	f.mu.Lock()
	hubMax, hubStreams := f.hubMaxMsg, f.hubStream
	f.mu.Unlock()
	if hubMax > 0 && size > int(hubMax) {
		// With several hub streams, one smaller than hubMax may refuse a
		// smaller message itself (10054, permanentForwardError).
		f.stats.Refused.Add(1)
		return verdict(handler.Fail(fmt.Sprintf("forwarded message of %d bytes exceeds the hub stream's max_msg_size %d (hub stream(s) %s)", size, hubMax, hubStreams)))
	}
	return out, created, nil
}

// send publishes out, the hub's copy of m, until the hub stores it (or
// has it already), in place: see Handle.
func (f *Forwarder) send(ctx context.Context, m *handler.Message, out *nats.Msg, created time.Time) handler.Result {
	for {
		if err := f.waitReady(ctx); err != nil {
			return handler.RetryLater("forwarding interrupted while waiting for the hub: " + err.Error())
		}
		if f.onHub(created, m) {
			// Sent before a reconnect, a restart or a failed publish,
			// and stored: the hub says so, whatever its duplicate window.
			f.stats.Skipped.Add(1)
			return handler.Ok()
		}
		pctx, cancel := context.WithTimeout(ctx, f.opts.Timeout)
		watched := f.cancelOnLinkDown(pctx, cancel)
		ack, err := f.hub.PublishMsg(pctx, out)
		cancel()
		<-watched
		if err == nil {
			if ack.Domain != f.opts.Domain {
				// Another hub's stream took it (and answered first): the
				// hub's may have it too, or not. Wait, in this delivery,
				// until the check finds the hub alone again.
				f.stats.Errors.Add(1)
				f.mu.Lock()
				werr := fmt.Errorf("stream %s of JetStream domain %q stored a forwarded message meant for the hub %q: a stream of another hub takes %s too",
					ack.Stream, ack.Domain, f.opts.Domain, f.pattern())
				if f.checkErr == nil || f.checkErr.Error() != werr.Error() {
					f.log.Error("forwarding waits: the hub's stream cannot take this edge's messages now", "err", werr)
				}
				f.checkErr = werr
				f.mu.Unlock()
				continue
			}
			f.noteRefused(m, false)
			if ack.Duplicate {
				// The sequence of the copy stored before: no news of the stream.
				f.stats.Duplicates.Add(1)
				f.stored(created, m, 0)
			} else {
				f.noteStored(ack.Stream, ack.Sequence, ack.Sequence, m.Sequence)
				f.stored(created, m, 1)
			}
			return handler.Ok()
		}
		f.stats.Errors.Add(1)
		if reason, permanent := permanentForwardError(err); permanent {
			f.stats.Refused.Add(1)
			f.noteRefused(m, true)
			return handler.Fail("the hub refused the message: " + reason)
		}
		if reason, full := hubStoreRefusal(err); full {
			// The hub's stream explains it: wait in this delivery, as
			// for the link, instead of spending deliveries on it.
			f.hubCannotStore(reason, "make room on the hub: raise its limits or purge")
			continue
		}
		if ctx.Err() != nil {
			return handler.RetryLater(err.Error())
		}
		// From here on the publish is in doubt: the check of the hub
		// below reads its position again before it is sent again.
		if !f.linkUp() {
			continue // the link fell under the publish: wait for it, same delivery
		}
		// The link is up: is the hub's stream there and answering (a hub
		// restarting, its stream deleted)? Then wait for it in this
		// delivery, as for the link; only a failure the hub's stream does
		// not explain spends a delivery.
		if cerr := f.checkHub(ctx); cerr != nil {
			continue
		}
		if !f.hubTakes(out.Subject) {
			// The hub's streams no longer take it (their subjects changed
			// while the link stayed up): no answer can ever come.
			f.stats.Refused.Add(1)
			f.noteRefused(m, true)
			return handler.Fail(f.notTaken(out.Subject))
		}
		if errors.Is(err, jetstream.ErrNoStreamResponse) {
			// No responders, though the hub's stream takes the subject
			// (checked): no interest in it reached this edge. The hub
			// does not let this edge publish there (the permissions of
			// its leafnode user), or its interest is still on the way
			// after the link came up. Either way the message is not at
			// fault: wait in its place, as for a full stream.
			f.hubCannotStore(fmt.Sprintf("no responders on %s, although the stream takes it", out.Subject),
				fmt.Sprintf("the hub must let this edge's leafnode user publish to %s: its publish_allow on the hub", f.pattern()))
			continue
		}
		if errors.Is(err, context.DeadlineExceeded) {
			// No PubAck within the timeout, from a hub whose stream is
			// there: the publish may have been swallowed (its stream
			// deleted and created again meanwhile) or the hub is slow.
			// Send it again in this delivery, holding its place; the
			// same Nats-Msg-Id stores it once.
			f.hubCannotStore(fmt.Sprintf("no PubAck within forward.timeout (%s)", f.opts.Timeout), "check the hub's stream: `nats stream info` on the hub")
			continue
		}
		// Any other failure waits in place too: a retry later would let
		// the next message go first, and the position would then pass
		// over this one.
		f.hubCannotStore("publish failed: "+err.Error(), "see the hub's log")
	}
}

// maxAtomic is the most messages the forwarder sends in one atomic batch:
// a batch costs the hub one flush, so a longer one drains a backlog
// faster, up to the server's limit (handler.MaxBatch); a short one keeps
// the first messages of a backlog from waiting for the rest.
const maxAtomic = 500

// HandleBatch implements handler.BatchHandler: msgs, in stream order, go
// to the hub in atomic batches when its stream takes them (one stream for
// the destination, allow_atomic set, as on a holdfast hub), else one by
// one as Handle sends them; each result is given to done as soon as the
// hub answered for it. A batch is stored whole or not at all, so the
// hub's position stays the last message of a run sent in order. After a
// message that is to come again (the workers stop) nothing later is sent:
// it would pass over it.
func (f *Forwarder) HandleBatch(ctx context.Context, msgs []*handler.Message, done func(int, handler.Result)) {
	b := &batchSend{f: f, ctx: ctx, msgs: msgs, done: done}
	for i, m := range msgs {
		if b.stopped {
			b.give(i, notSent)
			continue
		}
		out, c, r := f.prepare(ctx, m)
		if r != nil || m.OutOfBand {
			b.flush()
			switch {
			case b.stopped:
				b.give(i, notSent)
			case r != nil:
				b.give(i, *r)
			default:
				b.give(i, f.send(ctx, m, out, c))
			}
			continue
		}
		b.run, b.outs, b.created = append(b.run, i), append(b.outs, out), append(b.created, c)
		if len(b.run) == maxAtomic {
			b.flush()
		}
	}
	b.flush()
}

// notSent is the verdict on a message not sent because one before it is
// to come again.
var notSent = handler.RetryLater("not sent: a message before it is to come again")

// batchSend is one HandleBatch call: the run of messages gathered for the
// next atomic batch (their indexes, hub copies and streams' creation
// times), and whether a message is to come again.
type batchSend struct {
	f       *Forwarder
	ctx     context.Context
	msgs    []*handler.Message
	done    func(int, handler.Result)
	run     []int
	outs    []*nats.Msg
	created []time.Time
	stopped bool
}

// give hands message i's verdict to done.
func (b *batchSend) give(i int, r handler.Result) {
	if r.Outcome == handler.Retry {
		b.stopped = true
	}
	b.done(i, r)
}

// flush sends the gathered run, in atomic batches while the hub takes
// them, else one by one.
func (b *batchSend) flush() {
	defer func() { b.run, b.outs, b.created = b.run[:0], b.outs[:0], b.created[:0] }()
	f, k := b.f, 0
	for k < len(b.run) && !b.stopped {
		if err := f.waitReady(b.ctx); err != nil {
			break
		}
		for k < len(b.run) && f.onHub(b.created[k], b.msgs[b.run[k]]) {
			f.stats.Skipped.Add(1)
			b.give(b.run[k], handler.Ok())
			k++
		}
		f.mu.Lock()
		atomic := f.hubAtomic
		f.mu.Unlock()
		if len(b.run)-k < 2 || !atomic {
			break
		}
		err := f.publishAtomic(b.ctx, b.outs[k:])
		if err == nil {
			last := b.msgs[b.run[len(b.run)-1]]
			f.stats.Batches.Add(1)
			f.stored(b.created[len(b.run)-1], last, uint64(len(b.run)-k))
			for ; k < len(b.run); k++ {
				b.give(b.run[k], handler.Ok())
			}
			return
		}
		f.stats.Errors.Add(1)
		if !f.batchRetry(b.ctx, err, b.outs[k:]) {
			break // one by one from here: each meets the hub's own answer
		}
	}
	for ; k < len(b.run); k++ {
		i := b.run[k]
		switch {
		case b.stopped:
			b.give(i, notSent)
		case b.ctx.Err() != nil:
			b.give(i, handler.RetryLater("forwarding interrupted: "+b.ctx.Err().Error()))
		default:
			b.give(i, f.send(b.ctx, b.msgs[i], b.outs[k], b.created[k]))
		}
	}
}

// batchRetry reports whether an atomic batch that failed with err is to
// be sent again as a batch, once forwarding is ready again: the link fell
// under it, or no answer came while the hub's streams, checked again,
// take every subject of outs (the position, read again, then tells
// whether it was stored). Any other failure is for the messages to meet
// one by one: a duplicate in the batch, a message the hub refuses, atomic
// batches turned off there, no responders, and a stream full for now —
// it may have room for some of them, which then go in while the rest
// wait in place.
func (f *Forwarder) batchRetry(ctx context.Context, err error, outs []*nats.Msg) bool {
	if ctx.Err() != nil {
		return true // waitReady ends it
	}
	if !f.linkUp() {
		return true
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) {
		// In doubt: the check reads the hub's position again. A subject
		// its streams no longer take swallows every batch holding it:
		// one by one, that message meets its verdict.
		_ = f.checkHub(ctx)
		return !slices.ContainsFunc(outs, func(out *nats.Msg) bool { return !f.hubTakes(out.Subject) })
	}
	return false
}

// publishAtomic sends outs to the hub as one atomic batch and waits for
// its commit: nil when the hub stored every one of them.
func (f *Forwarder) publishAtomic(ctx context.Context, outs []*nats.Msg) error {
	id := nuid.Next()
	last := len(outs) - 1
	defer func() {
		// Sent one by one after all, they go without.
		for _, out := range outs {
			out.Header.Del("Nats-Batch-Id")
			out.Header.Del("Nats-Batch-Sequence")
			out.Header.Del("Nats-Batch-Commit")
		}
	}()
	for i, out := range outs {
		out.Header.Set("Nats-Batch-Id", id)
		out.Header.Set("Nats-Batch-Sequence", strconv.Itoa(i+1))
		if i == last {
			out.Header.Set("Nats-Batch-Commit", "1")
			break
		}
		if err := f.nc.PublishMsg(out); err != nil {
			return err
		}
	}
	pctx, cancel := context.WithTimeout(ctx, f.opts.Timeout)
	watched := f.cancelOnLinkDown(pctx, cancel)
	r, err := f.nc.RequestMsgWithContext(pctx, outs[last])
	cancel()
	<-watched
	if err != nil {
		return err
	}
	var ack struct {
		Stream string              `json:"stream"`
		Domain string              `json:"domain"`
		Seq    uint64              `json:"seq"`
		Count  int                 `json:"count"`
		Error  *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(r.Data, &ack); err != nil {
		return fmt.Errorf("the hub's answer to a batch is not a PubAck: %w", err)
	}
	switch {
	case ack.Error != nil:
		return ack.Error
	case ack.Domain != f.opts.Domain:
		return fmt.Errorf("stream %s of JetStream domain %q stored a batch meant for the hub %q", ack.Stream, ack.Domain, f.opts.Domain)
	case ack.Count != len(outs):
		return fmt.Errorf("the hub committed %d of a batch of %d", ack.Count, len(outs))
	}
	origin, _ := strconv.ParseUint(outs[0].Header.Get(HeaderOriginSeq), 10, 64)
	f.noteStored(ack.Stream, ack.Seq-uint64(len(outs))+1, ack.Seq, origin)
	return nil
}

// cancelOnLinkDown cancels a publish when the link falls under it: its
// PubAck cannot come any more, and waiting out the timeout would hold up
// forwarding after the link is back. The returned channel is closed when
// the watch ended (ctx done).
func (f *Forwarder) cancelOnLinkDown(ctx context.Context, cancel context.CancelFunc) <-chan struct{} {
	done := make(chan struct{})
	if f.opts.LinkUp == nil {
		close(done)
		return done
	}
	go func() {
		defer close(done)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if !f.linkUp() {
					cancel()
					return
				}
			}
		}
	}()
	return done
}

// waitReady blocks until the link is up and the hub checked, or ctx ends.
func (f *Forwarder) waitReady(ctx context.Context) error {
	for !f.Ready() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// permanentForwardError reports whether the hub (or the client) refused
// the message for what it is, so that sending it again cannot help.
func permanentForwardError(err error) (string, bool) {
	if errors.Is(err, nats.ErrMaxPayload) {
		return err.Error(), true
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case jetstream.JSErrCodeStreamMessageExceedsMaximum, // 10054
			10097: // header block over handler.MaxStoredHeader
			return apiErr.Error(), true
		}
	}
	return "", false
}

// hubStoreRefusal reports whether the hub's stream refused to store the
// message for now, for what it holds or where it stands rather than for
// what the message is: full with discard new (10077: maximum messages,
// bytes or messages per subject exceeded), storage or memory used up
// (10047, 10028, 10023), sealed (10109). Space made on the hub, or the
// stream replaced, lets the same message through.
func hubStoreRefusal(err error) (string, bool) {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case 10077, 10047, 10028, 10023, 10109:
			return apiErr.Error(), true
		}
	}
	return "", false
}

// Backlog is the forwarding consumer's pending count and the age of the
// oldest message not forwarded yet (zero when none).
func (f *Forwarder) Backlog(ctx context.Context) (pending uint64, oldest time.Time, err error) {
	c, err := f.local.Consumer(ctx, f.opts.Stream, f.opts.Consumer)
	if err != nil {
		return 0, time.Time{}, err
	}
	ci, err := c.Info(ctx)
	if err != nil {
		return 0, time.Time{}, err
	}
	pending = ci.NumPending + uint64(max(ci.NumAckPending, 0))
	if pending == 0 {
		return 0, time.Time{}, nil
	}
	s, err := f.local.Stream(ctx, f.opts.Stream)
	if err != nil {
		return pending, time.Time{}, err
	}
	// The next message at or after the ack floor: deleted sequences and
	// other subjects skipped.
	filter := ">"
	if fs := ci.Config.FilterSubject; fs != "" {
		filter = fs
	}
	msg, err := s.GetMsg(ctx, ci.AckFloor.Stream+1, jetstream.WithGetMsgSubject(filter))
	if err != nil {
		return pending, time.Time{}, err
	}
	return pending, msg.Time, nil
}
