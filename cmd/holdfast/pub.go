package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/urfave/cli/v2"

	"github.com/holdfast-io/holdfast/config"
)

// maxPubPayload is the largest message any holdfast takes: the most
// server.max_payload may be.
const maxPubPayload = 64 << 20

func pubCommand() *cli.Command {
	return &cli.Command{
		Name:      "pub",
		Usage:     "publish a message and wait for JetStream's acknowledgement",
		ArgsUsage: "SUBJECT [DATA|-]",
		Flags: []cli.Flag{
			serverFlag,
			&cli.StringFlag{Name: "id", Usage: "Nats-Msg-Id: a second publish with the same id within the stream's duplicate_window is stored once"},
			&cli.StringSliceFlag{Name: "header", Aliases: []string{"H"}, Usage: "header as Name:Value (repeatable)"},
			&cli.IntFlag{Name: "count", Value: 1, Usage: "publish the message N times (with --id, the ids are ID-1 ... ID-N); progress on a terminal"},
		},
		Action: pub,
	}
}

// pub publishes the message the arguments and flags describe, --count
// times, and prints where it was stored.
func pub(c *cli.Context) error {
	msg, err := pubMessage(c)
	if err != nil {
		return err
	}
	count := c.Int("count")
	if count < 1 {
		return usageError(fmt.Errorf("--count %d: must be at least 1", count))
	}
	cfg, nc, js, err := connect(c, jetstream.WithPublishAsyncTimeout(pubAckWait))
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx := publishDeniedCancels(c.Context, nc, msg.Subject)
	if count > 1 {
		return publishMany(ctx, c, js, msg, c.String("id"), count, func(err error) error {
			return explainPubError(cfg, nc, msg, c.String("id"), count, deniedCause(ctx, err))
		})
	}
	if id := c.String("id"); id != "" {
		msg.Header.Set(nats.MsgIdHdr, id)
	}
	ack, err := publishOne(ctx, js, msg)
	if err != nil {
		return runtimeError(fmt.Errorf("publish to %s: %w", msg.Subject, explainPubError(cfg, nc, msg, msg.Header.Get(nats.MsgIdHdr), 1, deniedCause(ctx, err))))
	}
	dup := ""
	if ack.Duplicate {
		dup = " (duplicate: already stored, not stored again)"
	}
	fmt.Fprintf(c.App.Writer, "stored in %s as seq %d%s\n", ack.Stream, ack.Sequence, dup)
	return nil
}

// publishDeniedCancels returns a context that ends, with the server's
// permissions violation as its cause, when the server refuses this
// connection a publish to subj: the server answers such a publish with
// an asynchronous -ERR and never a PubAck, so pub waited its whole
// pubAckWait and then said the message "may or may not be stored"
// (and to publish it again with --id), although the server had refused
// it. Other asynchronous errors are printed as nats.go does by default.
func publishDeniedCancels(parent context.Context, nc *nats.Conn, subj string) context.Context {
	ctx, cancel := context.WithCancelCause(parent)
	denied := "Publish to \"" + subj + "\""
	nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), denied) {
			cancel(err)
			return
		}
		fmt.Fprintf(os.Stderr, "%v\n", err)
	})
	return ctx
}

// deniedCause is err, or the permissions violation that ended ctx (see
// publishDeniedCancels).
func deniedCause(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); errors.Is(cause, nats.ErrPermissionViolation) {
		return cause
	}
	return err
}

