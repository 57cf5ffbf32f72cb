package mqtt

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/holdfast-io/holdfast/internal/natstest"
	"github.com/holdfast-io/holdfast/internal/subjects"
)

// sensors is the stream setup configures, as the gate knows it.
var sensors = Stream{Name: "SENSORS", Subjects: []string{"sensors.>"}, Barrier: subjects.Barrier("edge1", "SENSORS")}

// setup runs a server with its MQTT listener on loopback, sync = always,
// and a stream SENSORS on sensors.> with its barrier subject, as holdfast
// configures them; it returns the server's MQTT address and a gate in
// front of it, its options changed by edits.
func setup(t *testing.T, edits ...func(*Options)) (ns *server.Server, js jetstream.JetStream, backend string, g *Gate) {
	t.Helper()
	return setupServer(t, func(*server.Options) {}, edits...)
}

// setupServer is setup with the server's options edited too.
func setupServer(t *testing.T, serverEdit func(*server.Options), edits ...func(*Options)) (ns *server.Server, js jetstream.JetStream, backend string, g *Gate) {
	t.Helper()
	ns = natstest.RunServer(t, natstest.SyncAlways, func(o *server.Options) {
		o.ServerName = "edge1"
		o.MQTT.Host = "127.0.0.1"
		o.MQTT.Port = -1
		serverEdit(o)
	})
	nc := natstest.Connect(t, ns)
	js = natstest.JetStream(t, nc)
	if _, err := js.CreateStream(natstest.Context(t), jetstream.StreamConfig{
		Name: "SENSORS", Subjects: []string{"sensors.>", subjects.Barrier("edge1", "SENSORS")},
	}); err != nil {
		t.Fatal(err)
	}
	backend, err := mqttAddr(ns)
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Listen: "127.0.0.1:0", Backend: backend, Conn: nc,
		Streams: []Stream{sensors}, Log: natstestLogger(t)}
	for _, edit := range edits {
		edit(&o)
	}
	g, err = Listen(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	return ns, js, backend, g
}

func mqttAddr(ns *server.Server) (string, error) {
	v, err := ns.Varz(nil)
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(v.MQTT.Host, strconv.Itoa(v.MQTT.Port)), nil
}

func natstestLogger(t *testing.T) *slog.Logger {
	l, _ := natstest.Logger(t)
	return l
}

func device(t *testing.T, addr, id string) paho.Client {
	t.Helper()
	o := paho.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(id).
		SetAutoReconnect(false).SetConnectRetry(false).SetWriteTimeout(10 * time.Second)
	c := paho.NewClient(o)
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("connect %s: %v", addr, tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(100) })
	return c
}

// flood keeps the stream's inbound queue long: JetStream publishers with
// up to 256 PubAcks outstanding each, as busy local clients have.
func flood(t *testing.T, ns *server.Server, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	for i := range 2 {
		js := natstest.JetStream(t, natstest.Connect(t, ns), jetstream.WithPublishAsyncMaxPending(256))
		wg.Go(func() {
			payload := bytes.Repeat([]byte("x"), 512)
			for {
				select {
				case <-stop:
					<-js.PublishAsyncComplete()
					return
				default:
				}
				if _, err := js.PublishAsync("sensors.flood."+strconv.Itoa(i), payload); err != nil {
					time.Sleep(time.Millisecond)
				}
			}
		})
	}
	return &wg
}

