package pipeline

import "testing"

// settledSeqs tells the advisory path which sequences the workers already
// settled: the latest settledWindow of them, in order or not.
func TestSettledSeqs(t *testing.T) {
	var s Stats
	if s.settled(1) || s.settled(0) {
		t.Fatal("nothing settled yet")
	}
	s.noteSettled(5)
	s.noteSettledAll([]ackItem{{seq: 7}, {seq: 6}})
	for _, seq := range []uint64{5, 6, 7} {
		if !s.settled(seq) {
			t.Errorf("seq %d settled but not remembered", seq)
		}
	}
	for _, seq := range []uint64{0, 4, 8, 5 + settledWindow} {
		if s.settled(seq) {
			t.Errorf("seq %d never settled but remembered", seq)
		}
	}
	// A window later, 5's place holds 5+settledWindow.
	s.noteSettled(5 + settledWindow)
	if s.settled(5) || !s.settled(5+settledWindow) || !s.settled(6) {
		t.Error("the window did not move on for seq 5 alone")
	}
}
