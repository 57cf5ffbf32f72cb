// Package monitor watches the JetStream state behind holdfast and the
// workers' counters: that every stream and consumer exists, how far each
// consumer is behind, whether it makes progress, and whether retention
// removed messages a consumer had not acknowledged. It keeps the latest
// Report, judges it into the Health that /healthz serves, and exports
// both, with the handler durations, as Prometheus metrics (Metrics).
package monitor
