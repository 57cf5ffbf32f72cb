package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/internal/natstest"
	"github.com/holdfast-io/holdfast/internal/testcert"
)

// mqttDevices publish QoS 1 messages from n paho clients (and, when
// mosquitto_pub is installed, one `mosquitto_pub -q 1 -l`) until stop;
// each message's payload is its id and goes to orders/<id>, so that
// ORDERS (orders.*) stores it. Only a PUBACK puts an id in acks.
type mqttDevices struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	sent   int
}

// pahoClient connects a paho client to addr (tcp:// or ssl://), failing
// the test when it cannot.
func pahoClient(t *testing.T, broker, id string, edit func(*paho.ClientOptions)) paho.Client {
	t.Helper()
	c, err := pahoConnect(broker, id, edit)
	if err != nil {
		t.Fatalf("mqtt connect %s as %s: %v", broker, id, err)
	}
	t.Cleanup(func() { c.Disconnect(100) })
	return c
}

func pahoConnect(broker, id string, edit func(*paho.ClientOptions)) (paho.Client, error) {
	o := paho.NewClientOptions().AddBroker(broker).SetClientID(id).
		SetAutoReconnect(false).SetConnectRetry(false).SetConnectTimeout(10 * time.Second).SetWriteTimeout(10 * time.Second)
	if edit != nil {
		edit(o)
	}
	c := paho.NewClient(o)
	tok := c.Connect()
	if !tok.WaitTimeout(15 * time.Second) {
		return nil, errors.New("no CONNACK within 15s")
	}
	return c, tok.Error()
}

func startMQTTDevices(t *testing.T, addr, prefix string, n int, acks *ackLog) *mqttDevices {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	d := &mqttDevices{cancel: cancel}
	for i := range n {
		id := fmt.Sprintf("%s-paho%d", prefix, i)
		c, err := pahoConnect("tcp://"+addr, id, nil)
		if err != nil {
			t.Fatalf("device %s: %v", id, err)
		}
		// The last device publishes with QoS 2: the gate holds its PUBREC
		// like a PUBACK, and paho's token completes at the PUBCOMP after.
		qos := byte(1)
		if i == n-1 {
			qos = 2
		}
		d.wg.Go(func() {
			defer c.Disconnect(0)
			for k := 0; ctx.Err() == nil; k++ {
				msg := fmt.Sprintf("%s-%06d", id, k)
				tok := c.Publish("orders/"+msg, qos, false, msg)
				d.mu.Lock()
				d.sent++
				d.mu.Unlock()
				if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
					return // holdfast was killed
				}
				acks.add(msg, 0)
			}
		})
	}
	if pub, err := exec.LookPath("mosquitto_pub"); err == nil {
		d.mosquitto(t, ctx, pub, addr, prefix+"-mosq", acks)
	} else if os.Getenv("HOLDFAST_REQUIRE_MOSQUITTO") != "" {
		t.Fatal("mosquitto_pub not installed (apt-get install mosquitto-clients)")
	}
	return d
}

// pubAckLine is mosquitto_pub -d's line for a PUBACK.
var pubAckLine = regexp.MustCompile(`received PUBACK \(Mid: (\d+), RC:0\)`)

