package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/internal/natstest"
)

// Helpers shared by the power-loss and crash harnesses: a config with
// workers, concurrent publishers that record every PubAck, and a check
// that every acknowledged message is still in the stream.

// durConfig describes a holdfast config for the durability harnesses.
type durConfig struct {
	store      string
	port       int
	sync       string // jetstream.sync; "" keeps the default
	onDataLoss string // jetstream.on_data_loss; "" keeps the default
	// commitWindow is jetstream.commit_window; "" keeps the default.
	commitWindow string
	workers      int
	handler      string // "log" unless set
	extra        string // appended verbatim
	// groupCommit sets group_commit = true on ORDERS.
	groupCommit bool
	// ordersExtra is appended verbatim to [streams.ORDERS].
	ordersExtra string
}

func (c durConfig) toml() string {
	js := ""
	if c.sync != "" {
		js += fmt.Sprintf("sync = %q\n", c.sync)
	}
	if c.onDataLoss != "" {
		js += fmt.Sprintf("on_data_loss = %q\n", c.onDataLoss)
	}
	if c.commitWindow != "" {
		js += fmt.Sprintf("commit_window = %q\n", c.commitWindow)
	}
	handler := c.handler
	if handler == "" {
		handler = "log"
	}
	stream := c.ordersExtra
	if c.groupCommit {
		stream += "group_commit = true\n"
	}
	return fmt.Sprintf(`[server]
name = "holdfast-durability"
host = "127.0.0.1"
port = %d

[jetstream]
store_dir = %q
max_file_store = "1GB"
max_memory_store = "64MB"
%s
[http]
listen = ""

[run]
shutdown_timeout = "5s"

[streams.ORDERS]
subjects = ["orders.*"]
%s
[consumers.WORKER1]
stream = "ORDERS"
workers = %d
handler = %q
ack_wait = "5s"
backoff = ["100ms"]
%s`, c.port, c.store, js, stream, c.workers, handler, c.extra)
}

// durEnvInt reads a positive integer from the environment, or def.
func durEnvInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// ackLog records every message a publisher got a PubAck for: id → stream
// sequence. It is shared across restarts of holdfast.
type ackLog struct {
	mu   sync.Mutex
	acks map[string]uint64
}

func newAckLog() *ackLog { return &ackLog{acks: map[string]uint64{}} }

func (a *ackLog) add(id string, seq uint64) {
	a.mu.Lock()
	a.acks[id] = seq
	a.mu.Unlock()
}

func (a *ackLog) len() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.acks)
}

func (a *ackLog) ids() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]string, 0, len(a.acks))
	for id := range a.acks {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// publishers publishes from n goroutines on their own connection to url
// until stop is called; each message has a unique id (payload and
// Nats-Msg-Id) made of prefix, the publisher and a counter. Errors (the
// server was killed) are counted, not fatal.
type publishers struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	sent   int
	errs   int
}

func startPublishers(t *testing.T, url, prefix string, n int, acks *ackLog) *publishers {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &publishers{cancel: cancel}
	for i := range n {
		nc, err := nats.Connect(url, nats.Name(fmt.Sprintf("durability-pub-%d", i)), nats.MaxReconnects(0))
		if err != nil {
			cancel()
			t.Fatalf("publisher connect: %v", err)
		}
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer nc.Close()
			for k := 0; ctx.Err() == nil; k++ {
				id := fmt.Sprintf("%s-p%d-%06d", prefix, i, k)
				msg := &nats.Msg{Subject: "orders.created", Data: []byte(id), Header: nats.Header{}}
				msg.Header.Set(nats.MsgIdHdr, id)
				pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
				ack, err := js.PublishMsg(pctx, msg)
				pcancel()
				p.mu.Lock()
				p.sent++
				if err != nil {
					p.errs++
				}
				p.mu.Unlock()
				if err != nil {
					if nc.IsClosed() {
						return
					}
					time.Sleep(10 * time.Millisecond)
					continue
				}
				acks.add(id, ack.Sequence)
			}
		}()
	}
	return p
}

func (p *publishers) stop() {
	p.cancel()
	p.wg.Wait()
}

// streamIDs reads every message of stream ORDERS with an ordered consumer
// and returns the ids (payloads) it holds, and the stream state.
func streamIDs(ctx context.Context, js jetstream.JetStream) (map[string]uint64, jetstream.StreamState, error) {
	s, err := js.Stream(ctx, "ORDERS")
	if err != nil {
		return nil, jetstream.StreamState{}, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, jetstream.StreamState{}, err
	}
	st := info.State
	ids := make(map[string]uint64, st.Msgs)
	if st.Msgs == 0 {
		return ids, st, nil
	}
	oc, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, st, err
	}
	for uint64(len(ids)) < st.Msgs {
		batch, err := oc.Fetch(500, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return nil, st, err
		}
		n := 0
		for m := range batch.Messages() {
			n++
			md, err := m.Metadata()
			if err != nil {
				return nil, st, err
			}
			ids[string(m.Data())] = md.Sequence.Stream
			if md.Sequence.Stream >= st.LastSeq {
				return ids, st, nil
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return nil, st, err
		}
		if n == 0 {
			return ids, st, fmt.Errorf("read %d of %d messages, then nothing more", len(ids), st.Msgs)
		}
	}
	return ids, st, nil
}

// durVerdict is what a check of the acknowledged messages found.
type durVerdict struct {
	acked, lost     int
	streamMissing   bool
	consumerMissing bool
	lastSeq         uint64
	firstLost       string
}

// checkAcked compares the ack log with the stream's content.
func checkAcked(t *testing.T, url string, acks *ackLog) durVerdict {
	t.Helper()
	nc, err := nats.Connect(url, nats.Name("durability-check"), nats.MaxReconnects(0))
	if err != nil {
		t.Fatalf("check connect: %v", err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	v := durVerdict{}
	all := acks.ids()
	v.acked = len(all)
	have, st, err := streamIDs(ctx, js)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		v.streamMissing = true
		have = map[string]uint64{}
	case err != nil:
		t.Fatalf("read stream ORDERS: %v", err)
	}
	v.lastSeq = st.LastSeq
	if _, err := js.Consumer(ctx, "ORDERS", "WORKER1"); err != nil {
		v.consumerMissing = true
	}
	for _, id := range all {
		if _, ok := have[id]; !ok {
			if v.lost == 0 {
				v.firstLost = id
			}
			v.lost++
		}
	}
	return v
}

// waitDrained waits until consumer WORKER1 has nothing pending and
// nothing unacknowledged: every message was processed (or dead-lettered).
func waitDrained(t *testing.T, url string, timeout time.Duration) jetstream.ConsumerInfo {
	t.Helper()
	nc, err := nats.Connect(url, nats.Name("durability-drain"), nats.MaxReconnects(0))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	var info *jetstream.ConsumerInfo
	natstest.CheckFor(t, timeout, 100*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := js.Consumer(ctx, "ORDERS", "WORKER1")
		if err != nil {
			return err
		}
		info, err = c.Info(ctx)
		if err != nil {
			return err
		}
		if info.NumPending != 0 || info.NumAckPending != 0 {
			return fmt.Errorf("consumer WORKER1: %d pending, %d unacknowledged", info.NumPending, info.NumAckPending)
		}
		return nil
	})
	return *info
}

// randDuration is a random duration in [lo, hi).
func randDuration(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(rand.Int64N(int64(hi-lo)))
}

// durLogDir keeps the logs of long runs; "" means a temp dir.
func durTempDir(t *testing.T, name string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}
