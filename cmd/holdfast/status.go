package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/urfave/cli/v2"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/daemon"
	"github.com/holdfast-io/holdfast/ingest"
	"github.com/holdfast-io/holdfast/internal/subjects"
	"github.com/holdfast-io/holdfast/pipeline"
	"github.com/holdfast-io/holdfast/pipeline/forward"
	"github.com/holdfast-io/holdfast/pipeline/monitor"
)

// printJSON prints v indented, as `status --json` and the HTTP endpoints do.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// statusOutput is what `holdfast status --json` prints.
type statusOutput struct {
	// Healthy is true when the daemon answered and reports "ok"; the
	// exit code is 0 then, else 1.
	Healthy bool `json:"healthy"`
	// Error says why nothing could be read (holdfast unreachable); the
	// other fields are empty then.
	Error     string                `json:"error,omitempty"`
	URL       string                `json:"url"`
	Daemon    *daemonOutput         `json:"daemon"`
	Health    *monitor.Health       `json:"health"`
	Problems  []string              `json:"problems,omitempty"`
	JetStream jetStreamOutput       `json:"jetstream"`
	Cluster   *daemon.ClusterStatus `json:"cluster,omitempty"`
	Streams   []streamOutput        `json:"streams"`
	Consumers []consumerOutput      `json:"consumers"`

	Leafnodes *forward.EdgeStatus `json:"leafnodes,omitempty"`
}

type daemonOutput struct {
	Version    string    `json:"version"`
	NATSServer string    `json:"nats_server"`
	ServerName string    `json:"server_name"`
	PID        int       `json:"pid"`
	Started    time.Time `json:"started"`
	HTTPListen string    `json:"http_listen,omitempty"`
	FailOnLoss bool      `json:"fail_on_loss"`
}

type jetStreamOutput struct {
	Enabled   bool         `json:"enabled"`
	Error     string       `json:"error,omitempty"`
	StoreDir  string       `json:"store_dir,omitempty"`
	Sync      string       `json:"sync,omitempty"`
	Domain    string       `json:"domain,omitempty"`
	File      storageUsage `json:"file"`
	Memory    storageUsage `json:"memory"`
	Streams   int          `json:"streams"`
	Consumers int          `json:"consumers"`
}

type storageUsage struct {
	Used     uint64 `json:"used"`
	Reserved uint64 `json:"reserved"`
	// Limit is -1 when unknown or unlimited.
	Limit int64 `json:"limit"`
}

type streamOutput struct {
	monitor.StreamStatus
	DeadLetter    bool    `json:"dead_letter"`
	MaxAgeSeconds float64 `json:"max_age_seconds"`
	// Ratios to each limit that is set: messages, bytes, and the age of
	// the first message.
	LimitRatio map[string]float64 `json:"limit_ratio,omitempty"`
	// GroupCommit is "on" when the stream stores through group commit
	// (its subjects behind the prefix), with the daemon's counters.
	GroupCommit      string        `json:"group_commit"`
	GroupCommitStats *ingest.Stats `json:"group_commit_stats,omitempty"`
}

type consumerOutput struct {
	Name          string `json:"name"`
	Stream        string `json:"stream"`
	Exists        bool   `json:"exists"`
	Error         string `json:"error,omitempty"`
	FilterSubject string `json:"filter_subject,omitempty"`
	Pending       uint64 `json:"pending"`
	AckPending    uint64 `json:"ack_pending"`
	Redelivered   uint64 `json:"redelivered"`
	MaxAckPending int    `json:"max_ack_pending"`
	DeliveredSeq  uint64 `json:"delivered_stream_seq"`
	AckFloorSeq   uint64 `json:"ack_floor_stream_seq"`
	// DeadLetters is the number of its dead letters stored in
	// DeadLetterStream now; null without a dead-letter stream.
	DeadLetterStream string  `json:"dead_letter_stream,omitempty"`
	DeadLetters      *uint64 `json:"dead_letters"`
	// LostToRetention and the fields below come from the daemon; null
	// when it did not answer.
	LostToRetention *uint64               `json:"lost_to_retention"`
	LastLoss        *monitor.LossEvent    `json:"last_loss,omitempty"`
	Stalled         bool                  `json:"stalled"`
	BacklogRatio    map[string]float64    `json:"backlog_ratio,omitempty"`
	Warnings        []string              `json:"warnings,omitempty"`
	Workers         *monitor.WorkerStatus `json:"workers"`
	// Leader and Replicas are the consumer's Raft group in a cluster.
	Leader   string                  `json:"leader,omitempty"`
	Replicas []monitor.ReplicaStatus `json:"replicas,omitempty"`
}