// mosquitto runs `mosquitto_pub -q 1 -l -d`: each line it reads is a
// message, the n-th with packet id n (fewer than 65,535 per run); its
// debug output names the packet id of each PUBACK.
func (d *mqttDevices) mosquitto(t *testing.T, ctx context.Context, bin, addr, id string, acks *ackLog) {
	host, port, _ := strings.Cut(addr, ":")
	cmd := exec.Command(bin, "-h", host, "-p", port, "-i", id, "-q", "1", "-l", "-d", "-t", "orders/"+id)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d.wg.Go(func() {
		defer func() { _ = stdin.Close() }()
		w := bufio.NewWriter(stdin)
		for k := 1; k < 60_000 && ctx.Err() == nil; k++ {
			if _, err := fmt.Fprintf(w, "%s-%06d\n", id, k); err != nil {
				return
			}
			d.mu.Lock()
			d.sent++
			d.mu.Unlock()
			if k%20 == 0 {
				if w.Flush() != nil {
					return
				}
				time.Sleep(2 * time.Millisecond)
			}
		}
		_ = w.Flush()
	})
	d.wg.Go(func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := pubAckLine.FindStringSubmatch(sc.Text()); m != nil {
				k, _ := strconv.Atoi(m[1])
				acks.add(fmt.Sprintf("%s-%06d", id, k), 0)
			}
		}
		_ = cmd.Wait()
	})
	go func() {
		<-ctx.Done()
		_ = cmd.Process.Kill()
	}()
}

func (d *mqttDevices) stop() {
	d.cancel()
	d.wg.Wait()
}

// TestPowerLossMQTT is the MQTT promise under power cuts: devices publish
// QoS 1 (one of them QoS 2) through holdfast's [mqtt] listener — paho
// clients and Debian's mosquitto_pub — beside NATS publishers on the same
// stream, holdfast is killed at a random moment and the power cut (lazyfs:
// every write not fsynced is gone); every message a device got a PUBACK
// (PUBCOMP) for is in ORDERS at the next start, and every message is
// processed.
func TestPowerLossMQTT(t *testing.T) {
	t.Parallel()
	requireNoLoss(t, runPowerLossMQTT(t, false), "MQTT QoS 1 through [mqtt]")
}

// TestPowerLossMQTTGroupCommit is the same with group_commit = true on the
// stream: the devices' messages reach the stream through holdfast's ingest
// (in atomic batches), and so do the gate's barriers, in the same order.
func TestPowerLossMQTTGroupCommit(t *testing.T) {
	t.Parallel()
	requireNoLoss(t, runPowerLossMQTT(t, true), "MQTT QoS 1 through [mqtt] with group commit")
}

func runPowerLossMQTT(t *testing.T, groupCommit bool) powerLossResult {
	t.Helper()
	var maddr string
	return runPowerLossWith(t, powerLossLoad{
		cycles:      durEnvInt("HOLDFAST_POWERLOSS_CYCLES", 3),
		groupCommit: groupCommit,
		label:       ", MQTT QoS 1 and 2 devices",
		extra: func(port func() int) string {
			maddr = fmt.Sprintf("127.0.0.1:%d", port())
			return fmt.Sprintf("\n[mqtt]\nlisten = %q\n", maddr)
		},
		start: func(cycle int, url string, acks *ackLog) func() {
			devices := startMQTTDevices(t, maddr, fmt.Sprintf("c%03d", cycle), 4, acks)
			pubs := startPublishers(t, url, fmt.Sprintf("n%03d", cycle), 2, acks)
			return func() { devices.stop(); pubs.stop() }
		},
	})
}