// pubMessage is the message of pub's arguments (SUBJECT [DATA|-]) and
// --header flags, or a usage error naming what is wrong.
func pubMessage(c *cli.Context) (*nats.Msg, error) {
	if c.NArg() < 1 || c.NArg() > 2 {
		return nil, usageError(errors.New("usage: holdfast pub SUBJECT [DATA|-] (DATA - or absent reads stdin)"))
	}
	subj := c.Args().Get(0)
	if !server.IsValidLiteralSubject(subj) || strings.ContainsAny(subj, " \t\r\n") {
		return nil, usageError(fmt.Errorf("SUBJECT %q: not a subject a message can have: tokens separated by dots, without spaces or the wildcards * and >, such as orders.created", subj))
	}
	if strings.HasPrefix(subj, "$") {
		// $JS.API.STREAM.PURGE.ORDERS purged the stream, and pub then
		// reported an error ("invalid jetstream publish response"), as
		// if nothing had happened.
		return nil, usageError(fmt.Errorf("SUBJECT %q: subjects that begin with $ are the server's (the JetStream API, system and holdfast's own subjects), not a stream's: pub stores a message in a stream; for the API use the nats CLI", subj))
	}
	msg := nats.NewMsg(subj)
	switch data := c.Args().Get(1); {
	case c.NArg() == 1 || data == "-":
		// Read no more than a message may hold: all of a large file or
		// an endless pipe was read into memory first.
		b, err := io.ReadAll(io.LimitReader(os.Stdin, maxPubPayload+1))
		if err != nil {
			return nil, runtimeError(fmt.Errorf("read stdin: %w", err))
		}
		if len(b) > maxPubPayload {
			return nil, usageError(fmt.Errorf("stdin holds more than %d bytes (64 MiB), more than any NATS message may (server.max_payload is at most 64MiB): nothing was published", maxPubPayload))
		}
		msg.Data = b
	default:
		msg.Data = []byte(data)
	}
	for _, h := range c.StringSlice("header") {
		k, v, ok := strings.Cut(h, ":")
		name := strings.TrimSpace(k)
		if !ok || name == "" {
			return nil, usageError(fmt.Errorf("--header %q: use Name:Value", h))
		}
		if strings.IndexFunc(name, func(r rune) bool { return r <= ' ' || r >= 0x7f }) >= 0 {
			// nats.go would send it, and the publish would fail with
			// "nats: message could not decode headers".
			return nil, usageError(fmt.Errorf("--header %q: the name %q holds a blank or a control character; use a name such as X-Order-Id", h, name))
		}
		msg.Header.Add(name, strings.TrimSpace(v))
	}
	return msg, nil
}

// pubAckWait is how long holdfast pub waits for each PubAck. A publish
// whose request reached a stream leader that lost its quorum, or died,
// is never answered: without a limit the asynchronous publishes of
// --count would wait forever.
const pubAckWait = 10 * time.Second

// A single publish that no stream answered ("no responders": nothing
// stored) is sent again every pubRetryWait, pubRetries times: a stream
// leader's election after its node died can take 9 s and more
// (nats-server's election timeout is random between 4 and 9 s), and the
// retries outlast it. The asynchronous publishes of --count are not
// retried (nats.go arms no PubAck timeout on a retry).
const (
	pubRetryWait = 250 * time.Millisecond
	pubRetries   = 48 // 12 s
)

// publishOne publishes msg and waits up to pubAckWait for its PubAck.
// No responders means nothing took the message: it is sent again every
// pubRetryWait, pubRetries times, while a stream leader may be being
// elected.
func publishOne(ctx context.Context, js jetstream.JetStream, msg *nats.Msg) (*jetstream.PubAck, error) {
	for attempt := 0; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, pubAckWait)
		ack, err := js.PublishMsg(actx, msg, jetstream.WithRetryAttempts(0))
		cancel()
		if err == nil || !errors.Is(err, jetstream.ErrNoStreamResponse) || attempt == pubRetries {
			return ack, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(pubRetryWait):
		}
	}
}

// publishMany publishes msg count times, at most pubWindow awaiting their
// PubAck at once, and reports what was stored. It stops at the first
// failure: every message reported stored got its PubAck.
func publishMany(ctx context.Context, c *cli.Context, js jetstream.JetStream, msg *nats.Msg, id string, count int, explain func(error) error) error {
	const pubWindow = 256
	t := &pubTally{progress: isTerminal(os.Stderr), count: count}
	pending := make([]jetstream.PubAckFuture, 0, pubWindow)
	for i := 1; i <= count; i++ {
		m := nats.NewMsg(msg.Subject)
		m.Data = msg.Data
		for k, v := range msg.Header {
			m.Header[k] = v
		}
		if id != "" {
			m.Header.Set(nats.MsgIdHdr, id+"-"+strconv.Itoa(i))
		}
		f, err := js.PublishMsgAsync(m)
		if err == nil {
			pending = append(pending, f)
		}
		if err == nil && len(pending) < pubWindow && i < count {
			continue
		}
		if serr := t.settle(ctx, pending); err == nil {
			err = serr
		}
		pending = pending[:0]
		if err != nil {
			if t.progress {
				fmt.Fprintln(os.Stderr)
			}
			return runtimeError(fmt.Errorf("publish to %s failed after %d stored: %w", msg.Subject, t.stored, explain(err)))
		}
	}
	if t.progress {
		fmt.Fprintln(os.Stderr)
	}
	t.print(c.App.Writer)
	return nil
}