// missingAtPubAck publishes n QoS 1 messages through addr while the
// stream is flooded and counts those not in the stream when their PUBACK
// arrived.
func missingAtPubAck(t *testing.T, ns *server.Server, js jetstream.JetStream, addr string, n int) int {
	t.Helper()
	stop := make(chan struct{})
	wg := flood(t, ns, stop)
	defer func() { close(stop); wg.Wait() }()
	time.Sleep(200 * time.Millisecond)
	c := device(t, addr, "probe"+strconv.FormatInt(time.Now().UnixNano(), 36))
	stream, err := js.Stream(natstest.Context(t), "SENSORS")
	if err != nil {
		t.Fatal(err)
	}
	missing := 0
	prefix := "probe" + strconv.FormatInt(time.Now().UnixNano(), 36)
	for i := range n {
		topic := fmt.Sprintf("sensors/%s/%d", prefix, i)
		tok := c.Publish(topic, 1, false, []byte("reading "+strconv.Itoa(i)))
		if !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
			t.Fatalf("publish %s: no PUBACK: %v", topic, tok.Error())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := stream.GetLastMsgForSubject(ctx, fmt.Sprintf("sensors.%s.%d", prefix, i))
		cancel()
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			missing++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	return missing
}

// A PUBACK through the gate comes once the message is in the configured
// stream, also while that stream is busy with other publishers. The
// server's own PUBACK (straight to its MQTT listener) comes once its
// session stream has a copy; the figure is logged, not asserted: how
// often it is early depends on the machine's load.
func TestPubAckAfterStored(t *testing.T) {
	ns, js, backend, g := setup(t)
	const n = 40
	direct := missingAtPubAck(t, ns, js, backend, n)
	t.Logf("the server's own MQTT listener: %d of %d PUBACKs came before the message was in the stream", direct, n)
	if m := missingAtPubAck(t, ns, js, g.Addr().String(), n); m != 0 {
		t.Fatalf("through the gate, %d of %d PUBACKs came before the message was in the stream", m, n)
	}
	st := g.Stats()
	if st.Acked < n || st.Barriers == 0 || st.Failed != 0 || st.Holding != 0 {
		t.Fatalf("stats = %+v, want %d acked after barriers, none failed or held", st, n)
	}
}

// Devices subscribe and receive what NATS clients publish, and each
// other's QoS 1 messages, through the gate.
func TestSubscribeThroughGate(t *testing.T) {
	ns, _, _, g := setup(t)
	sub := device(t, g.Addr().String(), "display")
	got := make(chan string, 10)
	if tok := sub.Subscribe("sensors/#", 1, func(_ paho.Client, m paho.Message) {
		got <- m.Topic() + "=" + string(m.Payload())
	}); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	nc := natstest.Connect(t, ns)
	if err := nc.Publish("sensors.line1.temp", []byte("21.5")); err != nil {
		t.Fatal(err)
	}
	pub := device(t, g.Addr().String(), "thermometer")
	if tok := pub.Publish("sensors/line2/temp", 1, false, "19.0"); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("publish: %v", tok.Error())
	}
	want := map[string]bool{"sensors/line1/temp=21.5": true, "sensors/line2/temp=19.0": true}
	for len(want) > 0 {
		select {
		case m := <-got:
			if !want[m] {
				t.Fatalf("got %q, want one of %v", m, want)
			}
			delete(want, m)
		case <-time.After(10 * time.Second):
			t.Fatalf("still waiting for %v", want)
		}
	}
}

// A barrier that cannot pass (the stream is gone) holds the PUBACK and
// closes the device's connection: the device sends the message again
// rather than taking an acknowledgement for a message nobody stored.
func TestBarrierFailureClosesConnection(t *testing.T) {
	_, js, _, g := setup(t)
	g.bar.timeout = 2 * time.Second
	c := device(t, g.Addr().String(), "lonely")
	if err := js.DeleteStream(natstest.Context(t), "SENSORS"); err != nil {
		t.Fatal(err)
	}
	tok := c.Publish("sensors/x", 1, false, "1")
	if tok.WaitTimeout(10*time.Second) && tok.Error() == nil {
		t.Fatal("a PUBACK reached the device though no stream stored its message")
	}
	natstest.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		if c.IsConnectionOpen() {
			return errors.New("still connected")
		}
		if st := g.Stats(); st.Failed == 0 || st.LastError == "" {
			return fmt.Errorf("stats %+v: no failed barrier", st)
		}
		return nil
	})
}

