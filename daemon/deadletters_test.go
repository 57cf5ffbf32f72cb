package daemon

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/internal/natstest"
	"github.com/holdfast-io/holdfast/pipeline"
	"github.com/holdfast-io/holdfast/pipeline/handler"
)

// The status page lists a consumer's newest dead letters however many
// of other consumers sharing its dead-letter stream were stored after
// them.
func TestNewestDeadLettersInASharedStream(t *testing.T) {
	s := natstest.RunServer(t)
	js := natstest.JetStream(t, natstest.Connect(t, s))
	natstest.CreateStream(t, js, jetstream.StreamConfig{Name: "DLQ", Subjects: []string{"dlq.A.>", "dlq.B.>"}})
	ctx := natstest.Context(t)

	// A's oldest 150, then 5,000 of B's, then A's newest, then B's again.
	var a []uint64 // the original sequences of A's dead letters, oldest first
	orig := uint64(0)
	store := func(consumer string, n int) {
		t.Helper()
		for i := range n {
			if i%500 == 499 {
				waitPublished(t, js)
			}
			orig++
			m := &handler.Message{Subject: "orders.created", Stream: "ORDERS", Sequence: orig, Delivery: 5, Data: []byte("x")}
			dl := pipeline.NewDeadLetter(consumer, m, time.Unix(0, 0), "failed", time.Unix(int64(orig), 0))
			if _, err := js.PublishMsgAsync(dl); err != nil {
				t.Fatal(err)
			}
			if consumer == "A" {
				a = append(a, orig)
			}
		}
		waitPublished(t, js)
	}
	store("A", 150)
	store("B", 5000)
	store("A", 1)
	store("B", 10)

	got, err := newestDeadLetters(ctx, js, "DLQ", "A", MaxDeadLetterList)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := len(a) - 1; i >= 0 && len(want) < MaxDeadLetterList; i-- {
		want = append(want, fmt.Sprintf("A#%d", a[i]))
	}
	if g := names(got); fmt.Sprint(g) != fmt.Sprint(want) {
		t.Fatalf("A's newest dead letters:\n got %d %v\nwant %d %v", len(g), g, len(want), want)
	}

	// Every consumer's: the newest of the stream, whoever they belong to.
	got, err = newestDeadLetters(ctx, js, "DLQ", "", 12)
	if err != nil {
		t.Fatal(err)
	}
	want = want[:0]
	for o := orig; o > orig-12; o-- {
		c := "B"
		if o == a[len(a)-1] {
			c = "A"
		}
		want = append(want, fmt.Sprintf("%s#%d", c, o))
	}
	if g := names(got); fmt.Sprint(g) != fmt.Sprint(want) {
		t.Fatalf("the stream's newest dead letters:\n got %v\nwant %v", g, want)
	}
}

// names is each dead letter as consumer#original sequence.
func names(dls []DeadLetterView) []string {
	var out []string
	for _, dl := range dls {
		out = append(out, fmt.Sprintf("%s#%d", dl.Consumer, dl.OriginalSeq))
	}
	return out
}

// waitPublished waits for js's asynchronous publishes to be answered
// (more than its limit of outstanding ones would stall the next).
func waitPublished(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	select {
	case <-js.PublishAsyncComplete():
	case <-natstest.Context(t).Done():
		t.Fatal("the asynchronous publishes were not answered")
	}
}
