package forward

import (
	"testing"
	"time"
)

// TestSourceWatch: the stall clock runs while the lag stays or grows with
// the link up, and starts again when the lag shrinks, is 0, or the link is
// down.
func TestSourceWatch(t *testing.T) {
	t.Parallel()
	var w sourceWatch
	t0 := time.Now()
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	for _, step := range []struct {
		s    int
		lag  uint64
		up   bool
		want time.Duration
	}{
		{0, 5, true, 0},
		{3, 5, true, 3 * time.Second},
		{4, 7, true, 4 * time.Second}, // growing: still not shrinking
		{5, 6, true, 0},               // shrank
		{8, 6, true, 3 * time.Second},
		{9, 6, false, 0}, // link down: unreachable, not stalled
		{10, 6, true, time.Second},
		{11, 0, true, 0},
	} {
		if got := w.observe("S/src", step.lag, step.up, at(step.s)); got != step.want {
			t.Errorf("at %ds lag %d up %v: stalled for %s, want %s", step.s, step.lag, step.up, got, step.want)
		}
	}
}
