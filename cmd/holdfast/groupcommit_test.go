package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/internal/natstest"
	"github.com/holdfast-io/holdfast/internal/subjects"
)

// gcPublish publishes n messages on conns publishers with PublishAsync and
// returns, per publisher, the acknowledged sequences in publish order
// with the body each acknowledged.
func gcPublish(t *testing.T, url string, publishers, n int, tag string, opts ...nats.Option) [][]gcAck {
	t.Helper()
	out := make([][]gcAck, publishers)
	var wg sync.WaitGroup
	errs := make(chan error, publishers)
	for p := range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nc, err := nats.Connect(url, opts...)
			if err != nil {
				errs <- err
				return
			}
			defer nc.Close()
			js, _ := jetstream.New(nc)
			futs := make([]jetstream.PubAckFuture, 0, n)
			for i := range n {
				f, err := js.PublishAsync("orders.created", fmt.Appendf(nil, "%s-%d-%d", tag, p, i))
				if err != nil {
					errs <- err
					return
				}
				futs = append(futs, f)
			}
			for i, f := range futs {
				select {
				case a := <-f.Ok():
					if a.Stream != "ORDERS" || a.Duplicate {
						errs <- fmt.Errorf("ack %+v", a)
						return
					}
					out[p] = append(out[p], gcAck{a.Sequence, fmt.Sprintf("%s-%d-%d", tag, p, i)})
				case err := <-f.Err():
					errs <- err
					return
				case <-time.After(30 * time.Second):
					errs <- fmt.Errorf("publisher %d msg %d: no ack", p, i)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return out
}

type gcAck struct {
	seq  uint64
	body string
}

// gcCheckStored checks that every acknowledged sequence holds its message
// under orders.created, in publisher order, and that the stream holds
// exactly want messages.
func gcCheckStored(t *testing.T, js jetstream.JetStream, acks [][]gcAck, want uint64) {
	t.Helper()
	ctx := natstest.Context(t)
	s, err := js.Stream(ctx, "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	if got := natstest.StreamInfo(t, js, "ORDERS").State.Msgs; got != want {
		t.Fatalf("ORDERS holds %d messages, want %d", got, want)
	}
	for p, list := range acks {
		var last uint64
		for _, a := range list {
			m, err := s.GetMsg(ctx, a.seq)
			if err != nil || string(m.Data) != a.body || m.Subject != "orders.created" {
				t.Fatalf("seq %d acked for %s: %v %v", a.seq, a.body, m, err)
			}
			if a.seq <= last {
				t.Fatalf("publisher %d: seq %d after %d", p, a.seq, last)
			}
			last = a.seq
		}
	}
}

// TestGroupCommitStandardClients: with group_commit = true, nats.go
// PublishAsync publishers, `nats pub --jetstream` and `nats bench js pub`
// get ordinary PubAcks for ORDERS, every acknowledged message is stored
// once under its subject, `holdfast status` shows the group commit, and
// clients may not publish past it.
func TestGroupCommitStandardClients(t *testing.T) {
	t.Parallel()
	in := newE2EInstance(t)
	in.cfg = e2eWriteConfig(t, strings.Replace(e2eConfigTOML(in.store, in.port, ""),
		"subjects = [\"orders.*\"]\n", "subjects = [\"orders.*\"]\ngroup_commit = true\n", 1))
	d := startHoldfast(t, in.cfg)
	d.waitReady()
	_, js := e2eConnect(t, in)

	acks := gcPublish(t, in.url(), 4, 500, "a")
	gcCheckStored(t, js, acks, 2000)

	res := e2eRunBinary(t, natsBin, nil, nil, "--server", in.url(), "pub", "--jetstream", "orders.cli", "hello")
	if res.code != 0 || !strings.Contains(res.stdout+res.stderr, "Stream: ORDERS Sequence: 2,001") {
		t.Fatalf("nats pub --jetstream: %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	res = e2eRunBinary(t, natsBin, nil, nil, "--server", in.url(), "bench", "js", "pub", "async", "orders.bench",
		"--stream", "ORDERS", "--clients", "2", "--msgs", "2000", "--no-progress")
	if res.code != 0 {
		t.Fatalf("nats bench js pub async: %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	if got := natstest.StreamInfo(t, js, "ORDERS").State.Msgs; got != 4001 {
		t.Fatalf("ORDERS holds %d messages after nats bench, want 4001", got)
	}

	// Publishing past group commit into the prefixed subjects is denied.
	nc, err := nats.Connect(in.url())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	perr := make(chan error, 1)
	nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { perr <- err })
	_ = nc.Publish("$HOLDFAST.GC.ORDERS.orders.x", []byte("x"))
	select {
	case err := <-perr:
		if !strings.Contains(err.Error(), "Permissions Violation") {
			t.Fatalf("publish to the prefix: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("publish to $HOLDFAST.GC.> was not refused")
	}

	st := runHoldfast(t, nil, "status", "--config", in.cfg)
	if !strings.Contains(st.stdout, "GROUP COMMIT") || !strings.Contains(st.stdout, "on: ") {
		t.Fatalf("status does not show group commit:\n%s%s", st.stdout, st.stderr)
	}
	stj := runHoldfast(t, nil, "status", "--json", "--config", in.cfg)
	var out struct {
		Streams []struct {
			Name        string         `json:"name"`
			GroupCommit string         `json:"group_commit"`
			Stats       map[string]any `json:"group_commit_stats"`
		} `json:"streams"`
	}
	if err := json.Unmarshal([]byte(stj.stdout), &out); err != nil || len(out.Streams) == 0 || out.Streams[0].GroupCommit != "on" {
		t.Fatalf("status --json: %v\n%s", err, stj.stdout)
	}
	// The counters in the same snake_case as the rest of the JSON.
	for _, k := range []string{"batches", "batched_msgs", "alone", "forwarded", "refused", "batch_time_ns"} {
		if _, ok := out.Streams[0].Stats[k]; !ok {
			t.Errorf("status --json: group_commit_stats has no %q: %v", k, out.Streams[0].Stats)
		}
	}
	d.stop()
}

// TestGroupCommitReload: SIGHUP switches group commit on and off while
// publishers run between the reloads; every acknowledged message is
// stored exactly once, and the stream's subjects follow.
func TestGroupCommitReload(t *testing.T) {
	t.Parallel()
	in := newE2EInstance(t)
	d := startHoldfast(t, in.cfg)
	d.waitReady()
	_, js := e2eConnect(t, in)
	ctx := natstest.Context(t)
	subjects := func() string {
		t.Helper()
		s, err := js.Stream(ctx, "ORDERS")
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(info.Config.Subjects, ",")
	}

	var all [][]gcAck
	all = append(all, gcPublish(t, in.url(), 2, 200, "off1")...)
	d.reloadWith(in.cfg, editConfig(t, in.cfg, "subjects = [\"orders.*\"]\n", "subjects = [\"orders.*\"]\ngroup_commit = true\n"))
	if got := subjects(); got != "$HOLDFAST.GC.ORDERS.orders.*" {
		t.Fatalf("subjects with group commit: %s", got)
	}
	all = append(all, gcPublish(t, in.url(), 2, 200, "on")...)
	d.reloadWith(in.cfg, editConfig(t, in.cfg, "group_commit = true\n", "group_commit = false\n"))
	if got := subjects(); got != "orders.*" {
		t.Fatalf("subjects after group commit off: %s", got)
	}
	all = append(all, gcPublish(t, in.url(), 2, 200, "off2")...)
	gcCheckStored(t, js, all, 1200)
	if !strings.Contains(d.stderr.String(), "group commit off") {
		t.Errorf("no log line for group commit off:\n%s", d.stderr.String())
	}
	d.stop()

	// A restart switches it too.
	editConfig(t, in.cfg, "group_commit = false\n", "group_commit = true\n")
	d = startHoldfast(t, in.cfg)
	d.waitReady()
	_, js = e2eConnect(t, in)
	if got := subjects(); got != "$HOLDFAST.GC.ORDERS.orders.*" {
		t.Fatalf("subjects after a restart with group commit: %s", got)
	}
	all = append(all, gcPublish(t, in.url(), 2, 200, "restart")...)
	gcCheckStored(t, js, all, 1600)
	d.stop()
}

// TestGroupCommitWithAuth: with [auth], holdfast's own identity answers
// the publishes (its response permission covers the deferred PubAcks).
func TestGroupCommitWithAuth(t *testing.T) {
	t.Parallel()
	in := newE2EInstance(t)
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("e2e-token-0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	in.cfg = e2eWriteConfig(t, strings.Replace(e2eConfigTOML(in.store, in.port, fmt.Sprintf("[auth]\ntoken_file = %q\n", token)),
		"subjects = [\"orders.*\"]\n", "subjects = [\"orders.*\"]\ngroup_commit = true\n", 1))
	d := startHoldfast(t, in.cfg)
	d.waitReady()
	acks := gcPublish(t, in.url(), 4, 300, "auth", nats.Token("e2e-token-0123456789abcdef"))
	nc, err := nats.Connect(in.url(), nats.Token("e2e-token-0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	gcCheckStored(t, js, acks, 1200)
	d.stop()
}

// TestGroupCommitDeadLetters: messages that group commit stored in a
// batch carry the server's Nats-Batch-* headers; a handler that fails them
// has every one dead-lettered (the dead letters drop those headers; with
// them, the dead-letter stream refused every publish as an atomic batch
// message and the messages were never dead-lettered).
func TestGroupCommitDeadLetters(t *testing.T) {
	t.Parallel()
	in := newE2EInstance(t)
	script := e2eScript(t, "cat >/dev/null\nexit 65\n")
	text := strings.Replace(e2eConfigTOML(in.store, in.port, ""), "subjects = [\"orders.*\"]\n", "subjects = [\"orders.*\"]\ngroup_commit = true\n", 1)
	in.cfg = e2eWriteConfig(t, strings.Replace(text, "workers = 0\n", fmt.Sprintf("workers = 4\nhandler = \"exec\"\n\n[consumers.WORKER1.exec]\ncommand = [%q]\ntimeout = \"20s\"\n", script), 1))
	d := startHoldfast(t, in.cfg)
	d.waitReady()
	_, js := e2eConnect(t, in)
	acks := gcPublish(t, in.url(), 4, 40, "dl")
	s, err := js.Stream(natstest.Context(t), "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	batched := 0
	for _, list := range acks {
		for _, a := range list {
			m, err := s.GetMsg(natstest.Context(t), a.seq)
			if err != nil {
				t.Fatal(err)
			}
			if m.Header.Get("Nats-Batch-Id") != "" {
				batched++
			}
		}
	}
	if batched == 0 {
		t.Fatal("no message was stored in a batch: the test proves nothing")
	}
	natstest.CheckFor(t, 60*time.Second, 50*time.Millisecond, func() error {
		if n := len(e2eDeadLetters(t, js, "ORDERS_DLQ")); n != 160 {
			return fmt.Errorf("%d dead letters, want 160 (%d of them stored in batches)", n, batched)
		}
		return nil
	})
	d.stop()
}

// TestGroupCommitToggledUnderLoadThenKilled: publishers keep publishing
// (plain messages, some with a Nats-Expected-Stream header that the
// ingest passes on with the client's reply, some with a Nats-Msg-Id)
// while SIGHUP turns group commit off and on four times; holdfast is
// killed with SIGKILL right after the last reload and started again.
// Every acknowledged message is stored exactly once, at its acknowledged
// sequence, under its own subject, and in publisher order for the
// publishers that do not retry: nats.go's PublishAsync publishes again
// 250 ms later what got "no responders" while the stream's subjects
// changed, after the messages behind it (README, Group commit).
func TestGroupCommitToggledUnderLoadThenKilled(t *testing.T) {
	t.Parallel()
	in := newE2EInstance(t)
	on := editConfig(t, in.cfg, "subjects = [\"orders.*\"]\n", "subjects = [\"orders.*\"]\ngroup_commit = true\n")
	off := strings.Replace(on, "group_commit = true\n", "group_commit = false\n", 1)
	d := startHoldfast(t, in.cfg)
	d.waitReady()

	const publishers = 3
	acks := make([][]gcAck, publishers)
	var acked atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for p := range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nc, err := nats.Connect(in.url(), nats.MaxReconnects(0))
			if err != nil {
				t.Error(err)
				return
			}
			defer nc.Close()
			js, _ := jetstream.New(nc)
			for round := 0; ; round++ {
				select {
				case <-stop:
					return
				default:
				}
				type sent struct {
					f    jetstream.PubAckFuture
					body string
				}
				var batch []sent
				for i := range 200 {
					body := fmt.Sprintf("%d-%d-%d", p, round, i)
					var opts []jetstream.PublishOpt
					if p > 0 {
						opts = append(opts, jetstream.WithRetryAttempts(0))
					}
					switch i % 10 {
					case 3:
						opts = append(opts, jetstream.WithExpectStream("ORDERS"))
					case 7:
						opts = append(opts, jetstream.WithMsgID(body))
					}
					f, err := js.PublishAsync("orders.created", []byte(body), opts...)
					if err != nil {
						break
					}
					batch = append(batch, sent{f, body})
				}
				// One deadline for the round: once holdfast is killed,
				// the futures left are never answered.
				deadline := time.After(10 * time.Second)
			wait:
				for _, s := range batch {
					select {
					case a := <-s.f.Ok():
						acks[p] = append(acks[p], gcAck{a.Sequence, s.body})
						acked.Add(1)
					case <-s.f.Err():
					case <-deadline:
						break wait
					}
				}
				if nc.IsClosed() {
					return
				}
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	// Four reloads at least, and on until enough was acknowledged to
	// prove something: a loaded machine acknowledges fewer per reload.
	for i := 0; i < 4 || (acked.Load() < 2000 && i < 40); i++ {
		text := off
		if i%2 == 1 {
			text = on
		}
		d.reloadWith(in.cfg, text)
		time.Sleep(200 * time.Millisecond)
	}
	if err := d.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	d.wait(10 * time.Second)
	close(stop)
	wg.Wait()

	d = startHoldfast(t, in.cfg)
	d.waitReady()
	_, js := e2eConnect(t, in)
	ctx := natstest.Context(t)
	s, err := js.Stream(ctx, "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	info := natstest.StreamInfo(t, js, "ORDERS")
	count := map[string]int{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			continue // a gap
		}
		if m.Subject != "orders.created" {
			t.Errorf("seq %d stored under %s", seq, m.Subject)
		}
		count[string(m.Data)]++
	}
	total := 0
	for p, list := range acks {
		var last uint64
		for _, a := range list {
			total++
			m, err := s.GetMsg(ctx, a.seq)
			if err != nil || string(m.Data) != a.body {
				t.Fatalf("seq %d acknowledged for %s: %v %v", a.seq, a.body, m, err)
			}
			if count[a.body] != 1 {
				t.Fatalf("%s acknowledged, stored %d times", a.body, count[a.body])
			}
			if a.seq <= last && p > 0 {
				t.Fatalf("publisher %d: seq %d after %d", p, a.seq, last)
			}
			last = a.seq
		}
	}
	if total < 1000 {
		t.Fatalf("only %d messages acknowledged: too few to prove anything", total)
	}
	t.Logf("%d acknowledged, %d stored", total, info.State.Msgs)
	d.stop()
}

// TestGroupCommitStreamRemoved: after `nats stream rm ORDERS` a publish
// gets "no responders" at once, as from the server, until holdfast has
// created the stream again; then publishes are stored again.
func TestGroupCommitStreamRemoved(t *testing.T) {
	t.Parallel()
	in := newE2EInstance(t)
	editConfig(t, in.cfg, "subjects = [\"orders.*\"]\n", "subjects = [\"orders.*\"]\ngroup_commit = true\n")
	d := startHoldfast(t, in.cfg)
	d.waitReady()
	_, js := e2eConnect(t, in)
	gcPublish(t, in.url(), 2, 100, "before")
	if res := e2eRunBinary(t, natsBin, nil, nil, "--server", in.url(), "stream", "rm", "ORDERS", "-f"); res.code != 0 {
		t.Fatalf("nats stream rm: %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	noResponders := 0
	natstest.CheckFor(t, 60*time.Second, 0, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, err := js.Publish(ctx, "orders.created", []byte("x"), jetstream.WithRetryAttempts(0))
		switch {
		case errors.Is(err, jetstream.ErrNoStreamResponse):
			noResponders++
			time.Sleep(50 * time.Millisecond)
			return err
		case err != nil:
			t.Fatalf("publish while ORDERS is missing: %v, want no responders", err)
		}
		return nil
	})
	if noResponders == 0 {
		t.Fatal("no publish saw the stream missing: the test proves nothing")
	}
	acks := gcPublish(t, in.url(), 2, 100, "after")
	gcCheckStored(t, js, acks, natstest.StreamInfo(t, js, "ORDERS").State.Msgs)
	d.stop()
}

// TestGroupCommitWithoutIngestIsAProblem: a stream that has group
// commit's prefixed subjects while holdfast runs no ingest for it (set by
// hand with nats stream edit, or an ingest that could not be started on
// a reload) answers no publish to its subjects: each gets "no
// responders". `holdfast status` showed GROUP COMMIT "on" and healthy;
// it is a problem now, named with what to do.
func TestGroupCommitWithoutIngestIsAProblem(t *testing.T) {
	t.Parallel()
	o := newOpsInstance(t, "", "", "", "")
	d := startHoldfast(t, o.cfg)
	d.waitReady()
	_, js := e2eConnect(t, o.e2eInstance)
	natstest.EditStream(t, js, "ORDERS", func(sc *jetstream.StreamConfig) {
		sc.Subjects = subjects.GroupCommitSubjects("ORDERS", sc.Subjects)
		sc.SubjectTransform = &jetstream.SubjectTransformConfig{Source: subjects.GroupCommit("ORDERS", ">"), Destination: ">"}
		sc.AllowAtomicPublish = true
	})
	out, res := o.status(t)
	if s := findStream(t, out, "ORDERS"); s.GroupCommit != "on" {
		t.Fatalf("GROUP COMMIT %q, want on: the test does not test what it says", s.GroupCommit)
	}
	found := false
	for _, p := range out.Problems {
		found = found || strings.Contains(p, "ORDERS") && strings.Contains(p, "group commit")
	}
	if !found || out.Healthy || res.code == 0 {
		t.Errorf("status exited %d, healthy %v, problems %q: want a problem naming ORDERS and group commit", res.code, out.Healthy, out.Problems)
	}
	d.stop()
}

// TestIngestWithoutGroupCommitStreamIsAProblem: group commit runs for
// ORDERS but the stream was set back to its plain subjects by hand (nats
// stream edit): the stream and holdfast both take each publish, which
// may be stored twice. `holdfast status` showed GROUP COMMIT off and
// healthy; it is a problem now.
func TestIngestWithoutGroupCommitStreamIsAProblem(t *testing.T) {
	t.Parallel()
	o := newOpsInstance(t, "", "group_commit = true", "", "")
	d := startHoldfast(t, o.cfg)
	d.waitReady()
	_, js := e2eConnect(t, o.e2eInstance)
	natstest.EditStream(t, js, "ORDERS", func(sc *jetstream.StreamConfig) {
		sc.Subjects = []string{"orders.*"}
		sc.SubjectTransform = nil
	})
	out, res := o.status(t)
	if s := findStream(t, out, "ORDERS"); s.GroupCommit != "off" || s.GroupCommitStats == nil {
		t.Fatalf("GROUP COMMIT %q, stats %v: the test does not test what it says", s.GroupCommit, s.GroupCommitStats)
	}
	found := false
	for _, p := range out.Problems {
		found = found || strings.Contains(p, "ORDERS") && strings.Contains(p, "group commit")
	}
	if !found || out.Healthy || res.code == 0 {
		t.Errorf("status exited %d, healthy %v, problems %q: want a problem naming ORDERS and group commit", res.code, out.Healthy, out.Problems)
	}
	d.stop()
}

// TestGroupCommitStreamLeftOutReported: a group-commit stream left out of
// the config at a reload stays on the server with group commit's prefixed
// subjects, and nothing answers its configured ones any more: holdfast
// status says so (exit 1), as for a configured stream in that state.
func TestGroupCommitStreamLeftOutReported(t *testing.T) {
	t.Parallel()
	in := newE2EInstance(t)
	s2 := "\n[streams.S2]\nsubjects = [\"s2.*\"]\ngroup_commit = true\n"
	with := readFile(t, in.cfg) + s2
	if err := os.WriteFile(in.cfg, []byte(with), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startHoldfast(t, in.cfg)
	d.waitReady()
	if res := runHoldfast(t, nil, "--config", in.cfg, "status"); res.code != 0 {
		t.Fatalf("status with S2 configured: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	d.reloadWith(in.cfg, strings.Replace(with, s2, "\n", 1))
	res := runHoldfast(t, nil, "--config", in.cfg, "status")
	want := `stream S2: has group commit's prefixed subjects but holdfast runs no group commit for it: every publish to s2.* gets "no responders"`
	if res.code != 1 || !strings.Contains(res.stdout+res.stderr, want) {
		t.Fatalf("status after S2 was left out: exit %d, want 1 and %q:\n%s%s", res.code, want, res.stdout, res.stderr)
	}
	d.stop()
}

// TestCommitWindowUnconfiguredStreamReported: with jetstream.commit_window
// the server flushes nothing itself, and holdfast answers the publishes of
// the streams it is configured with after its flush. A stream made by hand
// beside them gets the server's PubAck before any flush: holdfast status
// says so (exit 1); its own streams and dead-letter streams are not named.
func TestCommitWindowUnconfiguredStreamReported(t *testing.T) {
	t.Parallel()
	in := newE2EInstance(t)
	editConfig(t, in.cfg, "max_memory_store = \"64MB\"\n", "max_memory_store = \"64MB\"\ncommit_window = \"40ms\"\n")
	d := startHoldfast(t, in.cfg)
	d.waitReady()
	if res := runHoldfast(t, nil, "--config", in.cfg, "status"); res.code != 0 {
		t.Fatalf("status with only configured streams: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	_, js := e2eConnect(t, in)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "HAND", Subjects: []string{"hand.*"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	res := runHoldfast(t, nil, "--config", in.cfg, "status")
	want := "stream HAND is not in holdfast's config: with jetstream.commit_window the server flushes nothing itself"
	out := res.stdout + res.stderr
	if res.code != 1 || !strings.Contains(out, want) || strings.Contains(out, "ORDERS is not in") || strings.Contains(out, "ORDERS_DLQ is not in") {
		t.Fatalf("status with stream HAND: exit %d, want 1 and %q:\n%s%s", res.code, want, res.stdout, res.stderr)
	}
	d.stop()
}
