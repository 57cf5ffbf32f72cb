package settle

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestRetry(t *testing.T) {
	refused := errors.New("refused")
	calls, retried := 0, 0
	err := Retry(context.Background(), Late, func(int, error) { retried++ }, func() error {
		calls++
		if calls == 1 {
			return context.DeadlineExceeded // late: asked again
		}
		return refused // not transient: returned at once
	})
	if !errors.Is(err, refused) || calls != 2 || retried != 1 {
		t.Fatalf("Retry = %v after %d calls, %d retries; want refused after 2 calls, 1 retry", err, calls, retried)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	calls = 0
	err = Retry(ctx, Late, nil, func() error { calls++; return context.DeadlineExceeded })
	if !errors.Is(err, context.DeadlineExceeded) || calls != 1 {
		t.Fatalf("Retry with an ended context = %v after %d calls, want the late error after 1", err, calls)
	}
}

// A refusal (10023 is insufficient resources on one node: a store limit)
// is not tried again; in a settling cluster it passes.
func TestTransient(t *testing.T) {
	if Transient(&jetstream.APIError{ErrorCode: 10023}, false) {
		t.Error("insufficient resources on one node taken for transient")
	}
	if !Transient(&jetstream.APIError{ErrorCode: 10023}, true) {
		t.Error("insufficient resources in a settling cluster not taken for transient")
	}
	if !Transient(fmt.Errorf("claim: %w", nats.ErrNoResponders), false) {
		t.Error("a wrapped no-responders not taken for transient")
	}
	if Transient(errors.New("consumer already exists"), true) {
		t.Error("a plain error taken for transient")
	}
}
