package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/internal/natstest"
)

// Issue 12: `dlq replay` republished a dead letter to its original
// subject, so every consumer of the stream handled it again, under a new
// idempotency key. A replay must reach only the consumer that failed it,
// with the key its handler saw the first time.
func TestDLQReplayReachesOnlyTheFailedConsumer(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	fixed := filepath.Join(dir, "fixed")
	out1 := filepath.Join(dir, "worker1")
	out2 := filepath.Join(dir, "worker2")
	worker1 := e2eScript(t, fmt.Sprintf(`cat >/dev/null
[ -e %q ] || { echo "cannot handle $HOLDFAST_MSG_ID yet" >&2; exit 65; }
echo "$HOLDFAST_MSG_ID $HOLDFAST_SEQ $HOLDFAST_HEADER_HOLDFAST_REPLAYED_FROM" >> %q
`, fixed, out1))
	worker2 := e2eScript(t, fmt.Sprintf("cat >/dev/null\necho \"$HOLDFAST_MSG_ID\" >> %q\n", out2))
	in := newE2EInstanceWith(t, fmt.Sprintf(`workers = 2
ack_wait = "3s"
max_deliver = 5
backoff = ["100ms"]
handler = "exec"

[consumers.WORKER1.exec]
command = [%q]
timeout = "20s"

[consumers.WORKER2]
stream = "ORDERS"
workers = 1
handler = "exec"

[consumers.WORKER2.exec]
command = [%q]
timeout = "20s"

[run]
shutdown_timeout = "2s"
`, worker1, worker2))
	p := startHoldfast(t, in.cfg)
	p.waitReady()
	_, js := e2eConnect(t, in)
	publish := func(id string) {
		t.Helper()
		m := nats.NewMsg("orders.created")
		m.Header.Set(nats.MsgIdHdr, id)
		m.Data = []byte(id)
		if _, err := js.PublishMsg(natstest.Context(t), m); err != nil {
			t.Fatal(err)
		}
	}
	publish("order-7")
	natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		if n := len(e2eDeadLetters(t, js, "ORDERS_DLQ")); n != 1 {
			return fmt.Errorf("%d dead letters", n)
		}
		if got := e2eLines(t, out2); len(got) != 1 {
			return fmt.Errorf("WORKER2 handled %q", got)
		}
		return nil
	})
	if err := os.WriteFile(fixed, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	res := runHoldfast(t, nil, "--config", in.cfg, "dlq", "replay", "--all")
	if res.code != 0 || !strings.Contains(res.stdout, "replayed 1 of 1") {
		t.Fatalf("dlq replay --all: %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	// The replay ran WORKER1's handler, with the original key, before the
	// command returned; the dead letter is gone.
	if got := e2eLines(t, out1); !slices.Equal(got, []string{"order-7 1 ORDERS_DLQ:1"}) {
		t.Fatalf("WORKER1 handled %q, want the original message once, key order-7", got)
	}
	if n := len(e2eDeadLetters(t, js, "ORDERS_DLQ")); n != 0 {
		t.Fatalf("%d dead letters left after the replay", n)
	}
	// WORKER2 (one worker, in stream order) handles a later message; it
	// must not have been handed the replay before it.
	publish("sentinel")
	natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		if got := e2eLines(t, out2); len(got) < 2 {
			return fmt.Errorf("WORKER2 handled %q", got)
		}
		return nil
	})
	if got := e2eLines(t, out2); !slices.Equal(got, []string{"order-7", "sentinel"}) {
		t.Fatalf("WORKER2 handled %q: a replay of WORKER1's dead letter reached it", got)
	}
	// The replayed dead letter is gone: show and replay say so in words,
	// not as a raw API error.
	for _, cmd := range []string{"show", "replay"} {
		res := runHoldfast(t, nil, "--config", in.cfg, "dlq", cmd, "1")
		if res.code != 1 || !strings.Contains(res.stderr, "there is no dead letter #1 in ORDERS_DLQ") || strings.Contains(res.stderr, "err_code") {
			t.Errorf("dlq %s 1 after the replay: %d %s", cmd, res.code, res.stderr)
		}
	}

	p.stop()
}

