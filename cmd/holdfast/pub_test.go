package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/urfave/cli/v2"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/internal/natstest"
)

// `holdfast pub --count N` stores N messages with PubAck; with --id the
// ids are ID-1..ID-N, so running it twice stores nothing new.
func TestPubCount(t *testing.T) {
	t.Parallel()
	in := newE2EInstance(t)
	d := startHoldfast(t, in.cfg)
	d.waitReady()
	first := runHoldfast(t, nil, "pub", "--config", in.cfg, "--count", "600", "--id", "batch", "orders.created", "x")
	if first.code != 0 || !strings.Contains(first.stdout, "stored 600 message(s) in ORDERS as seq 1..600") {
		t.Fatalf("pub --count 600: exit %d\n%s%s", first.code, first.stdout, first.stderr)
	}
	again := runHoldfast(t, nil, "pub", "--config", in.cfg, "--count", "600", "--id", "batch", "orders.created", "x")
	if again.code != 0 || !strings.Contains(again.stdout, "stored 0 messages, 600 duplicate(s) not stored again") {
		t.Fatalf("pub --count 600 again: exit %d\n%s%s", again.code, again.stdout, again.stderr)
	}
	_, js := e2eConnect(t, in)
	if st := natstest.StreamInfo(t, js, "ORDERS").State; st.Msgs != 600 {
		t.Fatalf("ORDERS holds %d messages, want 600", st.Msgs)
	}
	bad := runHoldfast(t, nil, "pub", "--config", in.cfg, "--count", "0", "orders.created", "x")
	if bad.code != 2 || !strings.Contains(bad.stderr, "--count") {
		t.Fatalf("pub --count 0: exit %d\n%s", bad.code, bad.stderr)
	}
	outside := runHoldfast(t, nil, "pub", "--config", in.cfg, "--count", "3", "payments.created", "x")
	if outside.code != 1 || !strings.Contains(outside.stderr, "failed after 0 stored") {
		t.Fatalf("pub --count to a subject no stream takes: exit %d\n%s%s", outside.code, outside.stdout, outside.stderr)
	}
	d.stop()
}

// TestFlagsAfterArgumentsNamed: a flag after a command's arguments is
// refused with a message that says flags come first (it was taken as an
// argument, or failed with only a usage line).
func TestFlagsAfterArgumentsNamed(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"pub", "orders.created", "hello", "--server", "nats://127.0.0.1:1"},
		{"pub", "orders.created", "--id=x", "hello"},
		{"dlq", "show", "5", "--server", "nats://127.0.0.1:1"},
	} {
		res := runHoldfast(t, nil, args...)
		if res.code != 2 || !strings.Contains(res.stderr, "after the arguments: flags come first, as in holdfast "+args[0]) {
			t.Errorf("holdfast %q exited %d: %s", args, res.code, res.stderr)
		}
	}
}

// TestPubRefusesWildcardSubject: a publish needs a literal subject. "orders.*"
// was stored by ORDERS (orders.*) as a message whose subject is the
// wildcard itself, which no consumer filtered on orders.created sees.
func TestPubRefusesWildcardSubject(t *testing.T) {
	t.Parallel()
	for _, subj := range []string{"orders.*", "orders.>", "orders created", "orders..created"} {
		res := runHoldfast(t, nil, "pub", "--server", "nats://127.0.0.1:1", subj, "hello")
		if res.code != 2 || !strings.Contains(res.stderr, fmt.Sprintf("SUBJECT %q: not a subject a message can have", subj)) {
			t.Errorf("holdfast pub %q exited %d: %s", subj, res.code, res.stderr)
		}
	}
}

