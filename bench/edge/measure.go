package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/holdfast-io/holdfast/bench/benchkit"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// How often the hub's stream is polled, and how long a hub that receives
// nothing more may take before the run fails.
const (
	pollEvery  = 50 * time.Millisecond
	stallAfter = time.Minute
)

// result is what one run measured.
type result struct {
	publish         float64       // msg/s, the backlog published to the edge
	first, done     time.Duration // from the hub's start: first message on the hub, all of them
	edgeHWM, hubHWM int64         // bytes, at the end of the catch-up
	atomic, async   float64       // msg/s, the hub's own ingest
	p50, p99, max   time.Duration // steady state, publish on the edge → stored on the hub
}

func (r result) String() string {
	return fmt.Sprintf("catch-up %.0f msg/s (all after %.1fs, the first after %.2fs), hub atomic %.0f msg/s, async %.0f msg/s, peak RSS edge %.1f MiB, hub %.1f MiB, steady latency p50 %.1f ms, p99 %.1f ms, max %.1f ms",
		float64(*msgs)/r.done.Seconds(), r.done.Seconds(), r.first.Seconds(), r.atomic, r.async, mib(r.edgeHWM), mib(r.hubHWM), ms(r.p50), ms(r.p99), ms(r.max))
}

// measure is one run in a directory of its own, removed at the end; when
// the run fails it is kept for its logs.
func (e *env) measure(run int) (r result, err error) {
	work, err := os.MkdirTemp(e.parent, ".bench-edge-")
	if err != nil {
		return r, err
	}
	defer func() {
		if err != nil {
			err = fmt.Errorf("%w (logs in %s)", err, work)
			return
		}
		err = os.RemoveAll(work)
	}()
	var ports [3]int
	for i := range ports {
		if ports[i], err = benchkit.FreePort(); err != nil {
			return r, err
		}
	}
	hub, err := newNode(work, "hub", hubConfig(work, ports[0], ports[1]), ports[0])
	if err != nil {
		return r, err
	}
	edge, err := newNode(work, "edge", edgeConfig(work, ports[2], ports[1]), ports[2])
	if err != nil {
		return r, err
	}
	defer func() { _, _ = edge.stop(), hub.stop() }()

	// The hub is down: the edge stores the backlog and forwards nothing.
	logf("run %d: edge up, hub down: publishing %d messages to the edge", run, *msgs)
	if err := edge.start(e, work); err != nil {
		return r, err
	}
	if err := edge.waitStream("ORDERS"); err != nil {
		return r, err
	}
	took, err := publishEdge(edge.url, *msgs, 0, func() []byte { return make([]byte, *size) })
	if err != nil {
		return r, err
	}
	r.publish = float64(*msgs) / took.Seconds()
	if n, err := edge.streamMsgs("ORDERS"); err != nil || n != uint64(*msgs) {
		return r, fmt.Errorf("the edge's ORDERS holds %d messages after %d PubAcks (%v)", n, *msgs, err)
	}

	logf("run %d: %.0f msg/s published; starting the hub", run, r.publish)
	if err := e.catchUp(work, hub, edge, uint64(*msgs), &r); err != nil {
		return r, fmt.Errorf("catch-up: %w", err)
	}
	logf("run %d: all %d on the hub %.1fs after its start; checking each is there once", run, *msgs, r.done.Seconds())
	if err := checkOnce(hub, 1, uint64(*msgs), nil); err != nil {
		return r, fmt.Errorf("catch-up: %w", err)
	}

	logf("run %d: steady state, %d msg/s for %s", run, *rate, *steadyDu)
	if err := steady(edge, hub, uint64(*msgs)+1, &r); err != nil {
		return r, fmt.Errorf("steady state: %w", err)
	}

	logf("run %d: the hub's own ingest (nats bench js pub atomic, async)", run)
	if r.atomic, err = e.natsBench(work, hub, "atomic", "BENCH", "--batch", strconv.Itoa(*batch), "--dedup"); err != nil {
		return r, err
	}
	if r.async, err = e.natsBench(work, hub, "async", "BENCH_ASYNC", "--batch", "500"); err != nil {
		return r, err
	}
	// The edge first: the hub it forwards to outlives it.
	return r, errors.Join(edge.stop(), hub.stop())
}