// pubTally counts the PubAcks of publishMany.
type pubTally struct {
	progress     bool
	count        int
	stored, dups int
	first, last  uint64
	stream       string
}

// settle waits for every PubAck of pending, also after a failure: the
// later messages were sent, and those stored count in "failed after K
// stored". It returns the first failure.
func (t *pubTally) settle(ctx context.Context, pending []jetstream.PubAckFuture) error {
	var failed error
	for _, f := range pending {
		select {
		case ack := <-f.Ok():
			if ack.Duplicate {
				t.dups++
				continue
			}
			t.stored++
			t.stream = ack.Stream
			if t.first == 0 {
				t.first = ack.Sequence
			}
			t.last = max(t.last, ack.Sequence)
		case err := <-f.Err():
			if failed == nil {
				failed = err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if failed == nil && t.progress {
		fmt.Fprintf(os.Stderr, "\rpublished %d/%d", t.stored+t.dups, t.count)
	}
	return failed
}

// print writes the summary line of publishMany.
func (t *pubTally) print(w io.Writer) {
	if t.stored > 0 {
		fmt.Fprintf(w, "stored %d message(s) in %s as seq %d..%d", t.stored, t.stream, t.first, t.last)
	} else {
		fmt.Fprint(w, "stored 0 messages")
	}
	if t.dups > 0 {
		fmt.Fprintf(w, ", %d duplicate(s) not stored again", t.dups)
	}
	fmt.Fprintln(w)
}

// retryAdvice says how to publish again after a publish that may or may
// not be stored, without storing it twice.
func retryAdvice(id string, count int) string {
	switch {
	case id == "":
		return "publishing it again may store it twice: publish with --id ID (its Nats-Msg-Id), and the stream stores a message with an id it holds once within its duplicate_window"
	case count > 1:
		return "run it again with the same --id and --count: the messages already stored are not stored again within the stream's duplicate_window"
	}
	return "publish again with the same --id, which the stream stores once within its duplicate_window"
}

// explainPubError says what a failed publish means and what to do, which
// nats.go words for a programmer: no acknowledgement in time (the message
// may or may not be stored), no stream takes the subject or none answers
// ("no response from stream": nothing stored), and a message over the
// server's max_payload ("maximum payload exceeded"). id is the message's
// Nats-Msg-Id (with count > 1, the --id the ids are made of), or "".
func explainPubError(cfg *config.Config, nc *nats.Conn, msg *nats.Msg, id string, count int, err error) error {
	switch {
	case errors.Is(err, nats.ErrPermissionViolation):
		return fmt.Errorf("%w: the server refused it, so it was not stored: this connection's user may not publish to %s "+
			"(its [auth.users.NAME] publish_allow or publish_deny, or a subject only holdfast itself may publish to, such as dlq.>); "+
			"publish as a user allowed that subject, or to a subject of a stream", err, msg.Subject)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, jetstream.ErrAsyncPublishTimeout), errors.Is(err, nats.ErrTimeout):
		return fmt.Errorf("%w: no acknowledgement within %s, so the message may or may not be stored: the stream's leader did not answer "+
			"(in a cluster: a leader being elected, or this node without its quorum; holdfast status says which); "+
			"%s", err, pubAckWait, retryAdvice(id, count))
	case errors.Is(err, jetstream.ErrNoStreamResponse):
		var streams []string
		for _, name := range cfg.StreamNames() {
			streams = append(streams, fmt.Sprintf("%s (%s)", name, strings.Join(cfg.Streams[name].Subjects, ", ")))
		}
		return fmt.Errorf("%w: no stream stores subject %s, so it was not stored; the config's streams take: %s (is holdfast running with this config? pick a subject of one of them, or add it to a stream's subjects; in a cluster, the stream may have no leader this node reaches: a single publish is tried for %s, and holdfast status lists the leaders)",
			err, msg.Subject, strings.Join(streams, "; "), pubRetries*pubRetryWait)
	case errors.Is(err, nats.ErrMaxPayload):
		size := len(msg.Data)
		for k, vs := range msg.Header {
			for _, v := range vs {
				size += len(k) + len(v) + 4
			}
		}
		return fmt.Errorf("%w: the message is about %d bytes with its headers, the server takes at most %d (server.max_payload); it was not stored", err, size, nc.MaxPayload())
	}
	return err
}
