package config

import (
	"errors"
	"strings"
	"testing"
)

const clusterNode = `
[server]
name = "n1"

[cluster]
name = "site-a"
listen = "127.0.0.1:6222"
routes = ["nats-route://127.0.0.1:6222", "nats-route://127.0.0.1:6223", "nats-route://127.0.0.1:6224"]
`

// TestClusterDefaults: a valid three-node config, and replicas default to
// 3 in cluster mode unless a stream says otherwise; dead-letter streams
// follow the streams they serve.
func TestClusterDefaults(t *testing.T) {
	cfg, err := Parse(strings.NewReader(clusterNode+`
[streams.ORDERS]
subjects = ["orders.*"]

[streams.LOCAL]
subjects = ["local.*"]
replicas = 1

[consumers.WORKER1]
stream = "ORDERS"
`), "test.toml")
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.validateFile(); err != nil {
		t.Fatal(err)
	}
	if r := cfg.Streams["ORDERS"].Replicas; r != 3 {
		t.Errorf("ORDERS replicas = %d, want 3 in cluster mode", r)
	}
	if r := cfg.Streams["LOCAL"].Replicas; r != 1 {
		t.Errorf("LOCAL replicas = %d, want the 1 it sets", r)
	}
	if r := cfg.DeadLetterReplicas("ORDERS_DLQ"); r != 3 {
		t.Errorf("ORDERS_DLQ replicas = %d, want 3", r)
	}
	// The built-in ORDERS too.
	cfg, err = Parse(strings.NewReader(clusterNode), "test.toml")
	if err != nil {
		t.Fatal(err)
	}
	if r := cfg.Streams[DefaultStreamName].Replicas; r != 3 {
		t.Errorf("default ORDERS replicas = %d in cluster mode, want 3", r)
	}
}

// TestClusterRefusals: each refusal names its key path.
func TestClusterRefusals(t *testing.T) {
	for _, tc := range []struct {
		name, toml, key, reason string
	}{
		{"no server.name", strings.Replace(clusterNode, "name = \"n1\"\n", "", 1), "server.name", "must be set in the file"},
		{"duplicate route", strings.Replace(clusterNode, "127.0.0.1:6224", "127.0.0.1:6223", 1), "cluster.routes[2]", "listed twice"},
		{"replicas 3 without a cluster", "[streams.ORDERS]\nsubjects = [\"orders.*\"]\nreplicas = 3\n", "streams.ORDERS.replicas", "needs a [cluster]"},
		{"replicas beyond the nodes", strings.Replace(clusterNode, `, "nats-route://127.0.0.1:6223", "nats-route://127.0.0.1:6224"`, "", 1), "streams.ORDERS.replicas", "more than the 2 node(s)"},
		{"replicas 2", clusterNode + "\n[streams.ORDERS]\nsubjects = [\"orders.*\"]\nreplicas = 2\n", "streams.ORDERS.replicas", "must be 1 or 3"},
		{"listen beyond loopback without route auth", strings.Replace(clusterNode, `listen = "127.0.0.1:6222"`, `listen = "0.0.0.0:6222"`, 1), "cluster.listen", "need cluster.user and cluster.password_file"},
		{"no cluster name", strings.Replace(clusterNode, "name = \"site-a\"\n", "", 1), "cluster.name", "required"},
		{"route port 0", strings.Replace(clusterNode, "nats-route://127.0.0.1:6224", "nats-route://127.0.0.1:0", 1), "cluster.routes[2]", "port 0 is not 1-65535"},
		{"route port too large", strings.Replace(clusterNode, "nats-route://127.0.0.1:6224", "nats-route://10.0.0.3:70000", 1), "cluster.routes[2]", "port 70000 is not 1-65535"},
		{"route scheme", strings.Replace(clusterNode, "nats-route://127.0.0.1:6224", "http://127.0.0.1:6224", 1), "cluster.routes[2]", "nats-route://"},
		{"listen on the client port", strings.Replace(clusterNode, `listen = "127.0.0.1:6222"`, `listen = "127.0.0.1:4222"`, 1), "cluster.listen", "client port"},
		{"empty table", "[cluster]\n", "cluster", "empty"},
		{"advertise without a port", strings.Replace(clusterNode, `listen = "127.0.0.1:6222"`, "listen = \"127.0.0.1:6222\"\nadvertise = \"10.0.0.1\"", 1), "cluster.advertise", "must be host:port"},
		{"advertise port", strings.Replace(clusterNode, `listen = "127.0.0.1:6222"`, "listen = \"127.0.0.1:6222\"\nadvertise = \"10.0.0.1:70000\"", 1), "cluster.advertise", "not 1-65535"},
		{"advertise without a host", strings.Replace(clusterNode, `listen = "127.0.0.1:6222"`, "listen = \"127.0.0.1:6222\"\nadvertise = \":6222\"", 1), "cluster.advertise", "the host is missing"},
		{"group commit in a cluster", clusterNode + "\n[streams.ORDERS]\nsubjects = [\"orders.*\"]\ngroup_commit = true\n", "streams.ORDERS.group_commit", "not supported with [cluster]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantFileProblem(t, tc.toml, tc.key, tc.reason)
		})
	}
}

// wantFileProblem parses text and fails unless validating it as a file
// reports a problem of key whose reason contains reason.
func wantFileProblem(t *testing.T, text, key, reason string) {
	t.Helper()
	cfg, err := Parse(strings.NewReader(text), "test.toml")
	if err != nil {
		t.Fatal(err)
	}
	err = cfg.validateFile()
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("validate: %v, want a ValidationError", err)
	}
	for _, p := range ve.Problems {
		if p.Key == key && strings.Contains(p.Reason, reason) {
			return
		}
	}
	t.Fatalf("no problem %s: ...%s... in\n%v", key, reason, err)
}

// TestClusterSecretFiles: route secrets and certificates that cannot be
// used are refused by key path before the server starts.
func TestClusterSecretFiles(t *testing.T) {
	cfg, err := Parse(strings.NewReader(clusterNode+`user = "route"
password_file = "/nonexistent/route.password"
cert_file = "/nonexistent/route.crt"
key_file = "/nonexistent/route.key"
ca_file = "/nonexistent/ca.crt"
`), "test.toml")
	if err != nil {
		t.Fatal(err)
	}
	_, err = cfg.LoadSecrets()
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("LoadSecrets: %v, want a ValidationError", err)
	}
	for _, key := range []string{"cluster.password_file", "cluster.cert_file", "cluster.key_file", "cluster.ca_file"} {
		found := false
		for _, p := range ve.Problems {
			found = found || p.Key == key
		}
		if !found {
			t.Errorf("no problem for %s in\n%v", key, err)
		}
	}
}