// TestPubRefusesServerSubjects: pub stores messages in streams; a $
// subject is the JetStream API or the server's own. Publishing to
// $JS.API.STREAM.PURGE.ORDERS purged the stream and then said "invalid
// jetstream publish response".
func TestPubRefusesServerSubjects(t *testing.T) {
	t.Parallel()
	for _, subj := range []string{"$JS.API.STREAM.PURGE.ORDERS", "$SYS.REQ.SERVER.PING", "$HOLDFAST.BARRIER.x.ORDERS"} {
		res := runHoldfast(t, nil, "pub", "--server", "nats://127.0.0.1:1", subj, "")
		if res.code != 2 || !strings.Contains(res.stderr, fmt.Sprintf("SUBJECT %q: subjects that begin with $ are the server's", subj)) {
			t.Errorf("holdfast pub %q exited %d: %s", subj, res.code, res.stderr)
		}
	}
}

// TestPubSaysWhyNothingWasStored: a subject no stream takes, and a
// message over the server's max_payload, are refused with what is wrong
// and what to do (nats.go's "no response from stream" and "maximum payload
// exceeded" were all they said), exit 1, and nothing is stored.
func TestPubSaysWhyNothingWasStored(t *testing.T) {
	t.Parallel()
	in := newE2EInstance(t)
	d := startHoldfast(t, in.cfg)
	d.waitReady()
	big := make([]byte, 1100<<10)
	for _, tt := range []struct {
		args  []string
		stdin []byte
		want  []string
	}{
		{[]string{"payments.created", "x"}, nil, []string{"no stream stores subject payments.created", "ORDERS (orders.*)"}},
		{[]string{"--count", "3", "payments.created", "x"}, nil, []string{"failed after 0 stored", "no stream stores subject payments.created"}},
		{[]string{"orders.created", "-"}, big, []string{"the message is about 1126400 bytes", "server.max_payload"}},
	} {
		res := runHoldfast(t, tt.stdin, append([]string{"pub", "--config", in.cfg}, tt.args...)...)
		if res.code != 1 {
			t.Errorf("pub %q: exit %d, want 1\n%s%s", tt.args, res.code, res.stdout, res.stderr)
		}
		for _, w := range tt.want {
			if !strings.Contains(res.stderr, w) {
				t.Errorf("pub %q does not say %q:\n%s", tt.args, w, res.stderr)
			}
		}
	}
	_, js := e2eConnect(t, in)
	if st := natstest.StreamInfo(t, js, "ORDERS").State; st.Msgs != 0 {
		t.Errorf("ORDERS holds %d messages, want none", st.Msgs)
	}
	d.stop()
}

// TestPubRefusesStdinOverAnyMessageSize: stdin larger than any NATS
// message may be (64 MiB) is refused without reading it all into memory;
// pub read a whole file or an endless pipe first.
func TestPubRefusesStdinOverAnyMessageSize(t *testing.T) {
	t.Parallel()
	res := runHoldfast(t, make([]byte, 64<<20+1), "pub", "--server", "nats://127.0.0.1:1", "orders.created", "-")
	if res.code != 2 || !strings.Contains(res.stderr, "stdin holds more than 67108864 bytes") {
		t.Errorf("pub of 64 MiB + 1 byte: exit %d, want 2\n%s", res.code, res.stderr)
	}
}

// TestPubRefusesHeaderNameWithBlank: a header name with a blank or a
// control character is a usage error naming it, before anything is sent;
// nats.go sent it and the publish failed with "nats: message could not
// decode headers".
func TestPubRefusesHeaderNameWithBlank(t *testing.T) {
	t.Parallel()
	for _, h := range []string{"X A:b", "X\tA:b", "X\x01A:b"} {
		res := runHoldfast(t, nil, "pub", "--server", "nats://127.0.0.1:1", "-H", h, "orders.created", "x")
		if res.code != 2 || !strings.Contains(res.stderr, "holds a blank or a control character") {
			t.Errorf("pub -H %q: exit %d, want 2\n%s", h, res.code, res.stderr)
		}
	}
}