// TestDLQRefusesConsumerWithoutDeadLetters: `dlq ls|replay|purge
// --consumer` with a name the config does not have, or of a consumer
// without a dead-letter stream, is a usage error naming it. A mistyped
// name used to list "0 dead letter(s)" and replay "0 of 0" with exit 0,
// as if the consumer had none. SEQ 0 is refused as a usage error too (it
// was the server's "bad request", exit 1), and `dlq show` of a message
// that is no dead letter says so (it printed it as one). replay's
// --consumer with SEQ arguments, and --stream with --all, are refused (each
// was ignored). A --stream that does not exist is named as the mistake
// (it asked whether holdfast was running with this config).
func TestDLQRefusesConsumerWithoutDeadLetters(t *testing.T) {
	t.Parallel()
	in := newE2EInstance(t)
	in.cfg = e2eWriteConfig(t, e2eConfigTOML(in.store, in.port, `
[consumers.NODLQ]
stream = "ORDERS"
workers = 0
dead_letter = ""
`))
	d := startHoldfast(t, in.cfg)
	d.waitReady()
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"dlq", "ls", "--consumer", "WORKER2"}, "--consumer WORKER2: no such consumer in the config (consumers: NODLQ, WORKER1)"},
		{[]string{"dlq", "replay", "--all", "--consumer", "WORKER2"}, "--consumer WORKER2: no such consumer"},
		{[]string{"dlq", "purge", "--yes", "--consumer", "WORKER2"}, "--consumer WORKER2: no such consumer"},
		{[]string{"dlq", "ls", "--consumer", "NODLQ"}, "consumers.NODLQ.dead_letter"},
		{[]string{"dlq", "show", "0"}, `SEQ "0" is not a sequence number`},
		{[]string{"dlq", "replay", "0"}, `SEQ "0" is not a sequence number`},
		{[]string{"dlq", "replay", "--consumer", "WORKER1", "1"}, "--consumer goes with --all"},
		{[]string{"dlq", "replay", "--all", "--stream", "ORDERS_DLQ"}, "--stream goes with SEQ arguments"},
		{[]string{"dlq", "show", "--stream", "NOPE", "1"}, "--stream NOPE: there is no such stream (the config's dead-letter streams: ORDERS_DLQ)"},
		{[]string{"dlq", "replay", "--stream", "NOPE", "1"}, "--stream NOPE: there is no such stream"},
	} {
		args := append([]string{tt.args[0], tt.args[1], "--config", in.cfg}, tt.args[2:]...)
		res := runHoldfast(t, nil, args...)
		if res.code != 2 || !strings.Contains(res.stderr, tt.want) {
			t.Errorf("%q: exit %d, want 2 saying %q\nstdout:\n%s\nstderr:\n%s", tt.args, res.code, tt.want, res.stdout, res.stderr)
		}
	}
	if res := runHoldfast(t, nil, "dlq", "ls", "--config", in.cfg, "--consumer", "WORKER1"); res.code != 0 || !strings.Contains(res.stdout, "0 dead letter(s)") {
		t.Errorf("dlq ls --consumer WORKER1: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	// A message that is no dead letter (of another --stream) is refused,
	// not printed as one.
	if res := runHoldfast(t, nil, "pub", "--config", in.cfg, "orders.created", "not a dead letter"); res.code != 0 {
		t.Fatalf("pub: exit %d\n%s", res.code, res.stderr)
	}
	if res := runHoldfast(t, nil, "dlq", "show", "--config", in.cfg, "--stream", "ORDERS", "1"); res.code != 1 ||
		!strings.Contains(res.stderr, "ORDERS #1 on orders.created is not a holdfast dead letter") || strings.Contains(res.stdout, "not a dead letter") {
		t.Errorf("dlq show --stream ORDERS 1: exit %d, want 1 saying it is no dead letter\n%s%s", res.code, res.stdout, res.stderr)
	}
	d.stop()
}

// TestClientCommandsRefuseServerWithoutJetStream: dlq and backup against a
// NATS server without JetStream (a wrong --server) say so, naming the
// address and what to check, exit 1. They failed at their first request
// with "nats: no responders available for request".
func TestClientCommandsRefuseServerWithoutJetStream(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t, func(o *server.Options) { o.JetStream = false })
	url := s.ClientURL()
	cfg := e2eWriteConfig(t, e2eConfigTOML(filepath.Join(t.TempDir(), "store"), 4222, ""))
	for _, args := range [][]string{
		{"dlq", "ls"},
		{"dlq", "purge", "--yes"},
		{"dlq", "replay", "--all"},
		{"backup", filepath.Join(t.TempDir(), "b")},
	} {
		full := append([]string{args[0]}, "--config", cfg, "--server", url)
		if args[0] == "dlq" {
			full = append([]string{"dlq", args[1], "--config", cfg, "--server", url}, args[2:]...)
		} else {
			full = append(full, args[1:]...)
		}
		res := runHoldfast(t, nil, full...)
		if res.code != 1 || !strings.Contains(res.stderr, "JetStream at "+url) || !strings.Contains(res.stderr, "it is not holdfast") {
			t.Errorf("%q: exit %d, want 1 saying the server at %s has no JetStream\n%s%s", args, res.code, url, res.stdout, res.stderr)
		}
	}
}

