package monitor

import (
	"net/http"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/holdfast-io/holdfast/pipeline/handler"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// MetricsNamespace prefixes every holdfast metric.
const MetricsNamespace = "holdfast"

// HandlerDurationBuckets are the handler duration histogram's buckets in
// seconds: from a fast in-process handler to an exec handler near its
// timeout.
var HandlerDurationBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}

// Metrics is holdfast's Prometheus registry: the handler duration
// histogram, observed as messages are handled, and everything else read
// at scrape time from the workers' counters and the Monitor's latest
// Report.
type Metrics struct {
	reg       *prometheus.Registry
	duration  *prometheus.HistogramVec
	buildInfo prometheus.GaugeFunc

	mu  sync.Mutex
	mon *Monitor
}

// NewMetrics returns a registry with holdfast's metrics and the process
// and Go runtime collectors. version and natsVersion go into
// holdfast_build_info.
func NewMetrics(version, natsVersion string) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: MetricsNamespace,
		Name:      "handler_duration_seconds",
		Help:      "Time the handler took per message, by outcome (success, retry, permanent).",
		Buckets:   HandlerDurationBuckets,
	}, []string{"stream", "consumer", "outcome"})
	m.buildInfo = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace:   MetricsNamespace,
		Name:        "build_info",
		Help:        "Always 1; the labels carry the holdfast and nats-server versions.",
		ConstLabels: prometheus.Labels{"version": version, "nats_server": natsVersion},
	}, func() float64 { return 1 })
	m.reg.MustRegister(
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewGoCollector(),
		m.duration,
		m.buildInfo,
		&collector{m: m},
	)
	return m
}

// MetricNames returns the name of every holdfast_ metric NewMetrics
// registers and the collectors in more describe (the daemon registers
// forward.EdgeView's beside them), also those only a cluster node, an edge
// or a hub has (histograms by their base name), sorted. Dashboards and
// alert rules are checked against it. (Group commit's histograms are
// package ingest's.)
func MetricNames(more ...prometheus.Collector) []string {
	m := NewMetrics("", "")
	ch := make(chan *prometheus.Desc, 128)
	go func() {
		m.duration.Describe(ch)
		m.buildInfo.Describe(ch)
		(&collector{}).Describe(ch)
		for _, c := range more {
			c.Describe(ch)
		}
		close(ch)
	}()
	var names []string
	for d := range ch {
		// A Desc shows its name only in its String form.
		if m := fqNameRe.FindStringSubmatch(d.String()); m != nil {
			names = append(names, m[1])
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

var fqNameRe = regexp.MustCompile(`fqName: "([^"]+)"`)

// Registry returns the registry, for tests and for adding collectors.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus exposition formats.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg, Timeout: 10 * time.Second})
}

// ObserveResult returns a ConsumerOptions.OnResult hook that records the
// handler duration for a consumer of stream.
func (m *Metrics) ObserveResult(stream string) func(consumer string, res handler.Result, took time.Duration) {
	return func(consumer string, res handler.Result, took time.Duration) {
		m.duration.WithLabelValues(stream, consumer, res.Outcome.String()).Observe(took.Seconds())
	}
}

// SetMonitor makes the metrics report what mon watches.
func (m *Metrics) SetMonitor(mon *Monitor) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.mon = mon
}

func (m *Metrics) monitor() *Monitor {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mon
}

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(MetricsNamespace, "", name), help, labels, nil)
}

