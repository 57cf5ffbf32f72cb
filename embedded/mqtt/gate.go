// Package mqtt is holdfast's MQTT listener: the gate in front of the
// embedded server's own MQTT support.
//
// nats-server speaks MQTT 3.1.1 itself — sessions, subscriptions,
// retained messages, QoS 0, 1 and 2, all kept in JetStream — and hands a
// device's PUBLISH to the stream that takes its subject. But it sends the
// QoS 1 PUBACK once its own session stream ($MQTT_msgs) has stored a copy,
// while the configured stream stores its copy on another goroutine, in
// its own time: a PUBACK could reach the device before the message was in
// the stream the workers read (and be lost by a power cut).
//
// The gate takes the devices' connections (and their TLS), passes every
// byte to the server's MQTT listener on loopback, and holds each PUBACK
// the server sends back until a barrier has passed every stream
// (barrier.go): the device hears "acknowledged" only once the message is
// stored where holdfast's promise holds. A device's QoS 2 PUBLISH goes to
// the server as QoS 1, whose PUBACK becomes the device's PUBREC (see
// conn.asQoS1).
//
// Of what devices send, the gate reads only each packet's fixed header
// and a PUBLISH's topic: a QoS 1 or 2 PUBLISH whose subject no configured
// stream takes is refused (the device's connection is closed before the
// server sees it; MQTT 3.1.1 has no negative PUBACK), since the server
// would acknowledge it once its own session store had it, kept nowhere
// holdfast's promise holds; so is one the stream that takes its subject
// would not store (group commit, max_msg_size), retained or not.
// Authentication, permissions, sessions and keep-alives stay the server's.
package mqtt

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/semaphore"

	"github.com/holdfast-io/holdfast/internal/subjects"
)

// Options are what Listen needs.
type Options struct {
	// Listen is the devices' host:port; TLS, when set, is their TLS.
	Listen string
	TLS    *tls.Config
	// Backend is the server's own MQTT listener (loopback).
	Backend string
	// Conn publishes the barriers to Streams (SetStreams changes them).
	Conn    *nats.Conn
	Streams []Stream
	// Timeout bounds a barrier; a PUBACK it could not clear closes the
	// device's connection (the device sends the PUBLISH again).
	Timeout time.Duration
	// WriteTimeout bounds a write to a device (10 s when zero, as
	// nats-server's write_deadline): a device that takes nothing of
	// what the server sends it for that long is disconnected.
	WriteTimeout time.Duration
	Log          *slog.Logger
}

// Stream is a configured stream the gate answers for.
type Stream struct {
	Name string
	// Subjects are those its clients publish to (group commit's prefix
	// left off); Barrier its barrier subject (subjects.Barrier).
	Subjects []string
	Barrier  string
	// GroupCommit: the stream takes its publishes through group
	// commit's ingest, which cannot store every subject the server
	// publishes a topic on (see groupCommitTakes).
	GroupCommit bool
	// MaxMsgSize is the stream's max_msg_size (0: any size).
	MaxMsgSize int
}

// Gate is the devices' MQTT listener.
type Gate struct {
	opts Options
	log  *slog.Logger
	ln   net.Listener
	bar  *barrier

	mu     sync.Mutex
	conns  map[*conn]struct{}
	closed bool
	wg     sync.WaitGroup

	accepted atomic.Uint64
	held     atomic.Uint64 // PUBACKs, PUBRECs and PUBCOMPs passed on after a barrier
	holding  atomic.Int64  // ... waiting for one now
	refused  atomic.Uint64 // QoS 1/2 PUBLISHes no stream takes
	lastErr  atomic.Pointer[string]
	streams  atomic.Pointer[[]Stream]
}