// A QoS 1 or 2 PUBLISH on a topic no configured stream takes is refused:
// the server would acknowledge it once its own session store had it, kept
// in no stream (found 2026-12-04). The device's connection closes without
// a PUBACK, what it published before stays published, and QoS 0 and
// retained messages on such topics pass as before.
func TestPublishNoStreamTakesRefused(t *testing.T) {
	_, js, _, g := setup(t)
	addr := g.Addr().String()
	c := device(t, addr, "lost-device")
	// QoS 0: no PUBACK, no promise; a retained message is kept as the
	// topic's retained message.
	if tok := c.Publish("elsewhere/qos0", 0, false, "0"); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("QoS 0 publish: %v", tok.Error())
	}
	if tok := c.Publish("elsewhere/status", 1, true, "online"); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("retained QoS 1 publish: no PUBACK: %v", tok.Error())
	}
	if tok := c.Publish("sensors/before", 1, false, "kept"); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("publish to sensors/before: %v", tok.Error())
	}
	for _, qos := range []byte{1, 2} {
		if qos == 2 {
			c = device(t, addr, "lost-device-2")
		}
		tok := c.Publish("elsewhere/reading", qos, false, "lost")
		if tok.WaitTimeout(5*time.Second) && tok.Error() == nil {
			t.Fatalf("QoS %d publish on a topic no stream takes was acknowledged", qos)
		}
		natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
			if c.IsConnectionOpen() {
				return errors.New("the device is still connected")
			}
			return nil
		})
	}
	st := g.Stats()
	if st.Refused != 2 || !strings.Contains(st.LastError, `"elsewhere/reading"`) || !slices.Equal(st.Streams, []string{"SENSORS"}) {
		t.Fatalf("stats %+v: want 2 refused, the topic in the last error, streams [SENSORS]", st)
	}
	stream, err := js.Stream(natstest.Context(t), "SENSORS")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.GetLastMsgForSubject(natstest.Context(t), "sensors.before"); err != nil {
		t.Fatalf("the message published before the refused one: %v", err)
	}
	// Once a stream takes the subject, the same publish is acknowledged.
	if _, err := js.CreateStream(natstest.Context(t), jetstream.StreamConfig{
		Name: "ELSEWHERE", Subjects: []string{"elsewhere.>", subjects.Barrier("edge1", "ELSEWHERE")},
	}); err != nil {
		t.Fatal(err)
	}
	g.SetStreams([]Stream{sensors, {Name: "ELSEWHERE", Subjects: []string{"elsewhere.>"}, Barrier: subjects.Barrier("edge1", "ELSEWHERE")}})
	c = device(t, addr, "found-device")
	if tok := c.Publish("elsewhere/reading", 1, false, "kept"); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("publish once ELSEWHERE takes it: %v", tok.Error())
	}
}

