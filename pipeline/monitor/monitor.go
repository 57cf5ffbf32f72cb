package monitor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/pipeline"
)

// Defaults for Options.
const (
	DefaultInterval     = time.Second
	DefaultIdleInterval = 30 * time.Second
	DefaultStallTimeout = 5 * time.Minute
	DefaultWarnRatio    = 0.8
)

// Consumer is a durable consumer the Monitor watches.
type Consumer struct {
	Stream   string
	Consumer string
	// WantWorkers is the configured number of in-process workers; 0 means
	// the consumer is read by other clients.
	WantWorkers int
	// Workers are its running in-process workers, nil when it has none.
	Workers *pipeline.Workers
	// DeadLetter is its dead-letter stream, "" when it has none.
	DeadLetter string
	// Handler is the kind of its handler (exec, http, log, forward).
	Handler string
	// HandlerTimeout is the longest a handler may run (the exec or http
	// handler's timeout), 0 when it has none. A handler running longer
	// than HandlerTimeout plus the stall timeout makes the consumer
	// stalled; before that it is working, not stalled.
	HandlerTimeout time.Duration
}

// Options configures a Monitor.
type Options struct {
	// Streams are watched for existence and state; the streams of the
	// consumers are added to them.
	Streams   []string
	Consumers []Consumer
	// Interval between two checks; DefaultInterval when zero.
	Interval time.Duration
	// Activity, when set, returns a fingerprint of the positions of the
	// streams and consumers (embedded.Server.StoreActivity) that changes
	// whenever a message is stored, removed, delivered or acknowledged,
	// or a stream or consumer comes or goes; 0 when it cannot tell. While
	// it stays the same, the health is ok without a warning on a single
	// node, no advisory arrived and nothing the Monitor reads in-process
	// changed, a check confirms the last report instead of reading
	// JetStream again, for up to IdleInterval.
	Activity func() uint64
	// IdleInterval is the longest the Monitor goes without reading
	// JetStream while Activity reports no change (a stall is found that
	// much later at most); DefaultIdleInterval when zero.
	IdleInterval time.Duration
	// StallTimeout is how long a consumer with work to do may go without
	// a delivery or an acknowledgement; DefaultStallTimeout when zero.
	StallTimeout time.Duration
	// WarnRatio is the share of a stream limit a consumer's backlog may
	// reach before a warning; DefaultWarnRatio when zero.
	WarnRatio float64
	// FailOnLoss makes a retention loss unhealthy (503) instead of
	// degraded (200).
	FailOnLoss bool
	// Check, when set, is called at every check; an error makes the
	// health unhealthy (used for "JetStream runs on the file store").
	Check func() error
	// FileStoreLimit and MemoryStoreLimit are the server's JetStream
	// limits, reported next to the usage (the account's own limits are
	// unlimited on a single server).
	FileStoreLimit, MemoryStoreLimit int64
	// Diagnose, when set, is called when a check found a problem, to name
	// its cause (the daemon probes whether the store can be written); its
	// error comes first in the health's problems.
	Diagnose func() error
	// StoreWriteErrors, when set, counts the store's write errors since
	// start (for the report and metrics).
	StoreWriteErrors func() uint64
	// ServerName is this node's name: in a cluster, a stream led by it is
	// reported as such (holdfast_stream_leader).
	ServerName string
	// ClusterPeers, when set, tells how many nodes of the JetStream
	// cluster this one sees current (itself included), how many the
	// cluster has and which peers it sees down; ok is false on a single
	// node.
	ClusterPeers func() (p Peers, ok bool)
	// ClusterNodes is how many nodes the config's cluster.routes name
	// with this one (which the routes may or may not name):
	// a cluster whose meta group counts more, one of them not current,
	// keeps a node replaced under another name (or taken away) as a
	// member.
	ClusterNodes int
	// Recreate, when set, creates the configured streams and consumers
	// again (the bootstrap). The Monitor calls it when one of them
	// disappeared while running (`nats stream rm`, `nats consumer rm`),
	// logs it as an error and counts it (Report, holdfast_recreated_total).
	Recreate func(ctx context.Context) error
	// StartupLosses describes acknowledged messages found lost when the
	// store was opened (a power cut with a sync interval, a damaged
	// block). Like a retention loss they make the health degraded until
	// the next start.
	StartupLosses []string
	// Degraded, when set, names problems that degrade the health without
	// making it unhealthy (a hub unreachable for too long).
	Degraded func(now time.Time) []string
	// Warnings, when set, names what the health should warn of without
	// changing its status (the streams and consumers that differ from
	// this node's config).
	Warnings func() []string
	// RestoreRunning, when set, tells whether the server still runs a
	// restore of stream; known is false where it cannot tell (in a
	// cluster the restore runs on the stream's leader). A restore whose
	// client was killed ends without an advisory: asked, it ends there
	// instead of after restoreTimeout.
	RestoreRunning func(stream string) (running, known bool)
}