// TestPubTimeoutAdviceFitsTheID: a publish that got no PubAck in time may
// be stored. The advice fits how it was published: without an id a retry
// may store it twice (publish with --id); with one, publish again with
// the same --id (and --count). It told a publish without --id to
// "publish again with the same --id".
func TestPubTimeoutAdviceFitsTheID(t *testing.T) {
	cfg := config.DefaultConfig()
	msg := nats.NewMsg("orders.created")
	for _, tt := range []struct {
		name, id string
		count    int
		want     string
		not      string
	}{
		{"no id", "", 1, "publishing it again may store it twice: publish with --id", "the same --id"},
		{"no id, --count", "", 5, "publishing it again may store it twice: publish with --id", "the same --id"},
		{"--id", "order-1", 1, "publish again with the same --id", "may store it twice"},
		{"--id and --count", "batch", 5, "run it again with the same --id and --count", "may store it twice"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := explainPubError(cfg, nil, msg, tt.id, tt.count, context.DeadlineExceeded).Error()
			if !strings.Contains(err, tt.want) || strings.Contains(err, tt.not) {
				t.Errorf("advice %q, want %q and not %q", err, tt.want, tt.not)
			}
		})
	}
}

// TestStrayArgumentsRefused: a command that takes no arguments refuses
// one (exit 2) before it does anything. `holdfast dlq purge --yes 6` read
// as "purge dead letter 6" deleted every dead letter: the 6 was ignored.
func TestStrayArgumentsRefused(t *testing.T) {
	t.Parallel()
	type leaf struct {
		path []string
		cmd  *cli.Command
	}
	var leaves []leaf
	var walk func(path []string, cmds []*cli.Command)
	walk = func(path []string, cmds []*cli.Command) {
		for _, cmd := range cmds {
			p := append(slices.Clone(path), cmd.Name)
			if len(cmd.Subcommands) > 0 {
				walk(p, cmd.Subcommands)
			} else if cmd.ArgsUsage == "" {
				leaves = append(leaves, leaf{p, cmd})
			}
		}
	}
	walk(nil, newApp().Commands)
	if !slices.ContainsFunc(leaves, func(l leaf) bool { return slices.Equal(l.path, []string{"dlq", "purge"}) }) {
		t.Fatalf("dlq purge not among the commands without arguments: %v", leaves)
	}
	for _, l := range leaves {
		args := slices.Clone(l.path)
		if l.cmd.Name == "purge" {
			args = append(args, "--yes")
		}
		for _, f := range l.cmd.Flags {
			if slices.Contains(f.Names(), "server") {
				args = append(args, "--server", "nats://127.0.0.1:1") // nothing there
			}
		}
		args = append(args, "6")
		res := runHoldfast(t, nil, args...)
		want := strings.Join(l.path, " ") + ` takes no arguments, got ["6"]`
		if res.code != 2 || !strings.Contains(res.stderr, want) {
			t.Errorf("holdfast %q exited %d, want 2 and %q:\n%s", args, res.code, want, res.stderr)
		}
	}
}

// TestPubDeniedSaysNotStored: a publish the server refuses by permission
// (here dlq.>, which only holdfast itself may publish to) is never
// answered with a PubAck. pub waited its whole ack timeout and then said
// the message "may or may not be stored" and to publish it again with
// --id; it now says at once that the server refused it.
func TestPubDeniedSaysNotStored(t *testing.T) {
	t.Parallel()
	in := newE2EInstance(t)
	d := startHoldfast(t, in.cfg)
	d.waitReady()
	for _, args := range [][]string{
		{"dlq.WORKER1.orders.created", "x"},
		{"--count", "3", "dlq.WORKER1.orders.created", "x"},
	} {
		start := time.Now()
		res := runHoldfast(t, nil, append([]string{"pub", "--config", in.cfg}, args...)...)
		took := time.Since(start)
		if res.code != 1 || !strings.Contains(res.stderr, "the server refused it, so it was not stored") ||
			strings.Contains(res.stderr, "may or may not be stored") {
			t.Errorf("pub %q: exit %d, want 1 saying it was refused\n%s%s", args, res.code, res.stdout, res.stderr)
		}
		if took >= pubAckWait {
			t.Errorf("pub %q took %s: it waited for the ack timeout", args, took)
		}
	}
	d.stop()
}
