package daemon

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/internal/natstest"
)

// TestReloadedStreamTakesDevices: a stream added at a reload is one the
// MQTT gate answers for at once: a device's QoS 1 publish on its subject
// gets its PUBACK once that stream has it (before, the gate kept the
// streams it started with: such a publish was refused, and without the
// refusal its PUBACK waited for the other streams only), and a stream
// left out at a reload is no longer waited for.
func TestReloadedStreamTakesDevices(t *testing.T) {
	d := openWith(t, io.Discard, func(cfg *config.Config) { cfg.MQTT.Listen = "127.0.0.1:0" })
	ctx := natstest.Context(t)
	if got := d.mqtt.Stats().Streams; !slices.Equal(got, []string{"ORDERS"}) {
		t.Fatalf("the gate answers for %q, want [ORDERS]", got)
	}

	next := editable(d.Running())
	sc := *next.Streams["ORDERS"]
	sc.Subjects = []string{"sensors.>"}
	next.Streams["SENSORS"] = &sc
	if err := next.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := d.Reload(ctx, next); err != nil {
		t.Fatal(err)
	}
	if got := d.mqtt.Stats().Streams; !slices.Equal(got, []string{"ORDERS", "SENSORS"}) {
		t.Fatalf("after the reload the gate answers for %q, want [ORDERS SENSORS]", got)
	}
	o := paho.NewClientOptions().AddBroker("tcp://" + d.mqtt.Addr().String()).SetClientID("thermometer").SetAutoReconnect(false)
	c := paho.NewClient(o)
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("connect: %v", tok.Error())
	}
	defer c.Disconnect(100)
	if tok := c.Publish("sensors/line1/temp", 1, false, "21.5"); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("publish to the stream added at the reload: no PUBACK: %v", tok.Error())
	}
	s, err := d.srv.JetStream().Stream(ctx, "SENSORS")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetLastMsgForSubject(ctx, "sensors.line1.temp"); err != nil {
		t.Fatalf("the acknowledged message is not in SENSORS: %v", err)
	}

	back := editable(d.Running())
	delete(back.Streams, "SENSORS")
	if err := d.Reload(ctx, back); err != nil {
		t.Fatal(err)
	}
	if got := d.mqtt.Stats().Streams; !slices.Equal(got, []string{"ORDERS"}) {
		t.Fatalf("after SENSORS was left out the gate answers for %q, want [ORDERS]", got)
	}
}

// TestGroupCommitTopicsNotStoredAreRefused: with group_commit on the
// stream, a device's QoS 1 PUBLISH whose subject group commit's ingest
// cannot store (a topic level "*" or ">", or a topic too long for the
// control line with the ingest's prefix) is refused by the gate like a
// topic no stream takes. Before, the ingest dropped it (the server
// publishes a device's message without a reply to refuse) while the
// barrier passed: the device got its PUBACK for a message in no stream
// (found 2026-12-05).
func TestGroupCommitTopicsNotStoredAreRefused(t *testing.T) {
	d, s := openMQTT(t, func(cfg *config.Config) {
		cfg.Streams["ORDERS"].Subjects = []string{"orders.>"}
		cfg.Streams["ORDERS"].GroupCommit = true
	})
	ctx := natstest.Context(t)
	for i, topic := range []string{"orders/ok", "orders/*", "orders/a/>", "orders/" + strings.Repeat("x", 4100), "orders/x*y"} {
		acked := devicePublish(t, d, fmt.Sprint("device-", i), topic, false, "21.5")
		subj := "orders." + strings.TrimPrefix(topic, "orders/")
		subj = strings.ReplaceAll(subj, "/", ".")
		// The last message on subj as a filter, which a wildcard
		// subject matches more than: the one stored under subj itself.
		m, err := s.GetLastMsgForSubject(ctx, subj)
		stored := err == nil && m.Subject == subj
		name := topic[:min(len(topic), 20)]
		if acked && !stored {
			t.Errorf("topic %q: PUBACK for a message that is not in ORDERS (%v)", name, err)
		}
		if (topic == "orders/ok" || topic == "orders/x*y") && !(acked && stored) {
			t.Errorf("topic %q: acked %v, stored %v: want both", name, acked, stored)
		}
	}
}

// TestMQTTMessageTooLargeForStreamRefused: a QoS 1 message that with the
// server's MQTT header is larger than the stream's max_msg_size (its
// server.max_payload) is refused by the gate; one byte less is stored and
// acknowledged. Before, the server took it (it allows 8 KiB more than
// max_payload), the stream refused it to no one, and the device got its
// PUBACK (found 2026-12-05). With group_commit the header reaches the
// stream one byte larger (group commit's ingest writes it as the NATS
// client does, "Nmqtt-Pub: 1"): before, the gate counted the server's
// 25 bytes there too, and a message of max_payload-25 bytes was
// acknowledged and in no stream (found 2026-12-05).
func TestMQTTMessageTooLargeForStreamRefused(t *testing.T) {
	for _, gc := range []bool{false, true} {
		t.Run(fmt.Sprint("group_commit=", gc), func(t *testing.T) { testMQTTMessageTooLarge(t, gc) })
	}
}

