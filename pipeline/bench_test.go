package pipeline_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/embedded"
	"github.com/holdfast-io/holdfast/embedded/bootstrap"
	"github.com/holdfast-io/holdfast/pipeline"
	"github.com/holdfast-io/holdfast/pipeline/handler"
)

// The benchmarks run the real path on an embedded server on b.TempDir()
// with jetstream.sync = "2m", so they measure CPU and round trips, not the
// disk's fsync rate (`holdfast bench` measures both). Run them with
//
//	go test -run '^$' -bench . -benchmem ./pipeline/

// benchEnv is an embedded server with the ORDERS stream, the WORKER1
// consumer and ORDERS_DLQ bootstrapped.
type benchEnv struct {
	srv *embedded.Server
	js  jetstream.JetStream
	cfg *config.Config
	log *slog.Logger
}

func startBenchEnv(tb testing.TB) *benchEnv {
	tb.Helper()
	cfg := config.DefaultConfig()
	cfg.Server.Port = -1
	cfg.HTTP.Listen = ""
	cfg.JetStream.StoreDir = tb.TempDir()
	cfg.JetStream.Sync = "2m"
	st := cfg.Streams[config.DefaultStreamName]
	st.MaxMsgs = -1
	if err := cfg.Validate(); err != nil {
		tb.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	srv := embedded.New(cfg, log)
	ctx := context.Background()
	if err := srv.Open(ctx); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { srv.Close(context.Background()) })
	if err := bootstrap.Apply(ctx, srv.JetStream(), cfg, log); err != nil {
		tb.Fatal(err)
	}
	return &benchEnv{srv: srv, js: srv.JetStream(), cfg: cfg, log: log}
}

// fill stores n messages of 128 bytes on orders.created.
func (e *benchEnv) fill(tb testing.TB, n int) {
	tb.Helper()
	data := make([]byte, 128)
	for i := 0; i < n; i++ {
		if _, err := e.js.PublishAsync("orders.created", data); err != nil {
			tb.Fatal(err)
		}
	}
	select {
	case <-e.js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		tb.Fatal("publish did not complete")
	}
}

func (e *benchEnv) workers(h handler.Handler, n, prefetch int) *pipeline.Workers {
	cc := e.cfg.Consumers[config.DefaultConsumerName]
	return pipeline.NewWorkers(e.js, e.srv.Conn(), pipeline.ConsumerOptions{
		Stream:     config.DefaultStreamName,
		Consumer:   config.DefaultConsumerName,
		Workers:    n,
		AckWait:    cc.AckWait.Duration,
		MaxDeliver: cc.MaxDeliver,
		Backoff:    []time.Duration{time.Second},
		DeadLetter: cc.DeadLetter,
		Handler:    h,
		Prefetch:   prefetch,
	}, e.log)
}