// Monitor watches the JetStream state behind holdfast: that every stream
// and consumer exists, how far each consumer is behind, whether it makes
// progress, and whether retention removed messages a consumer had not
// acknowledged (see retention.go). It keeps the latest Report for
// /metrics, /healthz and `holdfast status`.
type Monitor struct {
	js   jetstream.JetStream
	nc   *nats.Conn
	opts Options
	log  *slog.Logger
	hist history // each consumer's last 15 minutes, for the status page

	streams []string

	// checkMu serializes checks: the trackers' baselines belong to them.
	checkMu sync.Mutex
	// mu guards the trackers' loss counters, which the advisory handler
	// updates too.
	mu       sync.Mutex
	trackers map[consumerKey]*consumerTracker

	report atomic.Pointer[Report]

	// recreated counts, by "stream/NAME" or "consumer/STREAM/NAME", the
	// times a vanished stream or consumer was created again. checkMu.
	recreated       map[string]uint64
	lastRecreateErr time.Time
	// The last Diagnose result and when it ran. checkMu.
	diagnosedAt time.Time
	diagnosis   string
	// Since when this node reaches no peer, and since when its replica of
	// each stream is not current. checkMu.
	isolatedSince time.Time
	behindSince   map[string]time.Time

	advisory *nats.Subscription
	// restores are the server's restore advisories; restoring holds, by
	// stream, when its restore started (mu). A stream being restored is
	// missing until the restore is done: not a stream deleted by a client.
	restores  *nats.Subscription
	restoring map[string]time.Time
	// missingSince holds when a check first found a configured stream or
	// consumer missing (checkMu).
	missingSince map[string]time.Time
	// unavailableSince holds when a check of a clustered node first found
	// its JetStream API, a stream or a consumer answering "temporarily
	// unavailable" or not at all (checkMu): see electionGrace.
	unavailableSince map[string]time.Time
	// activity is Options.Activity as the last check that read JetStream
	// began, at readAt (checkMu). wake is set by the advisories: the next
	// check reads JetStream.
	activity uint64
	readAt   time.Time
	wake     atomic.Bool
	domain   string // the local JetStream domain, which advisories must carry
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	once     sync.Once
}

type consumerKey struct{ stream, consumer string }

// New returns a Monitor that reads JetStream through js and
// receives the server's advisories on nc.
func New(js jetstream.JetStream, nc *nats.Conn, opts Options, log *slog.Logger) *Monitor {
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	if opts.IdleInterval <= 0 {
		opts.IdleInterval = DefaultIdleInterval
	}
	if opts.StallTimeout <= 0 {
		opts.StallTimeout = DefaultStallTimeout
	}
	if opts.WarnRatio <= 0 {
		opts.WarnRatio = DefaultWarnRatio
	}
	if log == nil {
		log = slog.Default()
	}
	m := &Monitor{
		js:       js,
		nc:       nc,
		opts:     opts,
		log:      log.With("component", "monitor"),
		trackers: map[consumerKey]*consumerTracker{},

		recreated: map[string]uint64{},
	}
	seen := map[string]bool{}
	add := func(s string) {
		if s != "" && !seen[s] {
			seen[s] = true
			m.streams = append(m.streams, s)
		}
	}
	for _, s := range opts.Streams {
		add(s)
	}
	for _, c := range opts.Consumers {
		add(c.Stream)
		add(c.DeadLetter)
		m.trackers[consumerKey{c.Stream, c.Consumer}] = &consumerTracker{mc: c}
	}
	sort.Strings(m.streams)
	return m
}

// SetConsumers replaces the configured streams and consumers the Monitor
// watches, after a reload added or left out some. A consumer it watched
// already keeps its counters and baselines, with mc's settings and workers.
func (m *Monitor) SetConsumers(streams []string, consumers []Consumer) {
	m.checkMu.Lock()
	defer m.checkMu.Unlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	trackers := make(map[consumerKey]*consumerTracker, len(consumers))
	seen := map[string]bool{}
	var names []string
	add := func(s string) {
		if s != "" && !seen[s] {
			seen[s] = true
			names = append(names, s)
		}
	}
	for _, s := range streams {
		add(s)
	}
	for _, c := range consumers {
		add(c.Stream)
		add(c.DeadLetter)
		k := consumerKey{c.Stream, c.Consumer}
		t := m.trackers[k]
		if t == nil {
			t = &consumerTracker{}
		}
		t.mc = c
		trackers[k] = t
	}
	sort.Strings(names)
	m.streams, m.trackers = names, trackers
}

// Consumers returns the consumers the Monitor watches now, by stream and
// name.
func (m *Monitor) Consumers() []Consumer {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Consumer, 0, len(m.trackers))
	for _, t := range m.trackers {
		out = append(out, t.mc)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Stream != out[j].Stream {
			return out[i].Stream < out[j].Stream
		}
		return out[i].Consumer < out[j].Consumer
	})
	return out
}

// SetWorkers replaces the workers the Monitor reports for a consumer, after
// a reload restarted them (w nil: the consumer has no workers now).
func (m *Monitor) SetWorkers(stream, consumer string, want int, w *pipeline.Workers) {
	m.checkMu.Lock()
	defer m.checkMu.Unlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	if t := m.trackers[consumerKey{stream, consumer}]; t != nil {
		t.mc.WantWorkers = want
		t.mc.Workers = w
	}
}

// SetHandlerTimeout replaces the handler timeout of a consumer (see
// Consumer.HandlerTimeout), after a reload changed it.
func (m *Monitor) SetHandlerTimeout(stream, consumer string, timeout time.Duration) {
	m.checkMu.Lock()
	defer m.checkMu.Unlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	if t := m.trackers[consumerKey{stream, consumer}]; t != nil {
		t.mc.HandlerTimeout = timeout
	}
}

// Options returns the options the Monitor runs with.
func (m *Monitor) Options() Options { return m.opts }

