package config

import "time"

// GroupCommitStreams names the configured streams with group_commit on.
func (c *Config) GroupCommitStreams() []string {
	var out []string
	for _, name := range c.StreamNames() {
		if c.Streams[name].GroupCommit {
			out = append(out, name)
		}
	}
	return out
}

// validateGroupCommit refuses group commit where holdfast has nothing to
// answer — a mirror, or a stream with only sources: no subjects of its
// own — and with [cluster]: each node would answer the stream's subjects
// in one queue group, and the server may hand one publisher's messages to
// ingests on different nodes, which would store them out of order. Not
// tested on replicated streams either.
func (c *Config) validateGroupCommit(v *validator) {
	for _, name := range c.GroupCommitStreams() {
		key := "streams." + name + ".group_commit"
		sc := c.Streams[name]
		switch {
		case sc.Mirror != nil:
			v.add(key, "true", "a mirror is written by the server alone, no client publishes to it: set it to false")
		case len(sc.Subjects) == 0:
			v.add(key, "true", "the stream has no subjects of its own (only sources) for clients to publish to: set it to false, or add subjects")
		}
		// A commit window with [cluster] is refused by its own key.
		if c.Cluster.Enabled() && !sc.groupCommitImplied {
			v.add(key, "true", "not supported with [cluster] yet (a publisher's messages could reach the ingests of different nodes and be stored out of order): set it to false")
		}
	}
}

// maxCommitWindow bounds jetstream.commit_window: every publish may wait
// that long for its PubAck.
const maxCommitWindow = time.Second

// CommitWindowOn reports whether holdfast flushes the store itself, once
// per jetstream.commit_window (embedded/store.Syncer).
func (c *Config) CommitWindowOn() bool { return c.JetStream.CommitWindow.Duration > 0 }

// applyCommitWindow turns group commit on for every stream clients
// publish to when the commit window is on (the server answers no publish
// itself then, holdfast does after its flush), but where the file sets
// group_commit itself (groupCommitSet): Validate refuses a false there.
func (c *Config) applyCommitWindow(groupCommitSet func(stream string) bool) {
	if !c.CommitWindowOn() {
		return
	}
	for name, sc := range c.Streams {
		if takesPublishes(sc) && !groupCommitSet(name) {
			sc.GroupCommit, sc.groupCommitImplied = true, true
		}
	}
}

// takesPublishes reports whether clients publish to sc: it has subjects
// of its own and is no mirror.
func takesPublishes(sc *StreamConfig) bool { return sc.Mirror == nil && len(sc.Subjects) > 0 }

// validateCommitWindow refuses a commit window where a publish could be
// answered before holdfast's flush: a sync interval (nothing then waits
// for a flush), [cluster] (a replicated stream's server buffers its writes
// and answers once the replicas have them) and [mqtt] (the server answers
// the devices); and on a hub, whose edges forward one message at a time
// and would each wait for a window.
func (c *Config) validateCommitWindow(v *validator) {
	w := c.JetStream.CommitWindow
	if !v.duration("jetstream.commit_window", w) {
		return
	}
	switch d := w.Duration; {
	case d < 0:
		v.add("jetstream.commit_window", w.String(), "must be \"0s\" (the server flushes each write) or a positive window such as \"40ms\"")
	case d > maxCommitWindow:
		v.add("jetstream.commit_window", w.String(), "at most %s: every publish may wait that long for its PubAck", maxCommitWindow)
	case d == 0:
	case !c.JetStream.SyncAlways():
		v.add("jetstream.commit_window", w.String(), "needs jetstream.sync = \"always\": an interval already flushes on its own schedule, after the PubAck")
	case c.Cluster.Enabled():
		v.add("jetstream.commit_window", w.String(), "not supported with [cluster] (a replicated stream's server buffers writes before its replicas answer): remove it; "+
			"in a cluster each PubAck already waits until a majority of the stream's replicas has the message, each flushing with sync = \"always\"")
	case c.LeafNodes.Hub():
		v.add("jetstream.commit_window", w.String(), "not supported on a hub (leafnodes.listen): the edges forward one message at a time and each would wait for a window, so catching up after an outage would crawl; set it on the edges only")
	case c.MQTT.Listen != "":
		v.add("jetstream.commit_window", w.String(), "not supported with [mqtt] (the server answers the devices before holdfast's flush): set it to \"0s\", or mqtt.listen = \"\"")
	default:
		for _, name := range c.StreamNames() {
			if sc := c.Streams[name]; takesPublishes(sc) && !sc.GroupCommit {
				v.add("streams."+name+".group_commit", "false", "with jetstream.commit_window = %s every stream clients publish to takes group commit (the server would answer its publishers before holdfast's flush): remove the key", w)
			}
		}
	}
}
