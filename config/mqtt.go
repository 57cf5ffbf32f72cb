package config

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"time"
)

// MQTTConfig is the [mqtt] table: a listener for MQTT 3.1.1 devices. Off
// unless Listen is set. holdfast terminates the devices' connections and
// passes them to the embedded server's own MQTT support (sessions,
// subscriptions, retained messages, QoS 0/1/2); a QoS 1 PUBACK (a QoS 2
// PUBCOMP) reaches the device only once the configured stream that takes
// the topic's subject has stored the message (docs/mqtt.md).
type MQTTConfig struct {
	// Listen is host:port for devices, e.g. "127.0.0.1:1883". Beyond
	// loopback it needs [auth]: devices then log in with a user's name
	// and password (or the token as password).
	Listen string `toml:"listen"`
	// TLS for the listener; CAFile with Verify asks devices for a
	// certificate signed by it.
	CertFile string `toml:"cert_file"`
	KeyFile  string `toml:"key_file"`
	CAFile   string `toml:"ca_file"`
	Verify   bool   `toml:"verify"`
	// AckWait is how long the server waits for a device's PUBACK of a
	// QoS 1 delivery before sending it again.
	AckWait Duration `toml:"ack_wait"`
	// MaxAckPending is how many QoS 1 deliveries a subscription may have
	// unacknowledged (1-65535).
	MaxAckPending int `toml:"max_ack_pending"`
}

// WebSocketConfig is the [websocket] table: NATS clients over WebSocket
// (nats.ws, browsers). Off unless Listen is set.
type WebSocketConfig struct {
	Listen   string `toml:"listen"`
	CertFile string `toml:"cert_file"`
	KeyFile  string `toml:"key_file"`
	// NoTLS serves plain ws://, on a loopback address only.
	NoTLS bool `toml:"no_tls"`
	// AllowedOrigins are the origins (scheme://host[:port]) of the web
	// pages whose scripts may connect; ["*"] any, with [auth] only. A
	// browser sends its page's origin; other clients send none and are
	// not affected. Empty: no web page may connect.
	AllowedOrigins []string `toml:"allowed_origins"`
}

// AnyOrigin in websocket.allowed_origins lets a page of any origin connect.
const AnyOrigin = "*"

// Defaults of [mqtt].
const (
	DefaultMQTTAckWait       = 30 * time.Second // as nats-server
	DefaultMQTTMaxAckPending = 1024
)

// Enabled reports whether [mqtt] turns the listener on.
func (m *MQTTConfig) Enabled() bool { return m.Listen != "" }

// TLSEnabled reports whether the MQTT listener uses TLS.
func (m *MQTTConfig) TLSEnabled() bool { return m.CertFile != "" || m.KeyFile != "" }

// Enabled reports whether [websocket] turns the listener on.
func (w *WebSocketConfig) Enabled() bool { return w.Listen != "" }

// HostPort splits a listen address; port 0 takes a free port.
func listenHostPort(listen string) (string, int, error) {
	host, p, err := net.SplitHostPort(listen)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("port %q is not 0-65535", p)
	}
	if host == "" {
		return "", 0, fmt.Errorf("no host: use 127.0.0.1 for this machine only or 0.0.0.0 for every address")
	}
	return host, port, nil
}

// HostPort returns the MQTT listener's host and port.
func (m *MQTTConfig) HostPort() (string, int, error) { return listenHostPort(m.Listen) }

// HostPort returns the WebSocket listener's host and port.
func (w *WebSocketConfig) HostPort() (string, int, error) { return listenHostPort(w.Listen) }

