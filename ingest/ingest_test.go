package ingest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/holdfast-io/holdfast/internal/natstest"
	"github.com/holdfast-io/holdfast/internal/subjects"
)

// startIngest creates opts.Stream on opts.Subjects the way holdfast does
// for group_commit (bootstrap.StreamSpec: prefixed subjects, the transform
// back, atomic publish; mod adjusts it) and opens a Committer with opts.
func startIngest(t testing.TB, s *server.Server, js jetstream.JetStream, opts Options, mod func(*jetstream.StreamConfig)) *Committer {
	t.Helper()
	return startIngestHeld(t, s, js, opts, mod, nil)
}

// startIngestHeld is startIngest with the Committer's hold set before it
// opens.
func startIngestHeld(t testing.TB, s *server.Server, js jetstream.JetStream, opts Options, mod func(*jetstream.StreamConfig), hold func()) *Committer {
	t.Helper()
	cfg := jetstream.StreamConfig{Name: opts.Stream, Subjects: subjects.GroupCommitSubjects(opts.Stream, opts.Subjects),
		SubjectTransform:   &jetstream.SubjectTransformConfig{Source: subjects.GroupCommit(opts.Stream, ">"), Destination: ">"},
		AllowAtomicPublish: true, Duplicates: time.Minute, Storage: jetstream.FileStorage}
	if mod != nil {
		mod(&cfg)
	}
	if _, err := js.CreateStream(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	c := New(natstest.Connect(t, s), opts, slog.New(slog.NewTextHandler(io.Discard, nil)))
	c.hold = hold
	if err := c.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// awaitAck waits for a PublishAsync's answer: the PubAck, the server's
// error, or an error saying there was none within 30 seconds.
func awaitAck(f jetstream.PubAckFuture) (*jetstream.PubAck, error) {
	select {
	case a := <-f.Ok():
		return a, nil
	case err := <-f.Err():
		return nil, err
	case <-time.After(30 * time.Second):
		return nil, errors.New("no answer in 30s")
	}
}

// storedBodies reads the whole stream: subject and body per sequence.
func storedBodies(t *testing.T, js jetstream.JetStream, stream string) map[uint64]*jetstream.RawStreamMsg {
	t.Helper()
	ctx := context.Background()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[uint64]*jetstream.RawStreamMsg{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("seq %d: %v", seq, err)
		}
		out[seq] = m
	}
	return out
}

// TestPublishersGetPubAcksInOrder: async and sync publishers on two
// subjects get ordinary PubAcks; every acked sequence holds that message,
// under the configured subject, each stored once, in publisher order.
func TestPublishersGetPubAcksInOrder(t *testing.T) {
	s := natstest.RunServer(t, natstest.SyncAlways)
	js := natstest.JetStream(t, natstest.Connect(t, s))
	reg := prometheus.NewRegistry()
	c := startIngest(t, s, js, Options{Stream: "ORDERS", Subjects: []string{"orders.*", "bills.>"}, Metrics: NewMetrics(reg)}, nil)

	const publishers, each = 4, 600
	type ack struct {
		seq  uint64
		body string
	}
	acks := make([][]ack, publishers+1)
	var wg sync.WaitGroup
	errs := make(chan error, publishers+1)
	for p := range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pjs := natstest.JetStream(t, natstest.Connect(t, s))
			futs := make([]jetstream.PubAckFuture, 0, each)
			for i := range each {
				subj := "orders.created"
				if i%3 == 0 {
					subj = "bills.x.y"
				}
				f, err := pjs.PublishAsync(subj, fmt.Appendf(nil, "%d-%d", p, i))
				if err != nil {
					errs <- err
					return
				}
				futs = append(futs, f)
			}
			for i, f := range futs {
				a, err := awaitAck(f)
				if err != nil {
					errs <- fmt.Errorf("publisher %d msg %d: %w", p, i, err)
					return
				}
				if a.Stream != "ORDERS" || a.Duplicate {
					errs <- fmt.Errorf("publisher %d msg %d: ack %+v", p, i, a)
					return
				}
				acks[p] = append(acks[p], ack{a.Sequence, fmt.Sprintf("%d-%d", p, i)})
			}
		}()
	}
	wg.Add(1)
	go func() { // one synchronous publisher among them
		defer wg.Done()
		pjs := natstest.JetStream(t, natstest.Connect(t, s))
		for i := range 100 {
			a, err := pjs.Publish(context.Background(), "orders.sync", fmt.Appendf(nil, "%d-%d", publishers, i))
			if err != nil {
				errs <- err
				return
			}
			acks[publishers] = append(acks[publishers], ack{a.Sequence, fmt.Sprintf("%d-%d", publishers, i)})
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	stored := storedBodies(t, js, "ORDERS")
	want := publishers*each + 100
	if len(stored) != want {
		t.Fatalf("stored %d messages, want %d", len(stored), want)
	}
	for p, list := range acks {
		var last uint64
		for _, a := range list {
			m := stored[a.seq]
			if m == nil || string(m.Data) != a.body {
				t.Fatalf("ack seq %d for %s: stored %v", a.seq, a.body, m)
			}
			if strings.HasPrefix(m.Subject, "$") {
				t.Fatalf("seq %d stored under %s, want the configured subject", a.seq, m.Subject)
			}
			if a.seq <= last {
				t.Fatalf("publisher %d: seq %d after %d: order lost", p, a.seq, last)
			}
			last = a.seq
		}
	}
	st := c.Stats()
	if st.Batches == 0 {
		t.Fatalf("no batch committed: %+v", st)
	}
	t.Logf("stats %+v", st)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]uint64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			counts[mf.GetName()] += m.GetHistogram().GetSampleCount()
		}
	}
	if want := st.Batches + st.Alone; counts["holdfast_group_commit_batch_size"] != want || counts["holdfast_group_commit_latency_seconds"] != want {
		t.Fatalf("histogram counts %v, want %d commits", counts, want)
	}
}

// TestLonePublisherGoesAlone: a synchronous publisher never waits for a
// batch: each message is published alone.
func TestLonePublisherGoesAlone(t *testing.T) {
	s := natstest.RunServer(t, natstest.SyncAlways)
	js := natstest.JetStream(t, natstest.Connect(t, s))
	c := startIngest(t, s, js, Options{Stream: "S", Subjects: []string{"s.*"}}, nil)
	for i := range 20 {
		a, err := js.Publish(context.Background(), "s.a", []byte(strconv.Itoa(i)))
		if err != nil {
			t.Fatal(err)
		}
		if a.Sequence != uint64(i+1) || a.Stream != "S" {
			t.Fatalf("ack %+v", a)
		}
	}
	if st := c.Stats(); st.Alone != 20 || st.Batches != 0 {
		t.Fatalf("stats %+v, want 20 alone", st)
	}
}