// TestDLQConcurrentReplaysRunTheHandlerOnce: two `dlq replay --all` at
// once hand each dead letter to the handler once; the other request is
// told it is being replayed (or gone). They ran the handler twice on most
// letters (23 of 30 measured), each request on its own.
func TestDLQConcurrentReplaysRunTheHandlerOnce(t *testing.T) {
	t.Parallel()
	r := newReplayRace(t)
	in := newE2EInstanceWith(t, r.worker1(4))
	p := startHoldfast(t, in.cfg)
	p.waitReady()
	_, js := e2eConnect(t, in)
	r.run(js, in.cfg, in.cfg)
	p.stop()
}

// replayRace is two `holdfast dlq replay --all` at once on the same dead
// letters, made by an exec handler that fails until the test fixes it
// and then records each message's sequence it handled.
type replayRace struct {
	t                  *testing.T
	fixed, out, script string
}

func newReplayRace(t *testing.T) *replayRace {
	dir := t.TempDir()
	r := &replayRace{t: t, fixed: filepath.Join(dir, "fixed"), out: filepath.Join(dir, "handled")}
	r.script = e2eScript(t, fmt.Sprintf(`cat >/dev/null
[ -e %q ] || exit 65
sleep 0.2
echo "$HOLDFAST_SEQ" >> %q
`, r.fixed, r.out))
	return r
}

// worker1 is WORKER1's config: its workers run the handler, and a
// message it fails is a dead letter at once.
func (r *replayRace) worker1(workers int) string {
	return fmt.Sprintf(`workers = %d
max_deliver = 1
handler = "exec"

[consumers.WORKER1.exec]
command = [%q]
timeout = "20s"
`, workers, r.script)
}

