package mqtt

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// MetricNames are the metrics Register and RegisterSessions add.
func MetricNames() []string {
	return []string{"holdfast_mqtt_connections", "holdfast_mqtt_connections_total", "holdfast_mqtt_acks_total",
		"holdfast_mqtt_acks_waiting", "holdfast_mqtt_barrier_failures_total", "holdfast_mqtt_barrier_seconds",
		"holdfast_mqtt_refused_total",
		"holdfast_mqtt_sessions", "holdfast_mqtt_deliveries_unacked"}
}

// RegisterSessions adds the server's MQTT state to reg, read from js at
// each scrape (Sessions).
func RegisterSessions(reg prometheus.Registerer, js jetstream.JetStream) error {
	read := func(which int) func() float64 {
		return func() float64 {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			sessions, inFlight := Sessions(ctx, js)
			return float64([]int64{sessions, inFlight}[which])
		}
	}
	for i, g := range []prometheus.GaugeOpts{
		{Name: "holdfast_mqtt_sessions", Help: "MQTT sessions the server keeps ($MQTT_sess), connected or not; -1 when unreadable."},
		{Name: "holdfast_mqtt_deliveries_unacked", Help: "QoS 1 and 2 deliveries to devices not acknowledged yet; -1 when unreadable."},
	} {
		if err := reg.Register(prometheus.NewGaugeFunc(g, read(i))); err != nil {
			return err
		}
	}
	return nil
}

// Register adds the gate's metrics to reg.
func (g *Gate) Register(reg prometheus.Registerer) error {
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
	}
	counter := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, f)
	}
	for _, c := range []prometheus.Collector{
		gauge("holdfast_mqtt_connections", "MQTT devices connected now.", func() float64 {
			g.mu.Lock()
			defer g.mu.Unlock()
			return float64(len(g.conns))
		}),
		counter("holdfast_mqtt_connections_total", "MQTT connections accepted since start.", func() float64 { return float64(g.accepted.Load()) }),
		counter("holdfast_mqtt_acks_total", "PUBACKs (QoS 1) and PUBRECs (QoS 2) sent to devices once the stream stored the message.", func() float64 { return float64(g.held.Load()) }),
		gauge("holdfast_mqtt_acks_waiting", "PUBACKs and PUBRECs held now until the stream has stored the message.", func() float64 { return float64(g.holding.Load()) }),
		counter("holdfast_mqtt_barrier_failures_total", "Barriers that failed: the devices waiting on them were disconnected and send again.", func() float64 { return float64(g.bar.failed.Load()) }),
		counter("holdfast_mqtt_refused_total", "QoS 1 and 2 publishes refused because no configured stream would store them (their topic, or their size): the devices were disconnected.", func() float64 { return float64(g.refused.Load()) }),
		g.bar.seconds,
	} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
