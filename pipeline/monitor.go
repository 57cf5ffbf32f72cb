package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Defaults for MonitorOptions.
const (
	DefaultMonitorInterval = time.Second
	DefaultStallTimeout    = 5 * time.Minute
	DefaultWarnRatio       = 0.8
)

// MonitoredConsumer is a durable consumer the Monitor watches.
type MonitoredConsumer struct {
	Stream   string
	Consumer string
	// WantWorkers is the configured number of in-process workers; 0 means
	// the consumer is read by other clients.
	WantWorkers int
	// Workers are its running in-process workers, nil when it has none.
	Workers *Workers
	// DeadLetter is its dead-letter stream, "" when it has none.
	DeadLetter string
}

// MonitorOptions configures a Monitor.
type MonitorOptions struct {
	// Streams are watched for existence and state; the streams of the
	// consumers are added to them.
	Streams   []string
	Consumers []MonitoredConsumer
	// Interval between two checks; DefaultMonitorInterval when zero.
	Interval time.Duration
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
	// StartupLosses describes acknowledged messages found lost when the
	// store was opened (a power cut with a sync interval, a damaged
	// block). Like a retention loss they make the health degraded until
	// the next start.
	StartupLosses []string
}

// Monitor watches the JetStream state behind holdfast: that every stream
// and consumer exists, how far each consumer is behind, whether it makes
// progress, and whether retention removed messages a consumer had not
// acknowledged (see retention.go). It keeps the latest Report for
// /metrics, /healthz and `holdfast status`.
type Monitor struct {
	js   jetstream.JetStream
	nc   *nats.Conn
	opts MonitorOptions
	log  *slog.Logger

	streams []string

	// checkMu serializes checks: the trackers' baselines belong to them.
	checkMu sync.Mutex
	// mu guards the trackers' loss counters, which the advisory handler
	// updates too.
	mu       sync.Mutex
	trackers map[consumerKey]*consumerTracker

	report atomic.Pointer[Report]

	advisory *nats.Subscription
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	once     sync.Once
}

type consumerKey struct{ stream, consumer string }

