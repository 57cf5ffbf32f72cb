package config

import (
	"strings"
	"testing"
)

const mqttNode = `
[streams.SENSORS]
subjects = ["sensors.>"]

[mqtt]
listen = "127.0.0.1:1883"
`

// TestMQTTDefaults: [mqtt] is off by default; on loopback it needs no
// auth, and takes nats-server's ack_wait and a max_ack_pending.
func TestMQTTDefaults(t *testing.T) {
	if DefaultConfig().MQTT.Enabled() || DefaultConfig().WebSocket.Enabled() {
		t.Fatal("MQTT or WebSocket on by default")
	}
	cfg := mustParse(t, mqttNode+"\n[websocket]\nlisten = \"127.0.0.1:8443\"\nno_tls = true\n")
	if err := cfg.validateFile(); err != nil {
		t.Fatal(err)
	}
	if m := cfg.MQTT; m.AckWait.Duration != DefaultMQTTAckWait || m.MaxAckPending != DefaultMQTTMaxAckPending || m.TLSEnabled() {
		t.Errorf("mqtt = %+v", m)
	}
}

func TestMQTTRefusals(t *testing.T) {
	auth := "[auth.users.dev]\npassword = \"$2a$10$abcdefghijklmnopqrstuv\"\n"
	ws := "[websocket]\nlisten = \"127.0.0.1:8443\"\nno_tls = true\n"
	for _, tc := range []struct {
		name, toml, key, reason string
	}{
		{"beyond loopback without auth", "[mqtt]\nlisten = \"0.0.0.0:1883\"\n", "mqtt.listen", "needs authentication"},
		{"not host:port", "[mqtt]\nlisten = \"1883\"\n", "mqtt.listen", "host:port"},
		{"no host", "[mqtt]\nlisten = \":1883\"\n", "mqtt.listen", "no host"},
		{"a host name", "[mqtt]\nlisten = \"broker.example:1883\"\n", "mqtt.listen", "IP address"},
		{"the client port", "[mqtt]\nlisten = \"127.0.0.1:4222\"\n", "mqtt.listen", "client port"},
		{"cert without key", mqttNode + "cert_file = \"/c\"\n", "mqtt.cert_file", "key_file"},
		{"verify without ca", mqttNode + "cert_file = \"/c\"\nkey_file = \"/k\"\nverify = true\n", "mqtt.verify", "ca_file"},
		{"ca without TLS", mqttNode + "ca_file = \"/ca\"\n", "mqtt.ca_file", "for TLS"},
		{"TLS without listen", "[mqtt]\ncert_file = \"/c\"\nkey_file = \"/k\"\n", "mqtt.listen", "need a listener"},
		{"ack_wait", mqttNode + "ack_wait = \"10ms\"\n", "mqtt.ack_wait", "at least 1s"},
		{"max_ack_pending", mqttNode + "max_ack_pending = 70000\n", "mqtt.max_ack_pending", "1-65535"},
		{"with cluster", "[server]\nname = \"n1\"\n[cluster]\nname = \"c\"\nlisten = \"127.0.0.1:6222\"\nroutes = [\"nats-route://127.0.0.1:6223\"]\n" + mqttNode, "mqtt.listen", "[cluster]"},
		{"websocket without TLS beyond loopback", auth + "[websocket]\nlisten = \"0.0.0.0:8443\"\nno_tls = true\n", "websocket.no_tls", "loopback"},
		{"websocket without TLS or no_tls", "[websocket]\nlisten = \"127.0.0.1:8443\"\n", "websocket.cert_file", "no_tls"},
		{"websocket both", "[websocket]\nlisten = \"127.0.0.1:8443\"\nno_tls = true\ncert_file = \"/c\"\nkey_file = \"/k\"\n", "websocket.no_tls", "not both"},
		{"websocket beyond loopback without auth", "[websocket]\nlisten = \"0.0.0.0:8443\"\ncert_file = \"/c\"\nkey_file = \"/k\"\n", "websocket.listen", "needs authentication"},
		{"websocket settings without listen", "[websocket]\nno_tls = true\n", "websocket.listen", "need a listener"},
		{"any origin without auth", ws + "allowed_origins = [\"*\"]\n", "websocket.allowed_origins[0]", "only with [auth]"},
		{"any origin among others", auth + ws + "allowed_origins = [\"https://a.example\", \"*\"]\n", "websocket.allowed_origins[1]", "alone"},
		{"origin without scheme", ws + "allowed_origins = [\"app.example.com\"]\n", "websocket.allowed_origins[0]", "http or https"},
		{"origin with a path", ws + "allowed_origins = [\"https://a.example/app\"]\n", "websocket.allowed_origins[0]", "nothing after the host"},
		{"origin without host", ws + "allowed_origins = [\"https://\"]\n", "websocket.allowed_origins[0]", "no host"},
		{"origins without listen", "[websocket]\nallowed_origins = [\"https://a.example\"]\n", "websocket.listen", "need a listener"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantFileProblem(t, tc.toml, tc.key, tc.reason)
		})
	}
	wantParseError(t, "[mqtt]\nport = 1883\n", "mqtt.port", "unknown key")
}

// The MQTT and WebSocket certificates are loaded by LoadSecrets (and so
// by holdfast check), each problem named by its key.
func TestMQTTTLSFilesChecked(t *testing.T) {
	dir := t.TempDir()
	missing := dir + "/missing.pem"
	cfg := mustParse(t, mqttNode+"cert_file = \""+missing+"\"\nkey_file = \""+missing+"\"\n\n[websocket]\nlisten = \"127.0.0.1:8443\"\ncert_file = \""+missing+"\"\nkey_file = \""+missing+"\"\n")
	_, err := cfg.LoadSecrets()
	if err == nil {
		t.Fatal("missing MQTT and WebSocket certificates were not noticed")
	}
	for _, key := range []string{"mqtt.cert_file", "mqtt.key_file", "websocket.cert_file", "websocket.key_file"} {
		if !strings.Contains(err.Error(), key) {
			t.Errorf("the error does not name %s:\n%v", key, err)
		}
	}
}

// TakesBarrier: with [mqtt] every stream but a mirror takes the gate's
// barrier subject; without it none does.
func TestTakesBarrier(t *testing.T) {
	mirror := "\n[streams.COPY]\nmirror = { name = \"SENSORS\" }\n"
	cfg := mustParse(t, mqttNode+mirror)
	if !cfg.TakesBarrier("SENSORS") || cfg.TakesBarrier("COPY") || cfg.TakesBarrier("NOSUCH") {
		t.Errorf("with [mqtt]: SENSORS %v, COPY %v, NOSUCH %v; want true, false, false",
			cfg.TakesBarrier("SENSORS"), cfg.TakesBarrier("COPY"), cfg.TakesBarrier("NOSUCH"))
	}
	if cfg := mustParse(t, "[streams.SENSORS]\nsubjects = [\"sensors.>\"]\n"); cfg.TakesBarrier("SENSORS") {
		t.Error("a stream takes the barrier without [mqtt]")
	}
}
