package config

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
		switch sc := c.Streams[name]; {
		case sc.Mirror != nil:
			v.add(key, "true", "a mirror is written by the server alone, no client publishes to it: set it to false")
		case len(sc.Subjects) == 0:
			v.add(key, "true", "the stream has no subjects of its own (only sources) for clients to publish to: set it to false, or add subjects")
		}
		if c.Cluster.Enabled() {
			v.add(key, "true", "not supported with [cluster] yet (a publisher's messages could reach the ingests of different nodes and be stored out of order): set it to false")
		}
	}
}