// Open subscribes to the server's termination advisories (a message
// removed while delivered and unacknowledged is reported there), runs a
// first check and starts checking every Interval.
func (m *Monitor) Open(ctx context.Context) error {
	// Advisories are acted on only when they carry this server's
	// JetStream domain (see pipeline.CheckAdvisoryScope).
	ai, err := m.js.AccountInfo(ctx)
	if err != nil {
		return fmt.Errorf("monitor: cannot read the JetStream domain: %w", err)
	}
	m.domain = ai.Domain
	sub, err := m.nc.Subscribe(advisoryTerminatedPrefix+".>", m.onTerminated)
	if err != nil {
		return fmt.Errorf("monitor: cannot subscribe to termination advisories: %w", err)
	}
	m.advisory = sub
	if m.restores, err = m.nc.Subscribe(advisoryRestorePrefix+".>", m.onRestore); err != nil {
		_ = sub.Unsubscribe()
		return fmt.Errorf("monitor: cannot subscribe to restore advisories: %w", err)
	}
	// The subscription must be registered before the first check, or a
	// loss right after it could be missed.
	if err := m.nc.FlushTimeout(10 * time.Second); err != nil {
		_ = sub.Unsubscribe()
		_ = m.restores.Unsubscribe()
		return fmt.Errorf("monitor: %w", err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	m.check(ctx)
	m.wg.Add(1)
	go m.loop(runCtx)
	m.log.Debug("monitor started", "interval", m.opts.Interval, "stall_timeout", m.opts.StallTimeout, "streams", m.streams)
	return nil
}

func (m *Monitor) loop(ctx context.Context) {
	defer m.wg.Done()
	t := time.NewTicker(m.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if !m.confirm(time.Now()) {
				m.check(ctx)
			}
			m.hist.add(m.Report())
		}
	}
}

// confirm stores the last report again, dated now, when nothing it was
// made of can have changed since (see Options.Activity), and reports
// whether it did.
func (m *Monitor) confirm(now time.Time) bool {
	if m.opts.Activity == nil || m.wake.Load() {
		return false
	}
	m.checkMu.Lock()
	defer m.checkMu.Unlock()
	r := m.Report()
	if r == nil || r.Cluster != nil || r.Health.Status != HealthOK || len(r.Health.Warnings) > 0 ||
		now.Sub(m.readAt) >= m.opts.IdleInterval || m.activity == 0 || m.opts.Activity() != m.activity {
		return false
	}
	if m.opts.Check != nil && m.opts.Check() != nil {
		return false
	}
	if m.opts.StoreWriteErrors != nil && m.opts.StoreWriteErrors() != r.JetStream.StoreWriteErrors {
		return false
	}
	if m.opts.Degraded != nil && len(m.opts.Degraded(now)) > 0 {
		return false
	}
	if m.opts.Warnings != nil && len(m.opts.Warnings()) > 0 {
		return false
	}
	m.mu.Lock()
	for _, c := range r.Consumers {
		t := m.trackers[consumerKey{c.Stream, c.Name}]
		if t == nil || workerStatus(t.mc) != c.Workers {
			m.mu.Unlock()
			return false
		}
	}
	m.mu.Unlock()
	again := *r
	again.Time = now
	m.report.Store(&again)
	return true
}

// Close stops checking. It is idempotent.
func (m *Monitor) Close(ctx context.Context) error {
	m.once.Do(func() {
		if m.advisory != nil {
			_ = m.advisory.Unsubscribe()
		}
		if m.restores != nil {
			_ = m.restores.Unsubscribe()
		}
		if m.cancel != nil {
			m.cancel()
		}
		m.wg.Wait()
	})
	return nil
}

// Report returns the result of the latest check, or nil before the first.
func (m *Monitor) Report() *Report { return m.report.Load() }

// CheckNow runs a check at once (tests, and `holdfast status` freshness).
func (m *Monitor) CheckNow(ctx context.Context) *Report {
	m.check(ctx)
	return m.Report()
}

// Report is what a Monitor check found. It is also the payload holdfast
// answers on StatusSubject.
type Report struct {
	Time      time.Time        `json:"time"`
	JetStream JetStreamStatus  `json:"jetstream"`
	Streams   []StreamStatus   `json:"streams"`
	Consumers []ConsumerStatus `json:"consumers"`
	Health    Health           `json:"health"`
	// OtherStreams are the streams on the server that holdfast does not
	// manage (KV and object-store buckets, streams made by clients).
	OtherStreams []StreamStatus `json:"other_streams,omitempty"`
	// Cluster is this node's view of its JetStream cluster; nil on a
	// single node.
	Cluster *ClusterView `json:"cluster,omitempty"`
}

// ClusterView is how much of its cluster this node reaches.
type ClusterView struct {
	// Current counts the nodes this one sees current, itself included;
	// Size is the number of nodes of the cluster.
	Current int `json:"current"`
	Size    int `json:"size"`
	// IsolatedFor is how long this node has reached none of its peers.
	IsolatedFor time.Duration `json:"isolated_for_ns,omitempty"`
	// Configured is the number of nodes cluster.routes names (0 when
	// unknown).
	Configured int `json:"configured,omitempty"`
	// Down are the peers this node has no route to.
	Down []DownPeer `json:"down,omitempty"`
}

// Lingering tells whether the meta group counts more nodes than the
// config names, one of them not current: a node replaced under another
// name (or taken away) that is still a member. The streams keep a replica
// on it, and the meta group needs a majority of all its members.
func (c *ClusterView) Lingering() bool {
	return c != nil && c.Configured > 0 && c.Size > c.Configured && c.Current < c.Size
}

// Peers is this node's count of its JetStream cluster.
type Peers struct {
	// Current counts the nodes this one sees current, itself included;
	// Size is the number of nodes of the cluster.
	Current, Size int
	// Down are the peers this node has no route to.
	Down []DownPeer
}

// DownPeer is a peer this node has no route to.
type DownPeer struct {
	Name string `json:"name"`
	// Since is when this node last saw it (zero when unknown: down since
	// this node started).
	Since time.Time `json:"since,omitzero"`
}

// LastQuorum tells whether the cluster keeps its quorum with some peers
// down (no route to them) but would lose it with one more. A peer that is
// back and catching up is not down.
func (c *ClusterView) LastQuorum() bool {
	if c == nil || c.Size <= 1 || len(c.Down) == 0 || c.NoQuorum() {
		return false
	}
	up := c.Size - len(c.Down)
	return up*2 > c.Size && (up-1)*2 <= c.Size
}

// NoQuorum tells whether this node is outside a majority of its cluster.
func (c *ClusterView) NoQuorum() bool { return c != nil && c.Size > 1 && c.Current*2 <= c.Size }

// JetStreamStatus is the account's JetStream usage.
type JetStreamStatus struct {
	Enabled bool   `json:"enabled"`
	Error   string `json:"error,omitempty"`
	// UnavailableFor is how long the JetStream API of a clustered node
	// has answered as while its cluster elects leaders (see
	// electionGrace); 0 otherwise.
	UnavailableFor   time.Duration `json:"unavailable_for_ns,omitempty"`
	FileUsed         uint64        `json:"file_used"`
	FileReserved     uint64        `json:"file_reserved"`
	FileLimit        int64         `json:"file_limit"`
	MemoryUsed       uint64        `json:"memory_used"`
	MemoryReserved   uint64        `json:"memory_reserved"`
	MemoryLimit      int64         `json:"memory_limit"`
	Streams          int           `json:"streams"`
	Consumers        int           `json:"consumers"`
	APIRequests      uint64        `json:"api_requests"`
	APIErrors        uint64        `json:"api_errors"`
	ServerCheckError string        `json:"server_check_error,omitempty"`
	// StoreWriteErrors counts the writes to the store that failed since
	// start (disk full, I/O errors).
	StoreWriteErrors uint64 `json:"store_write_errors,omitempty"`
	// Diagnosis names the cause of a problem, when one was found.
	Diagnosis string `json:"diagnosis,omitempty"`
}

// StreamStatus is one stream's state and limits.
type StreamStatus struct {
	Name   string `json:"name"`
	Exists bool   `json:"exists"`
	Error  string `json:"error,omitempty"`
	// UnavailableFor: as JetStreamStatus.UnavailableFor, for the stream.
	UnavailableFor time.Duration `json:"unavailable_for_ns,omitempty"`
	Subjects       []string      `json:"subjects,omitempty"`
	Messages       uint64        `json:"messages"`
	Bytes          uint64        `json:"bytes"`
	FirstSeq       uint64        `json:"first_seq"`
	LastSeq        uint64        `json:"last_seq"`
	FirstTime      time.Time     `json:"first_time,omitzero"`
	LastTime       time.Time     `json:"last_time,omitzero"`
	Retention      string        `json:"retention,omitempty"`
	Discard        string        `json:"discard,omitempty"`
	Storage        string        `json:"storage,omitempty"`
	// MaxMsgs and MaxBytes are -1 when unlimited; MaxAge is 0 then.
	MaxMsgs  int64         `json:"max_msgs"`
	MaxBytes int64         `json:"max_bytes"`
	MaxAge   time.Duration `json:"max_age_ns"`
	// Recreated counts the times the stream disappeared while running and
	// holdfast created it again.
	Recreated uint64 `json:"recreated,omitempty"`
	// Leader and Replicas are the stream's Raft group in a cluster:
	// the leader's server name and the other replicas.
	Leader   string          `json:"leader,omitempty"`
	Replicas []ReplicaStatus `json:"replicas,omitempty"`
	// Leaderless: the stream is replicated and its Raft group has no
	// leader (no quorum of its replicas).
	Leaderless bool `json:"leaderless,omitempty"`
	// BehindFor is how long this node's replica has not been current with
	// the leader; BehindBy how many operations it lags.
	BehindFor time.Duration `json:"behind_for_ns,omitempty"`
	BehindBy  uint64        `json:"behind_by,omitempty"`
}

// ReplicaStatus is one follower of a replicated stream.
type ReplicaStatus struct {
	Name string `json:"name"`
	// Peer is the replica's Raft peer ID.
	Peer    string `json:"peer,omitempty"`
	Current bool   `json:"current"`
	Offline bool   `json:"offline,omitempty"`
	Lag     uint64 `json:"lag,omitempty"`
}

// ConsumerStatus is one consumer's position, progress and losses.
type ConsumerStatus struct {
	Stream string `json:"stream"`
	Name   string `json:"name"`
	Exists bool   `json:"exists"`
	Error  string `json:"error,omitempty"`
	// UnavailableFor: as JetStreamStatus.UnavailableFor, for the consumer.
	UnavailableFor time.Duration `json:"unavailable_for_ns,omitempty"`
	FilterSubject  string        `json:"filter_subject,omitempty"`
	// Pending are messages not delivered yet; AckPending delivered and
	// not acknowledged; Redelivered those of them delivered more than once.
	Pending       uint64 `json:"pending"`
	AckPending    uint64 `json:"ack_pending"`
	Redelivered   uint64 `json:"redelivered"`
	MaxAckPending int    `json:"max_ack_pending"`
	Waiting       int    `json:"waiting"`
	// OldestUnprocessed is when the oldest message the consumer has not
	// acknowledged was stored (read every few seconds); zero without a
	// backlog.
	OldestUnprocessed time.Time `json:"oldest_unprocessed,omitzero"`
	DeliveredSeq      uint64    `json:"delivered_stream_seq"`
	AckFloorSeq       uint64    `json:"ack_floor_stream_seq"`
	// LostToRetention counts messages removed from the stream (by
	// max_msgs, max_bytes, max_age or a deletion) before this consumer
	// acknowledged them, since holdfast started.
	LostToRetention uint64     `json:"lost_to_retention"`
	LastLoss        *LossEvent `json:"last_loss,omitempty"`
	// BacklogRatio is the backlog against each stream limit that is set:
	// "max_msgs", "max_bytes" (estimated from the average message size)
	// and "max_age" (age of the oldest unacknowledged message).
	BacklogRatio map[string]float64 `json:"backlog_ratio,omitempty"`
	Warnings     []string           `json:"warnings,omitempty"`
	// Stalled: holdfast's own workers should be making progress and are
	// not (a handler stuck past its timeout, workers idle while messages
	// wait). A restart cures that, so it is unhealthy and stops the
	// watchdog. Handlers still running within their timeout and messages
	// waiting for a delayed retry are not a stall.
	Stalled     bool   `json:"stalled"`
	StallReason string `json:"stall_reason,omitempty"`
	// Blocked: a consumer without in-process workers has max_ack_pending
	// messages out to other clients and made no progress for the stall
	// timeout. It makes the health degraded, never the watchdog stop.
	Blocked bool `json:"blocked,omitempty"`
	// IdleFor is how long the consumer made no progress while it was
	// expected to.
	IdleFor    time.Duration `json:"idle_for_ns,omitempty"`
	DeadLetter string        `json:"dead_letter,omitempty"`
	// Handler is the kind of handler its workers run.
	Handler string       `json:"handler,omitempty"`
	Workers WorkerStatus `json:"workers"`
	// Leader is the server leading the consumer's Raft group (cluster
	// mode); Leaderless says the replicated consumer has none.
	Leader     string `json:"leader,omitempty"`
	Leaderless bool   `json:"leaderless,omitempty"`
	// Recreated counts the times the consumer disappeared while running
	// and holdfast created it again.
	Recreated uint64 `json:"recreated,omitempty"`
}

// WorkerStatus is what a consumer's in-process workers did since start.
type WorkerStatus struct {
	Configured int  `json:"configured"`
	Running    bool `json:"running"`
	// Draining: the workers stopped taking messages and wait for their
	// handlers (up to shutdown_timeout), as a reload does before it
	// restarts them with the new settings.
	Draining     bool   `json:"draining,omitempty"`
	InFlight     int64  `json:"in_flight"`
	Processed    uint64 `json:"processed"`
	Acked        uint64 `json:"acked"`
	Retried      uint64 `json:"retried"`
	DeadLettered uint64 `json:"dead_lettered"`
	Failures     uint64 `json:"failures"`
	// DelayedRetries are messages waiting for a retry the workers delayed
	// on purpose (backoff, Retry-After), the last due at RetryDue.
	DelayedRetries int       `json:"delayed_retries,omitempty"`
	RetryDue       time.Time `json:"retry_due,omitzero"`
	// OldestHandlerStart is when the longest-running handler started.
	OldestHandlerStart time.Time `json:"oldest_handler_start,omitzero"`
	// DeadLetterFailing counts messages kept because their dead letter
	// cannot be stored now (DeadLetterError says why); they are retried.
	DeadLetterFailing int64  `json:"dead_letter_failing,omitempty"`
	DeadLetterError   string `json:"dead_letter_error,omitempty"`
	// LastFailure is the handlers' latest failure since holdfast started.
	LastFailure *pipeline.Failure `json:"last_failure,omitempty"`
}

// LossEvent is one detected retention loss.
type LossEvent struct {
	Time  time.Time `json:"time"`
	Count uint64    `json:"count"`
	// AtLeast: more may have been lost than counted (see retention.go).
	AtLeast  bool   `json:"at_least,omitempty"`
	FirstSeq uint64 `json:"first_seq"`
	LastSeq  uint64 `json:"last_seq"`
	Cause    string `json:"cause"`
}

// check reads everything once and publishes a new Report.
func (m *Monitor) check(ctx context.Context) {
	m.checkMu.Lock()
	defer m.checkMu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second+m.opts.Interval)
	defer cancel()
	m.wake.Store(false)
	if m.opts.Activity != nil {
		m.activity = m.opts.Activity()
	}
	now := time.Now()
	m.readAt = now
	r := &Report{Time: now}
	r.Cluster = m.clusterView(now)

	ai, err := m.js.AccountInfo(ctx)
	if err != nil {
		r.JetStream.Error = err.Error()
	} else {
		r.JetStream = JetStreamStatus{
			Enabled:        true,
			FileUsed:       ai.Store,
			FileReserved:   ai.ReservedStore,
			FileLimit:      limitOr(ai.Limits.MaxStore, m.opts.FileStoreLimit),
			MemoryUsed:     ai.Memory,
			MemoryReserved: ai.ReservedMemory,
			MemoryLimit:    limitOr(ai.Limits.MaxMemory, m.opts.MemoryStoreLimit),
			Streams:        ai.Streams,
			Consumers:      ai.Consumers,
			APIRequests:    ai.API.Total,
			APIErrors:      ai.API.Errors,
		}
	}
	if m.opts.Check != nil {
		if err := m.opts.Check(); err != nil {
			r.JetStream.ServerCheckError = err.Error()
		}
	}
	if m.opts.StoreWriteErrors != nil {
		r.JetStream.StoreWriteErrors = m.opts.StoreWriteErrors()
	}

	for _, name := range m.streams {
		r.Streams = append(r.Streams, m.checkStream(ctx, name, now, r))
	}
	if m.recreate(ctx, r, now) {
		r.Streams, r.Consumers = nil, nil
		for _, name := range m.streams {
			r.Streams = append(r.Streams, m.checkStream(ctx, name, now, r))
		}
	}
	for i := range r.Streams {
		r.Streams[i].Recreated = m.recreated["stream/"+r.Streams[i].Name]
	}
	if r.JetStream.Enabled {
		r.OtherStreams = m.otherStreams(ctx)
	}
	for i := range r.Consumers {
		r.Consumers[i].Recreated = m.recreated["consumer/"+r.Consumers[i].Stream+"/"+r.Consumers[i].Name]
	}
	sort.Slice(r.Consumers, func(i, j int) bool {
		if r.Consumers[i].Stream != r.Consumers[j].Stream {
			return r.Consumers[i].Stream < r.Consumers[j].Stream
		}
		return r.Consumers[i].Name < r.Consumers[j].Name
	})
	m.noteUnavailable(r, now)
	r.Health = m.evaluate(r)
	if r.Health.Status == HealthUnhealthy && m.opts.Diagnose != nil && r.JetStream.ServerCheckError == "" {
		// A diagnosis may write to the disk: at most every diagnoseEvery.
		if now.Sub(m.diagnosedAt) >= diagnoseEvery {
			m.diagnosedAt, m.diagnosis = now, ""
			if err := m.opts.Diagnose(); err != nil {
				m.diagnosis = err.Error()
			}
		}
		if m.diagnosis != "" {
			r.JetStream.Diagnosis = m.diagnosis
			r.Health = m.evaluate(r)
		}
	}
	m.report.Store(r)
}