// Stats is what the gate has done since it started.
type Stats struct {
	Listen      string `json:"listen"`
	Connections int    `json:"connections"`
	Accepted    uint64 `json:"accepted"`
	// Acked counts PUBACKs and PUBRECs (and the server's PUBCOMPs, for a
	// session's PUBRELs from before) passed on once stored; Holding, those
	// waiting for their barrier now.
	Acked   uint64 `json:"acked"`
	Holding int64  `json:"holding"`
	// Barriers counts barrier rounds; Failed, those that failed (each
	// closed the connections that waited on it).
	Barriers uint64 `json:"barriers"`
	Failed   uint64 `json:"failed"`
	// Refused counts QoS 1/2 PUBLISHes no stream in Streams would store,
	// for their topic or their size (each closed its device's connection).
	Refused   uint64   `json:"refused"`
	Streams   []string `json:"streams"`
	LastError string   `json:"last_error,omitempty"`
	// Sessions are the devices' sessions the server keeps ($MQTT_sess),
	// connected or not; InFlight the QoS 1 and 2 deliveries to devices
	// not acknowledged yet. -1 when they could not be read.
	Sessions int64 `json:"sessions"`
	InFlight int64 `json:"in_flight"`
}

// Listen starts the gate.
func Listen(o Options) (*Gate, error) {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Timeout <= 0 {
		o.Timeout = 30 * time.Second
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 10 * time.Second
	}
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return nil, fmt.Errorf("mqtt.listen %s: %w", o.Listen, err)
	}
	if o.TLS != nil {
		ln = tls.NewListener(ln, o.TLS)
	}
	g := &Gate{
		opts:  o,
		log:   o.Log,
		ln:    ln,
		bar:   newBarrier(o.Conn, o.Timeout),
		conns: map[*conn]struct{}{},
	}
	g.SetStreams(o.Streams)
	g.wg.Add(1)
	go g.accept()
	return g, nil
}

// SetStreams sets the streams the gate answers for: a reload that adds or
// leaves out a stream calls it once the streams are as configured.
func (g *Gate) SetStreams(streams []Stream) {
	streams = slices.Clone(streams)
	g.streams.Store(&streams)
	barriers := make([]string, len(streams))
	for i, s := range streams {
		barriers[i] = s.Barrier
	}
	g.bar.setSubjects(barriers)
}

// mqttHeaderBytes is what the server adds to a device's QoS 1 or 2
// message as it publishes it to the streams: "NATS/1.0\r\n",
// "Nmqtt-Pub:<qos>\r\n" and the blank line. A stream counts it against
// its max_msg_size.
const mqttHeaderBytes = len("NATS/1.0\r\n") + len("Nmqtt-Pub:1\r\n") + len("\r\n")

// groupCommitHeaderBytes is that header as group commit's ingest passes
// it on to the stream: the NATS client writes each header "Key: value",
// one byte more than the server's "Nmqtt-Pub:1".
const groupCommitHeaderBytes = len("NATS/1.0\r\n") + len("Nmqtt-Pub: 1\r\n") + len("\r\n")

// refusal says why no stream the gate answers for would store a QoS 1 or
// 2 message of size bytes on subject, "" when one does. The server
// publishes a device's message to the streams without a reply: a stream
// that refuses it tells no one, and the barrier behind it would pass.
// A retained message no stream takes passes (the server keeps it as the
// topic's retained message); one a stream takes is held to what that
// stream stores, as any other.
func (g *Gate) refusal(subject string, size int, retained bool) string {
	for _, s := range *g.streams.Load() {
		for _, f := range s.Subjects {
			if !server.SubjectMatchesFilter(subject, f) {
				continue
			}
			if s.GroupCommit && !groupCommitTakes(s.Name, subject) {
				return fmt.Sprintf("stream %s has group_commit, which stores literal subjects that fit the control line with its prefix only: "+
					"publish on a topic whose levels hold no * or > (letters, digits, - and _)", s.Name)
			}
			header := mqttHeaderBytes
			if s.GroupCommit {
				header = groupCommitHeaderBytes
			}
			if s.MaxMsgSize > 0 && size+header > s.MaxMsgSize {
				return fmt.Sprintf("its message of %d bytes and the server's %d-byte MQTT header are more than stream %s stores (max_msg_size %d, from server.max_payload): "+
					"raise server.max_payload, or send smaller messages", size, header, s.Name, s.MaxMsgSize)
			}
			return ""
		}
	}
	if retained {
		return ""
	}
	return "no configured stream takes it: add the subject to a stream's subjects, or publish where one does"
}