func statusCommand() *cli.Command {
	return &cli.Command{
		Name:  "status",
		Usage: "show JetStream, streams, consumers and workers of the running holdfast; exit 1 when it is not healthy",
		Description: "Connects to the running holdfast as a NATS client, reads JetStream, every stream and consumer,\n" +
			"and asks the daemon it is connected to (on " + subjects.Status("") + "<server name>) for what only it knows: losses to retention,\n" +
			"workers and health. Exit 0 when healthy, 1 when degraded or unreachable.",
		Flags: []cli.Flag{serverFlag, &cli.BoolFlag{Name: "json", Usage: "print JSON instead of tables"}},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usageError(errUnexpectedArgs(c))
			}
			cfg, nc, js, err := connect(c)
			if err != nil {
				if c.Bool("json") {
					// Scripts parse stdout: an object saying why, exit 1.
					if werr := printJSON(c.App.Writer, statusOutput{Error: err.Error()}); werr != nil {
						return runtimeError(werr)
					}
				}
				return err
			}
			defer nc.Close()
			out := collectStatus(c.Context, cfg, nc, js)
			out.URL = nc.ConnectedUrlRedacted()
			if c.Bool("json") {
				if err := printJSON(c.App.Writer, out); err != nil {
					return runtimeError(err)
				}
			} else {
				printStatus(c.App.Writer, out)
			}
			if !out.Healthy {
				return &exitError{code: 1, err: errors.New("holdfast is not healthy" + reasonSuffix(out))}
			}
			return nil
		},
	}
}

func reasonSuffix(out *statusOutput) string {
	if out.Health != nil && out.Health.Reason != "" {
		return ": " + out.Health.Reason
	}
	if len(out.Problems) > 0 {
		return ": " + out.Problems[0]
	}
	return ""
}

