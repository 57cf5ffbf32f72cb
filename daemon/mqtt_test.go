package daemon

import (
	"io"
	"slices"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

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