// deadLetters publishes n messages and waits until they are all dead
// letters (the handler fails until fixed).
func (r *replayRace) deadLetters(js jetstream.JetStream, n int) {
	t := r.t
	t.Helper()
	for i := range n {
		if _, err := js.Publish(natstest.Context(t), "orders.created", fmt.Appendf(nil, "%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	natstest.CheckFor(t, 60*time.Second, 20*time.Millisecond, func() error {
		if got := len(e2eDeadLetters(t, js, "ORDERS_DLQ")); got != n {
			return fmt.Errorf("%d dead letters", got)
		}
		return nil
	})
}

// run publishes messages until they are all dead letters, fixes the
// handler, replays them all through the two configs at once, and checks
// that the handler ran once on each and no dead letter is left.
func (r *replayRace) run(js jetstream.JetStream, cfgs ...string) {
	t := r.t
	t.Helper()
	const n = 8
	r.deadLetters(js, n)
	// `dlq ls` through each config: in a cluster its first pull, right
	// after creating its reader, met no responders on the node leading
	// it, and the command failed with "nats: no responders available for
	// request" in most runs.
	for _, cfg := range cfgs {
		for range 3 {
			if res := runHoldfast(t, nil, "--config", cfg, "dlq", "ls"); res.code != 0 || !strings.Contains(res.stdout, fmt.Sprintf("%d dead letter(s)", n)) {
				t.Fatalf("dlq ls --config %s: exit %d, want the %d dead letters\n%s%s", cfg, res.code, n, res.stdout, res.stderr)
			}
		}
	}
	if err := os.WriteFile(r.fixed, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	replays := make([]*exec.Cmd, len(cfgs))
	outs := make([]natstest.Buffer, len(cfgs))
	for i, cfg := range cfgs {
		replays[i] = exec.Command(holdfastBin, "--config", cfg, "dlq", "replay", "--all")
		replays[i].Env = e2eEnv()
		replays[i].Stdout, replays[i].Stderr = &outs[i], &outs[i]
		if err := replays[i].Start(); err != nil {
			t.Fatal(err)
		}
	}
	for i, cmd := range replays {
		err := cmd.Wait()
		t.Logf("dlq replay --all --config %s: %v\n%s", cfgs[i], err, outs[i].String())
		if strings.Contains(outs[i].String(), "could not be removed") {
			t.Errorf("a replay ran the handler on a dead letter another replay had removed:\n%s", outs[i].String())
		}
	}
	got := e2eLines(t, r.out)
	slices.Sort(got)
	if len(got) != n || len(slices.Compact(slices.Clone(got))) != n {
		t.Errorf("the handler ran on %q, want each of the %d messages once", got, n)
	}
	if left := len(e2eDeadLetters(t, js, "ORDERS_DLQ")); left != 0 {
		t.Errorf("%d dead letters left", left)
	}
	ctx := natstest.Context(t)
	s, err := js.Stream(ctx, "ORDERS_DLQ")
	if err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		var left []string
		names := s.ConsumerNames(ctx)
		for name := range names.Name() {
			left = append(left, name)
		}
		if len(left) != 0 {
			return fmt.Errorf("consumers left on ORDERS_DLQ: %q", left)
		}
		return nil
	})
}