// groupCommitTakes reports whether group commit's ingest stores a publish
// on subject for stream. It refuses a subject with a wildcard token (a
// topic level "*" or ">") or one too long for the server's control line
// with its prefix; the server publishes a device's message without a
// reply, so the refusal reaches no one: the barrier would pass and the
// device get its PUBACK for a message that is in no stream.
func groupCommitTakes(stream, subject string) bool {
	return server.IsValidLiteralSubject(subject) && subjects.GroupCommitFits(stream, subject, 0)
}

// Addr is the address devices connect to.
func (g *Gate) Addr() net.Addr { return g.ln.Addr() }

// Stats returns the gate's counters.
func (g *Gate) Stats() Stats {
	g.mu.Lock()
	n := len(g.conns)
	g.mu.Unlock()
	s := Stats{
		Listen: g.ln.Addr().String(), Connections: n, Accepted: g.accepted.Load(),
		Acked: g.held.Load(), Holding: g.holding.Load(),
		Barriers: g.bar.rounds.Load(), Failed: g.bar.failed.Load(), Refused: g.refused.Load(),
		Streams: []string{},
	}
	for _, st := range *g.streams.Load() {
		s.Streams = append(s.Streams, st.Name)
	}
	if e := g.lastErr.Load(); e != nil {
		s.LastError = *e
	}
	return s
}

// Close stops taking devices and closes their connections; a PUBACK still
// held is never sent, so the device sends its PUBLISH again to the next
// holdfast.
func (g *Gate) Close() error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	g.closed = true
	err := g.ln.Close()
	for c := range g.conns {
		c.close()
	}
	g.mu.Unlock()
	g.wg.Wait()
	return err
}

func (g *Gate) accept() {
	defer g.wg.Done()
	var delay time.Duration
	for {
		dev, err := g.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and the like: wait and try
			// again, as net/http does.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			g.log.Warn("mqtt: cannot take a device's connection; trying again", "err", err, "in", delay)
			time.Sleep(delay)
			continue
		}
		delay = 0
		g.accepted.Add(1)
		c := newConn(g, dev)
		g.mu.Lock()
		if g.closed {
			g.mu.Unlock()
			dev.Close()
			return
		}
		g.conns[c] = struct{}{}
		g.wg.Add(1)
		g.mu.Unlock()
		go c.serve()
	}
}

// conn is one device's connection and the gate's to the server for it.
type conn struct {
	g        *Gate
	dev, srv net.Conn
	once     sync.Once
	mu       sync.Mutex // guards srv until it is set
	gone     bool
	done     chan struct{} // closed by close

	// The device's QoS 2 PUBLISHes go to the server as QoS 1 (see
	// asQoS1): qos2 holds their packet ids until the server's PUBACK,
	// which goes to the device as its PUBREC; released, from then until
	// the device's PUBREL, which the gate answers with a PUBCOMP of its
	// own (local) instead of passing it on.
	qmu      sync.Mutex
	qos2     map[uint16]bool
	released map[uint16]bool
	local    chan []byte
}

func newConn(g *Gate, dev net.Conn) *conn {
	return &conn{g: g, dev: dev, done: make(chan struct{}), qos2: map[uint16]bool{}, released: map[uint16]bool{}, local: make(chan []byte, 16)}
}

// asQoS1 notes that the device's QoS 2 PUBLISH with packet id pi goes to
// the server as QoS 1. The server would keep a QoS 2 message in its own
// store, send the PUBREC from there and hand the message to the streams
// only at the device's PUBREL, deleting its own copy as it does: the
// device, which forgets the message at the PUBREC, would hear
// "received" before any configured stream had it, and a kill -9 between
// the two stores would lose it. As QoS 1, the server's PUBACK is held
// like any other until the stream has the message, and becomes the
// device's PUBREC. The cost: a device that loses its connection before
// the PUBREC sends the message again, and the stream may store it twice
// (QoS 1's at least once), and devices subscribed with QoS 2 receive it
// with QoS 1.
func (c *conn) asQoS1(pi uint16) {
	c.qmu.Lock()
	c.qos2[pi] = true
	c.qmu.Unlock()
}