// benchWaitFor polls until done reports true, failing after a minute without
// progress.
func benchWaitFor(tb testing.TB, done func() bool) {
	tb.Helper()
	deadline := time.Now().Add(time.Minute)
	for !done() {
		if time.Now().After(deadline) {
			tb.Fatal("workers did not finish in a minute")
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// runWorkers stores b.N messages, then times the workers handling and
// settling all of them; done tells when they have.
func runWorkers(b *testing.B, workers, prefetch int, h handler.Handler, done func(*pipeline.Stats, int) bool) {
	e := startBenchEnv(b)
	e.fill(b, b.N)
	w := e.workers(h, workers, prefetch)
	b.SetBytes(128)
	b.ReportAllocs()
	cpu := startCPU()
	b.ResetTimer()
	if err := w.Open(context.Background()); err != nil {
		b.Fatal(err)
	}
	benchWaitFor(b, func() bool { return done(w.Stats(), b.N) })
	b.StopTimer()
	cpu.report(b)
	_ = w.Close(context.Background())
}

// cpuClock measures the CPU time of the whole process (server, client and
// workers) over a benchmark's timed part.
type cpuClock struct {
	cpu  time.Duration
	wall time.Time
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func startCPU() cpuClock { return cpuClock{cpu: processCPU(), wall: time.Now()} }

// report adds cpu-µs/msg (the process's CPU time per message: what bounds
// throughput on a machine whose cores are busy) and cpu% (of one core).
func (c cpuClock) report(b *testing.B) {
	cpu, wall := processCPU()-c.cpu, time.Since(c.wall)
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/msg")
	b.ReportMetric(100*cpu.Seconds()/wall.Seconds(), "cpu%")
}

// BenchmarkDispatch is the success path per message: pull, build the
// Message, call a no-op handler, ack (counted once confirmed), without
// and with the default prefetch.
func BenchmarkDispatch(b *testing.B) {
	noop := handler.Func(func(context.Context, *handler.Message) handler.Result { return handler.Ok() })
	for _, prefetch := range []int{0, 256, 996} {
		for _, workers := range []int{1, 4, 16} {
			b.Run(fmt.Sprintf("workers=%d/prefetch=%d", workers, prefetch), func(b *testing.B) {
				runWorkers(b, workers, prefetch, noop, func(st *pipeline.Stats, n int) bool { return st.Acked.Load() >= uint64(n) })
			})
		}
	}
}

// BenchmarkPlainConsume is the reference for BenchmarkDispatch: what a
// plain nats.go client does in the same process with the same embedded
// server and consumer — stock `nats bench js consume`'s loop (Consume with
// a callback, batches of 500, a fire-and-forget Ack per message), timed
// until the server's ack floor covers every message. fanout=4 hands each
// message from the callback to 4 goroutines over a channel, which ack it:
// what any consumer with concurrent handlers pays.
func BenchmarkPlainConsume(b *testing.B) {
	for _, fanout := range []int{0, 4} {
		name := "callback"
		if fanout > 0 {
			name = fmt.Sprintf("fanout=%d", fanout)
		}
		b.Run(name, func(b *testing.B) { plainConsume(b, fanout) })
	}
}

func plainConsume(b *testing.B, fanout int) {
	e := startBenchEnv(b)
	e.fill(b, b.N)
	ctx := context.Background()
	cons, err := e.js.Consumer(ctx, config.DefaultStreamName, config.DefaultConsumerName)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(128)
	b.ReportAllocs()
	cpu := startCPU()
	b.ResetTimer()
	var acked atomic.Int64
	ack := func(m jetstream.Msg) {
		if err := m.Ack(); err == nil {
			acked.Add(1)
		}
	}
	handle := ack
	if fanout > 0 {
		ch := make(chan jetstream.Msg, 256)
		defer close(ch)
		for range fanout {
			go func() {
				for m := range ch {
					ack(m)
				}
			}()
		}
		handle = func(m jetstream.Msg) { ch <- m }
	}
	cc, err := cons.Consume(handle, jetstream.PullMaxMessages(500))
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Stop()
	benchWaitFor(b, func() bool {
		if acked.Load() < int64(b.N) {
			return false
		}
		ci, err := cons.Info(ctx)
		return err == nil && ci.AckFloor.Consumer >= uint64(b.N)
	})
	b.StopTimer()
	cpu.report(b)
}

// BenchmarkDeadLetter is the permanent-failure path per message: publish
// the dead letter, wait for its PubAck, then terminate the original.
func BenchmarkDeadLetter(b *testing.B) {
	fail := handler.Func(func(context.Context, *handler.Message) handler.Result { return handler.Fail("bench") })
	runWorkers(b, 4, 256, fail, func(st *pipeline.Stats, n int) bool { return st.DeadLettered.Load() >= uint64(n) })
}

// BenchmarkAck compares the ack the workers use (DoubleAck: one round trip
// to the server, so a lost ack is seen) with a fire-and-forget Ack, on
// messages fetched beforehand; one goroutine acks.
func BenchmarkAck(b *testing.B) {
	for _, mode := range []string{"double", "plain"} {
		b.Run(mode, func(b *testing.B) {
			e := startBenchEnv(b)
			e.fill(b, b.N)
			ctx := context.Background()
			cons, err := e.js.Consumer(ctx, config.DefaultStreamName, config.DefaultConsumerName)
			if err != nil {
				b.Fatal(err)
			}
			msgs := make([]jetstream.Msg, 0, b.N)
			for len(msgs) < b.N {
				batch, err := cons.Fetch(min(b.N-len(msgs), 500), jetstream.FetchMaxWait(5*time.Second))
				if err != nil {
					b.Fatal(err)
				}
				for m := range batch.Messages() {
					msgs = append(msgs, m)
				}
				if err := batch.Error(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for _, m := range msgs {
				if mode == "double" {
					err = m.DoubleAck(ctx)
				} else {
					err = m.Ack()
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			if mode == "plain" {
				// Count the acks only once the server has them all.
				benchWaitFor(b, func() bool {
					ci, err := cons.Info(ctx)
					return err == nil && ci.AckFloor.Consumer >= uint64(b.N)
				})
			}
		})
	}
}

// TestBenchmarksRunOnce runs every benchmark once (-benchtime=1x), so
// `go test ./...` proves they compile and work.
func TestBenchmarksRunOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("starts several servers: skipped with -short")
	}
	f := flag.Lookup("test.benchtime")
	if f == nil {
		t.Skip("test.benchtime flag not registered")
	}
	old := f.Value.String()
	if err := f.Value.Set("1x"); err != nil {
		t.Fatal(err)
	}
	defer f.Value.Set(old)
	for name, bench := range map[string]func(*testing.B){
		"Dispatch":     BenchmarkDispatch,
		"DeadLetter":   BenchmarkDeadLetter,
		"Ack":          BenchmarkAck,
		"PlainConsume": BenchmarkPlainConsume,
	} {
		if r := testing.Benchmark(bench); r.N < 1 {
			t.Errorf("Benchmark%s did not run (N = %d)", name, r.N)
		}
	}
}
