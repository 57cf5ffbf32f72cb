package forward

import (
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// TestForwardHubTracksIncarnations: the hub keeps each edge stream's highest
// origin sequence of its newest incarnation; a recreated stream (a later
// creation time, sequences from 1) starts again, and late messages of the
// old one do not count — also when the two creation times differ in the
// last digits of their fraction only.
func TestForwardHubTracksIncarnations(t *testing.T) {
	tr := &EdgeTracker{seen: map[[2]string]*EdgeSeen{}}
	old := time.Date(2026, 12, 2, 5, 31, 39, 120_000_000, time.UTC) // formats as …39.12Z
	recreated := old.Add(3 * time.Millisecond)                      // …39.123Z
	msg := func(created time.Time, seq uint64) *nats.Msg {
		m := nats.NewMsg("edge.edge1.orders.created")
		m.Header.Set(HeaderOriginServer, "edge1")
		m.Header.Set(HeaderOriginStream, "ORDERS")
		m.Header.Set(HeaderOriginStreamCreated, created.Format(time.RFC3339Nano))
		m.Header.Set(HeaderOriginSeq, strconv.FormatUint(seq, 10))
		m.Header.Set(HeaderOriginTime, created.Add(time.Second).Format(time.RFC3339Nano))
		return m
	}
	for _, step := range []struct {
		created time.Time
		seq     uint64
		wantSeq uint64
		want    time.Time // the incarnation recorded
	}{
		{old, 5, 5, old},
		{old, 3, 5, old}, // a redelivery of an older message
		{recreated, 1, 1, recreated},
		{old, 9, 1, recreated}, // late, from the deleted incarnation
		{recreated, 2, 2, recreated},
	} {
		tr.observe(msg(step.created, step.seq))
		seen := tr.Seen()
		if len(seen) != 1 {
			t.Fatalf("seen = %+v, want one edge stream", seen)
		}
		if got := seen[0]; got.LastSeq != step.wantSeq || got.StreamCreated != step.want.Format(time.RFC3339Nano) {
			t.Errorf("after seq %d of %s: last seq %d of %s, want %d of %s", step.seq, step.created.Format(time.RFC3339Nano),
				got.LastSeq, got.StreamCreated, step.wantSeq, step.want.Format(time.RFC3339Nano))
		}
	}
	if got := tr.Seen()[0].Messages; got != 5 {
		t.Errorf("messages = %d, want 5", got)
	}
}
