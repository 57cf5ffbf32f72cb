package forward

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// SourceStatus is one source (or the mirror) of a stream, as the server
// reports it, with holdfast's verdict.
type SourceStatus struct {
	Stream string `json:"stream"`
	// Source is the source stream, with its JetStream domain's API prefix
	// when it is in another domain ("COMMANDS@$JS.hub.API").
	Source string `json:"source"`
	Mirror bool   `json:"mirror,omitempty"`
	// Lag is how many of the source's messages this stream lacks: the
	// server's count, or more when the source's last sequence says so (the
	// server's lag stays 0 when storing the copies fails).
	Lag uint64 `json:"lag"`
	// Active is how long ago the source last had activity (-1: never).
	Active time.Duration `json:"active"`
	Error  string        `json:"error,omitempty"`
	// Unreachable: the source is in another domain and no leafnode link
	// is up.
	Unreachable bool `json:"unreachable,omitempty"`
	// Stalled: the lag has not shrunk for the stall timeout while the
	// link to the source was up.
	Stalled bool `json:"stalled,omitempty"`
	// StalledFor is how long the lag has not shrunk.
	StalledFor time.Duration `json:"stalled_for,omitempty"`
}

// sourceWatch remembers, per source, the lag and when it last shrank.
type sourceWatch struct {
	mu    sync.Mutex
	state map[string]sourceMark
}

type sourceMark struct {
	lag   uint64
	since time.Time // when the lag was last 0 or shrank
}

// observe records a source's lag at now and returns how long it has not
// shrunk (0 when it is 0 or shrank now). linkUp false resets the clock: a
// source cut off is unreachable, not stalled.
func (w *sourceWatch) observe(key string, lag uint64, linkUp bool, now time.Time) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.state == nil {
		w.state = map[string]sourceMark{}
	}
	m, ok := w.state[key]
	if !ok || lag == 0 || lag < m.lag || !linkUp {
		w.state[key] = sourceMark{lag: lag, since: now}
		return 0
	}
	m.lag = lag
	w.state[key] = m
	return now.Sub(m.since)
}

// checkSources reads the sourced streams' source states and marks the
// stalled ones.
func (v *EdgeView) checkSources(ctx context.Context, now time.Time) []SourceStatus {
	if v == nil || v.JS == nil || len(v.SourcedStreams) == 0 {
		return nil
	}
	linkUp := true
	if links := v.links(); len(links) > 0 {
		linkUp = false
		for _, l := range links {
			linkUp = linkUp || l.Connected
		}
	}
	var out []SourceStatus
	for _, name := range v.SourcedStreams {
		s, err := v.JS.Stream(ctx, name)
		if err != nil {
			out = append(out, SourceStatus{Stream: name, Error: err.Error()})
			continue
		}
		info := s.CachedInfo()
		add := func(si *jetstream.StreamSourceInfo, mirror bool) {
			if si == nil {
				return
			}
			src := si.Name
			local := si.External == nil || si.External.APIPrefix == ""
			if !local {
				src += "@" + si.External.APIPrefix
			}
			st := SourceStatus{Stream: name, Source: src, Mirror: mirror, Lag: si.Lag, Active: si.Active, Unreachable: !local && !linkUp}
			if !st.Unreachable {
				ours := si.Seq
				if mirror {
					ours = info.State.LastSeq
				}
				if last, err := v.sourceLastSeq(ctx, si); err == nil && last > ours {
					st.Lag = max(st.Lag, last-ours)
				}
			}
			if si.Error != nil {
				st.Error = si.Error.Error()
			}
			st.StalledFor = v.sources.observe(name+"/"+src, st.Lag, local || linkUp, now)
			st.Stalled = v.StallAfter > 0 && st.StalledFor >= v.StallAfter
			out = append(out, st)
		}
		add(info.Mirror, true)
		for _, si := range info.Sources {
			add(si, false)
		}
	}
	return out
}

// sourceLastSeq is the last sequence of the source stream (of its filter
// subject, when it has one), read through the source's JetStream domain.
func (v *EdgeView) sourceLastSeq(ctx context.Context, si *jetstream.StreamSourceInfo) (uint64, error) {
	js := v.JS
	if si.External != nil && si.External.APIPrefix != "" && v.Conn != nil {
		var err error
		if js, err = jetstream.NewWithAPIPrefix(v.Conn, si.External.APIPrefix); err != nil {
			return 0, err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	s, err := js.Stream(ctx, si.Name)
	if err != nil {
		return 0, err
	}
	if si.FilterSubject == "" {
		return s.CachedInfo().State.LastSeq, nil
	}
	m, err := s.GetLastMsgForSubject(ctx, si.FilterSubject)
	if err != nil {
		return 0, err
	}
	return m.Sequence, nil
}

// sourceProblems are the stalled and failing sources, for the health.
func sourceProblems(sources []SourceStatus) []string {
	var out []string
	for _, s := range sources {
		switch {
		case s.Stalled:
			out = append(out, fmt.Sprintf("stream %s: source %s is stalled: %d message(s) behind, no progress for %s while the link is up (the source stream may have been recreated: check `nats stream info %s`)",
				s.Stream, s.Source, s.Lag, s.StalledFor.Round(time.Second), s.Stream))
		case s.Error != "" && !s.Unreachable:
			out = append(out, fmt.Sprintf("stream %s: source %s: %s", s.Stream, s.Source, s.Error))
		}
	}
	return out
}