func (c *Config) validateMQTT(v *validator) {
	m := c.MQTT
	if !m.Enabled() {
		if m.TLSEnabled() || m.CAFile != "" || m.Verify {
			v.add("mqtt.listen", `""`, "TLS settings of [mqtt] need a listener: set listen, e.g. \"0.0.0.0:8883\"")
		}
	} else {
		c.checkListen(v, "mqtt.listen", m.Listen, "MQTT", 1883)
		if m.TLSEnabled() && (m.CertFile == "" || m.KeyFile == "") {
			v.add("mqtt.cert_file", q(m.CertFile), "MQTT TLS needs mqtt.cert_file and mqtt.key_file")
		}
		if m.Verify && m.CAFile == "" {
			v.add("mqtt.verify", "true", "needs mqtt.ca_file: the CA that signs the devices' certificates")
		}
		if (m.CAFile != "" || m.Verify) && !m.TLSEnabled() {
			v.add("mqtt.ca_file", q(m.CAFile), "ca_file and verify are for TLS: set mqtt.cert_file and mqtt.key_file too")
		}
		if c.Cluster.Enabled() {
			v.add("mqtt.listen", q(m.Listen), "MQTT is not available with [cluster] yet: holdfast's PUBACK-after-store check works on a single node's streams; take devices on an edge node and forward to the cluster")
		}
	}
	if v.duration("mqtt.ack_wait", m.AckWait) && m.AckWait.Duration < time.Second {
		v.add("mqtt.ack_wait", m.AckWait.String(), "must be at least 1s")
	}
	if m.MaxAckPending < 1 || m.MaxAckPending > 65535 {
		v.add("mqtt.max_ack_pending", strconv.Itoa(m.MaxAckPending), "must be 1-65535 (MQTT packet identifiers are 16 bits)")
	}

	w := c.WebSocket
	if !w.Enabled() {
		if w.CertFile != "" || w.KeyFile != "" || w.NoTLS || len(w.AllowedOrigins) > 0 {
			v.add("websocket.listen", `""`, "settings of [websocket] need a listener: set listen, e.g. \"0.0.0.0:8443\"")
		}
		return
	}
	host := c.checkListen(v, "websocket.listen", w.Listen, "WebSocket", 8443)
	switch {
	case w.NoTLS && (w.CertFile != "" || w.KeyFile != ""):
		v.add("websocket.no_tls", "true", "set no_tls or cert_file and key_file, not both")
	case w.NoTLS && host != "" && !IsLoopback(host):
		v.add("websocket.no_tls", "true", "plain ws:// only on a loopback address: browsers send credentials in the clear otherwise; set websocket.cert_file and websocket.key_file")
	case !w.NoTLS && (w.CertFile == "" || w.KeyFile == ""):
		v.add("websocket.cert_file", q(w.CertFile), "WebSocket needs TLS (websocket.cert_file and websocket.key_file), or no_tls = true on a loopback address")
	}
	for i, o := range w.AllowedOrigins {
		key := fmt.Sprintf("websocket.allowed_origins[%d]", i)
		if o == AnyOrigin {
			if len(w.AllowedOrigins) > 1 {
				v.add(key, q(o), `"*" allows every origin: give it alone, or list origins`)
			} else if !c.Auth.Enabled() {
				v.add(key, q(o), "any web site's page open in a browser here could then connect with this host's rights: only with [auth], so that it needs a user's credentials; or list the origins of your pages")
			}
			continue
		}
		if why := originProblem(o); why != "" {
			v.add(key, q(o), `%s: an origin is scheme://host[:port], e.g. "https://app.example.com"`, why)
		}
	}
}

// originProblem says why o is not a web origin (scheme://host[:port],
// http or https, nothing after the host), or "".
func originProblem(o string) string {
	u, err := url.Parse(o)
	switch {
	case err != nil:
		return err.Error()
	case u.Scheme != "http" && u.Scheme != "https":
		return "the scheme must be http or https"
	case u.Hostname() == "":
		return "no host"
	case u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "":
		return "an origin has nothing after the host and port"
	}
	return ""
}

// checkListen validates a listener's address: host:port, a port of its
// own, and authentication beyond loopback. It returns the host ("" when
// the address is not valid).
func (c *Config) checkListen(v *validator, key, listen, what string, usual int) string {
	host, port, err := listenHostPort(listen)
	if err != nil {
		v.add(key, q(listen), "must be host:port such as 127.0.0.1:%d: %v", usual, err)
		return ""
	}
	if net.ParseIP(host) == nil && host != "localhost" {
		v.add(key, q(listen), "the host must be an IP address such as 127.0.0.1 or 0.0.0.0")
		return ""
	}
	if port != 0 && port == c.Server.Port {
		v.add(key, q(listen), "uses the client port server.port = %d: give %s its own port (%d is usual)", port, what, usual)
	}
	if !IsLoopback(host) && !c.Auth.Enabled() && !c.Server.AllowAnonymous {
		v.add(key, q(listen), "%s on a non-loopback address %s", what, anonymousReason)
	}
	return host
}

// TakesBarrier reports whether stream name takes the MQTT gate's barrier
// subject (subjects.Barrier): with [mqtt], every stream that stores what
// is published on this server, so every one but a mirror.
func (c *Config) TakesBarrier(name string) bool {
	sc := c.Streams[name]
	return c.MQTT.Enabled() && sc != nil && sc.Mirror == nil
}
