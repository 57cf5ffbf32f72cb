package forward

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/holdfast-io/holdfast/internal/natstest"
)

// TestForwardHubTracksIncarnations: the hub keeps each edge stream's highest
// origin sequence of its newest incarnation; a recreated stream (a later
// creation time, sequences from 1) starts again, and late messages of the
// old one do not count — also when the two creation times differ in the
// last digits of their fraction only.
func TestForwardHubTracksIncarnations(t *testing.T) {
	t.Parallel()
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

// TestEdgeTrackerBounded: the origin headers are the publisher's to write;
// one that sends 2.5 × MaxTrackedEdges distinct origin servers to the edge
// subjects cannot grow the hub's tracker past MaxTrackedEdges. The least
// recently seen edge streams are dropped and counted; the latest are kept.
// (10,000 origins, each past the bound costing a scan of the tracker,
// took over 30 s under -race on a loaded CI machine.)
func TestEdgeTrackerBounded(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	tr, err := OpenEdgeTracker(natstest.Connect(t, s), []string{"edge.>"}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	nc := natstest.Connect(t, s)
	const edges = MaxTrackedEdges * 5 / 2
	for i := range edges {
		m := nats.NewMsg("edge.x.orders.created")
		m.Header.Set(HeaderOriginServer, fmt.Sprintf("edge-%d", i))
		m.Header.Set(HeaderOriginStream, "ORDERS")
		m.Header.Set(HeaderOriginSeq, "1")
		if err := nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	last := fmt.Sprintf("edge-%d", edges-1)
	natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		for _, e := range tr.Seen() {
			if e.Edge == last {
				return nil
			}
		}
		return fmt.Errorf("the last edge, %s, not seen yet", last)
	})
	if n := len(tr.Seen()); n > MaxTrackedEdges {
		t.Fatalf("%d edge streams tracked after %d distinct origins, want at most %d", n, edges, MaxTrackedEdges)
	}
	if got, want := tr.Dropped(), uint64(edges-MaxTrackedEdges); got != want {
		t.Fatalf("%d edge streams counted as dropped, want %d", got, want)
	}
}

// originMsg is a message an edge forwarded to the hub: the edge, its
// stream and the stream's subject, and the origin sequence.
type originMsg struct {
	edge, stream, subject string
	seq                   int
}

// seededTracker stores msgs in a stream EDGE on edge.> (with allow_direct,
// as a holdfast hub sets it, or without) and returns a tracker seeded
// from it.
func seededTracker(t *testing.T, allowDirect bool, msgs []originMsg) *EdgeTracker {
	t.Helper()
	srv := natstest.RunServer(t)
	nc := natstest.Connect(t, srv)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := natstest.Context(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EDGE", Subjects: []string{"edge.>"}, AllowDirect: allowDirect}); err != nil {
		t.Fatal(err)
	}
	created := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC).Format(time.RFC3339Nano)
	for _, m := range msgs {
		msg := nats.NewMsg("edge." + m.edge + "." + m.subject)
		msg.Header.Set(HeaderOriginServer, m.edge)
		msg.Header.Set(HeaderOriginStream, m.stream)
		msg.Header.Set(HeaderOriginStreamCreated, created)
		msg.Header.Set(HeaderOriginSeq, strconv.Itoa(m.seq))
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}
	tr, err := OpenEdgeTracker(nc, []string{"edge.>"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.Close)
	if err := tr.Seed(ctx, js, []string{"EDGE"}, []string{"edge.>"}); err != nil {
		t.Fatal(err)
	}
	return tr
}

// TestEdgeTrackerSeededFromStream: a hub's tracker started on a stream
// that holds edges' messages (a hub restarted, another node of a hub
// cluster) lists each edge with its last message from the stream, before
// any edge forwards again; a live message after it counts as seen.
func TestEdgeTrackerSeededFromStream(t *testing.T) {
	t.Parallel()
	var msgs []originMsg
	for _, m := range []struct {
		edge string
		seq  int
	}{{"edge1", 1}, {"edge2", 1}, {"edge1", 2}, {"edge2", 2}, {"edge1", 3}} {
		msgs = append(msgs, originMsg{m.edge, "ORDERS", "orders.created", m.seq})
	}
	seen := seededTracker(t, false, msgs).Seen()
	if len(seen) != 2 || seen[0].Edge != "edge1" || seen[0].LastSeq != 3 || seen[1].Edge != "edge2" || seen[1].LastSeq != 2 {
		t.Fatalf("seen after the seed = %+v, want edge1 at 3 and edge2 at 2", seen)
	}
	if seen[0].LastSeen.IsZero() || seen[0].Messages != 0 {
		t.Errorf("edge1 seeded: last seen %s, %d messages seen since start; want when the hub stored it, 0", seen[0].LastSeen, seen[0].Messages)
	}
}

// TestEdgeTrackerSeedsEveryStreamOfAnEdge: an edge that forwards two
// streams under its prefix (ORDERS on two subjects, METRICS) is listed
// with both after the seed, each at its own last message, not only with
// the stream that forwarded last.
func TestEdgeTrackerSeedsEveryStreamOfAnEdge(t *testing.T) {
	t.Parallel()
	tr := seededTracker(t, true, []originMsg{
		{"edge1", "ORDERS", "orders.created", 1}, {"edge1", "ORDERS", "orders.paid", 2}, {"edge1", "ORDERS", "orders.created", 3},
		{"edge1", "METRICS", "metrics.cpu", 1}, {"edge1", "METRICS", "metrics.cpu", 2},
	})
	var got []string
	for _, e := range tr.Seen() {
		got = append(got, fmt.Sprintf("%s/%s@%d", e.Edge, e.Stream, e.LastSeq))
	}
	if want := "edge1/METRICS@2 edge1/ORDERS@3"; strings.Join(got, " ") != want {
		t.Fatalf("seen after the seed: %v, want %s", got, want)
	}
}

// TestEdgeTrackerPending: the edge's backlog and delay are those of the
// message with the highest origin sequence; a redelivery of an older one
// (with the larger backlog it was first sent with) changes neither.
func TestEdgeTrackerPending(t *testing.T) {
	t.Parallel()
	tr := &EdgeTracker{seen: map[[2]string]*EdgeSeen{}}
	created := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	now := created.Add(time.Hour)
	msg := func(seq, pending uint64, age time.Duration) nats.Header {
		h := nats.Header{}
		h.Set(HeaderOriginServer, "edge1")
		h.Set(HeaderOriginStream, "ORDERS")
		h.Set(HeaderOriginStreamCreated, created.Format(time.RFC3339Nano))
		h.Set(HeaderOriginSeq, strconv.FormatUint(seq, 10))
		h.Set(HeaderOriginTime, now.Add(-age).Format(time.RFC3339Nano))
		h.Set(HeaderOriginPending, strconv.FormatUint(pending, 10))
		return h
	}
	tr.record(msg(10, 90, 3*time.Second), now, true)
	tr.record(msg(100, 0, 20*time.Millisecond), now, true)
	tr.record(msg(50, 50, time.Second), now, true) // sent again
	got := tr.Seen()[0]
	if got.Pending != 0 || got.Delay != 20*time.Millisecond || got.LastSeq != 100 {
		t.Errorf("pending %d, delay %s, last seq %d: want 0, 20ms and 100", got.Pending, got.Delay, got.LastSeq)
	}
}

// TestEdgeTrackerLossLoggedWhenTold: a loss read back from the stream at
// the hub's start (Seed) is history: counted, not logged again nor a
// problem; one an edge tells now is both.
func TestEdgeTrackerLossLoggedWhenTold(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	tr := &EdgeTracker{seen: map[[2]string]*EdgeSeen{}, log: slog.New(slog.NewTextHandler(&buf, nil))}
	h := func(seq, lost uint64) nats.Header {
		h := nats.Header{}
		h.Set(HeaderOriginServer, "edge1")
		h.Set(HeaderOriginStream, "ORDERS")
		h.Set(HeaderOriginSeq, strconv.FormatUint(seq, 10))
		h.Set(HeaderOriginLost, strconv.FormatUint(lost, 10))
		return h
	}
	tr.record(h(10, 3), time.Now(), false) // read back at start
	if buf.Len() != 0 || len(tr.Problems()) != 0 || tr.Seen()[0].Lost != 3 {
		t.Fatalf("a loss read back at start: log %q, problems %q, lost %d; want no log, no problem, 3", buf.String(), tr.Problems(), tr.Seen()[0].Lost)
	}
	tr.record(h(11, 5), time.Now(), true)
	if !strings.Contains(buf.String(), "lost on the edge too") || len(tr.Problems()) != 1 || tr.Seen()[0].Lost != 5 {
		t.Fatalf("a loss told now: log %q, problems %q, lost %d; want a log, a problem, 5", buf.String(), tr.Problems(), tr.Seen()[0].Lost)
	}
}

// TestEdgeMetricsWithForgedOrigin: the origin headers are the
// publisher's to write, in any bytes. A Prometheus label must be UTF-8:
// an origin server or stream that is not must not make the hub's
// /metrics fail, and two such origins must not collide into one label.
func TestEdgeMetricsWithForgedOrigin(t *testing.T) {
	t.Parallel()
	tr := &EdgeTracker{seen: map[[2]string]*EdgeSeen{}}
	for _, origin := range [][2]string{{"edge1", "ORDERS"}, {"edge-\xff", "ORDERS"}, {"edge-\xfe", "ORDERS"}, {"edge2", "OR\xc3DERS"}} {
		m := nats.NewMsg("edge.x.orders.created")
		m.Header.Set(HeaderOriginServer, origin[0])
		m.Header.Set(HeaderOriginStream, origin[1])
		m.Header.Set(HeaderOriginSeq, "1")
		tr.observe(m)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(&EdgeView{Hub: tr})
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `holdfast_edge_last_seq{edge="edge1",stream="ORDERS"} 1`) {
		t.Fatalf("GET /metrics: %d\n%.600s", rec.Code, rec.Body)
	}
}
