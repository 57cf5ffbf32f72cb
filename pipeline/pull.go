package pipeline

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// puller sends a consumer's pull requests on one long-lived inbox
// subscription. nats.go's Fetch subscribes a fresh inbox for every request
// and unsubscribes it at the end; with a request per batch of a few
// hundred messages that cost bounds how fast the workers drain a stream.
// Only one request is out at a time, so every message that arrives
// belongs to it; after a request that got no answer the inbox is replaced,
// so that a late answer cannot be taken for the next one.
type puller struct {
	nc      *nats.Conn
	subject string // $JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>
	buffer  int

	sub  *nats.Subscription
	msgs chan *nats.Msg
}

// pullGrace is how long after its expiry a pull request's end (the
// server's 408) may take before the request counts as unanswered.
const pullGrace = 5 * time.Second

func newPuller(js jetstream.JetStream, stream, consumer string, buffer int) (*puller, error) {
	p := &puller{nc: js.Conn(), subject: apiPrefix(js.Options()) + "CONSUMER.MSG.NEXT." + stream + "." + consumer, buffer: buffer}
	if err := p.subscribe(); err != nil {
		return nil, err
	}
	return p, nil
}

// apiPrefix is the JetStream API prefix js uses, with its trailing dot.
func apiPrefix(o jetstream.JetStreamOptions) string {
	switch {
	case o.APIPrefix != "":
		if o.APIPrefix[len(o.APIPrefix)-1] != '.' {
			return o.APIPrefix + "."
		}
		return o.APIPrefix
	case o.Domain != "":
		return "$JS." + o.Domain + ".API."
	}
	return jetstream.DefaultAPIPrefix
}