// electionGrace is how long a clustered node's JetStream API, a stream or
// a consumer may answer "temporarily unavailable" (or time out) before
// that makes the node unhealthy; until then it is degraded. A peer
// returning after a partition, or a leader lost, makes the cluster elect
// leaders again (meta, streams, consumers: nats-server's election timeout
// is 4 to 9 s, and a returning node with a higher term starts elections
// anew): for those seconds every node's API answers so, and a 503 from
// the nodes that kept the quorum would have a load balancer drop the
// whole cluster.
const electionGrace = 20 * time.Second

// electing reports whether err is what a clustered server answers while
// its cluster elects leaders: "JetStream system temporarily unavailable"
// (10008), no answer in time, or no responders.
func electing(err string) bool {
	for _, s := range []string{"err_code=10008", "temporarily unavailable", "deadline exceeded", "timeout", "no responders"} {
		if strings.Contains(err, s) {
			return true
		}
	}
	return false
}

// noteUnavailable sets, on a clustered node, how long the JetStream API
// and each stream and consumer have answered as during an election.
// checkMu is held.
func (m *Monitor) noteUnavailable(r *Report, now time.Time) {
	seen := map[string]bool{}
	since := func(key, err string) time.Duration {
		if r.Cluster == nil || !electing(err) {
			return 0
		}
		seen[key] = true
		if m.unavailableSince == nil {
			m.unavailableSince = map[string]time.Time{}
		}
		at, ok := m.unavailableSince[key]
		if !ok {
			at = now
			m.unavailableSince[key] = now
		}
		return max(now.Sub(at), time.Nanosecond)
	}
	if !r.JetStream.Enabled {
		r.JetStream.UnavailableFor = since("jetstream", r.JetStream.Error)
	}
	for i := range r.Streams {
		if s := &r.Streams[i]; !s.Exists {
			s.UnavailableFor = since("stream/"+s.Name, s.Error)
		}
	}
	for i := range r.Consumers {
		if c := &r.Consumers[i]; !c.Exists {
			c.UnavailableFor = since("consumer/"+c.Stream+"/"+c.Name, c.Error)
		}
	}
	for k := range m.unavailableSince {
		if !seen[k] {
			delete(m.unavailableSince, k)
		}
	}
}