// pubRec reports whether the server's PUBACK for pi answers a QoS 2
// PUBLISH the gate passed on as QoS 1, and then awaits the device's
// PUBREL for it.
func (c *conn) pubRec(pi uint16) bool {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	if !c.qos2[pi] {
		return false
	}
	delete(c.qos2, pi)
	c.released[pi] = true
	return true
}

// pubRel reports whether the device's PUBREL for pi is the gate's to
// answer: one for a message it passed on as QoS 1 on this connection. A
// PUBREL the gate does not know (a session's from before a restart) goes
// to the server, which answers it.
func (c *conn) pubRel(pi uint16) bool {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	if !c.released[pi] {
		return false
	}
	delete(c.released, pi)
	return true
}

func (c *conn) close() {
	c.once.Do(func() {
		close(c.done)
		c.dev.Close()
		c.mu.Lock()
		c.gone = true
		if c.srv != nil {
			c.srv.Close()
		}
		c.mu.Unlock()
	})
}

// frame is one MQTT control packet from the server, whole; ticket, when
// set, is the barrier it waits for.
type frame struct {
	b      []byte
	ticket *round
}

func (c *conn) serve() {
	g := c.g
	defer func() {
		c.close()
		g.mu.Lock()
		delete(g.conns, c)
		g.mu.Unlock()
		g.wg.Done()
	}()
	srv, err := net.DialTimeout("tcp", g.opts.Backend, 5*time.Second)
	if err != nil {
		g.log.Error("mqtt: cannot reach the server's MQTT listener", "backend", g.opts.Backend, "err", err)
		return
	}
	c.mu.Lock()
	c.srv = srv
	gone := c.gone
	c.mu.Unlock()
	if gone {
		srv.Close()
		return
	}

	// Device -> server: every packet as it comes, refused when the
	// gate could not keep the promise of its PUBACK.
	go func() {
		c.forward(srv)
		c.close()
	}()

	// Server -> device: packet by packet, in order; a PUBACK (or PUBREC) or PUBCOMP
	// waits for a barrier that started after the server sent it. What
	// the device has not taken yet stays pending on the server beyond
	// maxQueued, where the server's limits for slow clients see it.
	frames := make(chan frame, 256)
	queued := semaphore.NewWeighted(maxQueued)
	go func() {
		defer close(frames)
		r := bufio.NewReaderSize(srv, 32<<10)
		for {
			b, err := readPacket(r)
			if err != nil {
				return
			}
			_ = queued.Acquire(context.Background(), queuedCost(b))
			f := frame{b: b}
			if t := b[0] >> 4; t == pubAck || t == pubComp {
				if t == pubAck && len(b) == 4 && c.pubRec(uint16(b[2])<<8|uint16(b[3])) {
					b[0] = pubRec << 4
				}
				f.ticket = g.bar.ticket()
				g.holding.Add(1)
			}
			frames <- f
		}
	}()
	w := bufio.NewWriterSize(deadlineWriter{c.dev, g.opts.WriteTimeout}, 32<<10)
	for {
		var f frame
		select {
		case b := <-c.local:
			// The gate's own PUBCOMP: after the PUBREC the device
			// answered, which is written already.
			_, err := w.Write(b)
			if err == nil && len(frames) == 0 && len(c.local) == 0 {
				err = w.Flush()
			}
			if err != nil {
				c.close()
				drain(frames, g, queued)
				return
			}
			continue
		case next, ok := <-frames:
			if !ok {
				_ = w.Flush()
				return
			}
			f = next
		}
		if f.ticket != nil {
			<-f.ticket.done
			g.holding.Add(-1)
			if err := f.ticket.err; err != nil {
				msg := err.Error()
				g.lastErr.Store(&msg)
				g.log.Error("mqtt: a PUBACK could not be confirmed as stored; closing the device's connection, it sends the message again", "device", c.dev.RemoteAddr().String(), "err", err)
				queued.Release(queuedCost(f.b))
				c.close()
				drain(frames, g, queued)
				return
			}
			g.held.Add(1)
		}
		_, err := w.Write(f.b)
		queued.Release(queuedCost(f.b))
		if err == nil && len(frames) == 0 && len(c.local) == 0 {
			err = w.Flush()
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				g.log.Warn("mqtt: the device took nothing of what was sent to it; closing its connection", "device", c.dev.RemoteAddr().String(), "write_timeout", g.opts.WriteTimeout)
			}
			c.close()
			drain(frames, g, queued)
			return
		}
	}
}