func (p *puller) subscribe() error {
	msgs := make(chan *nats.Msg, p.buffer)
	sub, err := p.nc.ChanSubscribe(p.nc.NewInbox(), msgs)
	if err != nil {
		return fmt.Errorf("cannot subscribe for pulled messages: %w", err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	p.sub, p.msgs = sub, msgs
	return nil
}

// reset replaces the inbox: whatever the server still sends to the old one
// is dropped (and redelivered after ack_wait).
func (p *puller) reset() error {
	_ = p.sub.Unsubscribe()
	return p.subscribe()
}

func (p *puller) close() { _ = p.sub.Unsubscribe() }

// pull asks for n messages of at most maxBytes in all (0: no limit),
// waiting at most wait for them, and calls deliver for each one that
// arrives until n did or the server ended the request. It returns how many
// it delivered.
//
// With maxBytes the server ends the request before a message that would
// exceed what is left of it (409 "Message Size Exceeds MaxBytes"; the
// message stays for the next request), or silently after one that uses
// it up exactly: it counts a message as nats.Msg.Size counts one received
// (subject, reply, header block and data), and so does pull.
func (p *puller) pull(ctx context.Context, n, maxBytes int, wait time.Duration, deliver func(jetstream.Msg)) (int, error) {
	req := `{"batch":` + strconv.Itoa(n) + `,"expires":` + strconv.FormatInt(wait.Nanoseconds(), 10)
	if maxBytes > 0 {
		req += `,"max_bytes":` + strconv.Itoa(maxBytes)
	}
	left := maxBytes
	if err := p.nc.PublishRequest(p.subject, p.sub.Subject, []byte(req+"}")); err != nil {
		return 0, fmt.Errorf("pull request: %w", err)
	}
	timer := time.NewTimer(wait + pullGrace)
	defer timer.Stop()
	got := 0
	for got < n {
		select {
		case m := <-p.msgs:
			if len(m.Data) == 0 && m.Header.Get("Status") != "" {
				switch code := m.Header.Get("Status"); code {
				case "100": // heartbeat
					continue
				case "404", "408": // no messages, or the request expired
					return got, nil
				case "409":
					switch d := m.Header.Get("Description"); {
					case strings.Contains(d, "Batch Completed"):
						// A request with max_bytes that got its n messages
						// with bytes to spare ends with this, after its last
						// message: pull returned then, so it is an earlier
						// request's end.
						continue
					case maxBytes > 0 && strings.Contains(d, "Exceeds MaxBytes"):
						return got, nil // the next message did not fit
					}
					fallthrough
				default:
					err := fmt.Errorf("pull request ended by the server: %s %s", code, m.Header.Get("Description"))
					return got, errors.Join(err, p.reset())
				}
			}
			deliver(&pulledMsg{msg: m, nc: p.nc})
			got++
			if maxBytes > 0 {
				if left -= m.Size(); left <= 0 {
					return got, nil // used up: the server ends the request without a word
				}
			}
		case <-timer.C:
			return got, errors.Join(errors.New("no answer to the pull request"), p.reset())
		case <-ctx.Done():
			return got, errors.Join(ctx.Err(), p.reset())
		}
	}
	return got, nil
}

// pulledMsg is a message pulled by a puller, with the acknowledgements of
// jetstream.Msg: each is a publish to its reply subject, and only one of
// them (in-progress acks aside) is sent.
type pulledMsg struct {
	msg   *nats.Msg
	nc    *nats.Conn
	mu    sync.Mutex
	acked bool
}

var _ jetstream.Msg = (*pulledMsg)(nil)

func (m *pulledMsg) Metadata() (*jetstream.MsgMetadata, error) {
	md, err := m.msg.Metadata()
	if err != nil {
		return nil, err
	}
	return &jetstream.MsgMetadata{
		Sequence:     jetstream.SequencePair{Stream: md.Sequence.Stream, Consumer: md.Sequence.Consumer},
		NumDelivered: md.NumDelivered,
		NumPending:   md.NumPending,
		Timestamp:    md.Timestamp,
		Stream:       md.Stream,
		Consumer:     md.Consumer,
		Domain:       md.Domain,
	}, nil
}

func (m *pulledMsg) Data() []byte         { return m.msg.Data }
func (m *pulledMsg) Headers() nats.Header { return m.msg.Header }
func (m *pulledMsg) Subject() string      { return m.msg.Subject }
func (m *pulledMsg) Reply() string        { return m.msg.Reply }

// settle sends body as the message's one final acknowledgement (or, with
// final false, an in-progress ack); with confirm it waits, within ctx, for
// the server's confirmation.
func (m *pulledMsg) settle(ctx context.Context, confirm bool, body []byte, final bool) error {
	if m.msg.Reply == "" {
		return jetstream.ErrMsgNoReply
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.acked {
		return jetstream.ErrMsgAlreadyAckd
	}
	var err error
	if confirm {
		_, err = m.nc.RequestWithContext(ctx, m.msg.Reply, body)
	} else {
		err = m.nc.Publish(m.msg.Reply, body)
	}
	if err == nil && final {
		m.acked = true
	}
	return err
}

var (
	ackAck      = []byte("+ACK")
	ackNak      = []byte("-NAK")
	ackProgress = []byte("+WPI")
	ackTerm     = []byte("+TERM")
)

func (m *pulledMsg) Ack() error                          { return m.settle(context.Background(), false, ackAck, true) }
func (m *pulledMsg) DoubleAck(ctx context.Context) error { return m.settle(ctx, true, ackAck, true) }
func (m *pulledMsg) Nak() error                          { return m.settle(context.Background(), false, ackNak, true) }
func (m *pulledMsg) InProgress() error {
	return m.settle(context.Background(), false, ackProgress, false)
}
func (m *pulledMsg) Term() error { return m.settle(context.Background(), false, ackTerm, true) }

func (m *pulledMsg) NakWithDelay(delay time.Duration) error {
	return m.settle(context.Background(), false, fmt.Appendf(nil, `-NAK {"delay": %d}`, delay.Nanoseconds()), true)
}

func (m *pulledMsg) TermWithReason(reason string) error {
	return m.settle(context.Background(), false, fmt.Appendf(nil, "+TERM %s", reason), true)
}