// otherStreams lists the streams on the server that are not configured
// ones, in one paged API request.
func (m *Monitor) otherStreams(ctx context.Context) []StreamStatus {
	var out []StreamStatus
	lister := m.js.ListStreams(ctx)
	for si := range lister.Info() {
		if slices.Contains(m.streams, si.Config.Name) {
			continue
		}
		var st StreamStatus
		FillStream(&st, si)
		st.Name = si.Config.Name
		out = append(out, st)
	}
	if err := lister.Err(); err != nil {
		m.log.Debug("cannot list the server's streams", "err", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// clusterView asks ClusterPeers how much of the cluster this node sees,
// and keeps since when it sees none of its peers. checkMu is held.
func (m *Monitor) clusterView(now time.Time) *ClusterView {
	if m.opts.ClusterPeers == nil {
		return nil
	}
	p, ok := m.opts.ClusterPeers()
	if !ok || p.Size <= 1 {
		m.isolatedSince = time.Time{}
		return nil
	}
	v := &ClusterView{Current: p.Current, Size: p.Size, Configured: m.opts.ClusterNodes, Down: p.Down}
	if p.Current > 1 {
		m.isolatedSince = time.Time{}
		return v
	}
	if m.isolatedSince.IsZero() {
		m.isolatedSince = now
	}
	v.IsolatedFor = now.Sub(m.isolatedSince)
	return v
}

// trackReplica sets how long this node's replica of the stream has not
// been current. checkMu is held.
func (m *Monitor) trackReplica(st *StreamStatus, now time.Time) {
	var mine *ReplicaStatus
	for i := range st.Replicas {
		if st.Replicas[i].Name == m.opts.ServerName && m.opts.ServerName != "" {
			mine = &st.Replicas[i]
		}
	}
	if mine == nil || mine.Current {
		delete(m.behindSince, st.Name)
		return
	}
	if m.behindSince == nil {
		m.behindSince = map[string]time.Time{}
	}
	since, ok := m.behindSince[st.Name]
	if !ok {
		since = now
		m.behindSince[st.Name] = now
	}
	st.BehindFor, st.BehindBy = now.Sub(since), mine.Lag
}

// What a check reports for a stream or a consumer that is not on the
// server.
const (
	errStreamMissing   = "stream does not exist"
	errConsumerMissing = "consumer does not exist"
)

// diagnoseEvery is how often an unhealthy check calls Diagnose.
const diagnoseEvery = 10 * time.Second

// recreateRetry is how often a failing Recreate is logged again.
const recreateRetry = 30 * time.Second

// recreateGrace is how long a configured stream or consumer must be
// missing before it is created again: a restore deletes a stream just
// before the server announces that it restores it.
const recreateGrace = 2 * time.Second

// advisoryRestorePrefix starts the subjects of the server's restore
// advisories: .RESTORE_CREATE.<stream> when one starts, .RESTORE_COMPLETE.<stream>
// when it ended, and of .DELETED.<stream>, which ends a restore given up.
const advisoryRestorePrefix = "$JS.EVENT.ADVISORY.STREAM"

// restoreTimeout bounds how long a restore that never announced its end
// keeps holdfast from creating the stream again.
const restoreTimeout = 30 * time.Minute

// onRestore notes the server's restore advisories for streams of this
// domain.
func (m *Monitor) onRestore(msg *nats.Msg) {
	var adv struct {
		Type   string `json:"type"`
		Domain string `json:"domain"`
		Stream string `json:"stream"`
	}
	kind, stream, ok := strings.Cut(strings.TrimPrefix(msg.Subject, advisoryRestorePrefix+"."), ".")
	if !ok || (kind != "RESTORE_CREATE" && kind != "RESTORE_COMPLETE" && kind != "DELETED") {
		return
	}
	if err := json.Unmarshal(msg.Data, &adv); err != nil || adv.Stream != stream || adv.Domain != m.domain {
		return
	}
	m.wake.Store(true)
	m.mu.Lock()
	defer m.mu.Unlock()
	if kind == "RESTORE_COMPLETE" {
		delete(m.restoring, stream)
		return
	}
	if kind == "DELETED" {
		// A restore given up by its client (interrupted, or failed) is
		// never announced complete: the server ends it after 5 s without
		// data and publishes no RESTORE_COMPLETE. holdfast
		// restore ends it itself first; a client that does not (nats
		// stream restore, an older holdfast) may delete what it left,
		// and that deletion ends the restore here.
		if _, ok := m.restoring[stream]; ok {
			delete(m.restoring, stream)
			m.log.Warn("stream deleted while being restored (a restore given up): created again if it stays missing", "stream", stream)
		}
		return
	}
	if m.restoring == nil {
		m.restoring = map[string]time.Time{}
	}
	m.restoring[stream] = time.Now()
	m.log.Info("stream being restored from a backup: not created again meanwhile", "stream", stream)
}

// restoreStarted tells whether a restore of stream is under way, and
// since when.
func (m *Monitor) restoreStarted(stream string, now time.Time) (time.Time, bool) {
	m.mu.Lock()
	since, ok := m.restoring[stream]
	m.mu.Unlock()
	if !ok || now.Sub(since) >= restoreTimeout {
		return since, false
	}
	// The server announces a restore before it takes the restore's
	// data: give it recreateGrace to start.
	if m.opts.RestoreRunning == nil || now.Sub(since) < recreateGrace {
		return since, true
	}
	if running, known := m.opts.RestoreRunning(stream); running || !known {
		return since, true
	}
	m.mu.Lock()
	if m.restoring[stream] == since {
		delete(m.restoring, stream)
	}
	m.mu.Unlock()
	m.log.Warn("restore of the stream ended without announcing it (its client stopped sending: killed, or disconnected): created again if it stays missing", "stream", stream)
	return since, false
}

// recreate creates the configured streams and consumers again when the
// check found one missing, and reports whether it did. A stream or
// consumer deleted while holdfast runs would otherwise leave it without
// them until a restart: never silently — every time is an error line and
// counted. checkMu is held.
func (m *Monitor) recreate(ctx context.Context, r *Report, now time.Time) bool {
	if m.opts.Recreate == nil || !r.JetStream.Enabled {
		return false
	}
	var missing []string
	restoring := false
	for i := range r.Streams {
		s := &r.Streams[i]
		if !s.Exists && s.Error == errStreamMissing {
			if since, ok := m.restoreStarted(s.Name, now); ok {
				s.Error = fmt.Sprintf("being restored from a backup (since %s)", since.UTC().Format(time.RFC3339))
				restoring = true
				continue
			}
			missing = append(missing, "stream/"+s.Name)
		}
	}
	for _, c := range r.Consumers {
		if !c.Exists && c.Error == errConsumerMissing {
			missing = append(missing, "consumer/"+c.Stream+"/"+c.Name)
		}
	}
	// What went missing only now may be a restore about to start (the
	// stream is deleted first, then restored): look again after
	// recreateGrace. And nothing is created while a restore runs, since
	// the bootstrap would create the restored stream empty.
	seen := map[string]bool{}
	fresh := false
	for _, k := range missing {
		seen[k] = true
		if since, ok := m.missingSince[k]; !ok {
			if m.missingSince == nil {
				m.missingSince = map[string]time.Time{}
			}
			m.missingSince[k] = now
			fresh = true
		} else if now.Sub(since) < recreateGrace {
			fresh = true
		}
	}
	for k := range m.missingSince {
		if !seen[k] {
			delete(m.missingSince, k)
		}
	}
	if len(missing) == 0 || fresh || restoring {
		return false
	}
	if err := m.opts.Recreate(ctx); err != nil {
		if now.Sub(m.lastRecreateErr) >= recreateRetry {
			m.lastRecreateErr = now
			m.log.Error("configured streams or consumers disappeared while running and cannot be created again; retrying",
				"missing", missing, "err", err)
		}
		return false
	}
	for _, k := range missing {
		m.recreated[k]++
		delete(m.missingSince, k)
	}
	m.log.Error("configured streams or consumers disappeared while running (deleted by a client such as `nats stream rm`): created them again; the messages they held are gone",
		"recreated", missing)
	return true
}

// Recreated returns, by "stream/NAME" and "consumer/STREAM/NAME", how many
// times the Monitor created a vanished stream or consumer again.
func (m *Monitor) Recreated() map[string]uint64 {
	m.checkMu.Lock()
	defer m.checkMu.Unlock()
	return maps.Clone(m.recreated)
}

func limitOr(account, server int64) int64 {
	if account > 0 {
		return account
	}
	if server > 0 {
		return server
	}
	return -1
}

// checkStream reads one stream and then its consumers, and appends the
// consumers' status to r.
func (m *Monitor) checkStream(ctx context.Context, name string, now time.Time, r *Report) StreamStatus {
	st := StreamStatus{Name: name}
	var consumers []*consumerTracker
	for _, t := range m.trackers {
		if t.mc.Stream == name {
			consumers = append(consumers, t)
		}
	}
	sort.Slice(consumers, func(i, j int) bool { return consumers[i].mc.Consumer < consumers[j].mc.Consumer })

	s, err := m.js.Stream(ctx, name)
	if err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			st.Error = errStreamMissing
		} else {
			st.Error = err.Error()
		}
		for _, t := range consumers {
			m.mu.Lock()
			t.invalidate()
			cs := t.status(now)
			m.mu.Unlock()
			cs.Error = "stream " + name + " does not exist"
			if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
				cs.Error = err.Error()
			}
			r.Consumers = append(r.Consumers, cs)
		}
		return st
	}
	before := s.CachedInfo()
	FillStream(&st, before)
	m.trackReplica(&st, now)

	for _, t := range consumers {
		r.Consumers = append(r.Consumers, m.checkConsumer(ctx, s, before, t, now))
	}
	return st
}