// deadlineWriter gives each write to a device timeout to complete.
type deadlineWriter struct {
	conn    net.Conn
	timeout time.Duration
}

func (d deadlineWriter) Write(p []byte) (int, error) {
	if err := d.conn.SetWriteDeadline(time.Now().Add(d.timeout)); err != nil {
		return 0, err
	}
	return d.conn.Write(p)
}

// forward passes the device's packets to the server until either side
// closes or a PUBLISH is refused.
func (c *conn) forward(srv net.Conn) {
	g := c.g
	r := bufio.NewReaderSize(c.dev, 32<<10)
	w := bufio.NewWriterSize(srv, 32<<10)
	topic := make([]byte, 0, 256)
	for {
		hdr, n, err := readHeader(r)
		if err != nil {
			return
		}
		// A QoS 1 or 2 PUBLISH (type 3, QoS in bits 1-2, retained in
		// bit 0): its topic is read before any of it is passed on, then
		// the rest as it comes.
		if hdr[0]>>4 == publish && hdr[0]&0x06 != 0 && n >= 2 {
			var l [2]byte
			if _, err := io.ReadFull(r, l[:]); err != nil {
				return
			}
			tl := int(l[0])<<8 | int(l[1])
			if tl > n-2 {
				return // malformed: the server would close it too
			}
			topic = slices.Grow(topic[:0], tl)[:tl]
			if _, err := io.ReadFull(r, topic); err != nil {
				return
			}
			// What follows the topic: the packet id (2 bytes), the message.
			if subj, ok := natsSubject(topic); ok {
				if why := g.refusal(subj, n-2-tl-2, hdr[0]&0x01 != 0); why != "" {
					_ = w.Flush() // the packets before it are the server's
					g.refuse(c, string(topic), subj, why)
					return
				}
			}
			hdr = append(append(hdr, l[:]...), topic...)
			n -= 2 + tl
			if hdr[0]&0x06 == 0x04 { // QoS 2: passed on as QoS 1
				var pi [2]byte
				if n < 2 {
					return
				}
				if _, err := io.ReadFull(r, pi[:]); err != nil {
					return
				}
				c.asQoS1(uint16(pi[0])<<8 | uint16(pi[1]))
				hdr[0] = hdr[0]&^0x06 | 0x02
				hdr = append(hdr, pi[:]...)
				n -= 2
			}
		}
		// A PUBREL for a message passed on as QoS 1 is answered here.
		if hdr[0] == pubRel<<4|0x02 && n == 2 {
			var pi [2]byte
			if _, err := io.ReadFull(r, pi[:]); err != nil {
				return
			}
			if c.pubRel(uint16(pi[0])<<8 | uint16(pi[1])) {
				select {
				case c.local <- []byte{pubComp << 4, 2, pi[0], pi[1]}:
				case <-c.done:
					return
				}
				if !wholePacketBuffered(r) && w.Flush() != nil {
					return
				}
				continue
			}
			hdr = append(hdr, pi[:]...)
			n = 0
		}
		if _, err := w.Write(hdr); err != nil {
			return
		}
		if _, err := io.CopyN(w, r, int64(n)); err != nil {
			return
		}
		// What is written waits only for a next packet already here
		// whole: reading one still on its way could wait on the device.
		if !wholePacketBuffered(r) {
			if err := w.Flush(); err != nil {
				return
			}
		}
	}
}

// wholePacketBuffered reports whether r holds a whole MQTT packet ready
// to read without waiting.
func wholePacketBuffered(r *bufio.Reader) bool {
	have := r.Buffered()
	hdr, _ := r.Peek(min(have, 5))
	n, mult := 0, 1
	for i := 1; i < len(hdr); i++ {
		n += int(hdr[i]&0x7f) * mult
		if hdr[i]&0x80 == 0 {
			return have >= i+1+n
		}
		mult *= 128
	}
	return false
}

