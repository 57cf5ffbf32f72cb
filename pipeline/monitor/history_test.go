package monitor

import (
	"testing"
	"time"
)

// The history keeps a sample every HistoryEvery, the last HistoryLen.
func TestHistory(t *testing.T) {
	var h history
	m := &Monitor{}
	start := time.Now()
	for i := range 3 * HistoryLen {
		at := start.Add(time.Duration(i) * HistoryEvery / 2) // two reports per interval
		h.add(&Report{Time: at, Consumers: []ConsumerStatus{{Stream: "S", Name: "C", Pending: uint64(i), AckPending: 1, Workers: WorkerStatus{Acked: uint64(10 * i)}}}})
	}
	m.hist.by = h.by
	got := m.History("S", "C")
	if len(got) != HistoryLen {
		t.Fatalf("%d samples, want %d", len(got), HistoryLen)
	}
	last := got[len(got)-1]
	if want := uint64(3*HistoryLen - 2); last.Backlog != want+1 || last.Acked != 10*want {
		t.Fatalf("last sample %+v, want backlog %d (pending + ack pending), acked %d", last, want+1, 10*want)
	}
	for i := 1; i < len(got); i++ {
		if d := got[i].Time.Sub(got[i-1].Time); d != HistoryEvery {
			t.Fatalf("samples %d and %d are %s apart, want %s", i-1, i, d, HistoryEvery)
		}
	}
	if m.History("S", "other") != nil {
		t.Fatal("history of a consumer never seen")
	}
}
