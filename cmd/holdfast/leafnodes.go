package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/pipeline"
)

// openEdgeView builds the leafnode view of a hub or an edge (nil for a
// node without [leafnodes] or sourced streams): the links, the hub's
// tracker of edges, the sources, and the metrics.
func (d *daemon) openEdgeView() (*pipeline.EdgeView, error) {
	l := d.cfg.LeafNodes
	var sourced []string
	for _, name := range d.cfg.StreamNames() {
		if sc := d.cfg.Streams[name]; len(sc.Sources) > 0 || sc.Mirror != nil {
			sourced = append(sourced, name)
		}
	}
	if !l.Hub() && !l.Edge() && len(sourced) == 0 {
		return nil, nil
	}
	v := &pipeline.EdgeView{UnreachableAfter: l.UnreachableAfter.Duration,
		JS: d.srv.JetStream(), Conn: d.srv.Conn(), SourcedStreams: sourced, StallAfter: d.cfg.HTTP.StallTimeout.Duration}
	if l.Edge() {
		v.Links = func() []pipeline.LinkState {
			var out []pipeline.LinkState
			for _, ll := range d.srv.LeafLinks() {
				out = append(out, pipeline.LinkState{Remote: ll.Remote, Connected: ll.Connected, Since: ll.Since, Connects: ll.Connects})
			}
			return out
		}
	}
	if l.Hub() && len(l.EdgeSubjects) > 0 {
		t, err := pipeline.OpenEdgeTracker(d.srv.Conn(), l.EdgeSubjects)
		if err != nil {
			return nil, err
		}
		v.Hub = t
	}
	d.metrics.Registry().MustRegister(v)
	return v, nil
}

// openForwarder builds and opens the forward handler of consumer name; it
// refuses a reachable hub whose stream's duplicate window is too short.
func (d *daemon) openForwarder(ctx context.Context, cfg *config.Config, name string) (*pipeline.Forwarder, error) {
	cc := cfg.Consumers[name]
	f, err := pipeline.NewForwarder(d.srv.Conn(), pipeline.ForwardOptions{
		ServerName:         cfg.Server.Name,
		Stream:             cc.Stream,
		Consumer:           name,
		Subject:            cc.Forward.Subject,
		Domain:             cc.Forward.Domain,
		Timeout:            cc.Forward.Timeout.Duration,
		MinDuplicateWindow: cfg.LeafNodes.UnreachableAfter.Duration,
		LinkUp:             d.srv.LeafConnected,
	}, d.log.With("component", "handler"))
	if err != nil {
		return nil, fmt.Errorf("consumers.%s.forward: %w", name, err)
	}
	d.notify.Status(fmt.Sprintf("checking the hub's stream for consumer %s", name))
	if err := f.Open(ctx); err != nil {
		return nil, fmt.Errorf("consumers.%s.forward: %w", name, err)
	}
	return f, nil
}

// setForwarder records the forwarder of consumer name, closing the one it
// replaces (a reload restarted the workers).
func (d *daemon) setForwarder(name string, f *pipeline.Forwarder) {
	if d.forwarders == nil {
		d.forwarders = map[string]*pipeline.Forwarder{}
	}
	if old := d.forwarders[name]; old != nil && old != f {
		old.Close()
	}
	d.forwarders[name] = f
	if d.edge != nil {
		d.edge.SetForwarder(name, f)
	}
}

// closeLeaf stops the forwarders' background checks and the hub's
// tracker, after the workers stopped.
func (d *daemon) closeLeaf() {
	for _, f := range d.forwarders {
		f.Close()
	}
	if d.edge != nil {
		d.edge.Hub.Close()
	}
}

// printLeafnodes is the leafnode part of `holdfast status`.
func printLeafnodes(w io.Writer, st *pipeline.EdgeStatus) {
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