// TestDedupeWithinAndAcrossBatches: duplicates of Nats-Msg-Id in one burst
// and against the stream's window are stored once, acknowledged as
// duplicates, and fail none of the others — whether the committer knows
// the ids it sent (DuplicateWindow) or not (as after a restart, when the
// server refuses the batch and its messages are published one by one).
func TestDedupeWithinAndAcrossBatches(t *testing.T) {
	for _, window := range []time.Duration{time.Minute, 0} {
		t.Run("known ids "+window.String(), func(t *testing.T) { testDedupe(t, window) })
	}
}

func testDedupe(t *testing.T, window time.Duration) {
	s := natstest.RunServer(t, natstest.SyncAlways)
	js := natstest.JetStream(t, natstest.Connect(t, s))
	c := startIngest(t, s, js, Options{Stream: "S", Subjects: []string{"s.*"}, DuplicateWindow: window}, nil)
	pjs := natstest.JetStream(t, natstest.Connect(t, s))
	publish := func(ids []string) []*jetstream.PubAck {
		futs := make([]jetstream.PubAckFuture, len(ids))
		for i, id := range ids {
			f, err := pjs.PublishAsync("s.a", []byte(id), jetstream.WithMsgID(id))
			if err != nil {
				t.Fatal(err)
			}
			futs[i] = f
		}
		out := make([]*jetstream.PubAck, len(ids))
		for i, f := range futs {
			a, err := awaitAck(f)
			if err != nil {
				t.Fatalf("id %s: %v", ids[i], err)
			}
			out[i] = a
		}
		return out
	}
	// Within: each id twice in a row, among 300 messages.
	var ids []string
	for i := range 150 {
		ids = append(ids, "a"+strconv.Itoa(i), "a"+strconv.Itoa(i))
	}
	acks := publish(ids)
	for i := 0; i < len(acks); i += 2 {
		if acks[i].Duplicate || !acks[i+1].Duplicate || acks[i].Sequence != acks[i+1].Sequence {
			t.Fatalf("%s: acks %+v then %+v, want stored then duplicate of it", ids[i], acks[i], acks[i+1])
		}
	}
	// Across: new ids mixed with ids already in the window.
	ids = ids[:0]
	for i := range 200 {
		if i%2 == 0 {
			ids = append(ids, "a"+strconv.Itoa(i/2))
		} else {
			ids = append(ids, "b"+strconv.Itoa(i))
		}
	}
	acks = publish(ids)
	for i, a := range acks {
		if dup := strings.HasPrefix(ids[i], "a"); a.Duplicate != dup {
			t.Fatalf("%s: duplicate = %v", ids[i], a.Duplicate)
		}
	}
	// Only new ids: batches again.
	ids = ids[:0]
	for i := range 300 {
		ids = append(ids, "c"+strconv.Itoa(i))
	}
	for _, a := range publish(ids) {
		if a.Duplicate {
			t.Fatalf("new id acked as duplicate: %+v", a)
		}
	}
	if n := len(storedBodies(t, js, "S")); n != 550 {
		t.Fatalf("stored %d, want 550", n)
	}
	st := c.Stats()
	t.Logf("stats %+v", st)
	if window == 0 && st.Refused == 0 {
		t.Fatal("no batch was refused: the one-by-one fallback was not exercised")
	}
}

// TestErrorsAsTheServerGivesThem: a wrong expected sequence and a message
// above the stream's max_msg_size get the server's own errors, and the
// messages around them are stored.
func TestErrorsAsTheServerGivesThem(t *testing.T) {
	s := natstest.RunServer(t, natstest.SyncAlways)
	js := natstest.JetStream(t, natstest.Connect(t, s))
	ctx := context.Background()
	c := startIngest(t, s, js, Options{Stream: "S", Subjects: []string{"s.*"}, MaxMsgSize: 1000}, func(sc *jetstream.StreamConfig) { sc.MaxMsgSize = 1000 })
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "PLAIN", Subjects: []string{"p.*"}, MaxMsgSize: 1000}); err != nil {
		t.Fatal(err)
	}

	check := func(what string, pub func(subj string) error) {
		t.Helper()
		want := pub("p.a")
		got := pub("s.a")
		var we, ge *jetstream.APIError
		if !errors.As(want, &we) || !errors.As(got, &ge) || we.ErrorCode != ge.ErrorCode || we.Code != ge.Code {
			t.Fatalf("%s: group commit gave %v, the server %v", what, got, want)
		}
	}
	if _, err := js.Publish(ctx, "p.a", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "s.a", []byte("x")); err != nil {
		t.Fatal(err)
	}
	check("expected last sequence", func(subj string) error {
		_, err := js.Publish(ctx, subj, []byte("y"), jetstream.WithExpectLastSequence(7))
		return err
	})
	check("too large", func(subj string) error {
		_, err := js.Publish(ctx, subj, make([]byte, 2000))
		return err
	})
	// A right expected sequence works.
	a, err := js.Publish(ctx, "s.a", []byte("z"), jetstream.WithExpectLastSequence(1))
	if err != nil || a.Sequence != 2 {
		t.Fatalf("expected sequence 1: %+v %v", a, err)
	}
	// The three with an expected sequence or too large went with the
	// client's reply (the server answered them), the plain one alone.
	if st := c.Stats(); st.Forwarded != 3 || st.Alone != 1 || st.Batches != 0 || st.Refused != 0 {
		t.Fatalf("stats %+v, want 3 forwarded, 1 alone", st)
	}
}

// TestMessagesAtMaxMsgSizeFailNoBatch: a message of exactly the stream's
// max_msg_size (data alone, or data and headers) is stored by the server;
// inside a batch the batch headers pushed it over, the server abandoned
// the batch, and 1,000 other clients got "atomic publish batch is
// incomplete" (err_code 10176), an error no plain publish ever gets. Now
// every message is acknowledged and stored, as without group commit.
func TestMessagesAtMaxMsgSizeFailNoBatch(t *testing.T) {
	s := natstest.RunServer(t, natstest.SyncAlways)
	js := natstest.JetStream(t, natstest.Connect(t, s))
	const maxSize = 1000
	c := startIngest(t, s, js, Options{Stream: "S", Subjects: []string{"s.*"}, MaxMsgSize: maxSize}, func(sc *jetstream.StreamConfig) { sc.MaxMsgSize = maxSize })
	// What the header block "NATS/1.0\r\nX: y\r\n\r\n" takes of the limit.
	const hdrBytes = len("NATS/1.0\r\nX: y\r\n\r\n")
	const publishers, each = 4, 1000
	var wg sync.WaitGroup
	errs := make(chan error, publishers*each)
	for p := range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pjs := natstest.JetStream(t, natstest.Connect(t, s), jetstream.WithPublishAsyncMaxPending(each))
			futs := make([]jetstream.PubAckFuture, 0, each)
			for i := range each {
				m := nats.NewMsg("s.a")
				m.Data = []byte(strconv.Itoa(i))
				switch {
				case p == 0 && i == each/2:
					m.Data = make([]byte, maxSize)
				case p == 1 && i == each/2:
					m.Data = make([]byte, maxSize-hdrBytes)
					m.Header.Set("X", "y")
				}
				f, err := pjs.PublishMsgAsync(m)
				if err != nil {
					errs <- err
					return
				}
				futs = append(futs, f)
			}
			for i, f := range futs {
				if _, err := awaitAck(f); err != nil {
					errs <- fmt.Errorf("publisher %d msg %d: %w", p, i, err)
				}
			}
		}()
	}
	wg.Wait()
	failOnErrs(t, errs, "publishes failed", c)
	if got := len(storedBodies(t, js, "S")); got != publishers*each {
		t.Fatalf("stored %d, want %d", got, publishers*each)
	}
	st := c.Stats()
	if st.Batches == 0 || st.Refused != 0 {
		t.Fatalf("stats %+v: want batches, none refused", st)
	}
	t.Logf("stats %+v", st)
}

