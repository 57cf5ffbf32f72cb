// Package handler is what a worker hands a message to: the Handler
// contract (Message in, Result out) and the handlers holdfast ships, exec,
// http and log. A handler returns a verdict and never settles the message
// itself; the workers of package pipeline acknowledge, retry or
// dead-letter it.
package handler

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
)

// Message is what a Handler sees of one delivery.
type Message struct {
	Subject  string
	Stream   string
	Consumer string
	// Sequence is the message's stream sequence.
	Sequence uint64
	// Delivery is the delivery attempt, starting at 1.
	Delivery uint64
	// IdempotencyKey is the Nats-Msg-Id header when set, else "STREAM:seq".
	// It is the same on every delivery of the message.
	IdempotencyKey string
	Header         nats.Header
	Data           []byte
	// Published is when the server stored the message.
	Published time.Time
	// Pending is how many messages of the consumer were waiting behind
	// this one when it was delivered (0 when not known).
	Pending uint64
	// OutOfBand is set on a message handed over outside the consumer's
	// order: a dead letter replayed to the handler, a message parked by
	// an interrupted last delivery and resumed at start. A handler that
	// keeps track of the sequences it handled in order (the forward
	// handler's position on the hub) must not take it as one of them.
	OutOfBand bool
	// StreamCreated, when set, is when the stream that stored the message
	// was created: a replayed dead letter's stream may have been deleted
	// and created again since. Zero means the stream as it is now.
	StreamCreated time.Time
}

// Outcome is a handler's verdict on one message.
type Outcome int

const (
	// Success acknowledges the message.
	Success Outcome = iota
	// Retry redelivers the message after the next backoff delay, or after
	// Result.RetryAfter when the handler knows better (HTTP Retry-After).
	Retry
	// Permanent dead-letters the message at once.
	Permanent
)

func (o Outcome) String() string {
	switch o {
	case Success:
		return "success"
	case Retry:
		return "retry"
	case Permanent:
		return "permanent"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Result is what a Handler returns.
type Result struct {
	Outcome Outcome
	// Reason says why a message failed; it goes to the log and, for dead
	// letters, into the Holdfast-Error header.
	Reason string
	// RetryAfter, when positive, overrides the backoff delay for a Retry.
	RetryAfter time.Duration
}

// Ok is the result of a handler that succeeded.
func Ok() Result { return Result{Outcome: Success} }

// RetryLater is a transient failure: the message is redelivered later.
func RetryLater(reason string) Result { return Result{Outcome: Retry, Reason: reason} }

// Fail is a permanent failure: the message is dead-lettered.
func Fail(reason string) Result { return Result{Outcome: Permanent, Reason: reason} }

// Handler processes one message. It must respect ctx: when ctx is done
// (timeout or shutdown) it should stop and return; the worker then treats
// the message as a retry. Handle is called from several goroutines at once.
type Handler interface {
	Handle(ctx context.Context, msg *Message) Result
}

// BatchHandler is a Handler that can take several messages at once, in
// stream order: workers that run one worker hand it what they hold (up to
// MaxBatch) in one call, so that it can send them on together (the
// forward handler's atomic batches to the hub). It calls done once for
// each message, with its index in msgs and its Result, as soon as that is
// known: the workers settle it then.
type BatchHandler interface {
	Handler
	HandleBatch(ctx context.Context, msgs []*Message, done func(i int, r Result))
}

// MaxBatch is the most messages a BatchHandler gets at once: the server's
// largest atomic batch.
const MaxBatch = 1000

// Func adapts a function to Handler.
type Func func(ctx context.Context, msg *Message) Result

// Handle calls f.
func (f Func) Handle(ctx context.Context, msg *Message) Result { return f(ctx, msg) }