func testMQTTMessageTooLarge(t *testing.T, groupCommit bool) {
	const maxPayload = 4096
	d, s := openMQTT(t, func(cfg *config.Config) {
		cfg.Server.MaxPayload = config.Bytes(maxPayload)
		cfg.Streams["ORDERS"].GroupCommit = groupCommit
	})
	ctx := natstest.Context(t)
	header := "NATS/1.0\r\nNmqtt-Pub:1\r\n\r\n"
	if groupCommit {
		header = "NATS/1.0\r\nNmqtt-Pub: 1\r\n\r\n"
	}
	fits := maxPayload - len(header)
	for i, size := range []int{fits, fits + 1, maxPayload} {
		subj := fmt.Sprint("orders.s", size)
		acked := devicePublish(t, d, fmt.Sprint("device-", i), strings.ReplaceAll(subj, ".", "/"), false, strings.Repeat("x", size))
		_, err := s.GetLastMsgForSubject(ctx, subj)
		stored := err == nil
		if acked && !stored {
			t.Errorf("%d bytes: PUBACK for a message that is not in ORDERS (%v)", size, err)
		}
		if size == fits && !(acked && stored) {
			t.Errorf("%d bytes (what the stream takes): acked %v, stored %v: want both", size, acked, stored)
		}
	}
	if n := d.mqtt.Stats().Refused; n != 2 {
		t.Errorf("%d publishes refused, want 2", n)
	}
}

// TestMQTTRetainedMessageHeldToItsStream: a retained QoS 1 message on a
// topic a stream takes is held to what that stream stores, as any other:
// too large for its max_msg_size, or on a topic group commit cannot
// store, it is refused, not acknowledged. Before, the gate let every
// retained message through unread: the server kept it as the topic's
// retained message and published it to the stream, which refused it to
// no one, and the device got its PUBACK for a message in no stream
// (found 2026-12-05). A retained message no stream takes still passes.
func TestMQTTRetainedMessageHeldToItsStream(t *testing.T) {
	const maxPayload = 4096
	d, s := openMQTT(t, func(cfg *config.Config) {
		cfg.Server.MaxPayload = config.Bytes(maxPayload)
		cfg.Streams["ORDERS"].Subjects = []string{"orders.>"}
		cfg.Streams["ORDERS"].GroupCommit = true
	})
	ctx := natstest.Context(t)
	fits := maxPayload - len("NATS/1.0\r\nNmqtt-Pub: 1\r\n\r\n") // as group commit passes it on
	for i, tc := range []struct {
		topic string
		size  int
		want  bool // acknowledged: stored in ORDERS, or taken by no stream
	}{
		{"orders/fits", fits, true},
		{"orders/large", fits + 1, false},
		{"orders/*", 4, false},
		{"elsewhere/status", 6, true},
	} {
		acked := devicePublish(t, d, fmt.Sprint("device-", i), tc.topic, true, strings.Repeat("x", tc.size))
		subj := strings.ReplaceAll(tc.topic, "/", ".")
		m, err := s.GetLastMsgForSubject(ctx, subj)
		stored := err == nil && m.Subject == subj
		if acked && !stored && strings.HasPrefix(tc.topic, "orders/") {
			t.Errorf("retained %q, %d bytes: PUBACK for a message that is not in ORDERS (%v)", tc.topic, tc.size, err)
		}
		if acked != tc.want {
			t.Errorf("retained %q, %d bytes: acked %v, want %v", tc.topic, tc.size, acked, tc.want)
		}
	}
	if n := d.mqtt.Stats().Refused; n != 2 {
		t.Errorf("%d publishes refused, want 2", n)
	}
}

// devicePublish connects an MQTT device named id to d's listener,
// publishes payload on topic with QoS 1 (retained or not) and reports
// whether its PUBACK came within 5 s; then it disconnects.
func devicePublish(t *testing.T, d *Daemon, id, topic string, retained bool, payload string) bool {
	t.Helper()
	c := paho.NewClient(paho.NewClientOptions().AddBroker("tcp://" + d.mqtt.Addr().String()).SetClientID(id).SetAutoReconnect(false))
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("connect: %v", tok.Error())
	}
	defer c.Disconnect(100)
	tok := c.Publish(topic, 1, retained, payload)
	return tok.WaitTimeout(5*time.Second) && tok.Error() == nil
}

// openMQTT opens a daemon with [mqtt] on a free loopback port and the
// config changed by tweak, and returns it with its stream ORDERS.
func openMQTT(t *testing.T, tweak func(*config.Config)) (*Daemon, jetstream.Stream) {
	t.Helper()
	d := openWith(t, io.Discard, func(cfg *config.Config) {
		cfg.MQTT.Listen = "127.0.0.1:0"
		tweak(cfg)
	})
	s, err := d.srv.JetStream().Stream(natstest.Context(t), "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	return d, s
}
