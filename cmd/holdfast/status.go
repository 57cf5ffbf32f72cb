package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/daemon"
	"github.com/holdfast-io/holdfast/embedded/mqtt"
	"github.com/holdfast-io/holdfast/internal/subjects"
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

func statusCommand() *cli.Command {
	return &cli.Command{
		Name:  "status",
		Usage: "show JetStream, streams, consumers and workers of the running holdfast; exit 1 when it is not healthy",
		Description: "Connects to the running holdfast as a NATS client, reads JetStream, every stream and consumer,\n" +
			"and asks the daemon it is connected to (on " + subjects.Status("") + "<server name>) for what only it knows: losses to retention,\n" +
			"workers and health. Exit 0 when healthy, 1 when degraded or unreachable.",
		Flags: []cli.Flag{serverFlag, &cli.BoolFlag{Name: "json", Usage: "print JSON instead of tables"}},
		Action: func(c *cli.Context) error {
			cfg, nc, js, err := connect(c)
			if err != nil {
				if c.Bool("json") {
					// Scripts parse stdout: an object saying why, exit 1.
					if werr := printJSON(c.App.Writer, daemon.ClientStatus{Version: daemon.StatusVersion, Error: err.Error()}); werr != nil {
						return runtimeError(werr)
					}
				}
				return err
			}
			defer nc.Close()
			out := daemon.CollectStatus(c.Context, cfg, nc, js)
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

func reasonSuffix(out *daemon.ClientStatus) string {
	if out.Health != nil && out.Health.Reason != "" {
		return ": " + out.Health.Reason
	}
	if len(out.Problems) > 0 {
		return ": " + out.Problems[0]
	}
	return ""
}

// printStatus prints the compact human view.
func printStatus(w io.Writer, out *daemon.ClientStatus) {
	printVerdict(w, out)
	printJetStream(w, out.JetStream)
	printLeafnodes(w, out.Leafnodes)
	printMQTT(w, out.MQTT)
	printCluster(w, out.Cluster)
	printStreams(w, out.Streams, out.Cluster != nil)
	printConsumers(w, out.Consumers)
	printProblems(w, out)
}

// printVerdict prints which holdfast answered and whether it is healthy.
func printVerdict(w io.Writer, out *daemon.ClientStatus) {
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
}

// printJetStream prints the store and its use of file and memory.
func printJetStream(w io.Writer, js daemon.JetStreamStatus) {
	fmt.Fprintln(w)
	if !js.Enabled {
		fmt.Fprintf(w, "JetStream  NOT AVAILABLE: %s\n", js.Error)
		return
	}
	sync := orDash(js.Sync)
	if js.CommitWindow != "" {
		sync += ", commit window " + js.CommitWindow
	}
	fmt.Fprintf(w, "JetStream  enabled, store %s, sync %s\n", orDash(js.StoreDir), sync)
	fmt.Fprintf(w, "  file     %s\n", usageText(js.File))
	fmt.Fprintf(w, "  memory   %s\n", usageText(js.Memory))
}

// printCluster prints the cluster and its peers; nothing for a single
// server.
func printCluster(w io.Writer, c *daemon.ClusterStatus) {
	if c == nil {
		return
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "Cluster    %s: this node %s, meta leader %s, %d node(s), %d route(s)\n", orDash(c.Name), c.Node, orDash(c.MetaLeader), c.Size, c.Routes)
	for _, p := range c.Peers {
		fmt.Fprintf(w, "  peer     %s: %s\n", p.Name, peerText(p, time.Now()))
	}
}

// printStreams prints the table of streams, then the Raft group of each
// replicated one.
func printStreams(w io.Writer, streams []daemon.StreamStatus, clustered bool) {
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STREAM\tMESSAGES\tBYTES\tFIRST SEQ\tLAST SEQ\tLIMITS\tGROUP COMMIT")
	for _, s := range streams {
		if !s.Exists {
			fmt.Fprintf(tw, "%s\t%s: %s\t\t\t\t\t\n", s.Name, absentText(s.Unknown), s.Error)
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%s\t%s\n", s.Name, s.Messages, config.FormatBytes(int64(s.Bytes)), s.FirstSeq, s.LastSeq, limitsText(s), groupCommitText(s))
	}
	tw.Flush()
	for _, s := range streams {
		// A single server names itself leader of every stream: no Raft
		// group to show.
		if s.Leader == "" || (len(s.Replicas) == 0 && !clustered) {
			continue
		}
		fmt.Fprintf(w, "  %s: leader %s; replicas %s\n", s.Name, s.Leader, replicasText(s.Replicas))
	}
}

// printConsumers prints the table of consumers, then the Raft group of
// each replicated one.
func printConsumers(w io.Writer, consumers []daemon.ConsumerStatus) {
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CONSUMER\tSTREAM\tPENDING\tACK PENDING\tREDELIVERED\tDEAD LETTERS\tLOST\tWORKERS")
	for _, c := range consumers {
		if !c.Exists {
			fmt.Fprintf(tw, "%s\t%s\t%s: %s\t\t\t\t\t\n", c.Name, c.Stream, absentText(c.Unknown), c.Error)
			continue
		}
		dead, lost := "-", "?"
		if c.DeadLetters != nil {
			dead = fmt.Sprint(*c.DeadLetters)
		}
		if c.LostToRetention != nil {
			lost = fmt.Sprint(*c.LostToRetention)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d/%d\t%d\t%s\t%s\t%s\n", c.Name, c.Stream, c.Pending, c.AckPending, c.MaxAckPending,
			c.Redelivered, dead, lost, workersText(c))
	}
	tw.Flush()
	for _, c := range consumers {
		if c.Replicas == nil {
			continue
		}
		fmt.Fprintf(w, "  %s: leader %s; replicas %s\n", c.Name, orDash(c.Leader), replicasText(c.Replicas))
	}
}

// absentText heads the row of a stream or consumer that was not read:
// UNKNOWN when it did not answer, MISSING when it does not exist.
func absentText(unknown bool) string {
	if unknown {
		return "UNKNOWN"
	}
	return "MISSING"
}

// workersText is the WORKERS column of a consumer: "?" when the daemon did
// not answer.
func workersText(c daemon.ConsumerStatus) string {
	ws := c.Workers
	if ws == nil {
		return "?"
	}
	var text string
	switch {
	case ws.Configured == 0:
		text = "none"
	case ws.Draining:
		text = fmt.Sprintf("%d draining for a reload (%d busy)", ws.Configured, ws.InFlight)
	case !ws.Running:
		text = fmt.Sprintf("%d NOT RUNNING", ws.Configured)
	default:
		text = fmt.Sprintf("%d (%d busy; %d processed, %d acked, %d retried, %d dead-lettered)",
			ws.Configured, ws.InFlight, ws.Processed, ws.Acked, ws.Retried, ws.DeadLettered)
	}
	if c.Stalled {
		text += " STALLED"
	}
	return text
}

// replicasText lists the replicas of a Raft group and their state.
func replicasText(replicas []monitor.ReplicaStatus) string {
	var reps []string
	for _, r := range replicas {
		reps = append(reps, r.Name+" "+replicaText(r.Current, r.Offline, r.Lag))
	}
	return strings.Join(reps, ", ")
}

// printProblems prints the daemon's problems and the client's, then the
// daemon's warnings.
func printProblems(w io.Writer, out *daemon.ClientStatus) {
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

func usageText(u daemon.StorageUsage) string {
	s := config.FormatBytes(int64(u.Used)) + " used"
	if u.Limit > 0 {
		s += fmt.Sprintf(" of %s (%.0f%%)", config.FormatBytes(u.Limit), 100*float64(u.Used)/float64(u.Limit))
	}
	if u.Reserved > 0 {
		s += ", " + config.FormatBytes(int64(u.Reserved)) + " reserved"
	}
	return s
}

func limitsText(s daemon.StreamStatus) string {
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
		parts = append(parts, fmt.Sprintf("max_bytes %s%s", config.FormatBytes(s.MaxBytes), pct("max_bytes")))
	}
	if s.MaxAgeSeconds > 0 {
		parts = append(parts, fmt.Sprintf("max_age %s%s", time.Duration(s.MaxAgeSeconds*float64(time.Second)), pct("max_age")))
	}
	if len(parts) == 0 {
		parts = append(parts, "unlimited")
	}
	return strings.Join(parts, ", ") + ", discard " + s.Discard
}

// peerText describes a cluster peer: down (since when), current or
// lagging.
func peerText(p daemon.PeerStatus, now time.Time) string {
	switch {
	case p.Offline && !p.DownSince.IsZero():
		return fmt.Sprintf("down (no route since %s, %s ago)", p.DownSince.Format(time.RFC3339), now.Sub(p.DownSince).Round(time.Second))
	case p.Offline:
		return "down (no route since this node started)"
	}
	return replicaText(p.Current, false, p.Lag)
}

// replicaText describes a stream replica.
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

// groupCommitText is the GROUP COMMIT column: off, or on with the batches
// committed and their average size.
func groupCommitText(s daemon.StreamStatus) string {
	if s.GroupCommit != "on" {
		return "off"
	}
	st := s.GroupCommitStats
	if st == nil || st.Batches == 0 {
		return "on"
	}
	return fmt.Sprintf("on: %d batches, avg %.0f msgs", st.Batches, float64(st.BatchedMsgs)/float64(st.Batches))
}

// printMQTT is the devices' listener in `holdfast status`.
func printMQTT(w io.Writer, st *mqtt.Stats) {
	if st == nil {
		return
	}
	fmt.Fprintf(w, "\nMQTT       %s: %d device(s) connected (%d since start), %d session(s) kept, %d QoS 1/2 deliveries unacknowledged; %d PUBACK(s) sent once stored, %d waiting; %d barrier(s), %d failed; %d publish(es) refused: no stream takes the topic\n",
		st.Listen, st.Connections, st.Accepted, st.Sessions, st.InFlight, st.Acked, st.Holding, st.Barriers, st.Failed, st.Refused)
	fmt.Fprintf(w, "           streams devices publish into: %s\n", strings.Join(st.Streams, ", "))
	if st.LastError != "" {
		fmt.Fprintf(w, "           last failure: %s\n", st.LastError)
	}
}

// printLeafnodes is the leafnode part of `holdfast status`.
func printLeafnodes(w io.Writer, st *forward.EdgeStatus) {
	if st == nil {
		return
	}
	now := time.Now()
	for _, l := range st.Links {
		state := "connected"
		if l.Address != "" {
			state += " to " + l.Address
		}
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
		pos := "unknown"
		if f.HubPositionKnown {
			pos = fmt.Sprintf("seq %d", f.HubPosition)
		}
		fmt.Fprintf(w, "  backlog %d, oldest unforwarded %s, last forward %s, hub holds up to %s; forwarded %d (%d batches), skipped %d, duplicates %d, refused %d, errors %d\n",
			f.Backlog, lag, last, pos, f.Forwarded, f.Batches, f.Skipped, f.Duplicates, f.Refused, f.Errors)
		if f.Resent > 0 || f.Gone > 0 {
			fmt.Fprintf(w, "  the hub lost what it had acknowledged: %d sent again, %d lost on both sides (no longer on this edge)\n", f.Resent, f.Gone)
		}
		if f.Untrusted > 0 {
			fmt.Fprintf(w, "  %d hub position(s) not trusted: the last message on the hub for this edge was not sent by it (a client on the hub may publish on this edge's subjects)\n", f.Untrusted)
		}
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
		link := "not linked"
		if e.Linked {
			link = "linked"
		}
		loss := ""
		if e.Resent > 0 || e.Lost > 0 {
			loss = fmt.Sprintf("; LOST BY THIS HUB: %d sent again, %d lost on both sides", e.Resent, e.Lost)
		}
		fmt.Fprintf(w, "Edge       %s stream %s: %s, last seq %d, %d waiting there then, stored there %s, seen here %s ago after %s (%d message(s) seen)%s\n",
			e.Edge, e.Stream, link, e.LastSeq, e.Pending, e.LastOrigin.UTC().Format(time.RFC3339), now.Sub(e.LastSeen).Round(time.Second),
			e.Delay.Round(time.Millisecond), e.Messages, loss)
	}
}