// TestDLQPurgeUpTo: `dlq purge --upto SEQ` deletes the dead letters up to
// SEQ and keeps those stored since the operator listed them; purge says
// how many it deleted. It deleted every dead letter, also those that
// arrived between `dlq ls` and `dlq purge --yes`, unseen, and said only
// "purged ORDERS_DLQ". --upto 0 is refused for what it is.
func TestDLQPurgeUpTo(t *testing.T) {
	t.Parallel()
	in, p, js := startDeadLetterer(t)
	publish := func(n, want int) {
		t.Helper()
		for range n {
			if _, err := js.Publish(natstest.Context(t), "orders.created", []byte("x")); err != nil {
				t.Fatal(err)
			}
		}
		natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
			if got := len(e2eDeadLetters(t, js, "ORDERS_DLQ")); got != want {
				return fmt.Errorf("%d dead letters, want %d", got, want)
			}
			return nil
		})
	}
	publish(3, 3)
	res := runHoldfast(t, nil, "--config", in.cfg, "dlq", "purge", "--yes", "--upto", "2")
	if res.code != 0 || !strings.Contains(res.stdout, "purged 2 dead letter(s) up to seq 2 from ORDERS_DLQ") {
		t.Fatalf("dlq purge --upto 2: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	if dls := e2eDeadLetters(t, js, "ORDERS_DLQ"); len(dls) != 1 {
		t.Fatalf("%d dead letters after purge --upto 2, want the third", len(dls))
	}
	publish(2, 3)
	res = runHoldfast(t, nil, "--config", in.cfg, "dlq", "purge", "--yes")
	if res.code != 0 || !strings.Contains(res.stdout, "purged 3 dead letter(s) from ORDERS_DLQ") {
		t.Fatalf("dlq purge: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	// With one dead-letter stream, --upto 0 is the only mistake: it was
	// told "1 are configured (ORDERS_DLQ): pick one with --consumer".
	if res := runHoldfast(t, nil, "--config", in.cfg, "dlq", "purge", "--yes", "--upto", "0"); res.code != 2 ||
		!strings.Contains(res.stderr, "1 or more (the SEQ column of holdfast dlq ls)") || strings.Contains(res.stderr, "pick one") {
		t.Errorf("dlq purge --upto 0: exit %d, want 2 asking for a SEQ of dlq ls only\n%s", res.code, res.stderr)
	}
	p.stop()
}

// TestDLQShowQuotesControlCharacters: `dlq show` prints a header value
// holding control characters (the publisher's: an escape sequence could
// rewrite the operator's terminal) quoted; it printed them raw.
func TestDLQShowQuotesControlCharacters(t *testing.T) {
	t.Parallel()
	in, p, js := startDeadLetterer(t)
	m := nats.NewMsg("orders.created")
	m.Header.Set("X-Ctl", "a\x1b[2Kb")
	m.Data = []byte("x")
	if _, err := js.PublishMsg(natstest.Context(t), m); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		if got := len(e2eDeadLetters(t, js, "ORDERS_DLQ")); got != 1 {
			return fmt.Errorf("%d dead letters", got)
		}
		return nil
	})
	res := runHoldfast(t, nil, "--config", in.cfg, "dlq", "show", "1")
	if res.code != 0 || strings.Contains(res.stdout, "\x1b") || !strings.Contains(res.stdout, `X-Ctl: "a\x1b[2Kb"`) {
		t.Errorf("dlq show 1: exit %d, want the header quoted:\n%q", res.code, res.stdout)
	}
	p.stop()
}

// TestDLQLsQuotesControlCharacters: `dlq ls` and the first line of `dlq
// show` print a subject holding control characters or bytes that are not
// UTF-8 (the publisher's) quoted, and cut a long error on a character,
// not inside one. They printed the subject raw (an escape sequence in it
// cleared the operator's terminal, or moved the cursor up over the rows
// before), and cut the error inside a two-byte character.
func TestDLQLsQuotesControlCharacters(t *testing.T) {
	t.Parallel()
	in, p, js := startDeadLettererWith(t, "cat >/dev/null\necho x"+strings.Repeat("é", 100)+" >&2\nexit 65\n")
	if _, err := js.Publish(natstest.Context(t), "orders.\x1b[2J\x1b[1A\x9bx", []byte("x")); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		if got := len(e2eDeadLetters(t, js, "ORDERS_DLQ")); got != 1 {
			return fmt.Errorf("%d dead letters", got)
		}
		return nil
	})
	bad := func(s string) bool { return strings.ContainsRune(s, '\x1b') || !utf8.ValidString(s) }
	ls := runHoldfast(t, nil, "--config", in.cfg, "dlq", "ls")
	if ls.code != 0 || bad(ls.stdout) || !strings.Contains(ls.stdout, `"orders.\x1b[2J\x1b[1A\x9bx"`) || !strings.Contains(ls.stdout, "éé…") {
		t.Errorf("dlq ls: exit %d, want the subject quoted and the error cut on a character:\n%q", ls.code, ls.stdout)
	}
	show := runHoldfast(t, nil, "--config", in.cfg, "dlq", "show", "1")
	if first, _, _ := strings.Cut(show.stdout, "\n"); show.code != 0 || bad(first) || !strings.Contains(first, `"dlq.WORKER1.orders.\x1b[2J\x1b[1A`) {
		t.Errorf("dlq show 1: exit %d, want the subject quoted:\n%q", show.code, show.stdout)
	}
	p.stop()
}

