package pipeline

import (
	"testing"
	"time"
)

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

// One keep-alive interval serves the held messages and a message kept for
// its dead letter; without a known ack wait it is half the server's
// default. keepHeldAlive used to return at once on a zero AckWait,
// leaving queued messages without in-progress acks.
func TestInProgressInterval(t *testing.T) {
	for _, tc := range []struct{ ackWait, want time.Duration }{
		{0, 15 * time.Second},
		{4 * time.Second, 2 * time.Second},
	} {
		w := NewWorkers(nil, nil, ConsumerOptions{AckWait: tc.ackWait}, nil)
		if got := w.inProgressInterval(); got != tc.want {
			t.Errorf("AckWait %s: in-progress every %s, want %s", tc.ackWait, got, tc.want)
		}
		w.aliveStop, w.aliveDone = make(chan struct{}), make(chan struct{})
		go w.keepHeldAlive()
		select {
		case <-w.aliveDone:
			t.Errorf("AckWait %s: the keep-alive ticker stopped by itself", tc.ackWait)
		case <-time.After(100 * time.Millisecond):
		}
		close(w.aliveStop)
		<-w.aliveDone
	}
}