var (
	sc = []string{"stream", "consumer"}

	descProcessed    = desc("messages_processed_total", "Messages handed to the handler that returned (any outcome).", sc...)
	descAcked        = desc("messages_acked_total", "Messages acknowledged after the handler succeeded, confirmed by the server.", sc...)
	descRetried      = desc("messages_retried_total", "Failed deliveries given back for a retry after the backoff delay.", sc...)
	descDeadLettered = desc("messages_dead_lettered_total", "Messages moved to the dead-letter stream (or terminated when there is none).", sc...)
	descFailures     = desc("settle_failures_total", "Acks, naks and dead-letter publishes that failed (the message comes back).", sc...)
	descLost         = desc("messages_lost_to_retention_total", "Messages removed from the stream (max_msgs, max_bytes, max_age or a deletion) before the consumer acknowledged them.", sc...)
	descInFlight     = desc("handlers_in_flight", "Handlers running now.", sc...)
	descDLFailing    = desc("dead_letter_failing_messages", "Messages kept because their dead letter cannot be stored now; retried until it is.", sc...)
	descWorkers      = desc("workers", "In-process workers running for the consumer.", sc...)

	descPending     = desc("consumer_pending_messages", "Messages not yet delivered to the consumer.", sc...)
	descAckPending  = desc("consumer_ack_pending_messages", "Messages delivered and not yet acknowledged.", sc...)
	descRedelivered = desc("consumer_redelivered_messages", "Messages awaiting acknowledgement that were delivered more than once.", sc...)
	descMaxAck      = desc("consumer_max_ack_pending", "The consumer's max_ack_pending.", sc...)
	descOldest      = desc("consumer_oldest_unprocessed_age_seconds", "Age of the oldest message the consumer has not acknowledged (0 without a backlog; read every few seconds).", sc...)
	descStalled     = desc("consumer_stalled", "1 when the consumer has work but made no progress for the stall timeout.", sc...)
	descExists      = desc("consumer_exists", "1 when the configured consumer exists on the server.", sc...)
	descRecreated   = desc("recreated_total", "Times a configured stream or consumer disappeared while running and holdfast created it again.", "kind", "stream", "name")
	descBacklog     = desc("consumer_backlog_limit_ratio", "The consumer's unacknowledged backlog against a stream limit (1 = the limit removes unprocessed messages).", "stream", "consumer", "limit")

	descStreamMsgs     = desc("stream_messages", "Messages stored in the stream.", "stream")
	descStreamBytes    = desc("stream_bytes", "Bytes stored in the stream.", "stream")
	descStreamFirst    = desc("stream_first_seq", "Sequence of the stream's first message.", "stream")
	descStreamLast     = desc("stream_last_seq", "Sequence of the stream's last message.", "stream")
	descStreamMaxMsgs  = desc("stream_max_messages", "The stream's max_msgs (absent when unlimited).", "stream")
	descStreamMaxBytes = desc("stream_max_bytes", "The stream's max_bytes (absent when unlimited).", "stream")
	descStreamMaxAge   = desc("stream_max_age_seconds", "The stream's max_age (absent when unlimited).", "stream")
	descStreamExists   = desc("stream_exists", "1 when the configured stream exists on the server.", "stream")

	descJSUp       = desc("jetstream_enabled", "1 when the JetStream API answers.")
	descJSUsed     = desc("jetstream_storage_used_bytes", "JetStream storage used.", "type")
	descJSReserved = desc("jetstream_storage_reserved_bytes", "JetStream storage reserved by streams with limits.", "type")
	descJSLimit    = desc("jetstream_storage_limit_bytes", "JetStream storage limit.", "type")
	descJSAPI      = desc("jetstream_api_requests_total", "JetStream API requests served.")
	descJSAPIErr   = desc("jetstream_api_errors_total", "JetStream API requests that failed.")
	descStoreErr   = desc("store_write_errors_total", "Writes to the store that failed since start (disk full, I/O errors); the first makes /healthz unhealthy and the watchdog stop.")

	descStreamLeader = desc("stream_leader", "1 when this node leads the stream's Raft group (cluster mode).", "stream")
	descReplicaLag   = desc("replica_lag", "Operations a follower of the stream is behind its leader (cluster mode).", "stream", "replica")
	descClusterPeers = desc("cluster_peers", "Nodes of the JetStream cluster this node sees current, itself included (cluster mode).")
	descClusterSize  = desc("cluster_size", "Nodes the JetStream cluster has (cluster mode).")

	descHealthy   = desc("healthy", "1 when /healthz answers 200.")
	descLastCheck = desc("last_check_timestamp_seconds", "When the monitor last read the JetStream state.")
)

