package settle

import (
	"context"
	"errors"
	"testing"
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