// collectStatus reads JetStream as any client would and merges what the
// daemon reports.
func collectStatus(ctx context.Context, cfg *config.Config, nc *nats.Conn, js jetstream.JetStream) *statusOutput {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	out := &statusOutput{}

	var reply *daemon.StatusReply
	// The server this client is connected to answers, not another node of
	// a cluster or a leafnode network.
	name := nc.ConnectedServerName()
	if name == "" {
		name = cfg.Server.Name
	}
	subject := subjects.Status(name)
	msg, err := nc.RequestWithContext(ctx, subject, nil)
	if err == nil {
		reply = &daemon.StatusReply{}
		if err = json.Unmarshal(msg.Data, reply); err != nil {
			reply = nil
		}
	}
	if reply == nil {
		// A daemon still starting (a cluster node waiting for its quorum,
		// a store being recovered) does not answer yet; its /healthz
		// says what it waits for.
		if h := localHealthz(ctx, cfg.HTTP.Listen); h != nil {
			out.Health = h
			out.Problems = append(out.Problems, "/healthz on "+cfg.HTTP.Listen+": "+h.Reason)
		}
		out.Problems = append(out.Problems, fmt.Sprintf("the holdfast daemon does not answer on %s (%v): losses to retention, workers and health are unknown", subject, err))
	} else {
		out.Daemon = &daemonOutput{Version: reply.Version, NATSServer: reply.NATSServer, ServerName: reply.ServerName,
			PID: reply.PID, Started: reply.Started, HTTPListen: reply.HTTPListen, FailOnLoss: reply.FailOnLoss}
		h := reply.Health
		out.Health = &h
		out.JetStream.StoreDir = reply.StoreDir
		out.JetStream.Sync = reply.Sync
		out.JetStream.Domain = reply.Domain
		out.Cluster = reply.Cluster
		out.Leafnodes = reply.Leafnodes
	}

	out.JetStream.File.Limit, out.JetStream.Memory.Limit = -1, -1
	if ai, err := js.AccountInfo(ctx); err != nil {
		out.JetStream.Error = err.Error()
		out.Problems = append(out.Problems, "JetStream: "+err.Error())
	} else {
		out.JetStream.Enabled = true
		out.JetStream.File = storageUsage{Used: ai.Store, Reserved: ai.ReservedStore, Limit: ai.Limits.MaxStore}
		out.JetStream.Memory = storageUsage{Used: ai.Memory, Reserved: ai.ReservedMemory, Limit: ai.Limits.MaxMemory}
		out.JetStream.Streams, out.JetStream.Consumers = ai.Streams, ai.Consumers
	}
	if reply != nil && reply.Report != nil {
		// The account is unlimited on a single server; the server's own
		// limits are the ones that matter.
		if l := reply.Report.JetStream.FileLimit; l > 0 && out.JetStream.File.Limit <= 0 {
			out.JetStream.File.Limit = l
		}
		if l := reply.Report.JetStream.MemoryLimit; l > 0 && out.JetStream.Memory.Limit <= 0 {
			out.JetStream.Memory.Limit = l
		}
	}

	// What to show: what the daemon watches, else the local config.
	type consumerRef struct{ stream, name, deadLetter string }
	var streams []string
	var consumers []consumerRef
	daemonConsumers := map[string]monitor.ConsumerStatus{}
	if reply != nil && reply.Report != nil {
		for _, s := range reply.Report.Streams {
			streams = append(streams, s.Name)
		}
		for _, c := range reply.Report.Consumers {
			consumers = append(consumers, consumerRef{c.Stream, c.Name, c.DeadLetter})
			daemonConsumers[c.Stream+"/"+c.Name] = c
		}
	} else {
		streams = cfg.AllStreamNames()
		for _, name := range cfg.ConsumerNames() {
			cc := cfg.Consumers[name]
			consumers = append(consumers, consumerRef{cc.Stream, name, cc.DeadLetter})
		}
	}
	deadLetterStreams := map[string]bool{}
	for _, c := range consumers {
		if c.deadLetter != "" {
			deadLetterStreams[c.deadLetter] = true
		}
	}

	now := time.Now()
	for _, name := range streams {
		so := streamOutput{StreamStatus: monitor.StreamStatus{Name: name, MaxMsgs: -1, MaxBytes: -1}, DeadLetter: deadLetterStreams[name]}
		s, err := js.Stream(ctx, name)
		if err != nil {
			so.Error = notFound(err, "stream does not exist")
			out.Problems = append(out.Problems, fmt.Sprintf("stream %s: %s", name, so.Error))
			out.Streams = append(out.Streams, so)
			continue
		}
		si := s.CachedInfo()
		monitor.FillStream(&so.StreamStatus, si)
		so.MaxAgeSeconds = si.Config.MaxAge.Seconds()
		so.GroupCommit = "off"
		if t := si.Config.SubjectTransform; t != nil && subjects.IsGroupCommit(t.Source) {
			so.GroupCommit = "on"
		}
		if st, ok := replyGroupCommit(reply, name); ok {
			so.GroupCommitStats = &st
			if so.GroupCommit == "off" {
				// The stream takes the configured subjects itself, and
				// group commit takes them too.
				out.Problems = append(out.Problems, fmt.Sprintf("stream %s: holdfast runs group commit for it but the stream does not have its prefixed subjects (edited by hand?): "+
					"each publish is taken by both and may be stored twice; reload holdfast (systemctl reload holdfast) to set them back", name))
			}
		} else if so.GroupCommit == "on" && reply != nil {
			// The stream listens on the prefixed subjects only: with no
			// ingest, nothing answers its configured subjects.
			plain := make([]string, len(si.Config.Subjects))
			for i, sub := range si.Config.Subjects {
				plain[i] = strings.TrimPrefix(sub, subjects.GroupCommit(name, ""))
			}
			out.Problems = append(out.Problems, fmt.Sprintf("stream %s: has group commit's prefixed subjects but holdfast runs no group commit for it: "+
				"every publish to %s gets \"no responders\"; set group_commit = true for it and reload, or reload to set its subjects back",
				name, strings.Join(plain, ", ")))
		}
		so.LimitRatio = map[string]float64{}
		if si.Config.MaxMsgs > 0 {
			so.LimitRatio["max_msgs"] = float64(si.State.Msgs) / float64(si.Config.MaxMsgs)
		}
		if si.Config.MaxBytes > 0 {
			so.LimitRatio["max_bytes"] = float64(si.State.Bytes) / float64(si.Config.MaxBytes)
		}
		if si.Config.MaxAge > 0 && si.State.Msgs > 0 {
			so.LimitRatio["max_age"] = float64(now.Sub(si.State.FirstTime)) / float64(si.Config.MaxAge)
		}
		if len(so.LimitRatio) == 0 {
			so.LimitRatio = nil
		}
		out.Streams = append(out.Streams, so)
	}

	for _, ref := range consumers {
		co := consumerOutput{Name: ref.name, Stream: ref.stream, DeadLetterStream: ref.deadLetter}
		if c, err := js.Consumer(ctx, ref.stream, ref.name); err != nil {
			co.Error = notFound(err, "consumer does not exist")
			out.Problems = append(out.Problems, fmt.Sprintf("consumer %s on stream %s: %s", ref.name, ref.stream, co.Error))
		} else {
			ci := c.CachedInfo()
			co.Exists = true
			co.FilterSubject = ci.Config.FilterSubject
			co.Pending = ci.NumPending
			co.AckPending = uint64(max(ci.NumAckPending, 0))
			co.Redelivered = uint64(max(ci.NumRedelivered, 0))
			co.MaxAckPending = ci.Config.MaxAckPending
			co.DeliveredSeq = ci.Delivered.Stream
			co.AckFloorSeq = ci.AckFloor.Stream
			if cl := ci.Cluster; cl != nil && len(cl.Replicas) > 0 {
				co.Leader = cl.Leader
				for _, r := range cl.Replicas {
					co.Replicas = append(co.Replicas, monitor.ReplicaStatus{Name: r.Name, Current: r.Current, Offline: r.Offline, Lag: r.Lag})
				}
			}
		}
		if ref.deadLetter != "" {
			if n, err := countDeadLetters(ctx, js, ref.deadLetter, ref.name); err == nil {
				co.DeadLetters = &n
			} else {
				out.Problems = append(out.Problems, fmt.Sprintf("dead letters of %s in %s: %v", ref.name, ref.deadLetter, err))
			}
		}
		if dc, ok := daemonConsumers[ref.stream+"/"+ref.name]; ok {
			lost := dc.LostToRetention
			co.LostToRetention = &lost
			co.LastLoss = dc.LastLoss
			co.Stalled = dc.Stalled
			co.BacklogRatio = dc.BacklogRatio
			co.Warnings = dc.Warnings
			ws := dc.Workers
			co.Workers = &ws
		}
		out.Consumers = append(out.Consumers, co)
	}

	out.Healthy = reply != nil && reply.Health.Status == monitor.HealthOK && len(out.Problems) == 0
	return out
}