// TestUnsendableHeadersRefusedAlone: a client writing the protocol itself
// may send a header the NATS client cannot publish again (a name with
// "=", or a line without a colon). The committer's publish of it failed:
// alone, its client got no answer at all; in a batch, the server
// abandoned the batch for the missing message and up to 1,000 other
// clients got "atomic publish batch is incomplete". Each such publish now
// gets an error saying why, and every other publish is stored.
func TestUnsendableHeadersRefusedAlone(t *testing.T) {
	s := natstest.RunServer(t, natstest.SyncAlways)
	js := natstest.JetStream(t, natstest.Connect(t, s))
	c := startIngest(t, s, js, Options{Stream: "S", Subjects: []string{"s.*"}}, nil)

	conn, err := net.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	raw := bufio.NewReader(conn)
	if _, err := raw.ReadString('\n'); err != nil { // INFO
		t.Fatal(err)
	}
	if _, err := fmt.Fprint(conn, "CONNECT {\"verbose\":false,\"headers\":true,\"protocol\":1}\r\nSUB raw.> 1\r\n"); err != nil {
		t.Fatal(err)
	}
	blocks := []string{"NATS/1.0\r\nX-Eq=Name: v\r\n\r\n", "NATS/1.0\r\nno colon\r\n\r\n"}
	const bad = 20

	const publishers, each = 4, 1000
	var wg sync.WaitGroup
	errs := make(chan error, publishers*each)
	for p := range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pjs := natstest.JetStream(t, natstest.Connect(t, s), jetstream.WithPublishAsyncMaxPending(each))
			futs := make([]jetstream.PubAckFuture, 0, each)
			for i := range each {
				f, err := pjs.PublishAsync("s.a", []byte(strconv.Itoa(i)))
				if err != nil {
					errs <- err
					return
				}
				futs = append(futs, f)
			}
			for i, f := range futs {
				if _, err := awaitAck(f); err != nil {
					errs <- fmt.Errorf("publisher %d msg %d: %w", p, i, err)
				}
			}
		}()
	}
	// Among them, the raw client's publishes.
	for i := range bad {
		hdr := blocks[i%len(blocks)]
		if _, err := fmt.Fprintf(conn, "HPUB s.a raw.%d %d %d\r\n%sx\r\n", i, len(hdr), len(hdr)+1, hdr); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	answers := map[string]string{}
	if err := conn.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	for len(answers) < bad {
		line, err := raw.ReadString('\n')
		if err != nil {
			t.Fatalf("%d of %d raw publishes answered: %v", len(answers), bad, err)
		}
		var subj, sid string
		var size int
		if n, _ := fmt.Sscanf(line, "MSG %s %s %d", &subj, &sid, &size); n != 3 {
			continue // PING, INFO
		}
		body := make([]byte, size+2)
		if _, err := io.ReadFull(raw, body); err != nil {
			t.Fatal(err)
		}
		answers[subj] = string(body[:size])
	}
	for subj, a := range answers {
		if !strings.Contains(a, `"code":400`) || !strings.Contains(a, "cannot pass") {
			t.Errorf("%s: answer %s, want an error saying group commit cannot pass it on", subj, a)
		}
	}
	wg.Wait()
	failOnErrs(t, errs, "publishes failed", c)
	if got := len(storedBodies(t, js, "S")); got != publishers*each {
		t.Fatalf("stored %d, want %d", got, publishers*each)
	}
	t.Logf("stats %+v", c.Stats())
}