// publishEdge publishes count messages to the edge's orders.created, one
// every pace (0: as fast as -window outstanding PubAcks allow), and waits
// for every PubAck; it returns the time that took.
func publishEdge(url string, count int, pace time.Duration, payload func() []byte) (time.Duration, error) {
	var failed atomic.Int64
	var firstErr atomic.Value
	nc, js, err := benchkit.Connect(url, time.Second,
		jetstream.WithPublishAsyncMaxPending(*window),
		jetstream.WithPublishAsyncTimeout(30*time.Second),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, _ *nats.Msg, err error) {
			if failed.Add(1) == 1 {
				firstErr.Store(err.Error())
			}
		}))
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	var tick <-chan time.Time
	if pace > 0 {
		t := time.NewTicker(pace)
		defer t.Stop()
		tick = t.C
	}
	start := time.Now()
	for range count {
		if tick != nil {
			<-tick
		}
		// A full window waits for the edge's PubAcks rather than failing.
		if _, err := js.PublishAsync("orders.created", payload(), jetstream.WithStallWait(30*time.Second)); err != nil {
			return 0, fmt.Errorf("publish to the edge: %w", err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		return 0, fmt.Errorf("%d PubAcks from the edge outstanding a minute after the last publish", js.PublishAsyncPending())
	}
	took := time.Since(start)
	if n := failed.Load(); n > 0 {
		return 0, fmt.Errorf("%d of %d publishes to the edge failed; the first: %v", n, count, firstErr.Load())
	}
	return took, nil
}

// catchUp starts the hub and polls its stream EDGE until it holds want
// messages. It records, from the hub's process start, when the first and
// when the last had arrived, and both nodes' peak RSS at that moment.
func (e *env) catchUp(work string, hub, edge *node, want uint64, r *result) error {
	start := time.Now()
	if err := hub.start(e, work); err != nil {
		return err
	}
	var js jetstream.JetStream
	defer func() {
		if js != nil {
			js.Conn().Close()
		}
	}()
	var held uint64
	var err error
	progress := start
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for held < want {
		<-tick.C
		if hub.exited() || edge.exited() {
			return errors.New("the hub or the edge exited: see its log")
		}
		if time.Since(progress) > stallAfter {
			return fmt.Errorf("the hub's EDGE holds %d of %d messages, none more for %s (last error: %v)", held, want, stallAfter, err)
		}
		if js == nil {
			if _, js, err = benchkit.Connect(hub.url, time.Second); err != nil {
				js = nil
				continue
			}
		}
		var n uint64
		if n, err = benchkit.StreamMsgs(js, "EDGE", 2*time.Second); err != nil || n <= held {
			continue
		}
		at := time.Since(start)
		if held == 0 {
			r.first = at
		}
		held, progress, r.done = n, time.Now(), at
	}
	if r.edgeHWM, err = edge.peakRSS(); err != nil {
		return err
	}
	r.hubHWM, err = hub.peakRSS()
	return err
}

// steady publishes to the edge at -rate for -steady, each payload starting
// with its publish time, waits until the hub holds them (from its stream
// sequence from) and records the latency publish → stored in the hub's
// stream.
func steady(edge, hub *node, from uint64, r *result) error {
	count := int(float64(*rate) * steadyDu.Seconds())
	stamped := func() []byte {
		b := make([]byte, *size)
		binary.BigEndian.PutUint64(b, uint64(time.Now().UnixNano()))
		return b
	}
	if _, err := publishEdge(edge.url, count, time.Second/time.Duration(*rate), stamped); err != nil {
		return err
	}
	if err := waitHub(hub, from-1+uint64(count)); err != nil {
		return err
	}
	var lat []time.Duration
	err := checkOnce(hub, from, from-1+uint64(count), func(m jetstream.Msg) error {
		meta, err := m.Metadata()
		if err != nil || len(m.Data()) < 8 {
			return fmt.Errorf("hub message %s: no metadata or timestamp (%v)", m.Subject(), err)
		}
		sent := time.Unix(0, int64(binary.BigEndian.Uint64(m.Data())))
		lat = append(lat, meta.Timestamp.Sub(sent))
		return nil
	})
	if err != nil {
		return err
	}
	slices.Sort(lat)
	r.p50, r.p99, r.max = lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)-1]
	return nil
}

// waitHub waits until the hub's EDGE holds want messages.
func waitHub(hub *node, want uint64) error {
	var held uint64
	progress := time.Now()
	for {
		n, err := hub.streamMsgs("EDGE")
		if err == nil && n >= want {
			return nil
		}
		if err == nil && n > held {
			held, progress = n, time.Now()
		}
		if time.Since(progress) > stallAfter {
			return fmt.Errorf("the hub's EDGE holds %d of %d messages, none more for %s (%v)", held, want, stallAfter, err)
		}
		time.Sleep(pollEvery)
	}
}