// TestDLQReplayAllHoldsNoPayloads: `dlq replay --all` lists the dead
// letters before it asks for the first replay, and keeps of each only
// what the request names (stream, sequence, consumer, Nats-Msg-Id). It
// kept each whole, payload and all, until the last was replayed.
func TestDLQReplayAllHoldsNoPayloads(t *testing.T) {
	t.Parallel()
	in, p, js := startDeadLetterer(t)
	const n, size = 40, 1_000_000
	for i := range n {
		data := bytes.Repeat([]byte{byte('a' + i%26)}, size)
		if _, err := js.Publish(natstest.Context(t), "orders.created", data); err != nil {
			t.Fatal(err)
		}
	}
	natstest.CheckFor(t, 60*time.Second, 50*time.Millisecond, func() error {
		if got := natstest.StreamInfo(t, js, "ORDERS_DLQ").State.Msgs; got != n {
			return fmt.Errorf("%d dead letters", got)
		}
		return nil
	})
	// The heap each garbage collection left live, from the runtime's own
	// trace (the child's max RSS from wait4 would include the test
	// process's, which the child had until its exec).
	replay := exec.Command(holdfastBin, "--config", in.cfg, "dlq", "replay", "--all")
	replay.Env = append(e2eEnv(), "GODEBUG=gctrace=1")
	var stdout, stderr bytes.Buffer
	replay.Stdout, replay.Stderr = &stdout, &stderr
	err := replay.Run()
	if !strings.Contains(stdout.String(), fmt.Sprintf("replayed 0 of %d dead letter(s)", n)) {
		t.Fatalf("dlq replay --all (the handler still refuses them): %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	live := 0
	for _, m := range regexp.MustCompile(`\d+->\d+->(\d+) MB`).FindAllStringSubmatch(stderr.String(), -1) {
		mb, _ := strconv.Atoi(m[1])
		live = max(live, mb)
	}
	t.Logf("dlq replay --all of %d dead letters of %d B: at most %d MB live after a garbage collection", n, size, live)
	if live > n*size/2/1e6 {
		t.Errorf("dlq replay --all kept %d MB live for %d dead letters of %d B: it holds their payloads", live, n, size)
	}
	p.stop()
}

// startDeadLetterer starts holdfast with one WORKER1 worker whose exec
// handler refuses every message at its only delivery: each message
// published becomes a dead letter in ORDERS_DLQ at once.
func startDeadLetterer(t *testing.T) (*e2eInstance, *e2eProc, jetstream.JetStream) {
	t.Helper()
	return startDeadLettererWith(t, "cat >/dev/null\nexit 65\n")
}

// startDeadLettererWith is startDeadLetterer with the exec handler's
// shell script body.
func startDeadLettererWith(t *testing.T, body string) (*e2eInstance, *e2eProc, jetstream.JetStream) {
	t.Helper()
	script := e2eScript(t, body)
	in := newE2EInstanceWith(t, fmt.Sprintf(`workers = 1
max_deliver = 1
handler = "exec"

[consumers.WORKER1.exec]
command = [%q]
`, script))
	p := startHoldfast(t, in.cfg)
	p.waitReady()
	_, js := e2eConnect(t, in)
	return in, p, js
}

// TestDLQReplayInterruptedSaysHowFarItGot: Ctrl-C on `dlq replay --all`
// stops it asking for replays; it says how many it replayed and that the
// others are still dead letters. It used to die of the signal, silent.
func TestDLQReplayInterruptedSaysHowFarItGot(t *testing.T) {
	t.Parallel()
	r := newReplayRace(t)
	in := newE2EInstanceWith(t, r.worker1(1))
	p := startHoldfast(t, in.cfg)
	p.waitReady()
	_, js := e2eConnect(t, in)
	const n = 20
	r.deadLetters(js, n)
	if err := os.WriteFile(r.fixed, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	replay := exec.Command(holdfastBin, "--config", in.cfg, "dlq", "replay", "--all")
	replay.Env = e2eEnv()
	var out natstest.Buffer
	replay.Stdout, replay.Stderr = &out, &out
	if err := replay.Start(); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		if _, err := os.Stat(r.out); err != nil {
			return errors.New("no dead letter replayed yet")
		}
		return nil
	})
	if err := replay.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	err := replay.Wait()
	t.Logf("dlq replay --all, interrupted: %v\n%s", err, out.String())
	m := regexp.MustCompile(`replayed (\d+) of 20 dead letter\(s\)`).FindStringSubmatch(out.String())
	if replay.ProcessState.ExitCode() != 1 || m == nil || !strings.Contains(out.String(), "interrupted: the") {
		t.Fatalf("the interrupted replay (%v) does not say how far it got:\n%s", err, out.String())
	}
	replayed, _ := strconv.Atoi(m[1])
	if replayed == n {
		t.Skip("every dead letter was replayed before the interrupt")
	}
	// What it says holds: each replayed letter left the dead-letter
	// stream (the one asked for when the interrupt came may follow).
	natstest.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		left := len(e2eDeadLetters(t, js, "ORDERS_DLQ"))
		if left+replayed != n && left+replayed != n-1 {
			return fmt.Errorf("%d dead letters left after %d replayed, want %d", left, replayed, n-replayed)
		}
		return nil
	})
	p.stop()
}

