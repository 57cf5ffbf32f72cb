package forward_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/embedded"
	"github.com/holdfast-io/holdfast/embedded/bootstrap"
	"github.com/holdfast-io/holdfast/internal/natstest"
	"github.com/holdfast-io/holdfast/pipeline"
	"github.com/holdfast-io/holdfast/pipeline/handler"
)

// The forward tests run the forward handler in real workers: this is the
// part of package pipeline's test environment they use.

// testEnv is a real embedded server on t.TempDir() with the ORDERS stream,
// WORKER1 consumer and ORDERS_DLQ bootstrapped.
type testEnv struct {
	t   *testing.T
	srv *embedded.Server
	js  jetstream.JetStream
	cfg *config.Config
}

func startEnv(t *testing.T, tweak func(*config.ConsumerConfig)) *testEnv {
	t.Helper()
	return startEnvWith(t, func(cfg *config.Config) {
		if tweak != nil {
			tweak(cfg.Consumers[config.DefaultConsumerName])
		}
	})
}

// startEnvWith is startEnv with the whole config changed by tweak.
func startEnvWith(t *testing.T, tweak func(*config.Config)) *testEnv {
	t.Helper()
	cfg := config.DefaultConfig()
	cfg.Server.Port = -1
	cfg.HTTP.Listen = ""
	cfg.JetStream.StoreDir = t.TempDir()
	cc := cfg.Consumers[config.DefaultConsumerName]
	cc.AckWait = config.Dur(5 * time.Second)
	cc.Backoff = []config.Duration{config.Dur(100 * time.Millisecond)}
	if tweak != nil {
		tweak(cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	srv := embedded.New(cfg, log)
	ctx := context.Background()
	if err := srv.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close(context.Background()) })
	if err := bootstrap.Apply(ctx, srv.JetStream(), cfg, log); err != nil {
		t.Fatal(err)
	}
	return &testEnv{t: t, srv: srv, js: srv.JetStream(), cfg: cfg}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

func (e *testEnv) workers(h handler.Handler, n int) *pipeline.Workers {
	e.t.Helper()
	return e.workersWith(h, n, nil)
}

// workersWith is workers with the options changed by tweak (may be nil).
func (e *testEnv) workersWith(h handler.Handler, n int, tweak func(*pipeline.ConsumerOptions)) *pipeline.Workers {
	e.t.Helper()
	cc := e.cfg.Consumers[config.DefaultConsumerName]
	var backoff []time.Duration
	for _, b := range cc.Backoff {
		backoff = append(backoff, b.Duration)
	}
	opts := pipeline.ConsumerOptions{
		Stream: "ORDERS", Consumer: config.DefaultConsumerName, Workers: n,
		AckWait: cc.AckWait.Duration, MaxDeliver: cc.MaxDeliver, Backoff: backoff,
		DeadLetter: cc.DeadLetter, Handler: h,
	}
	if tweak != nil {
		tweak(&opts)
	}
	w := pipeline.NewWorkers(e.js, e.srv.Conn(), opts, slog.New(slog.NewTextHandler(io.Discard, nil)))
	w.ShutdownTimeout = 2 * time.Second
	if err := w.Open(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { w.Close(context.Background()) })
	return w
}

func (e *testEnv) publish(subject, data string, hdr nats.Header) uint64 {
	e.t.Helper()
	m := nats.NewMsg(subject)
	m.Data = []byte(data)
	for k, v := range hdr {
		m.Header[k] = v
	}
	ack, err := e.js.PublishMsg(context.Background(), m)
	if err != nil {
		e.t.Fatal(err)
	}
	return ack.Sequence
}

// consumerInfo returns the info of the consumer the workers pull from.
func (e *testEnv) consumerInfo() *jetstream.ConsumerInfo {
	e.t.Helper()
	return natstest.ConsumerInfo(e.t, e.js, "ORDERS", config.DefaultConsumerName)
}

func (e *testEnv) dlqCount() uint64 {
	e.t.Helper()
	s, err := e.js.Stream(context.Background(), "ORDERS_DLQ")
	if err != nil {
		return 0
	}
	info, err := s.Info(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	return info.State.Msgs
}

func (e *testEnv) dlqMsg(seq uint64) *jetstream.RawStreamMsg {
	e.t.Helper()
	s, err := e.js.Stream(context.Background(), "ORDERS_DLQ")
	if err != nil {
		e.t.Fatal(err)
	}
	m, err := s.GetMsg(context.Background(), seq)
	if err != nil {
		e.t.Fatal(err)
	}
	return m
}