func notFound(err error, text string) string {
	if errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrConsumerNotFound) {
		return text
	}
	return err.Error()
}

// countDeadLetters counts a consumer's dead letters (subjects
// dlq.<CONSUMER>.>) stored in a dead-letter stream.
func countDeadLetters(ctx context.Context, js jetstream.JetStream, stream, consumer string) (uint64, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, err
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(pipeline.DeadLetterSubject(consumer, ">")))
	if err != nil {
		return 0, err
	}
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	return n, nil
}

// printStatus prints the compact human view.
func printStatus(w io.Writer, out *statusOutput) {
	verdict := "OK"
	switch {
	case out.Health == nil:
		verdict = "UNKNOWN (daemon does not answer)"
	case !out.Healthy:
		verdict = strings.ToUpper(out.Health.Status)
		if out.Health.Status == monitor.HealthOK {
			verdict = "DEGRADED"
		}
	}
	if d := out.Daemon; d != nil {
		fmt.Fprintf(w, "holdfast on %s at %s: %s\n  %s, pid %d, up %s\n", d.ServerName, out.URL, verdict,
			d.Version, d.PID, time.Since(d.Started).Round(time.Second))
	} else {
		fmt.Fprintf(w, "holdfast at %s: %s\n", out.URL, verdict)
	}

	js := out.JetStream
	fmt.Fprintln(w)
	if !js.Enabled {
		fmt.Fprintf(w, "JetStream  NOT AVAILABLE: %s\n", js.Error)
	} else {
		fmt.Fprintf(w, "JetStream  enabled, store %s, sync %s\n", orDash(js.StoreDir), orDash(js.Sync))
		fmt.Fprintf(w, "  file     %s\n", usageText(js.File))
		fmt.Fprintf(w, "  memory   %s\n", usageText(js.Memory))
	}

	printLeafnodes(w, out.Leafnodes)
	if c := out.Cluster; c != nil {
		fmt.Fprintln(w)
		fmt.Fprintf(w, "Cluster    %s: this node %s, meta leader %s, %d node(s), %d route(s)\n", orDash(c.Name), c.Node, orDash(c.MetaLeader), c.Size, c.Routes)
		for _, p := range c.Peers {
			fmt.Fprintf(w, "  peer     %s: %s\n", p.Name, replicaText(p.Current, p.Offline, p.Lag))
		}
	}

	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STREAM\tMESSAGES\tBYTES\tFIRST SEQ\tLAST SEQ\tLIMITS\tGROUP COMMIT")
	for _, s := range out.Streams {
		if !s.Exists {
			fmt.Fprintf(tw, "%s\tMISSING: %s\t\t\t\t\t\n", s.Name, s.Error)
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%s\t%s\n", s.Name, s.Messages, formatBytes(int64(s.Bytes)), s.FirstSeq, s.LastSeq, limitsText(s), groupCommitText(s))
	}
	tw.Flush()
	for _, s := range out.Streams {
		// A single server names itself leader of every stream: no Raft
		// group to show.
		if s.Leader == "" || (len(s.Replicas) == 0 && out.Cluster == nil) {
			continue
		}
		var reps []string
		for _, r := range s.Replicas {
			reps = append(reps, r.Name+" "+replicaText(r.Current, r.Offline, r.Lag))
		}
		fmt.Fprintf(w, "  %s: leader %s; replicas %s\n", s.Name, s.Leader, strings.Join(reps, ", "))
	}

	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CONSUMER\tSTREAM\tPENDING\tACK PENDING\tREDELIVERED\tDEAD LETTERS\tLOST\tWORKERS")
	for _, c := range out.Consumers {
		if !c.Exists {
			fmt.Fprintf(tw, "%s\t%s\tMISSING: %s\t\t\t\t\t\n", c.Name, c.Stream, c.Error)
			continue
		}
		dead, lost, workers := "-", "?", "?"
		if c.DeadLetters != nil {
			dead = fmt.Sprint(*c.DeadLetters)
		}
		if c.LostToRetention != nil {
			lost = fmt.Sprint(*c.LostToRetention)
		}
		if ws := c.Workers; ws != nil {
			switch {
			case ws.Configured == 0:
				workers = "none"
			case ws.Draining:
				workers = fmt.Sprintf("%d draining for a reload (%d busy)", ws.Configured, ws.InFlight)
			case !ws.Running:
				workers = fmt.Sprintf("%d NOT RUNNING", ws.Configured)
			default:
				workers = fmt.Sprintf("%d (%d busy; %d processed, %d acked, %d retried, %d dead-lettered)",
					ws.Configured, ws.InFlight, ws.Processed, ws.Acked, ws.Retried, ws.DeadLettered)
			}
			if c.Stalled {
				workers += " STALLED"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d/%d\t%d\t%s\t%s\t%s\n", c.Name, c.Stream, c.Pending, c.AckPending, c.MaxAckPending,
			c.Redelivered, dead, lost, workers)
	}
	tw.Flush()
	for _, c := range out.Consumers {
		if c.Replicas == nil {
			continue
		}
		var reps []string
		for _, r := range c.Replicas {
			reps = append(reps, r.Name+" "+replicaText(r.Current, r.Offline, r.Lag))
		}
		fmt.Fprintf(w, "  %s: leader %s; replicas %s\n", c.Name, orDash(c.Leader), strings.Join(reps, ", "))
	}

	var problems, warnings []string
	if out.Health != nil {
		problems = append(problems, out.Health.Problems...)
		warnings = out.Health.Warnings
	}
	problems = append(problems, out.Problems...)
	if len(problems) > 0 {
		fmt.Fprintln(w, "\nProblems:")
		for _, p := range problems {
			fmt.Fprintf(w, "  - %s\n", p)
		}
	}
	if len(warnings) > 0 {
		fmt.Fprintln(w, "\nWarnings:")
		for _, p := range warnings {
			fmt.Fprintf(w, "  - %s\n", p)
		}
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func usageText(u storageUsage) string {
	s := formatBytes(int64(u.Used)) + " used"
	if u.Limit > 0 {
		s += fmt.Sprintf(" of %s (%.0f%%)", formatBytes(u.Limit), 100*float64(u.Used)/float64(u.Limit))
	}
	if u.Reserved > 0 {
		s += ", " + formatBytes(int64(u.Reserved)) + " reserved"
	}
	return s
}

func limitsText(s streamOutput) string {
	var parts []string
	pct := func(k string) string {
		if r, ok := s.LimitRatio[k]; ok {
			return fmt.Sprintf(" (%.0f%%)", 100*r)
		}
		return ""
	}
	if s.MaxMsgs > 0 {
		parts = append(parts, fmt.Sprintf("max_msgs %d%s", s.MaxMsgs, pct("max_msgs")))
	}
	if s.MaxBytes > 0 {
		parts = append(parts, fmt.Sprintf("max_bytes %s%s", formatBytes(s.MaxBytes), pct("max_bytes")))
	}
	if s.MaxAgeSeconds > 0 {
		parts = append(parts, fmt.Sprintf("max_age %s%s", time.Duration(s.MaxAgeSeconds*float64(time.Second)), pct("max_age")))
	}
	if len(parts) == 0 {
		parts = append(parts, "unlimited")
	}
	return strings.Join(parts, ", ") + ", discard " + s.Discard
}

// formatBytes prints a size with binary units, as the config accepts.
func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}

// replicaText describes a cluster peer or stream replica.
func replicaText(current, offline bool, lag uint64) string {
	switch {
	case offline:
		return "offline"
	case current:
		return "current"
	default:
		return fmt.Sprintf("lagging (%d behind)", lag)
	}
}

// groupCommit returns the daemon's group commit counters of stream name.
func replyGroupCommit(r *daemon.StatusReply, name string) (ingest.Stats, bool) {
	if r == nil {
		return ingest.Stats{}, false
	}
	st, ok := r.GroupCommit[name]
	return st, ok
}

// groupCommitText is the GROUP COMMIT column: off, or on with the batches
// committed and their average size.
func groupCommitText(s streamOutput) string {
	if s.GroupCommit != "on" {
		return "off"
	}
	st := s.GroupCommitStats
	if st == nil || st.Batches == 0 {
		return "on"
	}
	return fmt.Sprintf("on: %d batches, avg %.0f msgs", st.Batches, float64(st.BatchedMsgs)/float64(st.Batches))
}

// printLeafnodes is the leafnode part of `holdfast status`.
func printLeafnodes(w io.Writer, st *forward.EdgeStatus) {
	if st == nil {
		return
	}
	now := time.Now()
	for _, l := range st.Links {
		state := "connected"
		if !l.Connected {
			state = "DISCONNECTED"
		}
		fmt.Fprintf(w, "\nLeafnode   %s %s for %s (%d connect(s))\n", l.Remote, state, now.Sub(l.Since).Round(time.Second), l.Connects)
		if l.Problem != "" {
			fmt.Fprintf(w, "           DROPPED: %s\n", l.Problem)
		}
	}
	for _, f := range st.Forwards {
		fmt.Fprintf(w, "Forward    %s (stream %s) -> domain %s: ", f.Consumer, f.Stream, f.Domain)
		switch {
		case f.Problem != "":
			fmt.Fprintf(w, "WAITING: %s\n", f.Problem)
		case !f.Ready:
			fmt.Fprintf(w, "waiting for the link\n")
		default:
			fmt.Fprintf(w, "ready\n")
		}
		last := "-"
		if !f.LastForward.IsZero() {
			last = now.Sub(f.LastForward).Round(time.Millisecond).String() + " ago"
		}
		lag := "-"
		if !f.OldestUnforwarded.IsZero() {
			lag = now.Sub(f.OldestUnforwarded).Round(time.Millisecond).String()
		}
		fmt.Fprintf(w, "  backlog %d, oldest unforwarded %s, last forward %s; forwarded %d, duplicates %d, refused %d, errors %d\n",
			f.Backlog, lag, last, f.Forwarded, f.Duplicates, f.Refused, f.Errors)
	}
	for _, s := range st.Sources {
		kind := "source"
		if s.Mirror {
			kind = "mirror"
		}
		state := "ok"
		switch {
		case s.Stalled:
			state = fmt.Sprintf("STALLED for %s", s.StalledFor.Round(time.Second))
		case s.Unreachable:
			state = "waiting for the link"
		case s.Error != "":
			state = "ERROR: " + s.Error
		}
		fmt.Fprintf(w, "Source     stream %s %s %s: lag %d, %s\n", s.Stream, kind, s.Source, s.Lag, state)
	}
	for _, e := range st.Edges {
		fmt.Fprintf(w, "Edge       %s stream %s: last seq %d, stored there %s, seen here %s ago (%d message(s) seen)\n",
			e.Edge, e.Stream, e.LastSeq, e.LastOrigin.UTC().Format(time.RFC3339), now.Sub(e.LastSeen).Round(time.Second), e.Messages)
	}
}

// localHealthz reads the /healthz of the holdfast listening on listen (the
// config's http.listen; on this host when it names no address), or nil.
func localHealthz(ctx context.Context, listen string) *monitor.Health {
	host, port, err := net.SplitHostPort(listen)
	if listen == "" || err != nil {
		return nil
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(host, port)+"/healthz", nil)
	if err != nil {
		return nil
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var h monitor.Health
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&h); err != nil || h.Status == "" {
		return nil
	}
	return &h
}
