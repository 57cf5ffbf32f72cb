package pipeline_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/internal/natstest"
	"github.com/holdfast-io/holdfast/pipeline"
	"github.com/holdfast-io/holdfast/pipeline/handler"
)

// TestHTTPWorkersCloseTheirConnections: closing the workers (a stop, or a
// reload that restarts them with a new handler) closes the connections
// their http handler kept alive. They used to stay open, idle, until the
// idle timeout (90s): 4 connections per reload of a consumer with 4
// workers.
func TestHTTPWorkersCloseTheirConnections(t *testing.T) {
	var open atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			open.Add(1)
		case http.StateClosed, http.StateHijacked:
			open.Add(-1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	ns := natstest.RunServer(t)
	nc := natstest.Connect(t, ns)
	js := natstest.JetStream(t, nc)
	ctx := natstest.Context(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.*"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{Durable: "WORKER1", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	h, err := handler.NewHTTP(handler.HTTPOptions{URL: srv.URL, Timeout: 5 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := pipeline.NewWorkers(js, nc, pipeline.ConsumerOptions{Stream: "ORDERS", Consumer: "WORKER1", Workers: 4, MaxDeliver: 5, Handler: h}, nil)
	if err := w.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	for i := range 40 {
		if _, err := js.Publish(ctx, "orders.created", []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	natstest.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		if n := w.Stats().Acked.Load(); n != 40 {
			return fmt.Errorf("%d of 40 acked", n)
		}
		return nil
	})
	if open.Load() == 0 {
		t.Fatal("no connection kept alive: nothing to check")
	}
	if err := w.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if n := open.Load(); n != 0 {
			return fmt.Errorf("%d connections to the endpoint still open after the workers closed", n)
		}
		return nil
	})
}
