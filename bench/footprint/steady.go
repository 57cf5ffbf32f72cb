package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/bench/benchkit"
)

// steadySubject is what the steady publishers publish to: a subject of
// holdfast's default stream ORDERS, and of the ORDERS the benchmark
// creates on stock.
const steadySubject = "orders.created"

// steadyResult is one steady run of one server: what it cost per message
// while msgs messages were published at the steady rate and consumed.
type steadyResult struct {
	msgs  int
	ticks int64
	runNS int64
	// childTicks is the CPU of the children the server waited for (an
	// exec handler's commands), in 1/userHZ s.
	childTicks int64
	writeBytes int64
	// p50 and p99 are publish→PubAck latencies.
	p50, p99 time.Duration
	// handled50 and handled99 are publish→ack latencies: from the publish
	// until the consumer acknowledged the message, which holdfast's
	// workers do once the handler succeeded (see watchAcks).
	handled50, handled99 time.Duration
	// syncs counts the fsync and fdatasync calls of a run under strace
	// (see measureSteady's trace), -1 when not counted.
	syncs int64
}

// measureSteady starts srv on a fresh store, publishes n messages of size
// bytes at rate per second, and measures its CPU and bytes written from
// the first publish until every message was acknowledged by a consumer:
// holdfast's own WORKER1 (its default log handler), or, on stock, a pull
// consumer in this process that acks each message.
//
// With trace, the run's fsync and fdatasync calls are counted by strace
// attached to the server (which slows it: its other figures are not
// reported from such a run).
func measureSteady(srv *server, work string, n, rate, size int, trace bool) (steadyResult, error) {
	store := filepath.Join(work, srv.name+"-steady-store")
	if err := os.RemoveAll(store); err != nil {
		return steadyResult{}, err
	}
	defer os.RemoveAll(store)
	p, err := srv.start(work, store, false)
	if err != nil {
		return steadyResult{}, err
	}
	defer p.stop()
	nc, js, err := benchkit.Connect(p.url, 2*time.Second)
	if err != nil {
		return steadyResult{}, err
	}
	defer nc.Close()
	consumed, stop, err := startConsumer(srv, js)
	if err != nil {
		return steadyResult{}, err
	}
	defer stop()
	time.Sleep(*settle)
	before, err := readSample(p.pid())
	if err != nil {
		return steadyResult{}, err
	}
	acks, stopAcks, err := watchAcks(nc, "ORDERS", "WORKER1")
	if err != nil {
		return steadyResult{}, err
	}
	defer stopAcks()
	var tr *syncTrace
	if trace {
		if tr, err = startSyncTrace(p.pid(), work); err != nil {
			return steadyResult{}, err
		}
	}
	pubs, err := publishSteady(js, n, rate, size)
	if err != nil {
		return steadyResult{}, err
	}
	deadline := time.Now().Add(time.Minute)
	for {
		got, err := consumed()
		if err == nil && got >= uint64(n) {
			break
		}
		if time.Now().After(deadline) {
			return steadyResult{}, fmt.Errorf("%s: %d of %d messages consumed a minute after the last publish (%v)", srv.name, got, n, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	after, err := readSample(p.pid())
	if err != nil {
		return steadyResult{}, err
	}
	syncs := int64(-1)
	if tr != nil {
		if syncs, err = tr.stop(); err != nil {
			return steadyResult{}, err
		}
	}
	lat := make([]time.Duration, n)
	for i, p := range pubs {
		lat[i] = p.pubAck
	}
	// The last acknowledgements may still be on their way to the
	// subscription: the consumer counted them when it sent them.
	var handled []time.Duration
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ackAt := acks()
		handled = handled[:0]
		for _, p := range pubs {
			if at, ok := ackAt[p.seq]; ok {
				handled = append(handled, at.Sub(p.sent))
			}
		}
		if len(handled) == n {
			break
		}
		if time.Now().After(deadline) {
			return steadyResult{}, fmt.Errorf("%s: the acknowledgements of %d of %d messages were not seen on $JS.ACK", srv.name, n-len(handled), n)
		}
	}
	slices.Sort(lat)
	slices.Sort(handled)
	return steadyResult{msgs: n, syncs: syncs, ticks: after.ticks - before.ticks, runNS: after.runNS - before.runNS,
		childTicks: after.childTicks - before.childTicks,
		writeBytes: after.writeBytes - before.writeBytes,
		p50:        lat[len(lat)/2], p99: lat[len(lat)*99/100],
		handled50: handled[len(handled)/2], handled99: handled[len(handled)*99/100]}, nil
}

// watchAcks subscribes to the acknowledgements of consumer on stream: a
// consumer acknowledges a message by publishing "+ACK" to the message's
// reply subject, $JS.ACK.<stream>.<consumer>.<delivered>.<stream
// sequence>.…, which any client may subscribe to (the servers here have
// no authorization). It returns when each stream sequence was first
// acknowledged, and how to stop watching. The subscription costs the
// server one more small delivery per message, on stock and holdfast alike.
func watchAcks(nc *nats.Conn, stream, consumer string) (func() map[uint64]time.Time, func(), error) {
	var mu sync.Mutex
	at := make(map[uint64]time.Time)
	sub, err := nc.Subscribe("$JS.ACK.>", func(m *nats.Msg) {
		now := time.Now()
		if len(m.Data) > 0 && !bytes.HasPrefix(m.Data, []byte("+ACK")) {
			return // not an acknowledgement: in progress, nak, term
		}
		seq, ok := ackedSeq(m.Subject, stream, consumer)
		if !ok {
			return
		}
		mu.Lock()
		if _, seen := at[seq]; !seen {
			at[seq] = now
		}
		mu.Unlock()
	})
	if err != nil {
		return nil, nil, fmt.Errorf("subscribe to acknowledgements: %w", err)
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		return nil, nil, err
	}
	if err := nc.Flush(); err != nil {
		return nil, nil, err
	}
	return func() map[uint64]time.Time {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(at)
	}, func() { _ = sub.Unsubscribe() }, nil
}

// ackedSeq returns the stream sequence an acknowledgement subject of
// stream's consumer names ($JS.ACK.<stream>.<consumer>.<delivered>.<seq>.…,
// or with a domain and an account hash before the stream), read by
// nats.go's own parser of reply subjects (Msg.Metadata, which wants the
// message bound to a subscription).
func ackedSeq(subject, stream, consumer string) (uint64, bool) {
	meta, err := (&nats.Msg{Reply: subject, Sub: &nats.Subscription{}}).Metadata()
	if err != nil || meta.Stream != stream || meta.Consumer != consumer || meta.Sequence.Stream == 0 {
		return 0, false
	}
	return meta.Sequence.Stream, true
}

// startConsumer starts what consumes the steady messages and returns how
// to read how many were acknowledged, and how to stop it.
func startConsumer(srv *server, js jetstream.JetStream) (func() (uint64, error), func(), error) {
	ctx, cancel := context.WithCancel(context.Background())
	if srv.holdfast {
		return func() (uint64, error) {
			ictx, icancel := context.WithTimeout(ctx, 2*time.Second)
			defer icancel()
			c, err := js.Consumer(ictx, "ORDERS", "WORKER1")
			if err != nil {
				return 0, err
			}
			return c.CachedInfo().AckFloor.Stream, nil
		}, cancel, nil
	}
	cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
	defer ccancel()
	if _, err := js.CreateOrUpdateStream(cctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.*"},
		Storage: jetstream.FileStorage, MaxMsgs: 1_000_000, MaxAge: 72 * time.Hour}); err != nil {
		cancel()
		return nil, nil, fmt.Errorf("create stream ORDERS: %w", err)
	}
	c, err := js.CreateOrUpdateConsumer(cctx, "ORDERS", jetstream.ConsumerConfig{Durable: "WORKER1",
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxDeliver: 5})
	if err != nil {
		cancel()
		return nil, nil, fmt.Errorf("create consumer WORKER1: %w", err)
	}
	var acked atomic.Uint64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			batch, err := c.Fetch(100, jetstream.FetchMaxWait(time.Second))
			if err != nil {
				continue
			}
			for m := range batch.Messages() {
				if m.Ack() == nil {
					acked.Add(1)
				}
			}
		}
	}()
	return func() (uint64, error) { return acked.Load(), nil }, func() { cancel(); wg.Wait() }, nil
}

