package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// benchPayload returns a payload of size bytes with the send time in its
// first 8 bytes.
func benchPayload(buf []byte, t time.Time) []byte {
	binary.BigEndian.PutUint64(buf, uint64(t.UnixNano()))
	return buf
}

func benchConnect(url string, i int) (*nats.Conn, error) {
	nc, err := nats.Connect(url, nats.Name(fmt.Sprintf("holdfast-bench-%d", i)), nats.Timeout(5*time.Second))
	if err != nil {
		return nil, fmt.Errorf("cannot connect to %s: %w", url, err)
	}
	return nc, nil
}

// benchPublishers opens n publisher connections to url; closeAll closes
// them (also the ones opened before an error).
func benchPublishers(url string, n int, opts ...jetstream.JetStreamOpt) (conns []jetstream.JetStream, closeAll func(), err error) {
	var ncs []*nats.Conn
	closeAll = func() {
		for _, nc := range ncs {
			nc.Close()
		}
	}
	for i := 0; i < n; i++ {
		nc, err := benchConnect(url, i)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		ncs = append(ncs, nc)
		js, err := jetstream.New(nc, opts...)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		conns = append(conns, js)
	}
	return conns, closeAll, nil
}

// pubRecord is one published message: when it was sent and where it was
// stored.
type pubRecord struct {
	sent, acked time.Time
	seq         uint64
}

// publishAsync publishes n messages on subject from the publishers, each
// with at most Window PubAcks outstanding, and measures until the last
// PubAck. When records is not nil, it receives each message's record.
func (b *Bencher) publishAsync(ctx context.Context, url, subject string, n int, name string, records *[]pubRecord) (Figure, error) {
	p := b.Params
	per := splitCount(n, p.Publishers)
	recs := make([][]pubRecord, p.Publishers)
	for i := range recs {
		recs[i] = make([]pubRecord, per[i])
	}
	conns, closeConns, err := benchPublishers(url, p.Publishers, jetstream.WithPublishAsyncMaxPending(p.Window))
	if err != nil {
		return Figure{}, err
	}
	defer closeConns()
	var done atomic.Int64
	b.progress.set(name, done.Load, n)
	errs := make([]error, p.Publishers)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = publishAsyncOne(ctx, conns[i], subject, p.Size, recs[i], &done)
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return Figure{}, err
	}
	all := slices.Concat(recs...)
	if records != nil {
		*records = all
	}
	lat := make([]time.Duration, len(all))
	for i, r := range all {
		lat[i] = r.acked.Sub(r.sent)
	}
	return newFigure(name, n, p.Size, elapsed, lat), nil
}

// publishAsyncOne publishes len(recs) messages; a second goroutine waits
// for the PubAcks in order (they arrive in order on one stream), so each
// ack time is at most a little late.
func publishAsyncOne(ctx context.Context, js jetstream.JetStream, subject string, size int, recs []pubRecord, done *atomic.Int64) error {
	futures := make(chan jetstream.PubAckFuture, 1<<16)
	var ackErr error
	ackDone := make(chan struct{})
	go func() {
		defer close(ackDone)
		i := 0
		for f := range futures {
			select {
			case ack := <-f.Ok():
				recs[i].acked = time.Now()
				recs[i].seq = ack.Sequence
			case err := <-f.Err():
				if ackErr == nil {
					ackErr = fmt.Errorf("async publish: %w", err)
				}
			}
			done.Add(1)
			i++
		}
	}()
	buf := make([]byte, size)
	var err error
	for i := range recs {
		// The payload is copied into the connection's buffer before
		// PublishAsync returns, so one buffer serves every message.
		now := time.Now()
		recs[i].sent = now
		var f jetstream.PubAckFuture
		f, err = js.PublishAsync(subject, benchPayload(buf, now), jetstream.WithStallWait(30*time.Second))
		if err != nil {
			err = fmt.Errorf("async publish: %w", err)
			break
		}
		futures <- f
	}
	close(futures)
	<-ackDone
	if err != nil {
		return err
	}
	if ackErr != nil {
		return ackErr
	}
	return ctx.Err()
}

// publishSync publishes n messages one at a time from the publishers.
func (b *Bencher) publishSync(ctx context.Context, url, subject string, n int) (Figure, error) {
	p := b.Params
	per := splitCount(n, p.Publishers)
	lats := make([][]time.Duration, p.Publishers)
	errs := make([]error, p.Publishers)
	conns, closeConns, err := benchPublishers(url, p.Publishers)
	if err != nil {
		return Figure{}, err
	}
	defer closeConns()
	var done atomic.Int64
	b.progress.set("publish sync", done.Load, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, p.Size)
			lats[i] = make([]time.Duration, 0, per[i])
			for range per[i] {
				t := time.Now()
				if _, err := conns[i].Publish(ctx, subject, benchPayload(buf, t)); err != nil {
					errs[i] = fmt.Errorf("publish: %w", err)
					return
				}
				lats[i] = append(lats[i], time.Since(t))
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return Figure{}, err
	}
	return newFigure("publish sync", n, p.Size, elapsed, slices.Concat(lats...)), nil
}

func splitCount(n, parts int) []int {
	out := make([]int, parts)
	for i := range out {
		out[i] = n / parts
		if i < n%parts {
			out[i]++
		}
	}
	return out
}
