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

// ClusterSettling reports whether code is a JetStream API error code a
// cluster answers while it settles (a stream or meta leader being
// elected, peers joining, a peer briefly counted offline), as opposed to a
// refusal of the request itself. On a single node the same codes are
// refusals (insufficient resources is a store limit): ask this only of a
// clustered server.
func ClusterSettling(code uint16) bool {
	switch code {
	case 10008, // JetStream system temporarily unavailable
		10009, // cluster can not handle request (no leader)
		10023, // insufficient resources (peers not all known yet)
		10005: // no suitable peers for placement
		return true
	}
	return false
}

// Transient reports an error that passes: a request the server did not
// answer in time, and, of a clustered server, what a JetStream cluster
// answers while it settles (ClusterSettling), as opposed to a refusal of
// the request itself. On one node those API errors are refusals.
func Transient(err error, clustered bool) bool {
	if Late(err) {
		return true
	}
	var apiErr *jetstream.APIError
	return clustered && errors.As(err, &apiErr) && ClusterSettling(uint16(apiErr.ErrorCode))
}

// NoResponders reports whether m is the server's "no responders" status
// (nothing subscribed to what m answers), as it arrives on a plain
// subscription; nats.go's Request turns it into nats.ErrNoResponders.
func NoResponders(m *nats.Msg) bool {
	return len(m.Data) == 0 && m.Header.Get("Status") == "503"
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