// TestMQTTAuthTLSAndWebSocket: with [auth], devices log in as users over
// TLS — none without credentials or with a wrong password, none in plain
// text on the TLS port — publish where their permissions allow, receive
// what NATS clients publish; a NATS client over [websocket] (ws:// on
// loopback) publishes into the same stream.
func TestMQTTAuthTLSAndWebSocket(t *testing.T) {
	t.Parallel()
	etc := t.TempDir()
	certs, err := testcert.Write(etc)
	if err != nil {
		t.Fatal(err)
	}
	hashPassword(t, filepath.Join(etc, "device.hash"), "device-password-1")
	hashPassword(t, filepath.Join(etc, "app.hash"), "app-password-22")
	port, mport, wport := natstest.FreePort(t), natstest.FreePort(t), natstest.FreePort(t)
	cfgPath := e2eWriteConfig(t, fmt.Sprintf(`[server]
name = "edge-mqtt"
host = "127.0.0.1"
port = %d

[jetstream]
store_dir = %q
max_file_store = "1GB"

[http]
listen = ""

[auth.users.device]
password_file = %q
publish_allow = ["sensors.>"]
subscribe_allow = ["sensors.>"]

[auth.users.app]
password_file = %q

[mqtt]
listen = "0.0.0.0:%d"
cert_file = %q
key_file = %q

[websocket]
listen = "127.0.0.1:%d"
no_tls = true

[streams.SENSORS]
subjects = ["sensors.>"]

[consumers.LOGGER]
stream = "SENSORS"
handler = "log"
`, port, filepath.Join(t.TempDir(), "store"), filepath.Join(etc, "device.hash"), filepath.Join(etc, "app.hash"),
		mport, certs.ServerCert, certs.ServerKey, wport))
	if res := runHoldfast(t, nil, "check", "--config", cfgPath); res.code != 0 {
		t.Fatalf("check: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	proc := startHoldfast(t, cfgPath)
	proc.waitReady()

	broker := fmt.Sprintf("ssl://127.0.0.1:%d", mport)
	pem, err := os.ReadFile(certs.CA)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	tlsCfg := func(user, password string) func(*paho.ClientOptions) {
		return func(o *paho.ClientOptions) {
			o.SetTLSConfig(&tls.Config{RootCAs: pool})
			if user != "" {
				o.SetUsername(user).SetPassword(password)
			}
		}
	}
	if _, err := pahoConnect(broker, "anon", tlsCfg("", "")); err == nil {
		t.Fatal("a device without credentials was let in")
	}
	if _, err := pahoConnect(broker, "guess", tlsCfg("device", "wrong")); err == nil {
		t.Fatal("a device with a wrong password was let in")
	}
	if _, err := pahoConnect(fmt.Sprintf("tcp://127.0.0.1:%d", mport), "plain", func(o *paho.ClientOptions) {
		o.SetUsername("device").SetPassword("device-password-1").SetConnectTimeout(3 * time.Second)
	}); err == nil {
		t.Fatal("a device in plain text was let in on the TLS port")
	}

	dev := pahoClient(t, broker, "sensor-1", tlsCfg("device", "device-password-1"))
	got := make(chan string, 4)
	if tok := dev.Subscribe("sensors/commands/#", 1, func(_ paho.Client, m paho.Message) {
		got <- m.Topic() + "=" + string(m.Payload())
	}); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	if tok := dev.Publish("sensors/line1/temp", 1, false, "21.5"); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("publish: %v", tok.Error())
	}

	nc, err := nats.Connect(fmt.Sprintf("ws://127.0.0.1:%d", wport), nats.UserInfo("app", "app-password-22"), nats.MaxReconnects(0))
	if err != nil {
		t.Fatalf("NATS over WebSocket: %v", err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.Publish(ctx, "sensors.commands.line1", []byte("stop")); err != nil {
		t.Fatalf("JetStream publish over WebSocket: %v", err)
	}
	select {
	case m := <-got:
		if m != "sensors/commands/line1=stop" {
			t.Fatalf("device got %q", m)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the device did not receive the NATS client's message")
	}
	// A device's QoS 1 message to another device (here: to itself) goes
	// through the server's QoS 1 delivery.
	peer := pahoClient(t, broker, "sensor-2", tlsCfg("device", "device-password-1"))
	if tok := peer.Publish("sensors/commands/line2", 1, false, "start"); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("publish: %v", tok.Error())
	}
	select {
	case m := <-got:
		if m != "sensors/commands/line2=start" {
			t.Fatalf("device got %q", m)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the device did not receive the other device's QoS 1 message")
	}
	s, err := js.Stream(ctx, "SENSORS")
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(ctx, "sensors.line1.temp")
	if err != nil || string(m.Data) != "21.5" {
		t.Fatalf("the device's reading in SENSORS: %v %v", m, err)
	}
}