// collector reads the counters and the latest Report at scrape time.
type collector struct{ m *Metrics }

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descProcessed, descAcked, descRetried, descDeadLettered, descFailures, descDLFailing, descLost,
		descInFlight, descWorkers, descPending, descAckPending, descRedelivered, descMaxAck, descStalled, descOldest, descExists,
		descBacklog, descStreamMsgs, descStreamBytes, descStreamFirst, descStreamLast, descStreamMaxMsgs,
		descStreamMaxBytes, descStreamMaxAge, descStreamExists, descJSUp, descJSUsed, descJSReserved, descJSLimit,
		descJSAPI, descJSAPIErr, descHealthy, descLastCheck, descRecreated, descStoreErr,
		descStreamLeader, descReplicaLag, descClusterPeers, descClusterSize} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	mon := c.m.monitor()
	if mon == nil {
		return
	}
	metric := func(d *prometheus.Desc, t prometheus.ValueType, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, t, v, labels...)
	}
	bool01 := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}

	// Worker counters are read live, the rest from the latest check.
	for _, mc := range mon.Consumers() {
		if mc.Workers == nil {
			continue
		}
		st := mc.Workers.Stats()
		l := []string{mc.Stream, mc.Consumer}
		metric(descProcessed, prometheus.CounterValue, float64(st.Processed.Load()), l...)
		metric(descAcked, prometheus.CounterValue, float64(st.Acked.Load()), l...)
		metric(descRetried, prometheus.CounterValue, float64(st.Retried.Load()), l...)
		metric(descDeadLettered, prometheus.CounterValue, float64(st.DeadLettered.Load()), l...)
		metric(descFailures, prometheus.CounterValue, float64(st.Failures.Load()), l...)
		metric(descInFlight, prometheus.GaugeValue, float64(st.InFlight.Load()), l...)
		metric(descDLFailing, prometheus.GaugeValue, float64(st.DeadLetterFailing.Load()), l...)
		metric(descWorkers, prometheus.GaugeValue, float64(mc.Workers.Options().Workers), l...)
	}

	r := mon.Report()
	if r == nil {
		return
	}
	metric(descLastCheck, prometheus.GaugeValue, float64(r.Time.UnixNano())/1e9)
	metric(descHealthy, prometheus.GaugeValue, bool01(mon.Health().HTTPStatus() == http.StatusOK))

	js := r.JetStream
	metric(descJSUp, prometheus.GaugeValue, bool01(js.Enabled))
	if mon.opts.StoreWriteErrors != nil {
		metric(descStoreErr, prometheus.CounterValue, float64(mon.opts.StoreWriteErrors()))
	}
	if js.Enabled {
		metric(descJSUsed, prometheus.GaugeValue, float64(js.FileUsed), "file")
		metric(descJSUsed, prometheus.GaugeValue, float64(js.MemoryUsed), "memory")
		metric(descJSReserved, prometheus.GaugeValue, float64(js.FileReserved), "file")
		metric(descJSReserved, prometheus.GaugeValue, float64(js.MemoryReserved), "memory")
		if js.FileLimit > 0 {
			metric(descJSLimit, prometheus.GaugeValue, float64(js.FileLimit), "file")
		}
		if js.MemoryLimit > 0 {
			metric(descJSLimit, prometheus.GaugeValue, float64(js.MemoryLimit), "memory")
		}
		metric(descJSAPI, prometheus.CounterValue, float64(js.APIRequests))
		metric(descJSAPIErr, prometheus.CounterValue, float64(js.APIErrors))
	}

	if f := mon.opts.ClusterPeers; f != nil {
		if p, ok := f(); ok {
			metric(descClusterPeers, prometheus.GaugeValue, float64(p.Current))
			metric(descClusterSize, prometheus.GaugeValue, float64(p.Size))
		}
	}
	streamState := func(s StreamStatus) {
		if s.Leader != "" {
			metric(descStreamLeader, prometheus.GaugeValue, bool01(s.Leader == mon.opts.ServerName), s.Name)
			for _, rep := range s.Replicas {
				metric(descReplicaLag, prometheus.GaugeValue, float64(rep.Lag), s.Name, rep.Name)
			}
		}
		metric(descStreamMsgs, prometheus.GaugeValue, float64(s.Messages), s.Name)
		metric(descStreamBytes, prometheus.GaugeValue, float64(s.Bytes), s.Name)
		metric(descStreamFirst, prometheus.GaugeValue, float64(s.FirstSeq), s.Name)
		metric(descStreamLast, prometheus.GaugeValue, float64(s.LastSeq), s.Name)
		if s.MaxMsgs > 0 {
			metric(descStreamMaxMsgs, prometheus.GaugeValue, float64(s.MaxMsgs), s.Name)
		}
		if s.MaxBytes > 0 {
			metric(descStreamMaxBytes, prometheus.GaugeValue, float64(s.MaxBytes), s.Name)
		}
		if s.MaxAge > 0 {
			metric(descStreamMaxAge, prometheus.GaugeValue, s.MaxAge.Seconds(), s.Name)
		}
	}
	for _, s := range r.Streams {
		metric(descStreamExists, prometheus.GaugeValue, bool01(s.Exists), s.Name)
		metric(descRecreated, prometheus.CounterValue, float64(s.Recreated), "stream", s.Name, s.Name)
		if s.Exists {
			streamState(s)
		}
	}
	// Streams holdfast does not manage (KV and object-store buckets,
	// streams made with the nats CLI): their state, for dashboards.
	for _, s := range r.OtherStreams {
		streamState(s)
	}

	for _, cs := range r.Consumers {
		l := []string{cs.Stream, cs.Name}
		metric(descLost, prometheus.CounterValue, float64(cs.LostToRetention), l...)
		metric(descExists, prometheus.GaugeValue, bool01(cs.Exists), l...)
		metric(descRecreated, prometheus.CounterValue, float64(cs.Recreated), "consumer", cs.Stream, cs.Name)
		if !cs.Exists {
			continue
		}
		metric(descPending, prometheus.GaugeValue, float64(cs.Pending), l...)
		metric(descAckPending, prometheus.GaugeValue, float64(cs.AckPending), l...)
		metric(descRedelivered, prometheus.GaugeValue, float64(cs.Redelivered), l...)
		metric(descMaxAck, prometheus.GaugeValue, float64(cs.MaxAckPending), l...)
		metric(descStalled, prometheus.GaugeValue, bool01(cs.Stalled), l...)
		oldestAge := 0.0
		if !cs.OldestUnprocessed.IsZero() {
			oldestAge = max(r.Time.Sub(cs.OldestUnprocessed).Seconds(), 0)
		}
		metric(descOldest, prometheus.GaugeValue, oldestAge, l...)
		for limit, v := range cs.BacklogRatio {
			metric(descBacklog, prometheus.GaugeValue, v, cs.Stream, cs.Name, limit)
		}
	}
}