// TestDLQWithoutDeadLetterStreams: with dead_letter = "" for every
// consumer, dlq ls, replay --all and purge (which all read dlqStreams)
// say there is no dead-letter stream, exit 2, as show and replay SEQ do.
// ls printed "0 dead letter(s)" and replay --all "replayed 0 of 0", exit
// 0, as if no message had failed, also while a dead-letter stream
// configured before still held dead letters.
func TestDLQWithoutDeadLetterStreams(t *testing.T) {
	cfg := config.DefaultConfig()
	for _, cc := range cfg.Consumers {
		cc.DeadLetter = ""
	}
	targets, err := dlqStreams(cfg, "")
	if exitCode(err) != 2 || err == nil || !strings.Contains(err.Error(), "no consumer has a dead-letter stream") {
		t.Fatalf("dlqStreams of a config without dead-letter streams: %v, %v (exit %d); want exit 2 saying there is none", targets, err, exitCode(err))
	}
}

// TestDLQArgumentsSayWhatIsWrong: `dlq show` and `dlq replay` with the
// wrong arguments name what is wrong beside the usage line, exit 2. They
// printed only the usage line ("usage: holdfast dlq show SEQ" for two
// SEQs, or for a --consumer that show does not take).
func TestDLQArgumentsSayWhatIsWrong(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"dlq", "show"}, "dlq show takes one SEQ (the SEQ column of holdfast dlq ls), got []"},
		{[]string{"dlq", "show", "1", "2"}, `got ["1" "2"]`},
		{[]string{"dlq", "show", "1", "--consumer", "WORKER1"}, `got ["1" "--consumer" "WORKER1"]`},
		{[]string{"dlq", "replay"}, "neither SEQ nor --all given"},
		{[]string{"dlq", "replay", "--all", "3"}, `--all replays every dead letter: no SEQ goes with it, got ["3"]`},
	} {
		res := runHoldfast(t, nil, tt.args...)
		if res.code != 2 || !strings.Contains(res.stderr, tt.want) {
			t.Errorf("%q: exit %d, want 2 saying %q\n%s", tt.args, res.code, tt.want, res.stderr)
		}
	}
}