// NewMonitor returns a Monitor that reads JetStream through js and
// receives the server's advisories on nc.
func NewMonitor(js jetstream.JetStream, nc *nats.Conn, opts MonitorOptions, log *slog.Logger) *Monitor {
	if opts.Interval <= 0 {
		opts.Interval = DefaultMonitorInterval
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

// SetWorkers replaces the workers the Monitor reports for a consumer, after
// a reload restarted them (w nil: the consumer has no workers now).
func (m *Monitor) SetWorkers(stream, consumer string, want int, w *Workers) {
	m.checkMu.Lock()
	defer m.checkMu.Unlock()
	if t := m.trackers[consumerKey{stream, consumer}]; t != nil {
		t.mc.WantWorkers = want
		t.mc.Workers = w
	}
}

// Options returns the options the Monitor runs with.
func (m *Monitor) Options() MonitorOptions { return m.opts }

// Open subscribes to the server's termination advisories (a message
// removed while delivered and unacknowledged is reported there), runs a
// first check and starts checking every Interval.
func (m *Monitor) Open(ctx context.Context) error {
	sub, err := m.nc.Subscribe(advisoryTerminatedPrefix+".>", m.onTerminated)
	if err != nil {
		return fmt.Errorf("monitor: cannot subscribe to termination advisories: %w", err)
	}
	m.advisory = sub
	// The subscription must be registered before the first check, or a
	// loss right after it could be missed.
	if err := m.nc.FlushTimeout(10 * time.Second); err != nil {
		_ = sub.Unsubscribe()
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
			m.check(ctx)
		}
	}
}

// Close stops checking. It is idempotent.
func (m *Monitor) Close(ctx context.Context) error {
	m.once.Do(func() {
		if m.advisory != nil {
			_ = m.advisory.Unsubscribe()
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
}

// JetStreamStatus is the account's JetStream usage.
type JetStreamStatus struct {
	Enabled          bool   `json:"enabled"`
	Error            string `json:"error,omitempty"`
	FileUsed         uint64 `json:"file_used"`
	FileReserved     uint64 `json:"file_reserved"`
	FileLimit        int64  `json:"file_limit"`
	MemoryUsed       uint64 `json:"memory_used"`
	MemoryReserved   uint64 `json:"memory_reserved"`
	MemoryLimit      int64  `json:"memory_limit"`
	Streams          int    `json:"streams"`
	Consumers        int    `json:"consumers"`
	APIRequests      uint64 `json:"api_requests"`
	APIErrors        uint64 `json:"api_errors"`
	ServerCheckError string `json:"server_check_error,omitempty"`
}

// StreamStatus is one stream's state and limits.
type StreamStatus struct {
	Name      string    `json:"name"`
	Exists    bool      `json:"exists"`
	Error     string    `json:"error,omitempty"`
	Subjects  []string  `json:"subjects,omitempty"`
	Messages  uint64    `json:"messages"`
	Bytes     uint64    `json:"bytes"`
	FirstSeq  uint64    `json:"first_seq"`
	LastSeq   uint64    `json:"last_seq"`
	FirstTime time.Time `json:"first_time,omitzero"`
	LastTime  time.Time `json:"last_time,omitzero"`
	Retention string    `json:"retention,omitempty"`
	Discard   string    `json:"discard,omitempty"`
	Storage   string    `json:"storage,omitempty"`
	// MaxMsgs and MaxBytes are -1 when unlimited; MaxAge is 0 then.
	MaxMsgs  int64         `json:"max_msgs"`
	MaxBytes int64         `json:"max_bytes"`
	MaxAge   time.Duration `json:"max_age_ns"`
}

// ConsumerStatus is one consumer's position, progress and losses.
type ConsumerStatus struct {
	Stream        string `json:"stream"`
	Name          string `json:"name"`
	Exists        bool   `json:"exists"`
	Error         string `json:"error,omitempty"`
	FilterSubject string `json:"filter_subject,omitempty"`
	// Pending are messages not delivered yet; AckPending delivered and
	// not acknowledged; Redelivered those of them delivered more than once.
	Pending       uint64 `json:"pending"`
	AckPending    uint64 `json:"ack_pending"`
	Redelivered   uint64 `json:"redelivered"`
	MaxAckPending int    `json:"max_ack_pending"`
	Waiting       int    `json:"waiting"`
	DeliveredSeq  uint64 `json:"delivered_stream_seq"`
	AckFloorSeq   uint64 `json:"ack_floor_stream_seq"`
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
	Stalled      bool               `json:"stalled"`
	// IdleFor is how long the consumer made no progress while it had
	// work to do.
	IdleFor    time.Duration `json:"idle_for_ns,omitempty"`
	DeadLetter string        `json:"dead_letter,omitempty"`
	Workers    WorkerStatus  `json:"workers"`
}

// WorkerStatus is what a consumer's in-process workers did since start.
type WorkerStatus struct {
	Configured   int    `json:"configured"`
	Running      bool   `json:"running"`
	InFlight     int64  `json:"in_flight"`
	Processed    uint64 `json:"processed"`
	Acked        uint64 `json:"acked"`
	Retried      uint64 `json:"retried"`
	DeadLettered uint64 `json:"dead_lettered"`
	Failures     uint64 `json:"failures"`
	// DeadLetterFailing counts messages kept because their dead letter
	// cannot be stored now (DeadLetterError says why); they are retried.
	DeadLetterFailing int64  `json:"dead_letter_failing,omitempty"`
	DeadLetterError   string `json:"dead_letter_error,omitempty"`
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
	now := time.Now()
	r := &Report{Time: now}

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

	for _, name := range m.streams {
		r.Streams = append(r.Streams, m.checkStream(ctx, name, now, r))
	}
	sort.Slice(r.Consumers, func(i, j int) bool {
		if r.Consumers[i].Stream != r.Consumers[j].Stream {
			return r.Consumers[i].Stream < r.Consumers[j].Stream
		}
		return r.Consumers[i].Name < r.Consumers[j].Name
	})
	r.Health = m.evaluate(r)
	m.report.Store(r)
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
			st.Error = "stream does not exist"
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

	for _, t := range consumers {
		r.Consumers = append(r.Consumers, m.checkConsumer(ctx, s, before, t, now))
	}
	return st
}

// FillStream sets st from a stream's info: existence, state and limits.
func FillStream(st *StreamStatus, si *jetstream.StreamInfo) {
	st.Exists = true
	st.Subjects = slices.Clone(si.Config.Subjects)
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
			cs.Error = "consumer does not exist"
		} else {
			cs.Error = err.Error()
		}
		return cs
	}
	ci := c.CachedInfo()
	var obs observation
	if filtered(si.Config.Subjects, ci.Config) {
		obs, err = m.observeFiltered(ctx, s, si, ci, t)
		if err != nil {
			m.log.Warn("cannot check consumer for retention loss", "stream", t.mc.Stream, "consumer", t.mc.Consumer, "err", err)
		}
	} else {
		obs = observation{si: si, ci: ci, consistent: true}
	}

	oldest := m.oldestUnacked(ctx, s, obs.si, obs.ci, t, now)

	m.mu.Lock()
	defer m.mu.Unlock()
	m.account(t, obs, now)
	m.warn(t, obs.si, obs.ci, oldest, now)
	t.progress(obs.ci, now)
	cs := t.status(now)
	cs.Exists = true
	cs.Stalled = t.stalled(obs.ci, m.opts.StallTimeout, now)
	return cs
}

// advisoryTerminatedPrefix is where the server reports messages it
// stopped delivering, including those removed while unacknowledged.
const advisoryTerminatedPrefix = "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED"

// reasonUnackedDeleted is the server's reason (nats-server
// ackTermUnackedLimitsReason) when a delivered, unacknowledged message
// was removed from its stream.
const reasonUnackedDeleted = "Unacknowledged message was deleted"

type terminatedAdvisory struct {
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
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.trackers[consumerKey{adv.Stream, adv.Consumer}]
	if t == nil {
		return
	}
	t.lost++
	t.unlogged.add(adv.StreamSeq, adv.StreamSeq, 1)
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
