package daemon

import (
	"crypto/tls"
	"fmt"
	"net"
	"strconv"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/embedded/mqtt"
	"github.com/holdfast-io/holdfast/internal/subjects"
)

// openMQTT starts the devices' MQTT listener ([mqtt]) once everything
// behind it serves: the gate in front of the server's own MQTT listener.
func (d *Daemon) openMQTT() error {
	m := d.cfg.MQTT
	if !m.Enabled() {
		return nil
	}
	backend, err := mqttBackend(d.srv.NATS())
	if err != nil {
		return err
	}
	var tc *tls.Config
	if m.TLSEnabled() {
		if tc, err = mqttTLS(m); err != nil {
			return err
		}
	}
	nc, err := d.srv.Connect("holdfast-mqtt-gate")
	if err != nil {
		return err
	}
	d.mqtt, err = mqtt.Listen(mqtt.Options{
		Listen:  m.Listen,
		TLS:     tc,
		Backend: backend,
		Conn:    nc,
		Streams: gateStreams(d.cfg),
		Log:     d.log.With("component", "mqtt"),
	})
	if err != nil {
		nc.Close()
		return err
	}
	d.mqttConn = nc
	if err := d.mqtt.Register(d.metrics.Registry()); err != nil {
		return err
	}
	if err := mqtt.RegisterSessions(d.metrics.Registry(), d.srv.JetStream()); err != nil {
		return err
	}
	if d.cfg.WebSocket.Enabled() {
		d.log.Warn("mqtt: devices that connect over WebSocket (path /mqtt of websocket.listen) get the server's own PUBACK, sent once its session stream has the message, not once the configured stream has; connect them to mqtt.listen",
			"websocket", d.cfg.WebSocket.Listen, "mqtt", d.mqtt.Addr().String())
	}
	d.log.Info("mqtt: taking devices", "listen", d.mqtt.Addr().String(), "tls", tc != nil, "streams", d.cfg.StreamNames())
	return nil
}

// closeMQTT closes the devices' listener and connections first, before
// what they publish into stops.
func (d *Daemon) closeMQTT() {
	if d.mqtt != nil {
		_ = d.mqtt.Close()
	}
	if d.mqttConn != nil {
		d.mqttConn.Close()
	}
}

// gateStreams are the streams that take messages published on this
// server, with their barrier subjects (bootstrap.StreamSpec adds them).
func gateStreams(cfg *config.Config) []mqtt.Stream {
	var out []mqtt.Stream
	for _, name := range cfg.StreamNames() {
		if cfg.TakesBarrier(name) {
			out = append(out, mqtt.Stream{Name: name, Subjects: cfg.Streams[name].Subjects, Barrier: subjects.Barrier(cfg.Server.Name, name),
				GroupCommit: cfg.Streams[name].GroupCommit, MaxMsgSize: int(cfg.StreamMaxMsgSize(name))})
		}
	}
	return out
}

// mqttBackend is the address of the server's own MQTT listener, which
// holdfast opens on a free loopback port.
func mqttBackend(ns *server.Server) (string, error) {
	v, err := ns.Varz(nil)
	if err != nil {
		return "", err
	}
	if v.MQTT.Port <= 0 {
		return "", fmt.Errorf("the server has no MQTT listener")
	}
	return net.JoinHostPort(v.MQTT.Host, strconv.Itoa(v.MQTT.Port)), nil
}

func mqttTLS(m config.MQTTConfig) (*tls.Config, error) {
	tc, err := server.GenTLSConfig(&server.TLSConfigOpts{
		CertFile: m.CertFile, KeyFile: m.KeyFile, CaFile: m.CAFile, Verify: m.Verify, MinVersion: tls.VersionTLS12,
	})
	if err != nil {
		return nil, fmt.Errorf("mqtt TLS: %w", err)
	}
	return tc, nil
}
