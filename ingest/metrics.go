package ingest

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are group commit's Prometheus histograms, labelled by stream.
type Metrics struct {
	size    *prometheus.HistogramVec
	latency *prometheus.HistogramVec
}

// NewMetrics registers the histograms with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		size: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "holdfast_group_commit_batch_size",
			Help:    "Messages per group commit (1: published alone because nothing else waited).",
			Buckets: []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000},
		}, []string{"stream"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "holdfast_group_commit_latency_seconds",
			Help:    "Time from sending a group commit to the server's answer.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}, []string{"stream"}),
	}
	reg.MustRegister(m.size, m.latency)
	return m
}

func (m *Metrics) observe(stream string, n int, d time.Duration) {
	m.size.WithLabelValues(stream).Observe(float64(n))
	m.latency.WithLabelValues(stream).Observe(d.Seconds())
}