// natsSubject gives the subject the server itself publishes a topic on:
// devices publish QoS 0 straight to the server's MQTT listener and a NATS
// subscriber sees each subject.
func TestTopicsBecomeTheServersSubjects(t *testing.T) {
	ns, _, backend, _ := setup(t)
	nc := natstest.Connect(t, ns)
	got := make(chan string, 64)
	sub, err := nc.Subscribe(">", func(m *nats.Msg) {
		if strings.HasPrefix(string(m.Data), "topic=") {
			got <- m.Subject + " " + string(m.Data)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	c := device(t, backend, "topics")
	for _, topic := range []string{"a", "a/b/c", "/a", "a/", "a//b", "//a", "a//", "/", "//", "a.b", "a/./b", ".", "/.", "a/*/b", "a/>", "x-y_z/ä"} {
		want, ok := natsSubject([]byte(topic))
		if !ok {
			t.Fatalf("natsSubject(%q) refused a topic the server takes", topic)
		}
		if tok := c.Publish(topic, 0, false, "topic="+topic); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("publish %q: %v", topic, tok.Error())
		}
		select {
		case m := <-got:
			if m != want+" topic="+topic {
				t.Errorf("topic %q: the server published %q, natsSubject says %q", topic, m, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("topic %q: nothing published", topic)
		}
	}
	for _, topic := range []string{"", "a b", "a/+", "a/#", "a\x7f"} {
		if _, ok := natsSubject([]byte(topic)); ok {
			t.Errorf("natsSubject(%q) took a topic the server refuses", topic)
		}
	}
}

// readPacket splits a byte stream into MQTT packets at the lengths their
// fixed headers give, one to four length bytes.
func TestReadPacket(t *testing.T) {
	var stream []byte
	var want [][]byte
	for _, n := range []int{0, 2, 127, 128, 16383, 16384, 70000} {
		p := []byte{0x30}
		for x := n; ; {
			b := byte(x % 128)
			x /= 128
			if x > 0 {
				b |= 0x80
			}
			p = append(p, b)
			if x == 0 {
				break
			}
		}
		p = append(p, bytes.Repeat([]byte{byte(n)}, n)...)
		want = append(want, p)
		stream = append(stream, p...)
	}
	r := bufio.NewReader(bytes.NewReader(stream))
	for i, w := range want {
		got, err := readPacket(r)
		if err != nil || !bytes.Equal(got, w) {
			t.Fatalf("packet %d: %d bytes, %v; want %d bytes", i, len(got), err, len(w))
		}
	}
	if _, err := readPacket(r); err == nil {
		t.Fatal("no error at the end")
	}
	if _, err := readPacket(bufio.NewReader(bytes.NewReader([]byte{0x30, 0xff, 0xff, 0xff, 0xff, 0x01}))); err == nil {
		t.Fatal("a fifth length byte was taken")
	}
}

// A device with a persistent session (clean session false) that was away
// gets, when it comes back, the QoS 1 messages published for its
// subscription meanwhile.
func TestPersistentSessionThroughGate(t *testing.T) {
	_, _, _, g := setup(t)
	addr := g.Addr().String()
	got := make(chan string, 10)
	opts := func(o *paho.ClientOptions) *paho.ClientOptions {
		return o.SetCleanSession(false).SetDefaultPublishHandler(func(_ paho.Client, m paho.Message) {
			got <- m.Topic() + "=" + string(m.Payload())
		})
	}
	connect := func() paho.Client {
		t.Helper()
		c := paho.NewClient(opts(paho.NewClientOptions().AddBroker("tcp://" + addr).SetClientID("display-7").SetAutoReconnect(false)))
		if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("connect: %v", tok.Error())
		}
		return c
	}
	away := connect()
	if tok := away.Subscribe("sensors/alarms/#", 1, nil); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	away.Disconnect(100)

	pub := device(t, addr, "alarm-panel")
	if tok := pub.Publish("sensors/alarms/door", 1, false, "open"); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("publish: %v", tok.Error())
	}
	ns := g.opts.Conn
	js, err := jetstream.New(ns)
	if err != nil {
		t.Fatal(err)
	}
	if sessions, _ := Sessions(natstest.Context(t), js); sessions < 1 {
		t.Fatalf("%d sessions kept while the persistent one is away, want at least 1", sessions)
	}
	back := connect()
	defer back.Disconnect(100)
	select {
	case m := <-got:
		if m != "sensors/alarms/door=open" {
			t.Fatalf("got %q", m)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the device that came back did not get the message published while it was away")
	}
}

// MetricNames lists what Register and RegisterSessions add, no more.
func TestMetricNames(t *testing.T) {
	_, js, _, g := setup(t)
	reg := prometheus.NewRegistry()
	if err := g.Register(reg); err != nil {
		t.Fatal(err)
	}
	if err := RegisterSessions(reg, js); err != nil {
		t.Fatal(err)
	}
	g.bar.seconds.Observe(0.001) // a histogram without observations is still gathered
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range families {
		got = append(got, f.GetName())
	}
	want := MetricNames()
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("registered %q, MetricNames says %q", got, want)
	}
}

// wholePacketBuffered says whether the next packet is all there: the gate
// sends on what it has before it waits for the rest of one.
func TestWholePacketBuffered(t *testing.T) {
	ping := []byte{0xc0, 0x00}
	long := append([]byte{0x30, 0x80, 0x01}, bytes.Repeat([]byte{'x'}, 128)...)
	for _, tc := range []struct {
		in   []byte
		want bool
	}{
		{nil, false},
		{ping[:1], false},
		{ping, true},
		{append(slices.Clone(ping), 0x30), true}, // the next one is whole
		{[]byte{0x30}, false},
		{long[:2], false},
		{long[:100], false},
		{long, true},
		{append(slices.Clone(long), ping...), true},
	} {
		r := bufio.NewReaderSize(bytes.NewReader(tc.in), 4096)
		_, _ = r.Peek(len(tc.in)) // fill the buffer with all of it
		if got := wholePacketBuffered(r); got != tc.want {
			t.Errorf("%d bytes %x...: %v, want %v", len(tc.in), tc.in[:min(len(tc.in), 4)], got, tc.want)
		}
	}
}

// A packet the device sent reaches the server without waiting for the
// rest of the one after it: a PINGREQ followed by the start of a PUBLISH
// gets its PINGRESP.
func TestGatePassesPacketsBeforeAPartialOne(t *testing.T) {
	_, _, _, g := setup(t)
	c, r := rawDevice(t, g.Addr().String(), "raw-device")
	// PINGREQ, then the first bytes of a QoS 0 PUBLISH of 100 bytes.
	if _, err := c.Write([]byte{0xc0, 0x00, 0x30, 100, 0, 9, 's', 'e'}); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	if p, err := readPacket(r); err != nil || p[0] != 0xd0 {
		t.Fatalf("PINGRESP: %x, %v (the PINGREQ waited for the PUBLISH after it)", p, err)
	}
}

// rawDevice connects to addr over plain TCP as an MQTT 3.1.1 device with
// a clean session and returns once the CONNACK came; the connection reads
// with a deadline of 10 s from then.
func rawDevice(t *testing.T, addr, id string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	connect := append([]byte{0x10, byte(12 + len(id)), 0, 4, 'M', 'Q', 'T', 'T', 4, 0x02, 0, 60, 0, byte(len(id))}, id...)
	if _, err := c.Write(connect); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(c)
	if p, err := readPacket(r); err != nil || p[0] != 0x20 {
		t.Fatalf("CONNACK: %x, %v", p, err)
	}
	return c, r
}

// deafDevice subscribes a raw device to sensors/# with QoS 0 through g,
// which then reads nothing, and publishes n messages of 512 KiB to it.
func deafDevice(t *testing.T, ns *server.Server, g *Gate, n int) {
	t.Helper()
	c, r := rawDevice(t, g.Addr().String(), "deaf-device")
	if err := c.(*net.TCPConn).SetReadBuffer(64 << 10); err != nil {
		t.Fatal(err)
	}
	filter := "sensors/#"
	subscribe := append([]byte{0x82, byte(5 + len(filter)), 0, 1, 0, byte(len(filter))}, filter...)
	if _, err := c.Write(append(subscribe, 0)); err != nil {
		t.Fatal(err)
	}
	if p, err := readPacket(r); err != nil || p[0] != 0x90 {
		t.Fatalf("SUBACK: %x, %v", p, err)
	}
	nc := natstest.Connect(t, ns)
	payload := bytes.Repeat([]byte("x"), 512<<10)
	for range n {
		if err := nc.Publish("sensors.firmware", payload); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// A device that subscribes and then takes nothing of what the server
// sends it is disconnected once a write to it has waited WriteTimeout:
// its connection, and what the gate holds for it, do not outlast it.
func TestDeviceThatNeverReadsIsDisconnected(t *testing.T) {
	t.Parallel()
	ns, _, _, g := setup(t, func(o *Options) { o.WriteTimeout = time.Second })
	// 32 MiB is more than the sockets between the gate and the device
	// hold.
	deafDevice(t, ns, g, 64)
	natstest.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		if n := g.Stats().Connections; n != 0 {
			return fmt.Errorf("the gate still keeps %d connection(s) of a device that reads nothing", n)
		}
		return nil
	})
}

// The gate queues little for a device beyond what the sockets hold: what
// a device takes nothing of stays pending on the server, whose
// max_pending and write_deadline apply to it as to a device connected to
// the server directly.
func TestDeviceThatNeverReadsLeavesItPendingOnServer(t *testing.T) {
	t.Parallel()
	// The server's write_deadline (10 s by default) closes the device's
	// connection once its writes have stalled that long: publishing 60
	// MiB can take longer than that on a loaded machine (31 s once in
	// CI, with the race detector), and the pending bytes are looked for
	// after it.
	ns, _, _, g := setupServer(t, func(o *server.Options) { o.WriteDeadline = 5 * time.Minute },
		func(o *Options) { o.WriteTimeout = time.Minute })
	// 60 MiB: less than the server's max_pending (64 MiB), which would
	// close the connection, and more than the sockets between the
	// server and the device hold (up to 4 MiB and tcp_rmem's maximum,
	// 32 MiB here, on the gate's side; the device's receive buffer is
	// 64 KiB) by more than the 16 MiB looked for.
	deafDevice(t, ns, g, 120)
	natstest.CheckFor(t, 8*time.Second, 50*time.Millisecond, func() error {
		cz, err := ns.Connz(&server.ConnzOptions{MQTTClient: "deaf-device"})
		if err != nil {
			return err
		}
		if len(cz.Conns) != 1 {
			return fmt.Errorf("%d server connections of the device", len(cz.Conns))
		}
		if p := cz.Conns[0].Pending; p < 16<<20 {
			return fmt.Errorf("the server holds %d bytes pending for the device; the gate took the rest of 60 MiB the device did not read", p)
		}
		return nil
	})
}

// The gate keeps taking devices after it ran out of file descriptors for
// a moment (a flood of connections): a device that connects once there
// are descriptors again gets its CONNACK. Not parallel: it lowers the
// test process's descriptor limit.
func TestGateAcceptsAfterRunningOutOfDescriptors(t *testing.T) {
	logger, logs := natstest.Logger(t)
	_, _, _, g := setup(t, func(o *Options) { o.Log = logger })
	var limit syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &limit); err != nil {
		t.Fatal(err)
	}
	open, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd:", err)
	}
	low := limit
	low.Cur = uint64(len(open) + 64)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	var filler []*os.File
	release := func() {
		for _, f := range filler {
			f.Close()
		}
		filler = nil
	}
	defer func() {
		release()
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &limit); err != nil {
			t.Error(err)
		}
	}()
	for {
		f, err := os.Open(os.DevNull)
		if err != nil {
			break
		}
		filler = append(filler, f)
	}
	// One descriptor for the device's side: the gate's accept finds none.
	filler[len(filler)-1].Close()
	filler = filler[:len(filler)-1]
	early, err := net.Dial("tcp", g.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer early.Close()
	natstest.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if !strings.Contains(logs.String(), "cannot take a device's connection") {
			return errors.New("the gate did not say it could not take the connection")
		}
		return nil
	})
	release()
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &limit); err != nil {
		t.Fatal(err)
	}
	rawDevice(t, g.Addr().String(), "after-the-flood")
}

