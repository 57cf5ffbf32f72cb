package daemon

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/jsm.go/api"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/internal/natstest"
)

// TestRestoreWhoseClientDiedEnds: a restore client killed (kill -9, a
// lost connection) before it sent any data leaves the stream deleted, and
// nats-server 2.15.2 gives the restore up 5 s later without announcing
// its end. holdfast waited for that announcement up to 30 min before it
// created the stream again: ORDERS missing, every publish failing, the
// health unhealthy. It now sees that the server's restore is gone.
func TestRestoreWhoseClientDiedEnds(t *testing.T) {
	d := openDefault(t)
	nc := natstest.Connect(t, d.srv.NATS())
	js := natstest.JetStream(t, nc)
	ctx := natstest.Context(t)
	s, err := js.Stream(ctx, "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	var scfg api.StreamConfig
	raw, _ := json.Marshal(s.CachedInfo().Config)
	if err := json.Unmarshal(raw, &scfg); err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(ctx, "ORDERS"); err != nil {
		t.Fatal(err)
	}
	// The restore request, and then nothing: the client died.
	req, _ := json.Marshal(api.JSApiStreamRestoreRequest{Config: scfg, State: api.StreamState{}})
	msg, err := nc.Request("$JS.API.STREAM.RESTORE.ORDERS", req, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var resp api.JSApiStreamRestoreResponse
	if err := json.Unmarshal(msg.Data, &resp); err != nil || resp.IsError() || resp.DeliverSubject == "" {
		t.Fatalf("restore request: %s, %v", msg.Data, err)
	}
	natstest.CheckFor(t, 30*time.Second, 200*time.Millisecond, func() error {
		if _, err := js.Stream(natstest.Context(t), "ORDERS"); err != nil {
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				return errors.New("ORDERS is still missing after its restore's client died")
			}
			return err
		}
		return nil
	})
	if _, err := js.Publish(ctx, "orders.created", nil); err != nil {
		t.Fatal(err)
	}
}