// FillStream sets st from a stream's info: existence, state and limits.
func FillStream(st *StreamStatus, si *jetstream.StreamInfo) {
	st.Exists = true
	st.Leader, st.Replicas = "", nil
	if c := si.Cluster; c != nil {
		st.Leader = c.Leader
		st.Leaderless = c.Leader == "" && si.Config.Replicas > 1
		for _, r := range c.Replicas {
			st.Replicas = append(st.Replicas, ReplicaStatus{Name: r.Name, Peer: r.Peer, Current: r.Current, Offline: r.Offline, Lag: r.Lag})
		}
	}
	st.Subjects = StoredSubjects(si.Config.Subjects)
	st.Messages = si.State.Msgs
	st.Bytes = si.State.Bytes
	st.FirstSeq = si.State.FirstSeq
	st.LastSeq = si.State.LastSeq
	st.FirstTime = si.State.FirstTime
	st.LastTime = si.State.LastTime
	st.Retention, st.Discard, st.Storage = StreamPolicies(si.Config)
	st.MaxMsgs = si.Config.MaxMsgs
	st.MaxBytes = si.Config.MaxBytes
	st.MaxAge = si.Config.MaxAge
}

func (m *Monitor) checkConsumer(ctx context.Context, s jetstream.Stream, si *jetstream.StreamInfo, t *consumerTracker, now time.Time) ConsumerStatus {
	c, err := s.Consumer(ctx, t.mc.Consumer)
	if err != nil {
		m.mu.Lock()
		t.invalidate()
		cs := t.status(now)
		m.mu.Unlock()
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			cs.Error = errConsumerMissing
		} else {
			cs.Error = err.Error()
		}
		return cs
	}
	ci := c.CachedInfo()
	if t.mc.Workers != nil {
		// ack_wait changed by nats consumer edit or another node's
		// config: the workers' in-progress acks follow it.
		t.mc.Workers.SetAckWait(ci.Config.AckWait)
	}
	var obs observation
	if filtered(si.Config.Subjects, ci.Config) {
		obs, err = m.observeFiltered(ctx, s, si, ci, t)
		if err != nil {
			m.log.Warn("cannot check consumer for retention loss", "stream", t.mc.Stream, "consumer", t.mc.Consumer, "err", err)
		}
	} else {
		// The stream as it is after the consumer was read: a removal
		// that moved the consumer past messages it had not received (a
		// purge, a worker's fetch skipping what a limit removed) after
		// si was read would otherwise be hidden, the consumer past
		// them and the stream's first sequence not yet, and those
		// messages never counted.
		if after, err := s.Info(ctx); err == nil {
			si = after
		} else {
			m.log.Warn("cannot check consumer for retention loss", "stream", t.mc.Stream, "consumer", t.mc.Consumer, "err", err)
		}
		obs = observation{si: si, ci: ci, consistent: true}
	}

	oldest := m.oldestUnacked(ctx, s, obs.si, obs.ci, t, now)

	m.mu.Lock()
	defer m.mu.Unlock()
	m.account(t, obs, now)
	m.warn(t, obs.si, obs.ci, oldest, now)
	var act pipeline.Activity
	if t.mc.Workers != nil {
		act = t.mc.Workers.Activity(now)
	}
	t.progress(obs.ci, act, now)
	cs := t.status(now)
	cs.Exists = true
	cs.OldestUnprocessed = oldest
	if c := obs.ci.Cluster; c != nil {
		cs.Leader = c.Leader
		cs.Leaderless = c.Leader == "" && obs.ci.Config.Replicas != 1 && si.Config.Replicas > 1
	}
	cs.Stalled, cs.StallReason = t.stalled(obs.ci, act, m.opts.StallTimeout, now)
	cs.Blocked = t.blocked(m.opts.StallTimeout, now)
	return cs
}