// published is one steady publish: when it was sent, its latency to its
// PubAck, and the stream sequence the PubAck gave it.
type published struct {
	sent   time.Time
	pubAck time.Duration
	seq    uint64
}

// publishSteady publishes n messages at rate per second, each at its
// time whether or not the ones before it were answered (as independent
// devices do), and returns each publish with its PubAck.
func publishSteady(js jetstream.JetStream, n, rate, size int) ([]published, error) {
	payload := make([]byte, size)
	for i := range payload {
		payload[i] = byte('a' + i%26)
	}
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	pubs := make([]published, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := range n {
		time.Sleep(time.Until(start.Add(time.Duration(i) * interval)))
		t := time.Now()
		f, err := js.PublishAsync(steadySubject, payload)
		if err != nil {
			return nil, fmt.Errorf("publish %d: %w", i+1, err)
		}
		wg.Go(func() {
			select {
			case ack := <-f.Ok():
				pubs[i] = published{sent: t, pubAck: time.Since(t), seq: ack.Sequence}
			case err := <-f.Err():
				errs <- fmt.Errorf("publish %d: %w", i+1, err)
			case <-time.After(10 * time.Second):
				errs <- fmt.Errorf("publish %d: no PubAck within 10s", i+1)
			}
		})
	}
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	return pubs, errors.Join(all...)
}

func (r steadyResult) bytesPerMsg() float64 { return float64(r.writeBytes) / float64(r.msgs) }

// cpuMSPerMsg is the CPU time of the server's threads and of the children
// it waited for, per message.
func (r steadyResult) cpuMSPerMsg() float64 {
	return (float64(r.runNS)/1e6 + float64(r.childTicks)*1000/userHZ) / float64(r.msgs)
}

// steadyLog and steadyGroupCommit are what the steady holdfast servers add
// to their config: no log line per message, and the default stream and
// consumer with group commit on.
const (
	steadyLog         = "[log]\nlevel = \"warn\"\n"
	steadyGroupCommit = "[streams.ORDERS]\nsubjects = [\"orders.*\"]\ngroup_commit = true\n[consumers.WORKER1]\nstream = \"ORDERS\"\n"
	// steadyExec hands each message to /bin/true: a fork and exec per
	// message, its children's CPU counted with the server's (cutime).
	steadyExec = "[streams.ORDERS]\nsubjects = [\"orders.*\"]\n[consumers.WORKER1]\nstream = \"ORDERS\"\nhandler = \"exec\"\n[consumers.WORKER1.exec]\ncommand = [\"/bin/true\"]\n"
	// steadyForward forwards each message to the hub (holdfastEdgeServer).
	steadyForward = "[streams.ORDERS]\nsubjects = [\"orders.*\"]\n[consumers.WORKER1]\nstream = \"ORDERS\"\nhandler = \"forward\"\n"
)

// syncTrace is strace counting a process's fsync and fdatasync calls.
type syncTrace struct {
	cmd *exec.Cmd
	out string
}

// startSyncTrace attaches strace to pid.
func startSyncTrace(pid int, work string) (*syncTrace, error) {
	out := filepath.Join(work, fmt.Sprintf("strace-%d.txt", pid))
	cmd := exec.Command("strace", "-f", "-c", "-e", "trace=fsync,fdatasync", "-o", out, "-p", strconv.Itoa(pid))
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("strace: %w", err)
	}
	// strace attaches to each thread before it counts anything.
	time.Sleep(500 * time.Millisecond)
	return &syncTrace{cmd: cmd, out: out}, nil
}

// stop detaches strace and returns the calls it counted.
func (t *syncTrace) stop() (int64, error) {
	_ = t.cmd.Process.Signal(os.Interrupt)
	_ = t.cmd.Wait()
	f, err := os.Open(t.out)
	if err != nil {
		return 0, fmt.Errorf("strace summary: %w", err)
	}
	defer f.Close()
	return parseSyncCalls(f)
}

// parseSyncCalls sums the calls of fsync and fdatasync in an strace -c
// summary ("% time seconds usecs/call calls errors syscall").
func parseSyncCalls(r io.Reader) (int64, error) {
	var n int64
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 || (f[len(f)-1] != "fsync" && f[len(f)-1] != "fdatasync") {
			continue
		}
		calls, err := strconv.ParseInt(f[3], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("strace summary line %q: %w", sc.Text(), err)
		}
		n += calls
	}
	return n, sc.Err()
}
