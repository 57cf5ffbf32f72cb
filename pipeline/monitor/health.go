package monitor

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/holdfast-io/holdfast/config"
)

// Health states, from best to worst.
const (
	// HealthOK: JetStream runs on the file store, every stream and
	// consumer exists, the workers run and no consumer is stalled.
	HealthOK = "ok"
	// HealthDegraded: all of the above, but retention removed messages
	// before a consumer acknowledged them, or a consumer without
	// in-process workers is blocked by the clients that read it; or, in
	// a cluster, this node is in a minority (for less than a minute), a
	// stream or consumer has no leader, this node's replica of a stream
	// has been behind its leader for more than 30s, or the cluster counts
	// an absent node beyond those cluster.routes names; or what
	// Options.Degraded names (edges a hub lost, streams a restore holds
	// closed).
	HealthDegraded = "degraded"
	// HealthUnhealthy: something in the HealthOK list is not true.
	HealthUnhealthy = "unhealthy"
)

// Health is the verdict of a check: what /healthz answers.
type Health struct {
	Status string `json:"status"`
	// Reason is the first problem, for a one-line alert.
	Reason   string   `json:"reason,omitempty"`
	Problems []string `json:"problems,omitempty"`
	// Warnings do not change Status: backlogs close to a stream limit.
	Warnings []string `json:"warnings,omitempty"`
	// LostToRetention maps "STREAM/CONSUMER" to the messages it lost since
	// start, for consumers that lost any.
	LostToRetention map[string]uint64 `json:"lost_to_retention,omitempty"`
	// FailOnLoss says whether a loss makes the status code 503.
	FailOnLoss bool `json:"-"`
	// Lost: the health is degraded by a loss of messages (retention, or
	// found at start-up), not only by a blocked consumer.
	Lost bool `json:"-"`
}

// HTTPStatus is the status code /healthz answers with.
func (h Health) HTTPStatus() int {
	switch h.Status {
	case HealthOK:
		return http.StatusOK
	case HealthDegraded:
		if !h.FailOnLoss || !h.Lost {
			return http.StatusOK
		}
	}
	return http.StatusServiceUnavailable
}

// Health returns the verdict of the latest check; it is unhealthy before
// the first check and when checks stopped coming.
func (m *Monitor) Health() Health {
	r := m.Report()
	if r == nil {
		return Health{Status: HealthUnhealthy, Reason: "starting: no check has run yet", Problems: []string{"starting: no check has run yet"}, FailOnLoss: m.opts.FailOnLoss}
	}
	h := r.Health
	h.FailOnLoss = m.opts.FailOnLoss
	// A check that hangs (the JetStream API does not answer) must not
	// leave the last good verdict standing.
	if age := time.Since(r.Time); age > 3*m.opts.Interval+10*time.Second {
		p := fmt.Sprintf("the last check finished %s ago: the JetStream API may be stuck", age.Round(time.Second))
		h.Problems = append([]string{p}, h.Problems...)
		h.Reason = p
		h.Status = HealthUnhealthy
	}
	return h
}

// In a cluster: how long a node may reach none of its peers, and its
// replica of a stream may stay behind the leader, before health says so
// (unhealthy and degraded). Short cuts and catching up after a restart
// are normal.
const (
	isolatedAfter      = 60 * time.Second
	replicaBehindAfter = 30 * time.Second
)

