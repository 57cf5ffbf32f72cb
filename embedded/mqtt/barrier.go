package mqtt

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// A stream processes what reaches it one message at a time, in the order
// it arrived (its inbound queue). A publish whose Nats-Expected-Stream
// names another stream is refused in that same order, after every
// message queued before it was stored — and, under sync = "always",
// fsynced. So once the refusal is back, whatever a device published
// before it is in the stream: the barrier.
//
// A device's PUBLISH reaches the stream's queue before the server stores
// its own copy in $MQTT_msgs and sends the PUBACK (nats-server's
// mqttInitiateMsgDelivery); a barrier started after the gate saw the
// PUBACK therefore comes back after the message is stored.

// notThisStream is the Nats-Expected-Stream of a barrier: a name no
// stream can have ('.' is not allowed in one), so every stream refuses it.
const notThisStream = "holdfast.barrier"

// errStreamNotMatch is JetStream's err_code for "expected stream does not
// match": the barrier's answer.
const errStreamNotMatch = 10060

// barrier coalesces: every PUBACK seen while a round runs waits for the
// next round, which starts once the running one is back; one round covers
// all of them, on every connection.
type barrier struct {
	nc      *nats.Conn
	timeout time.Duration

	mu       sync.Mutex
	subjects []string // one per stream (subjects.Barrier)
	next     *round   // the round the next ticket waits for; nil when none is wanted
	running  bool

	rounds  atomic.Uint64
	failed  atomic.Uint64
	seconds prometheus.Histogram // how long each round took
}

func newBarrier(nc *nats.Conn, timeout time.Duration) *barrier {
	return &barrier{nc: nc, timeout: timeout, seconds: prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "holdfast_mqtt_barrier_seconds",
		Help:    "How long a barrier took to pass every stream: what a PUBACK waits beyond the server's own.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
	})}
}

type round struct {
	done chan struct{}
	err  error
}

var passed = func() *round { r := &round{done: make(chan struct{})}; close(r.done); return r }()

// ticket returns the round that starts after this call: its done closes
// once every stream has stored what was queued before the call.
func (b *barrier) ticket() *round {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.subjects) == 0 {
		return passed
	}
	if b.next == nil {
		b.next = &round{done: make(chan struct{})}
	}
	r := b.next
	if !b.running {
		b.running = true
		go b.loop()
	}
	return r
}

// setSubjects sets the streams' barrier subjects; rounds that start
// from now on pass these.
func (b *barrier) setSubjects(subjects []string) {
	b.mu.Lock()
	b.subjects = subjects
	b.mu.Unlock()
}

func (b *barrier) loop() {
	for {
		b.mu.Lock()
		r := b.next
		b.next = nil
		subjects := b.subjects
		if r == nil {
			b.running = false
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		start := time.Now()
		r.err = b.pass(subjects)
		b.seconds.Observe(time.Since(start).Seconds())
		b.rounds.Add(1)
		if r.err != nil {
			b.failed.Add(1)
		}
		close(r.done)
	}
}

// pass sends one barrier to every stream at once and waits for all.
func (b *barrier) pass(subjects []string) error {
	errs := make([]error, len(subjects))
	var wg sync.WaitGroup
	for i, subj := range subjects {
		wg.Go(func() { errs[i] = b.one(subj) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (b *barrier) one(subject string) error {
	m := nats.NewMsg(subject)
	m.Header.Set(nats.ExpectedStreamHdr, notThisStream)
	resp, err := b.nc.RequestMsg(m, b.timeout)
	if err != nil {
		return fmt.Errorf("barrier on %s: %w", subject, err)
	}
	var r struct {
		Error *struct {
			ErrCode     int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
		Stream string `json:"stream"`
	}
	if err := json.Unmarshal(resp.Data, &r); err != nil {
		return fmt.Errorf("barrier on %s: not a JetStream answer: %q", subject, resp.Data)
	}
	if r.Error == nil || r.Error.ErrCode != errStreamNotMatch {
		return fmt.Errorf("barrier on %s: stream %s answered %s", subject, r.Stream, resp.Data)
	}
	return nil
}
