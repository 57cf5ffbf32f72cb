package daemon

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/internal/configtest"
	"github.com/holdfast-io/holdfast/internal/natstest"
)

// TestStatusSlowStreamIsNotMissing: a server that does not answer the
// info requests of ORDERS_DLQ and WORKER1 in time (as a busy server, or a
// cluster whose stream leader just died) leaves them unknown, not
// missing, and the streams that answer are still read. WORKER1's dead
// letters are not counted in the dead-letter stream that did not answer
// (another 5 s, and a second problem for the same cause).
func TestStatusSlowStreamIsNotMissing(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	js := natstest.JetStream(t, nc)
	natstest.CreateStream(t, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.*"}})
	natstest.CreateStream(t, js, jetstream.StreamConfig{Name: "ORDERS_DLQ", Subjects: []string{"dlq.WORKER1.>"}})
	natstest.CreateOrUpdateConsumer(t, js, "ORDERS", jetstream.ConsumerConfig{Durable: "WORKER1", AckPolicy: jetstream.AckExplicitPolicy})

	// The client's JetStream API goes through SLOW.API, which passes every
	// request on but those about ORDERS_DLQ and WORKER1.
	silent := map[string]bool{"STREAM.INFO.ORDERS_DLQ": true, "CONSUMER.INFO.ORDERS.WORKER1": true}
	if _, err := nc.Subscribe("SLOW.API.>", func(m *nats.Msg) {
		api := strings.TrimPrefix(m.Subject, "SLOW.API.")
		if silent[api] {
			return
		}
		if resp, err := nc.Request("$JS.API."+api, m.Data, 5*time.Second); err == nil {
			m.Respond(resp.Data)
		}
	}); err != nil {
		t.Fatal(err)
	}
	slow, err := jetstream.NewWithAPIPrefix(nc, "SLOW.API")
	if err != nil {
		t.Fatal(err)
	}

	out := CollectStatus(natstest.Context(t), configtest.Default(t), natstest.Connect(t, s), slow)
	byName := statusByName(t, out)
	for _, name := range []string{"ORDERS_DLQ", "WORKER1"} {
		st := byName[name]
		if st["exists"] != false || st["unknown"] != true || st["error"] != "no answer within 5s" {
			t.Errorf("%s: exists %v, unknown %v, error %q; want false, true, \"no answer within 5s\"", name, st["exists"], st["unknown"], st["error"])
		}
	}
	if st := byName["ORDERS"]; st["exists"] != true {
		t.Errorf("ORDERS, which answers: exists %v, error %v; want it read", st["exists"], st["error"])
	}
	for _, p := range out.Problems {
		if strings.HasPrefix(p, "dead letters of WORKER1") {
			t.Errorf("problem %q: WORKER1's dead letters counted in ORDERS_DLQ, which did not answer", p)
		}
	}
}

// statusByName is out as `holdfast status --json` and the status page
// read it: each stream and consumer by name.
func statusByName(t *testing.T, out *ClientStatus) map[string]map[string]any {
	t.Helper()
	data, err := json.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct{ Streams, Consumers []map[string]any }
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	byName := map[string]map[string]any{}
	for _, s := range append(doc.Streams, doc.Consumers...) {
		byName[s["name"].(string)] = s
	}
	return byName
}