// TestConsumersSeeConfiguredSubjects: what group commit stores is read
// under the configured subjects, with a filter on them.
func TestConsumersSeeConfiguredSubjects(t *testing.T) {
	s := natstest.RunServer(t, natstest.SyncAlways)
	js := natstest.JetStream(t, natstest.Connect(t, s))
	ctx := context.Background()
	startIngest(t, s, js, Options{Stream: "S", Subjects: []string{"s.*"}}, nil)
	for _, subj := range []string{"s.a", "s.b", "s.a"} {
		if _, err := js.Publish(ctx, subj, []byte(subj)); err != nil {
			t.Fatal(err)
		}
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "S", jetstream.ConsumerConfig{Durable: "C", FilterSubject: "s.a", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(5, jetstream.FetchMaxWait(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for m := range batch.Messages() {
		got = append(got, m.Subject())
	}
	if strings.Join(got, ",") != "s.a,s.a" {
		t.Fatalf("consumer got %v", got)
	}
}

// TestCloseAnswersWhatItTook: messages taken before Close are all
// committed and acknowledged; afterwards the subjects have no responder.
func TestCloseAnswersWhatItTook(t *testing.T) {
	t.Run("server flushes", func(t *testing.T) { testCloseAnswersWhatItTook(t, nil) })
	// With a commit window the answers wait for a flush: Close still
	// answers everything it took.
	var flushes atomic.Int64
	t.Run("commit window", func(t *testing.T) {
		testCloseAnswersWhatItTook(t, func() error { flushes.Add(1); return nil })
		if flushes.Load() == 0 {
			t.Fatal("no flush before the answers")
		}
	})
}

func testCloseAnswersWhatItTook(t *testing.T, flush func() error) {
	s := natstest.RunServer(t, natstest.SyncAlways)
	js := natstest.JetStream(t, natstest.Connect(t, s))
	c := startIngest(t, s, js, Options{Stream: "S", Subjects: []string{"s.*"}, Flush: flush}, nil)
	pnc := natstest.Connect(t, s)
	pjs := natstest.JetStream(t, pnc)
	futs := publishNumbered(t, pjs, 500)
	// Once the server has the publishes, it has handed them to the
	// committer; close while it works.
	if err := pnc.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for i, f := range futs {
		if _, err := awaitAck(f); err != nil {
			t.Fatalf("publish %d, taken before Close: %v", i, err)
		}
	}
	if n := len(storedBodies(t, js, "S")); n != len(futs) {
		t.Fatalf("stored %d, acked %d", n, len(futs))
	}
	if _, err := js.Publish(context.Background(), "s.a", nil, jetstream.WithRetryAttempts(0)); !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Fatalf("publish after Close: %v, want no responders", err)
	}
}

// TestCloseWaitsForForwarded: Close returns only once the stream applied
// what went out with the clients' own replies (here with a
// Nats-Expected-Stream header), so the reload that turns group commit off
// right after cannot have them stored under the prefixed subjects. Close
// returned when its batches were answered, and a stream update removing
// the transform at once left 2,729 of 3,000 acknowledged messages stored
// as $HOLDFAST.GC.S.s.a.
func TestCloseWaitsForForwarded(t *testing.T) {
	s := natstest.RunServer(t, natstest.SyncAlways)
	js := natstest.JetStream(t, natstest.Connect(t, s))
	c := startIngest(t, s, js, Options{Stream: "S", Subjects: []string{"s.*"}}, nil)
	pnc := natstest.Connect(t, s)
	pjs := natstest.JetStream(t, pnc, jetstream.WithPublishAsyncMaxPending(5000))
	const n = 3000
	futs := publishNumbered(t, pjs, n, jetstream.WithExpectStream("S"))
	if err := pnc.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// What a reload turning group commit off does next.
	natstest.EditStream(t, js, "S", func(sc *jetstream.StreamConfig) { sc.Subjects, sc.SubjectTransform = []string{"s.*"}, nil })
	for i, f := range futs {
		if _, err := awaitAck(f); err != nil {
			t.Fatalf("publish %d, taken before Close: %v", i, err)
		}
	}
	stored := storedBodies(t, js, "S")
	prefixed := 0
	for _, m := range stored {
		if m.Subject != "s.a" {
			prefixed++
		}
	}
	if len(stored) != n || prefixed > 0 {
		t.Fatalf("stored %d of %d acknowledged, %d of them not under s.a; stats %+v", len(stored), n, prefixed, c.Stats())
	}
}

// TestStreamMissingAnswersNoResponders: while the stream is missing
// (deleted with `nats stream rm`, until holdfast creates it again), the
// server answers a publish with "no responders", which nats.go's
// js.Publish retries. Through group commit the server sent that answer
// to the committer's connection instead of the client (for a message
// published alone, passed on with a Nats-* header, or refused in a batch
// and published again), and the client waited for its own timeout. Each
// now gets "no responders" at once, as from the server.
func TestStreamMissingAnswersNoResponders(t *testing.T) {
	s := natstest.RunServer(t, natstest.SyncAlways)
	js := natstest.JetStream(t, natstest.Connect(t, s))
	ctx := context.Background()
	startIngest(t, s, js, Options{Stream: "S", Subjects: []string{"s.*"}}, nil)
	if _, err := js.Publish(ctx, "s.a", []byte("before")); err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(ctx, "S"); err != nil {
		t.Fatal(err)
	}
	pjs := natstest.JetStream(t, natstest.Connect(t, s))
	for _, opts := range [][]jetstream.PublishOpt{nil, {jetstream.WithExpectStream("S")}} {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := pjs.Publish(pctx, "s.a", []byte("alone"), append(opts, jetstream.WithRetryAttempts(0))...)
		cancel()
		if !errors.Is(err, jetstream.ErrNoStreamResponse) {
			t.Fatalf("publish (options %d) to a missing stream: %v, want no responders", len(opts), err)
		}
	}
	// A burst: batches, refused, their messages one by one.
	futs := publishNumbered(t, pjs, 300, jetstream.WithRetryAttempts(0))
	deadline := time.After(10 * time.Second)
	for i, f := range futs {
		select {
		case <-f.Ok():
			t.Fatalf("publish %d to a missing stream acknowledged", i)
		case err := <-f.Err():
			if !errors.Is(err, jetstream.ErrNoStreamResponse) {
				t.Fatalf("publish %d to a missing stream: %v, want no responders", i, err)
			}
		case <-deadline:
			t.Fatalf("publish %d of 300 to a missing stream: no answer", i)
		}
	}
}

// TestBatchesCutAtServerLimit: more waiting messages than the server's
// maximum atomic batch (1000) go out in several batches, none refused.
func TestBatchesCutAtServerLimit(t *testing.T) {
	s := natstest.RunServer(t, natstest.SyncAlways)
	js := natstest.JetStream(t, natstest.Connect(t, s))
	c := startIngest(t, s, js, Options{Stream: "S", Subjects: []string{"s.*"}}, nil)
	pjs := natstest.JetStream(t, natstest.Connect(t, s), jetstream.WithPublishAsyncMaxPending(5000))
	// 4,000 at once: while the first commits, thousands wait.
	for i := range 4000 {
		if _, err := pjs.PublishAsync("s.a", []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-pjs.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		t.Fatal("acks missing")
	}
	if n := len(storedBodies(t, js, "S")); n != 4000 {
		t.Fatalf("stored %d, want 4000", n)
	}
	st := c.Stats()
	if st.Refused != 0 || st.Batches == 0 || st.BatchedMsgs/st.Batches > maxBatch {
		t.Fatalf("stats %+v", st)
	}
	t.Logf("stats %+v", st)
}

// TestStreamFullDiscardNew: a batch the server refuses because the stream
// is full (discard new) is published again one by one: the messages that
// fit are stored, the others get the server's own error, as without group
// commit.
func TestStreamFullDiscardNew(t *testing.T) {
	s := natstest.RunServer(t, natstest.SyncAlways)
	js := natstest.JetStream(t, natstest.Connect(t, s))
	ctx := context.Background()
	c := startIngest(t, s, js, Options{Stream: "S", Subjects: []string{"s.*"}}, func(sc *jetstream.StreamConfig) {
		sc.MaxMsgs, sc.Discard = 10, jetstream.DiscardNew
	})
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "PLAIN", Subjects: []string{"p.*"}, MaxMsgs: 10, Discard: jetstream.DiscardNew}); err != nil {
		t.Fatal(err)
	}
	pjs := natstest.JetStream(t, natstest.Connect(t, s))
	run := func(subj string) (stored int, codes map[jetstream.ErrorCode]int) {
		codes = map[jetstream.ErrorCode]int{}
		var futs []jetstream.PubAckFuture
		for i := range 60 {
			f, err := pjs.PublishAsync(subj, []byte(strconv.Itoa(i)))
			if err != nil {
				t.Fatal(err)
			}
			futs = append(futs, f)
		}
		for i, f := range futs {
			_, err := awaitAck(f)
			var ae *jetstream.APIError
			switch {
			case err == nil:
				stored++
			case errors.As(err, &ae):
				codes[ae.ErrorCode]++
			default:
				t.Fatalf("%s %d: %v", subj, i, err)
			}
		}
		return stored, codes
	}
	wantStored, wantCodes := run("p.a")
	stored, codes := run("s.a")
	if stored != wantStored || fmt.Sprint(codes) != fmt.Sprint(wantCodes) {
		t.Fatalf("group commit: %d stored, errors %v; the server: %d stored, errors %v", stored, codes, wantStored, wantCodes)
	}
	t.Logf("stored %d, errors %v, stats %+v", stored, codes, c.Stats())
}

// TestCloseAfterFailedOpen: a Committer whose Open failed closes at once
// (nothing was started) and holds no subscription.
func TestCloseAfterFailedOpen(t *testing.T) {
	s := natstest.RunServer(t, natstest.SyncAlways)
	nc := natstest.Connect(t, s)
	c := New(nc, Options{Stream: "S", Subjects: []string{"s.a", "bad subject"}}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := c.Open(context.Background()); err == nil || !strings.Contains(err.Error(), "bad subject") {
		t.Fatalf("Open with a bad subject: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := c.Close(ctx); err != nil {
		t.Fatalf("Close after a failed Open: %v", err)
	}
	if n := nc.NumSubscriptions(); n != 0 {
		t.Fatalf("%d subscriptions left after a failed Open", n)
	}
}

// TestServerHeadersGoAlone: a message with a header the server acts on
// (here Nats-TTL on a stream without per-message TTLs, which the server
// refuses) gets the server's own error and fails none of the messages
// published around it, however busy the committer is.
func TestServerHeadersGoAlone(t *testing.T) {
	s := natstest.RunServer(t, natstest.SyncAlways)
	js := natstest.JetStream(t, natstest.Connect(t, s))
	c := startIngest(t, s, js, Options{Stream: "S", Subjects: []string{"s.*"}}, nil)
	const publishers, each = 4, 1500
	var wg sync.WaitGroup
	errs := make(chan error, publishers*each)
	for p := range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pjs, err := jetstream.New(natstest.Connect(t, s), jetstream.WithPublishAsyncMaxPending(2000))
			if err != nil {
				errs <- err
				return
			}
			futs := make([]jetstream.PubAckFuture, 0, each)
			for i := range each {
				var opts []jetstream.PublishOpt
				if p == 0 && i == each/2 {
					opts = append(opts, jetstream.WithMsgTTL(time.Minute))
				}
				f, err := pjs.PublishAsync("s.a", []byte(strconv.Itoa(i)), opts...)
				if err != nil {
					errs <- err
					return
				}
				futs = append(futs, f)
			}
			for i, f := range futs {
				_, err := awaitAck(f)
				var ae *jetstream.APIError
				switch ttl := p == 0 && i == each/2; {
				case ttl && !errors.As(err, &ae):
					errs <- fmt.Errorf("the message with Nats-TTL: %v, want the server's error", err)
				case !ttl && err != nil:
					errs <- fmt.Errorf("publisher %d msg %d: %w", p, i, err)
				}
			}
		}()
	}
	wg.Wait()
	failOnErrs(t, errs, "wrong answers", c)
	if got := len(storedBodies(t, js, "S")); got != publishers*each-1 {
		t.Fatalf("stored %d, want %d", got, publishers*each-1)
	}
	t.Logf("stats %+v", c.Stats())
}

// TestKnownIDsBounded: past maxKnownIDs remembered Nats-Msg-Ids, the
// oldest half is forgotten, even when all of them are within the
// duplicate window (a fast publisher with a long window).
func TestKnownIDsBounded(t *testing.T) {
	c := New(nil, Options{Stream: "S", Subjects: []string{"s.*"}, DuplicateWindow: time.Hour}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	c.ids = make(map[string]struct{})
	const extra = 1000
	for i := range maxKnownIDs + extra {
		c.remember(item{msgID: strconv.Itoa(i)})
	}
	if n := len(c.ids); n > maxKnownIDs {
		t.Fatalf("%d ids remembered, want at most %d", n, maxKnownIDs)
	}
	if c.known("0") || !c.known(strconv.Itoa(maxKnownIDs+extra-1)) {
		t.Fatalf("known(first) = %v, known(last) = %v: want the oldest forgotten, the newest kept", c.known("0"), c.known(strconv.Itoa(maxKnownIDs+extra-1)))
	}
	// Remembering an id again keeps its first time, as the server's
	// window counts from the stored message.
	c.remember(item{msgID: "x"})
	n := len(c.idOrder)
	c.remember(item{msgID: "x"})
	if len(c.idOrder) != n || c.idOrder[n-1].id != "x" {
		t.Fatal("remembering an id again moved its time")
	}
	// forgetIDs drops what is older than its age, and only that.
	c.forgetIDs(0)
	if len(c.ids) != 0 {
		t.Fatalf("%d ids left after forgetIDs(0)", len(c.ids))
	}
}

// TestLongSubjectRefusedConnectionKept: a publish whose subject and reply
// fit the server's control line (4096 bytes) but not once holdfast adds
// its prefix ($HOLDFAST.GC.S.): the server closed the committer's
// connection ("maximum control line exceeded") and every publish after it
// got "no response from stream". It is refused with an error instead, and
// the next publishes are stored.
func TestLongSubjectRefusedConnectionKept(t *testing.T) {
	s := natstest.RunServer(t, natstest.SyncAlways)
	nc := natstest.Connect(t, s)
	js := natstest.JetStream(t, nc)
	ctx := context.Background()
	startIngest(t, s, js, Options{Stream: "S", Subjects: []string{"s.*"}}, nil)
	// "PUB <subject> r.1 4" is 4089 bytes: it fits; with the prefix it
	// does not.
	long := "s." + strings.Repeat("x", 4078)
	replies, err := nc.SubscribeSync("r.1")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishMsg(&nats.Msg{Subject: long, Reply: "r.1", Data: []byte("long")}); err != nil {
		t.Fatal(err)
	}
	r, err := replies.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatalf("no answer to a publish to a %d-byte subject: %v", len(long), err)
	}
	if !strings.Contains(string(r.Data), "too long") {
		t.Fatalf("answer to a publish to a %d-byte subject: %s, want an error saying it is too long", len(long), r.Data)
	}
	for i := range 3 {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		a, err := js.Publish(c, "s.a", []byte("after"))
		cancel()
		if err != nil || a.Sequence != uint64(i+1) {
			t.Fatalf("publish %d after the long one: %+v, %v", i, a, err)
		}
	}
}

// failOnErrs closes errs, reports the first three errors on it and fails
// with their count (what they are) and c's stats.
func failOnErrs(t *testing.T, errs chan error, what string, c *Committer) {
	t.Helper()
	close(errs)
	n := 0
	for err := range errs {
		if n++; n <= 3 {
			t.Error(err)
		}
	}
	if n > 0 {
		t.Fatalf("%d %s; stats %+v", n, what, c.Stats())
	}
}

// publishNumbered publishes n messages, "0" to "n-1", to s.a
// asynchronously with opts and returns their futures.
func publishNumbered(t *testing.T, pjs jetstream.JetStream, n int, opts ...jetstream.PublishOpt) []jetstream.PubAckFuture {
	t.Helper()
	futs := make([]jetstream.PubAckFuture, 0, n)
	for i := range n {
		f, err := pjs.PublishAsync("s.a", []byte(strconv.Itoa(i)), opts...)
		if err != nil {
			t.Fatal(err)
		}
		futs = append(futs, f)
	}
	return futs
}

// TestUnansweredUnitDoesNotHoldTheLine: a stream deleted while messages
// were still queued for it answers neither them nor the marker or batch
// commit after them (the CI flake of TestStreamMissingAnswersNoResponders:
// the marker after "before" was dropped). Later publishes must not wait
// for the committer to give up on those (answerTimeout, 30 s): a
// publisher's own timeout is 5 s. A subscriber that swallows the stored
// stream's subjects plays the stream that drops messages: first a lone
// publish and its marker, then a batch holding Nats-Msg-Ids (sent only
// when nothing else is in flight, and followed by nothing until answered).
func TestUnansweredUnitDoesNotHoldTheLine(t *testing.T) {
	s := natstest.RunServer(t, natstest.SyncAlways)
	nc := natstest.Connect(t, s)
	js := natstest.JetStream(t, nc)
	ctx := context.Background()
	opts := Options{Stream: "S", Subjects: []string{"s.*"}, DuplicateWindow: time.Minute}
	c := startIngest(t, s, js, opts, nil)
	info, err := js.Stream(ctx, "S")
	if err != nil {
		t.Fatal(err)
	}
	cfg := info.CachedInfo().Config
	if err := js.DeleteStream(ctx, "S"); err != nil {
		t.Fatal(err)
	}
	swallowed := make(chan *nats.Msg, 100)
	hole, err := nc.ChanSubscribe(subjects.GroupCommit("S", ">"), swallowed)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	awaitSwallowed := func(n int) {
		t.Helper()
		for i := range n {
			select {
			case <-swallowed:
			case <-time.After(15 * time.Second):
				t.Fatalf("%d of %d messages reached the stream's subjects within 15 s: the committer is waiting for an answer that will never come", i, n)
			}
		}
	}
	pjs := natstest.JetStream(t, natstest.Connect(t, s), jetstream.WithPublishAsyncMaxPending(100))
	if _, err := pjs.PublishAsync("s.a", []byte("lost alone")); err != nil {
		t.Fatal(err)
	}
	awaitSwallowed(2) // the message and its marker
	for i := range 20 {
		if _, err := pjs.PublishAsync("s.a", []byte("lost in a batch"), jetstream.WithMsgID(fmt.Sprintf("lost-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	awaitSwallowed(20) // one batch: nothing else was in flight... once the lone one was given up on
	if err := hole.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ack, err := pjs.Publish(pctx, "s.a", []byte("after"), jetstream.WithRetryAttempts(0))
	if err != nil {
		t.Fatalf("publish after two unanswered units: %v after %v", err, time.Since(start).Round(time.Millisecond))
	}
	if ack.Sequence != 1 {
		t.Fatalf("stored as %d, want 1 (nothing of the lost units is stored)", ack.Sequence)
	}
	// Close waits for the lost units until its context ends (they would
	// expire after answerTimeout).
	cctx, ccancel := context.WithTimeout(ctx, time.Second)
	defer ccancel()
	if err := c.Close(cctx); err == nil || !strings.Contains(err.Error(), "closed before every batch was answered") {
		t.Fatalf("close with two lost units in flight: %v", err)
	}
}

// TestWildcardSubjectRefused: a publish to a subject with a wildcard
// token (nats.go publishes to "s.*" as asked; the server routes it to
// the subscribers of s.*) was stored under the prefixed subject
// ($HOLDFAST.GC.S.s.*): the stream's transform maps literal subjects
// only. Consumers filtered on the configured subjects never saw it, and
// the others saw holdfast's internal subject. It is refused with an error
// that says why.
func TestWildcardSubjectRefused(t *testing.T) {
	s := natstest.RunServer(t, natstest.SyncAlways)
	nc := natstest.Connect(t, s)
	js := natstest.JetStream(t, nc)
	startIngest(t, s, js, Options{Stream: "S", Subjects: []string{"s.>"}}, nil)
	for _, subj := range []string{"s.*", "s.a.>", "s.*.b"} {
		r, err := nc.RequestMsg(&nats.Msg{Subject: subj, Data: []byte("x")}, 10*time.Second)
		if err != nil {
			t.Fatalf("%s: no answer: %v", subj, err)
		}
		if !strings.Contains(string(r.Data), "wildcard") {
			t.Errorf("%s: answered %s, want an error naming the wildcard", subj, r.Data)
		}
	}
	a, err := js.Publish(context.Background(), "s.a", []byte("y"))
	if err != nil {
		t.Fatal(err)
	}
	for seq, m := range storedBodies(t, js, "S") {
		if m.Subject != "s.a" {
			t.Errorf("seq %d stored under %q", seq, m.Subject)
		}
	}
	if a.Sequence != 1 {
		t.Fatalf("the publish after the refused ones got sequence %d, want 1", a.Sequence)
	}
}

// TestBurstBeyondQueueRefusedAsTooManyRequests: a burst larger than a
// stream's inbound queue (128 MiB in nats-server) is refused in part by
// the server with "too many requests" (code 429). Group commit held all
// of it in memory instead (512 MiB offered: 1 GiB of heap, against 267
// MiB and 1,675 refusals of 4,000 for a plain stream), and at 800 MiB
// the server closed its connection as a slow consumer. Past
// MaxWaitingBytes waiting (1 MiB here) it answers 429 as the server does;
// every other publish is acknowledged and stored.
func TestBurstBeyondQueueRefusedAsTooManyRequests(t *testing.T) {
	s := natstest.RunServer(t, natstest.SyncAlways)
	js := natstest.JetStream(t, natstest.Connect(t, s))
	c := startIngest(t, s, js, Options{Stream: "S", Subjects: []string{"s.*"}, MaxWaitingBytes: 1 << 20}, nil)
	const publishers, each = 4, 300
	var wg sync.WaitGroup
	var acked, throttled atomic.Int64
	errs := make(chan error, publishers*each)
	for range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pjs := natstest.JetStream(t, natstest.Connect(t, s), jetstream.WithPublishAsyncMaxPending(each))
			futs := make([]jetstream.PubAckFuture, 0, each)
			data := make([]byte, 16<<10)
			for range each {
				f, err := pjs.PublishAsync("s.a", data, jetstream.WithRetryAttempts(0))
				if err != nil {
					errs <- err
					return
				}
				futs = append(futs, f)
			}
			for _, f := range futs {
				_, err := awaitAck(f)
				var ae *jetstream.APIError
				switch {
				case err == nil:
					acked.Add(1)
				case errors.As(err, &ae) && ae.Code == 429 && ae.ErrorCode == errTooManyRequests:
					throttled.Add(1)
				default:
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	failOnErrs(t, errs, "publishes neither acknowledged nor refused with 429", c)
	if throttled.Load() == 0 {
		t.Fatalf("no publish refused with 429 although %d KiB were offered at once against a limit of 1 MiB; stats %+v", publishers*each*16, c.Stats())
	}
	if info := natstest.StreamInfo(t, js, "S"); info.State.Msgs != uint64(acked.Load()) {
		t.Fatalf("%d acknowledged, %d stored", acked.Load(), info.State.Msgs)
	}
	t.Logf("%d acknowledged, %d refused with 429; stats %+v", acked.Load(), throttled.Load(), c.Stats())
}

// TestBurstWhileBusyAnsweredEveryOne: while the committing goroutine is
// busy, a burst larger than the channel the subscriptions deliver into
// still gets an answer for every publish: "too many requests" (429) at
// once past the waiting limit, a PubAck for the others once committed.
// None is dropped as a slow consumer (no answer at all).
func TestBurstWhileBusyAnsweredEveryOne(t *testing.T) {
	s := natstest.RunServer(t, natstest.SyncAlways)
	js := natstest.JetStream(t, natstest.Connect(t, s))
	busy := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(busy) }) }
	defer release()
	limit, total := 4096, inChanLen+4096
	c := startIngestHeld(t, s, js, Options{Stream: "S", Subjects: []string{"s.*"}, MaxWaitingMsgs: limit}, nil, func() { <-busy })

	var acked, throttled, other atomic.Int64
	nc := natstest.Connect(t, s)
	inbox := nc.NewInbox()
	sub, err := nc.Subscribe(inbox, func(m *nats.Msg) {
		switch {
		case strings.Contains(string(m.Data), `"code":429`):
			throttled.Add(1)
		case strings.Contains(string(m.Data), `"seq":`) && !strings.Contains(string(m.Data), `"error"`):
			acked.Add(1)
		default:
			other.Add(1)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		t.Fatal(err)
	}
	base := c.nc.Stats().InMsgs
	for range total {
		if err := nc.PublishMsg(&nats.Msg{Subject: "s.a", Reply: inbox, Data: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	// Under -race on a loaded machine the server took over the default
	// 10 s to answer the flush's ping behind the burst (a CI failure).
	if err := nc.FlushTimeout(time.Minute); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		if n := c.nc.Stats().InMsgs - base; n < uint64(total) {
			return fmt.Errorf("%d of %d publishes reached the committer's connection", n, total)
		}
		c.qmu.Lock()
		queued := c.waitingMsgs
		c.qmu.Unlock()
		if n := int(c.Stats().Throttled) + queued; n < total {
			return fmt.Errorf("%d of %d publishes taken (%d queued), %d wait in the channel", n, total, queued, len(c.in))
		}
		return nil
	})
	release()
	natstest.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		if n := acked.Load() + throttled.Load() + other.Load(); n < int64(total) {
			return fmt.Errorf("%d of %d publishes answered (%d acknowledged, %d too many requests, %d other); stats %+v",
				n, total, acked.Load(), throttled.Load(), other.Load(), c.Stats())
		}
		return nil
	})
	if other.Load() != 0 || throttled.Load() != int64(total-limit) {
		t.Fatalf("%d acknowledged, %d too many requests, %d other: want %d too many requests, the rest acknowledged",
			acked.Load(), throttled.Load(), other.Load(), total-limit)
	}
	if info := natstest.StreamInfo(t, js, "S"); info.State.Msgs != uint64(acked.Load()) {
		t.Fatalf("%d acknowledged, %d stored", acked.Load(), info.State.Msgs)
	}
}

// TestFlushBeforeEveryAnswer: with Options.Flush (jetstream.commit_window)
// no client hears of its publish before a flush that began after the
// stream stored it — a lone publish (which goes with the client's reply
// otherwise, answered by the server), a burst (an atomic batch) and a
// message that goes alone for its Nats-Expected header alike — and a
// flush that fails answers each with an error instead of its PubAck.
func TestFlushBeforeEveryAnswer(t *testing.T) {
	s := natstest.RunServer(t)
	js := natstest.JetStream(t, natstest.Connect(t, s))
	var fail atomic.Bool
	gate := make(chan struct{})
	flushes := atomic.Int64{}
	flush := func() error {
		flushes.Add(1)
		<-gate
		if fail.Load() {
			return errors.New("disk gone")
		}
		return nil
	}
	startIngest(t, s, js, Options{Stream: "S", Subjects: []string{"s.*"}, Flush: flush}, nil)
	pjs := natstest.JetStream(t, natstest.Connect(t, s))
	var futs []jetstream.PubAckFuture
	lone, err := pjs.PublishAsync("s.a", []byte("lone"))
	if err != nil {
		t.Fatal(err)
	}
	futs = append(futs, lone)
	natstest.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		if flushes.Load() == 0 {
			return errors.New("no flush asked for yet")
		}
		return nil
	})
	futs = append(futs, publishNumbered(t, pjs, 50)...)
	alone, err := pjs.PublishAsync("s.a", []byte("expects"), jetstream.WithExpectStream("S"))
	if err != nil {
		t.Fatal(err)
	}
	futs = append(futs, alone)
	// Every message stored, no answer yet.
	natstest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if n := natstest.StreamInfo(t, js, "S").State.Msgs; n != 52 {
			return fmt.Errorf("%d of 52 stored", n)
		}
		return nil
	})
	for i, f := range futs {
		select {
		case <-f.Ok():
			t.Fatalf("publish %d answered before any flush ended", i)
		case err := <-f.Err():
			t.Fatalf("publish %d failed before any flush ended: %v", i, err)
		default:
		}
	}
	close(gate)
	seqs := map[uint64]bool{}
	for i, f := range futs {
		a, err := awaitAck(f)
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		seqs[a.Sequence] = true
	}
	if len(seqs) != 52 {
		t.Fatalf("%d distinct sequences in 52 PubAcks", len(seqs))
	}

	fail.Store(true)
	_, err = pjs.Publish(context.Background(), "s.a", []byte("after the disk went"))
	if err == nil || !strings.Contains(err.Error(), "cannot flush to disk: disk gone") {
		t.Fatalf("publish with a failing flush: %v, want the flush's error", err)
	}
}

// The PubAcks of a batch's messages are built from one head per batch:
// each must be what json.Marshal makes of the whole PubAck.
func TestSeqPubAckIsMarshalsOutput(t *testing.T) {
	for _, tc := range []struct {
		stream, domain string
		seq            uint64
	}{
		{"ORDERS", "", 1},
		{"ORDERS", "hub", 1234567},
		{`we"ird\name`, `<dom>&`, 18446744073709551615},
		{"S", "", 0},
	} {
		want, err := json.Marshal(pubAck{Stream: tc.stream, Domain: tc.domain, Seq: tc.seq})
		if err != nil {
			t.Fatal(err)
		}
		if got := seqPubAck(pubAckHead(tc.stream, tc.domain), tc.seq); string(got) != string(want) {
			t.Errorf("seqPubAck(%q, %q, %d) = %s, want %s", tc.stream, tc.domain, tc.seq, got, want)
		}
	}
}

// TestClientAtomicBatchRefusedAsDisabled: a configured stream takes no
// atomic batches from clients (the server answers "atomic publish is
// disabled", err_code 10174, and opens none), but the group-commit
// stream allows them for the ingest's own batches. A client's own batch
// message went to the stream and was stored; a client leaving batches
// open (60 here, the server allows 50 per stream) made the server refuse
// the ingest's batches, and 8,000 of 10,000 publishes of four other
// clients got "atomic publish batch is incomplete" (err_code 10176). Now
// a client's batch message gets the stream's own 10174, and the others
// are stored; where the configured stream takes atomic batches
// (Options.AllowAtomic: a hub's stream of edge messages) it is the
// server's again.
func TestClientAtomicBatchRefusedAsDisabled(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t, natstest.SyncAlways)
	nc := natstest.Connect(t, s)
	js := natstest.JetStream(t, nc)
	ctx := context.Background()
	c := startIngest(t, s, js, Options{Stream: "S", Subjects: []string{"s.*"}}, nil)
	startIngest(t, s, js, Options{Stream: "A", Subjects: []string{"a.*"}, AllowAtomic: true}, nil)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "PLAIN", Subjects: []string{"p.*"}}); err != nil {
		t.Fatal(err)
	}
	batchMsg := func(subj, id string, commit bool) *nats.Msg {
		h := nats.Header{"Nats-Batch-Id": {id}, "Nats-Batch-Sequence": {"1"}}
		if commit {
			h.Set("Nats-Batch-Commit", "1")
		}
		return &nats.Msg{Subject: subj, Header: h, Data: []byte("x")}
	}
	answer := func(subj, id string) pubAck {
		t.Helper()
		r, err := nc.RequestMsg(batchMsg(subj, id, true), 5*time.Second)
		if err != nil {
			t.Fatalf("%s: %v", subj, err)
		}
		var a pubAck
		if err := json.Unmarshal(r.Data, &a); err != nil {
			t.Fatalf("%s: %s: %v", subj, r.Data, err)
		}
		return a
	}
	want, got := answer("p.a", "b1"), answer("s.a", "b2")
	if want.Error == nil || got.Error == nil || *got.Error != *want.Error || got.Seq != 0 {
		t.Fatalf("a client's atomic batch: group commit answered %+v (error %+v), the server %+v", got, got.Error, want.Error)
	}
	if a := answer("a.a", "b3"); a.Error != nil || a.Seq != 1 || a.Count != 1 {
		t.Fatalf("a client's atomic batch where the stream takes them: %+v (error %+v)", a, a.Error)
	}
	// An empty batch id is none: the server stores the message.
	if want, got := answer("p.a", ""), answer("s.a", ""); want.Error != nil || got.Error != nil || got.Seq != 1 {
		t.Fatalf("an empty batch id: group commit answered %+v (error %+v), the server %+v (error %+v)", got, got.Error, want, want.Error)
	}
	// Batches opened and never committed.
	for i := range 60 {
		if err := nc.PublishMsg(batchMsg("s.a", "open"+strconv.Itoa(i), false)); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	const publishers, each = 4, 1000 // fewer go alone, not batched: with the fix reverted 2,000 fail
	var futs []jetstream.PubAckFuture
	for range publishers {
		pjs := natstest.JetStream(t, natstest.Connect(t, s), jetstream.WithPublishAsyncMaxPending(each))
		futs = append(futs, publishNumbered(t, pjs, each)...)
	}
	errs := make(chan error, len(futs))
	for i, f := range futs {
		if _, err := awaitAck(f); err != nil {
			errs <- fmt.Errorf("publish %d: %w", i, err)
		}
	}
	failOnErrs(t, errs, "publishes failed", c)
	if n := len(storedBodies(t, js, "S")); n != publishers*each+1 {
		t.Fatalf("stored %d, want %d", n, publishers*each+1)
	}
}

