package handler_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/holdfast-io/holdfast/pipeline/handler"
)

// errInventoryDown stands in for a dependency that is briefly unavailable.
var errInventoryDown = errors.New("inventory service unavailable")

// reserve stands in for a team's business logic.
func reserve(sku string, qty int) error {
	if sku == "OUT-OF-REACH" {
		return errInventoryDown
	}
	return nil
}

// A team that builds its own binary around the packages writes its handler
// in Go. The verdict decides what happens to the message: Ok acknowledges
// it, RetryLater redelivers it after the consumer's backoff (or after
// RetryAfter, when set), Fail dead-letters it at once.
func ExampleFunc() {
	type order struct {
		SKU string `json:"sku"`
		Qty int    `json:"qty"`
	}
	reserveOrder := handler.Func(func(ctx context.Context, msg *handler.Message) handler.Result {
		var o order
		if err := json.Unmarshal(msg.Data, &o); err != nil {
			// Redelivering a payload that cannot be parsed never helps.
			return handler.Fail("bad order: " + err.Error())
		}
		if o.Qty <= 0 {
			return handler.Fail(fmt.Sprintf("bad order: quantity %d", o.Qty))
		}
		if err := reserve(o.SKU, o.Qty); errors.Is(err, errInventoryDown) {
			r := handler.RetryLater(err.Error())
			r.RetryAfter = 30 * time.Second
			return r
		}
		return handler.Ok()
	})

	for i, payload := range []string{
		`{"sku":"A-1","qty":2}`,
		`{"sku":"OUT-OF-REACH","qty":1}`,
		`{"sku":"A-1","qty":0}`,
		`not json`,
	} {
		msg := &handler.Message{
			Subject:        "orders.created",
			Stream:         "ORDERS",
			Consumer:       "WORKER1",
			Sequence:       uint64(i + 1),
			Delivery:       1,
			IdempotencyKey: fmt.Sprintf("ORDERS:%d", i+1),
			Data:           []byte(payload),
		}
		r := reserveOrder.Handle(context.Background(), msg)
		fmt.Printf("seq %d: %s", msg.Sequence, r.Outcome)
		if r.Reason != "" {
			fmt.Printf(" (%s)", r.Reason)
		}
		if r.RetryAfter > 0 {
			fmt.Printf(" after %s", r.RetryAfter)
		}
		fmt.Println()
	}
	// Output:
	// seq 1: success
	// seq 2: retry (inventory service unavailable) after 30s
	// seq 3: permanent (bad order: quantity 0)
	// seq 4: permanent (bad order: invalid character 'o' in literal null (expecting 'u'))
}