// evaluate turns a Report into a Health verdict.
func (m *Monitor) evaluate(r *Report) Health {
	h := Health{Status: HealthOK, FailOnLoss: m.opts.FailOnLoss}
	// bad problems make the health unhealthy, the others degraded.
	var bad []string
	unhealthy := func(format string, args ...any) {
		bad = append(bad, fmt.Sprintf(format, args...))
	}
	problem := func(format string, args ...any) {
		h.Problems = append(h.Problems, fmt.Sprintf(format, args...))
	}
	// Outside a majority of its cluster, a node's JetStream API, streams
	// and consumers do not answer: the cause, not a fault of this node,
	// until it has reached no peer for isolatedAfter.
	noQuorum, isolated := r.Cluster.NoQuorum(), false
	var cause string
	unreachable := unhealthy
	if noQuorum {
		c := r.Cluster
		cause = fmt.Sprintf("this node sees %d of the %d nodes of its cluster: no quorum here, so publishes to it fail and its streams are served by the other side until the network heals", c.Current, c.Size)
		if isolated = c.IsolatedFor >= isolatedAfter; isolated {
			cause += fmt.Sprintf("; it has reached none of its peers for %s", c.IsolatedFor.Round(time.Second))
		}
		unreachable = problem
	}
	if c := r.Cluster; c.LastQuorum() && !c.Lingering() {
		problem("%d of the %d nodes of the cluster are up (down: %s): the cluster can survive no further node loss; bring the node back, or replace it",
			c.Size-len(c.Down), c.Size, downText(c.Down, r.Time))
	}
	if c := r.Cluster; c.Lingering() {
		problem("the cluster counts %d nodes, %d of them current, but cluster.routes names %d: a node replaced under another name (or taken away) is still a member, the streams keep a replica on it and one more node down loses the quorum; once it will not come back, remove it: nats --user system server raft peer-remove NAME (the peer holdfast status shows down)",
			c.Size, c.Current, c.Configured)
	}
	if r.JetStream.Diagnosis != "" {
		unhealthy("%s", r.JetStream.Diagnosis)
	}
	// The server refuses every publish to a file stream then (503
	// "insufficient resources"), a lowered limit or not: not a fault a
	// restart mends, so degraded, not unhealthy.
	if js := r.JetStream; js.FileLimit > 0 && js.FileUsed >= uint64(js.FileLimit) {
		problem("JetStream file storage is full: %s used of jetstream.max_file_store %s, so every publish to a file stream is refused (insufficient resources); raise max_file_store, or make room: lower the streams' max_bytes or max_age, or purge what is no longer needed",
			config.FormatBytes(int64(js.FileUsed)), config.FormatBytes(js.FileLimit))
	}
	if r.JetStream.ServerCheckError != "" {
		unhealthy("%s", r.JetStream.ServerCheckError)
	}
	// While the cluster elects leaders (electionGrace), what does not
	// answer degrades the node; past it, it is a fault.
	electingFor := func(d time.Duration) bool { return d > 0 && d < electionGrace }
	const electingNote = " (the cluster is electing leaders: unhealthy if it lasts %s)"
	switch {
	case r.JetStream.Enabled:
	case electingFor(r.JetStream.UnavailableFor):
		problem("JetStream does not answer: %s"+electingNote, r.JetStream.Error, electionGrace)
	default:
		unreachable("JetStream does not answer: %s", r.JetStream.Error)
	}
	for _, s := range r.Streams {
		switch {
		case !s.Exists && s.Error == errStreamMissing:
			unhealthy("stream %s: %s", s.Name, s.Error)
		case !s.Exists && electingFor(s.UnavailableFor):
			problem("stream %s: %s"+electingNote, s.Name, s.Error, electionGrace)
		case !s.Exists:
			unreachable("stream %s: %s", s.Name, s.Error)
		case s.Leaderless:
			problem("stream %s has no leader: fewer than a majority of its replicas are reachable, so it takes no publishes", s.Name)
		case s.BehindFor >= replicaBehindAfter:
			problem("this node's replica of stream %s has not been current with the leader %s for %s (%d operations behind)",
				s.Name, s.Leader, s.BehindFor.Round(time.Second), s.BehindBy)
		}
	}
	for _, c := range r.Consumers {
		switch {
		case !c.Exists && c.Error != errConsumerMissing && electingFor(c.UnavailableFor):
			problem("consumer %s on stream %s: %s"+electingNote, c.Name, c.Stream, c.Error, electionGrace)
		case !c.Exists && (!noQuorum || c.Error == errConsumerMissing):
			unhealthy("consumer %s on stream %s: %s", c.Name, c.Stream, c.Error)
		case !c.Exists:
			problem("consumer %s on stream %s: %s", c.Name, c.Stream, c.Error)
		case c.Workers.Configured > 0 && c.Workers.Draining:
			// A reload waits for their handlers before it restarts
			// them: planned, and over within shutdown_timeout.
			problem("consumer %s: its workers are draining (%d handler(s) still running) to restart with a reloaded config", c.Name, c.Workers.InFlight)
		case c.Workers.Configured > 0 && !c.Workers.Running:
			unhealthy("consumer %s: its %d workers are not running", c.Name, c.Workers.Configured)
		case c.Stalled:
			unhealthy("consumer %s on stream %s is stalled: %s (%d pending, %d of max %d awaiting ack)",
				c.Name, c.Stream, c.StallReason, c.Pending, c.AckPending, c.MaxAckPending)
		case c.Leaderless:
			problem("consumer %s on stream %s has no leader: fewer than a majority of its replicas are reachable, so it delivers nothing", c.Name, c.Stream)
		}
		h.Warnings = append(h.Warnings, c.Warnings...)
	}
	// The cause first (a lost quorum), then what makes the node
	// unhealthy, then what degrades it.
	unhealthyNow := len(bad) > 0 || isolated
	if cause != "" {
		bad = append([]string{cause}, bad...)
	}
	h.Problems = append(bad, h.Problems...)
	for _, c := range r.Consumers {
		if c.Exists && c.Blocked {
			problem("consumer %s on stream %s (no in-process workers) is blocked: %d of max %d messages await acknowledgement by other clients, no progress for %s",
				c.Name, c.Stream, c.AckPending, c.MaxAckPending, c.IdleFor.Round(time.Second))
		}
		if n := c.Workers.DeadLetterFailing; n > 0 {
			problem("consumer %s: %d message(s) kept because their dead letter cannot be stored (retrying): %s", c.Name, n, c.Workers.DeadLetterError)
		}
	}
	h.Lost = len(m.opts.StartupLosses) > 0
	for _, l := range m.opts.StartupLosses {
		problem("found at start-up: %s", l)
	}
	for _, c := range r.Consumers {
		if c.LostToRetention == 0 {
			continue
		}
		if h.LostToRetention == nil {
			h.LostToRetention = map[string]uint64{}
		}
		h.Lost = true
		h.LostToRetention[c.Stream+"/"+c.Name] = c.LostToRetention
		msg := fmt.Sprintf("consumer %s on stream %s lost %d message(s) to retention since start", c.Name, c.Stream, c.LostToRetention)
		if ll := c.LastLoss; ll != nil {
			msg += fmt.Sprintf(" (last: %d, seq %d..%d, %s, at %s)", ll.Count, ll.FirstSeq, ll.LastSeq, ll.Cause, ll.Time.UTC().Format(time.RFC3339))
		}
		problem("%s", msg)
	}
	if f := m.opts.Degraded; f != nil {
		for _, p := range f(time.Now()) {
			problem("%s", p)
		}
	}
	if f := m.opts.Warnings; f != nil {
		h.Warnings = append(h.Warnings, f()...)
	}
	switch {
	case unhealthyNow:
		h.Status = HealthUnhealthy
	case len(h.Problems) > 0:
		h.Status = HealthDegraded
	}
	if len(h.Problems) > 0 {
		h.Reason = h.Problems[0]
	}
	return h
}

// downText names the down peers with how long ago each was last seen.
func downText(down []DownPeer, now time.Time) string {
	if len(down) == 0 {
		return "unknown"
	}
	var parts []string
	for _, d := range down {
		if d.Since.IsZero() || now.IsZero() {
			parts = append(parts, d.Name)
			continue
		}
		parts = append(parts, fmt.Sprintf("%s, last seen %s ago", d.Name, now.Sub(d.Since).Round(time.Second)))
	}
	return strings.Join(parts, "; ")
}