// A QoS 2 PUBREC through the gate comes once the message is in the
// configured stream, as a QoS 1 PUBACK does: at the PUBREC the device
// forgets the message. The server alone would send it from its own QoS 2
// store and hand the message to the stream only at the device's PUBREL,
// after which a kill -9 could lose it between the two stores. Each PUBREL
// is answered with a PUBCOMP, also one sent in the same segment as the
// next PUBLISH, and each message is stored once.
func TestPubRecAfterStored(t *testing.T) {
	ns, js, _, g := setup(t)
	stop := make(chan struct{})
	wg := flood(t, ns, stop)
	defer func() { close(stop); wg.Wait() }()
	c, r := rawDevice(t, g.Addr().String(), "qos2")
	stream, err := js.Stream(natstest.Context(t), "SENSORS")
	if err != nil {
		t.Fatal(err)
	}
	// A PUBREL the gate does not know (a session's from before a restart)
	// goes to the server, which answers it.
	if _, err := c.Write([]byte{0x62, 2, 0, 99}); err != nil {
		t.Fatal(err)
	}
	if p, err := readPacket(r); err != nil || !bytes.Equal(p, []byte{0x70, 2, 0, 99}) {
		t.Fatalf("PUBREL for a message the gate never saw: got %x, %v; want PUBCOMP 70020063", p, err)
	}
	const n = 5
	for pi := byte(1); pi <= n+1; pi++ {
		// The PUBLISH of pi, then the PUBREL of the one before, at once.
		var out, want []byte
		answers := 0
		if pi <= n {
			topic := fmt.Sprintf("sensors/q2/%d", pi)
			out = append([]byte{0x34, byte(2 + len(topic) + 2 + 1), 0, byte(len(topic))}, topic...)
			out = append(out, 0, pi, 'x')
			want = []byte{0x50, 2, 0, pi}
			answers++
		}
		if pi > 1 {
			out = append(out, 0x62, 2, 0, pi-1)
			answers++
		}
		if _, err := c.Write(out); err != nil {
			t.Fatal(err)
		}
		for range answers {
			p, err := readPacket(r)
			switch {
			case err != nil:
				t.Fatalf("after PUBLISH %d and PUBREL %d: %v", pi, pi-1, err)
			case bytes.Equal(p, []byte{0x70, 2, 0, pi - 1}):
			case bytes.Equal(p, want):
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := stream.GetLastMsgForSubject(ctx, fmt.Sprintf("sensors.q2.%d", pi))
				cancel()
				if err != nil {
					t.Fatalf("sensors.q2.%d at its PUBREC: %v; want it in SENSORS (the device has forgotten it)", pi, err)
				}
			default:
				t.Fatalf("after PUBLISH %d and PUBREL %d: got %x, want PUBREC 5002%04x or PUBCOMP 7002%04x", pi, pi-1, p, pi, pi-1)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter("sensors.q2.>"))
	if err != nil {
		t.Fatal(err)
	}
	for pi := 1; pi <= n; pi++ {
		if got := info.State.Subjects[fmt.Sprintf("sensors.q2.%d", pi)]; got != 1 {
			t.Errorf("SENSORS holds sensors.q2.%d %d times, want once", pi, got)
		}
	}
}