// refuse closes the connection of a device that published topic, on
// subject, with QoS 1 or 2, which no configured stream would store: why
// (a refusal) says what to do.
func (g *Gate) refuse(c *conn, topic, subject, why string) {
	g.refused.Add(1)
	msg := fmt.Sprintf("a QoS 1/2 PUBLISH on topic %q (subject %s) was refused: %s", topic, subject, why)
	g.lastErr.Store(&msg)
	g.log.Error("mqtt: refused a QoS 1/2 PUBLISH that no stream would store, so its PUBACK could not mean stored; closing the device's connection (MQTT 3.1.1 has no negative PUBACK)",
		"why", why, "device", c.dev.RemoteAddr().String(), "topic", topic, "subject", subject)
	c.close()
}

// drain empties frames after the device's connection closed, so that the
// reader ends and the holding count stays true.
func drain(frames <-chan frame, g *Gate, queued *semaphore.Weighted) {
	for f := range frames {
		queued.Release(queuedCost(f.b))
		if f.ticket != nil {
			<-f.ticket.done
			g.holding.Add(-1)
		}
	}
}

// maxQueued bounds the bytes of the server's packets the gate queues for
// one device.
const maxQueued = 1 << 20

// queuedCost is what a packet b takes of the bytes queued for a device
// (maxQueued): its size, and all of them for a larger one, which then goes
// alone.
func queuedCost(b []byte) int64 { return int64(min(len(b), maxQueued)) }

// MQTT control packet types (the high nibble of the first byte).
const (
	publish = 3
	pubAck  = 4
	pubRec  = 5
	pubRel  = 6
	pubComp = 7
)

// maxPacket bounds the remaining length the gate reads: MQTT's own limit
// (four length bytes).
const maxPacket = 268_435_455

// readPacket reads one MQTT control packet, whole.
func readPacket(r *bufio.Reader) ([]byte, error) {
	hdr, n, err := readHeader(r)
	if err != nil {
		return nil, err
	}
	b := make([]byte, len(hdr)+n)
	copy(b, hdr)
	if _, err := io.ReadFull(r, b[len(hdr):]); err != nil {
		return nil, err
	}
	return b, nil
}

// readHeader reads an MQTT control packet's fixed header (type and flags,
// then the remaining length in one to four 7-bit bytes) and returns it
// with the remaining length it announces.
func readHeader(r *bufio.Reader) ([]byte, int, error) {
	hdr := make([]byte, 1, 5)
	first, err := r.ReadByte()
	if err != nil {
		return nil, 0, err
	}
	hdr[0] = first
	n, mult := 0, 1
	for {
		b, err := r.ReadByte()
		if err != nil {
			return nil, 0, err
		}
		hdr = append(hdr, b)
		n += int(b&0x7f) * mult
		if b&0x80 == 0 {
			break
		}
		if len(hdr) == 5 {
			return nil, 0, errors.New("mqtt: malformed remaining length")
		}
		mult *= 128
	}
	if n > maxPacket {
		return nil, 0, errors.New("mqtt: packet too large")
	}
	return hdr, n, nil
}

// The streams nats-server keeps the devices' state in (mqtt.go).
const (
	sessionStream = "$MQTT_sess"
	msgsStream    = "$MQTT_msgs"
)

// Sessions reads how many sessions the server keeps and how many QoS 1 and
// 2 deliveries to devices wait for their acknowledgement (the ack pending
// of the server's consumers on $MQTT_msgs), -1 each when it cannot.
func Sessions(ctx context.Context, js jetstream.JetStream) (sessions, inFlight int64) {
	sessions, inFlight = -1, -1
	if s, err := js.Stream(ctx, sessionStream); err == nil {
		sessions = int64(s.CachedInfo().State.Msgs)
	} else if errors.Is(err, jetstream.ErrStreamNotFound) {
		sessions = 0 // no device connected yet
	}
	s, err := js.Stream(ctx, msgsStream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return sessions, 0
	}
	if err != nil {
		return sessions, -1
	}
	var n int64
	lister := s.ListConsumers(ctx)
	for ci := range lister.Info() {
		n += int64(ci.NumAckPending)
	}
	if lister.Err() != nil {
		return sessions, -1
	}
	return sessions, n
}
