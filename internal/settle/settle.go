// Package settle retries a JetStream request that the server answered
// after the client's timeout: a server busy with a slow disk, or a
// cluster electing a leader, answers it a moment later. holdfast's
// start-up (bootstrap in embedded, the workers' consumer lookup in
// pipeline) asks again instead of stopping.
package settle

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Timeout bounds how long Retry asks again.
const Timeout = 2 * time.Minute

// interval is the pause between two attempts.
const interval = time.Second

// Late reports whether err is a request nobody answered in time: the
// client's timeout, or no responder yet.
func Late(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse)
}

// Retry calls f until it returns nil or an error transient does not
// accept, for up to Timeout, once a second; before each new attempt it
// calls retrying (may be nil) with the attempt that failed and its error.
// It returns f's last error, also when ctx ends.
func Retry(ctx context.Context, transient func(error) bool, retrying func(attempt int, err error), f func() error) error {
	deadline := time.Now().Add(Timeout)
	for attempt := 1; ; attempt++ {
		err := f()
		if err == nil || !transient(err) || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		if retrying != nil {
			retrying(attempt, err)
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(interval):
		}
	}
}