// advisoryTerminatedPrefix is where the server reports messages it
// stopped delivering, including those removed while unacknowledged.
const advisoryTerminatedPrefix = "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED"

// reasonUnackedDeleted is the server's reason (nats-server
// ackTermUnackedLimitsReason) when a delivered, unacknowledged message
// was removed from its stream.
const reasonUnackedDeleted = "Unacknowledged message was deleted"

// terminatedType is the type of a MSG_TERMINATED advisory.
const terminatedType = "io.nats.jetstream.advisory.v1.terminated"

type terminatedAdvisory struct {
	Type      string `json:"type"`
	Domain    string `json:"domain"`
	Stream    string `json:"stream"`
	Consumer  string `json:"consumer"`
	StreamSeq uint64 `json:"stream_seq"`
	Reason    string `json:"reason"`
}

func (m *Monitor) onTerminated(msg *nats.Msg) {
	var adv terminatedAdvisory
	if err := json.Unmarshal(msg.Data, &adv); err != nil || adv.Reason != reasonUnackedDeleted {
		return
	}
	// From another server's JetStream (across a leafnode): not ours to count.
	if pipeline.CheckAdvisoryScope(terminatedType, adv.Type, adv.Stream, adv.Consumer, adv.Domain, adv.Stream, adv.Consumer, m.domain) != "" {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.trackers[consumerKey{adv.Stream, adv.Consumer}]
	if t == nil {
		return
	}
	t.lost++
	t.unlogged.add(adv.StreamSeq, adv.StreamSeq, 1)
	m.wake.Store(true)
}

// StreamPolicies names a stream's retention, discard and storage policies
// as the config file spells them ("limits", "old", "file").
func StreamPolicies(c jetstream.StreamConfig) (retention, discard, storage string) {
	switch c.Retention {
	case jetstream.InterestPolicy:
		retention = "interest"
	case jetstream.WorkQueuePolicy:
		retention = "workqueue"
	default:
		retention = "limits"
	}
	discard = "old"
	if c.Discard == jetstream.DiscardNew {
		discard = "new"
	}
	storage = "file"
	if c.Storage == jetstream.MemoryStorage {
		storage = "memory"
	}
	return retention, discard, storage
}