// TestStreamFullDiscardNewKeepsOrder: once a stream with discard new is
// full, the server refuses every later publish (nothing frees room
// here). Batches went on while one was in flight, so a batch refused for
// the full stream was not the last sent, and its clients got the error
// while a later batch, published again one by one, stored messages that
// came after theirs: each publisher saw a message refused and later ones
// stored (51 to 379 such messages of 6,000 per run). Now a batch to such
// a stream is followed by nothing until it is answered, and is published
// again in place when refused: every publisher gets its PubAcks, then
// only errors.
//
// So when a batch is slow to be answered: a batch that took longer than
// stallAfter (2 s, seen under CI load) let the next go out, with the same
// result; here every batch takes longer than a stallAfter of 1 ms.
func TestStreamFullDiscardNewKeepsOrder(t *testing.T) {
	t.Parallel()
	for _, stall := range []time.Duration{0, time.Millisecond} {
		name := "stall after 2s"
		if stall > 0 {
			name = "stall after " + stall.String()
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testStreamFullDiscardNewKeepsOrder(t, stall)
		})
	}
}

func testStreamFullDiscardNewKeepsOrder(t *testing.T, stall time.Duration) {
	s := natstest.RunServer(t, natstest.SyncAlways)
	js := natstest.JetStream(t, natstest.Connect(t, s))
	const publishers, each, room = 4, 1500, 2500
	c := startIngest(t, s, js, Options{Stream: "S", Subjects: []string{"s.*"}, DiscardNew: true, stall: stall}, func(sc *jetstream.StreamConfig) {
		sc.MaxMsgs, sc.Discard = room, jetstream.DiscardNew
	})
	var all [][]jetstream.PubAckFuture
	for range publishers {
		pjs := natstest.JetStream(t, natstest.Connect(t, s), jetstream.WithPublishAsyncMaxPending(each))
		all = append(all, publishNumbered(t, pjs, each))
	}
	errs := make(chan error, publishers*each)
	stored := 0
	for p, futs := range all {
		refused := -1
		for i, f := range futs {
			_, err := awaitAck(f)
			var ae *jetstream.APIError
			switch {
			case err == nil && refused >= 0:
				errs <- fmt.Errorf("publisher %d: msg %d stored after msg %d was refused", p, i, refused)
			case err == nil:
				stored++
			case errors.As(err, &ae) && ae.ErrorCode == 10077: // maximum messages exceeded
				if refused < 0 {
					refused = i
				}
			default:
				errs <- fmt.Errorf("publisher %d msg %d: %w", p, i, err)
			}
		}
	}
	failOnErrs(t, errs, "out of order", c)
	if stored != room {
		t.Fatalf("%d acknowledged, want %d", stored, room)
	}
}
