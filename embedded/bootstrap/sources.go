package bootstrap

import (
	"fmt"
	"slices"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/config"
)

// streamSources maps a stream's configured sources and mirror onto the
// server's.
func streamSources(sc *config.StreamConfig) ([]*jetstream.StreamSource, *jetstream.StreamSource) {
	conv := func(src config.SourceConfig) *jetstream.StreamSource {
		out := &jetstream.StreamSource{Name: src.Name, FilterSubject: src.FilterSubject, OptStartSeq: src.StartSeq}
		if p := config.SourceAPIPrefix(src.Domain); p != "" {
			out.External = &jetstream.ExternalStream{APIPrefix: p}
		}
		return out
	}
	var sources []*jetstream.StreamSource
	for _, src := range sc.Sources {
		sources = append(sources, conv(src))
	}
	var mirror *jetstream.StreamSource
	if sc.Mirror != nil {
		mirror = conv(*sc.Mirror)
	}
	return sources, mirror
}

// sourceKey is what identifies a source for the bootstrap's comparison.
func sourceKey(s *jetstream.StreamSource) string {
	if s == nil {
		return "none"
	}
	api := ""
	if s.External != nil {
		api = s.External.APIPrefix
	}
	return fmt.Sprintf("%s@%s filter=%q start=%d", s.Name, api, s.FilterSubject, s.OptStartSeq)
}

// diffSources applies the wanted sources to next (the server can change
// them) and refuses a changed mirror (it cannot).
func diffSources(next *jetstream.StreamConfig, want jetstream.StreamConfig, changes *[]Change) error {
	if h, w := sourceKey(next.Mirror), sourceKey(want.Mirror); h != w {
		return &DriftError{Kind: "stream", Name: want.Name, Field: "mirror", Have: h, Want: w,
			Fix: fmt.Sprintf("set streams.%s.mirror back, or back up the stream (nats stream backup), delete it and restart holdfast to recreate it", want.Name)}
	}
	keys := func(ss []*jetstream.StreamSource) []string {
		out := make([]string, 0, len(ss))
		for _, s := range ss {
			out = append(out, sourceKey(s))
		}
		slices.Sort(out)
		return out
	}
	if h, w := keys(next.Sources), keys(want.Sources); !slices.Equal(h, w) {
		record(changes, "sources", h, w)
		next.Sources = want.Sources
	}
	return nil
}
