// Package pipelinetest holds the test environment of the packages that run
// holdfast's workers: a real embedded holdfast server on a temporary store
// with the default config (stream ORDERS, consumer WORKER1, dead-letter
// stream ORDERS_DLQ) bootstrapped, and workers on that consumer.
//
// It is imported by _test.go files only, and only by packages it does not
// import itself (pipeline's external tests, pipeline/forward,
// pipeline/monitor). Everything it starts ends with the test (t.Cleanup).
package pipelinetest

import (
	"context"
	"io"
	"log/slog"
	"strings"
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

// Stream, DLQ and Consumer name the stream, its dead-letter stream and the
// consumer of the default config that the environment bootstraps.
const (
	Stream   = "ORDERS"
	DLQ      = "ORDERS_DLQ"
	Consumer = config.DefaultConsumerName
)

// Env is a real embedded server on t.TempDir() with the ORDERS stream,
// WORKER1 consumer and ORDERS_DLQ bootstrapped from Cfg.
type Env struct {
	T   *testing.T          // the test the environment ends with
	Srv *embedded.Server    // the server, closed when the test ends
	JS  jetstream.JetStream // the server's in-process JetStream client
	Cfg *config.Config      // the validated config the server runs
}

// Start starts an Env from the default config with a random client port,
// no HTTP listener, an ack wait of 5s and one backoff step of 100ms on
// WORKER1, changed by tweak (may be nil).
func Start(t *testing.T, tweak func(*config.ConsumerConfig)) *Env {
	t.Helper()
	return StartWith(t, func(cfg *config.Config) {
		if tweak != nil {
			tweak(cfg.Consumers[Consumer])
		}
	})
}

// StartWith is Start with the whole config changed by tweak (may be nil).
// The server logs nothing, or into the test's log at debug level under
// go test -v.
func StartWith(t *testing.T, tweak func(*config.Config)) *Env {
	t.Helper()
	cfg := config.DefaultConfig()
	cfg.Server.Port = -1
	cfg.HTTP.Listen = ""
	cfg.JetStream.StoreDir = t.TempDir()
	cc := cfg.Consumers[Consumer]
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
	return &Env{T: t, Srv: srv, JS: srv.JetStream(), Cfg: cfg}
}

// testWriter writes each line into the test's log, without its newline
// (t.Log adds one: with both, every line was followed by an empty one,
// and a failed test's message scrolled out of a CI excerpt twice as fast).
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// Workers opens n workers running h on WORKER1 with the consumer's
// settings from Cfg; they are closed when the test ends.
func (e *Env) Workers(h handler.Handler, n int) *pipeline.Workers {
	e.T.Helper()
	return e.WorkersWith(h, n, nil)
}

// WorkersWith is Workers with the options changed by tweak (may be nil).
// They log into the test's log, which a failed test prints.
func (e *Env) WorkersWith(h handler.Handler, n int, tweak func(*pipeline.ConsumerOptions)) *pipeline.Workers {
	e.T.Helper()
	opts := e.Options(h, n)
	if tweak != nil {
		tweak(&opts)
	}
	return e.OpenWorkers(opts, slog.New(slog.NewTextHandler(testWriter{e.T}, nil)))
}

// Options returns the options of n workers running h on WORKER1, with the
// ack wait, max deliver, backoff and dead-letter settings of Cfg.
func (e *Env) Options(h handler.Handler, n int) pipeline.ConsumerOptions {
	cc := e.Cfg.Consumers[Consumer]
	var backoff []time.Duration
	for _, b := range cc.Backoff {
		backoff = append(backoff, b.Duration)
	}
	return pipeline.ConsumerOptions{
		Stream: Stream, Consumer: Consumer, Workers: n,
		AckWait: cc.AckWait.Duration, MaxDeliver: cc.MaxDeliver, Backoff: backoff,
		DeadLetter: cc.DeadLetter, Handler: h,
	}
}

// OpenWorkers opens workers with opts that log to log, with a shutdown
// timeout of 2s; they are closed when the test ends.
func (e *Env) OpenWorkers(opts pipeline.ConsumerOptions, log *slog.Logger) *pipeline.Workers {
	e.T.Helper()
	w := pipeline.NewWorkers(e.JS, e.Srv.Conn(), opts, log)
	w.ShutdownTimeout = 2 * time.Second
	if err := w.Open(context.Background()); err != nil {
		e.T.Fatal(err)
	}
	e.T.Cleanup(func() { w.Close(context.Background()) })
	return w
}

// Publish stores a message with data and the headers hdr (may be nil) on
// subject and returns its stream sequence.
func (e *Env) Publish(subject, data string, hdr nats.Header) uint64 {
	e.T.Helper()
	m := nats.NewMsg(subject)
	m.Data = []byte(data)
	for k, v := range hdr {
		m.Header[k] = v
	}
	ack, err := e.JS.PublishMsg(natstest.Context(e.T), m)
	if err != nil {
		e.T.Fatal(err)
	}
	return ack.Sequence
}

// ConsumerInfo returns the info of the consumer the workers pull from.
func (e *Env) ConsumerInfo() *jetstream.ConsumerInfo {
	e.T.Helper()
	return natstest.ConsumerInfo(e.T, e.JS, Stream, Consumer)
}

// DLQCount returns the number of messages in the dead-letter stream, 0 if
// there is no such stream.
func (e *Env) DLQCount() uint64 {
	e.T.Helper()
	ctx := natstest.Context(e.T)
	s, err := e.JS.Stream(ctx, DLQ)
	if err != nil {
		return 0
	}
	info, err := s.Info(ctx)
	if err != nil {
		e.T.Fatal(err)
	}
	return info.State.Msgs
}

// DLQMsg returns the message at seq of the dead-letter stream. Its
// requests may take 30 s (natstest.Context), not the client's default 5:
// under -race on a loaded machine the server took 3.8 s to answer the
// get of a message near max_payload, and the get failed (a CI failure).
func (e *Env) DLQMsg(seq uint64) *jetstream.RawStreamMsg {
	e.T.Helper()
	ctx := natstest.Context(e.T)
	s, err := e.JS.Stream(ctx, DLQ)
	if err != nil {
		e.T.Fatal(err)
	}
	m, err := s.GetMsg(ctx, seq)
	if err != nil {
		e.T.Fatal(err)
	}
	return m
}
