package daemon

import (
	"slices"
	"testing"
	"time"

	"github.com/holdfast-io/holdfast/config"
)

// TestGroupCommitChanged: a reload restarts a stream's ingest when group
// commit is switched or what the ingest was built from changes (subjects,
// duplicate window, max_payload), and leaves it running otherwise.
func TestGroupCommitChanged(t *testing.T) {
	withGC := func(on bool, change func(*config.Config)) *config.Config {
		c := config.DefaultConfig()
		c.Streams = map[string]*config.StreamConfig{
			"A": config.DefaultStream([]string{"a.*"}),
			"B": config.DefaultStream([]string{"b.*"}),
		}
		c.Streams["A"].GroupCommit = on
		if change != nil {
			change(c)
		}
		return c
	}
	for _, tc := range []struct {
		name              string
		cur, next         *config.Config
		wantStop, wantRun []string
	}{
		{"unchanged", withGC(true, nil), withGC(true, nil), nil, nil},
		{"off both", withGC(false, nil), withGC(false, nil), nil, nil},
		{"other stream changed", withGC(true, nil), withGC(true, func(c *config.Config) { c.Streams["B"].MaxMsgs = 5 }), nil, nil},
		{"switched on", withGC(false, nil), withGC(true, nil), nil, []string{"A"}},
		{"switched off", withGC(true, nil), withGC(false, nil), []string{"A"}, nil},
		{"subjects", withGC(true, nil), withGC(true, func(c *config.Config) { c.Streams["A"].Subjects = []string{"a.>"} }), []string{"A"}, []string{"A"}},
		{"duplicate window", withGC(true, nil), withGC(true, func(c *config.Config) { c.Streams["A"].DuplicateWindow = config.Dur(time.Hour) }), []string{"A"}, []string{"A"}},
		{"max_payload", withGC(true, nil), withGC(true, func(c *config.Config) { c.Server.MaxPayload.Bytes *= 2 }), []string{"A"}, []string{"A"}},
	} {
		stop, start := groupCommitChanged(tc.cur, tc.next)
		if !slices.Equal(stop, tc.wantStop) || !slices.Equal(start, tc.wantRun) {
			t.Errorf("%s: stop %v start %v, want stop %v start %v", tc.name, stop, start, tc.wantStop, tc.wantRun)
		}
	}
}
