// Package configtest holds the holdfast configs that tests in several
// packages start servers from: the built-in defaults made fit for a test,
// alone or as the nodes of a cluster.
//
// It is imported by _test.go files only. It imports no holdfast package
// but config and internal/natstest, so that the tests of embedded and of
// everything above it can use it.
package configtest

import (
	"fmt"
	"testing"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/internal/natstest"
)

// Default returns the built-in defaults (stream ORDERS, consumer WORKER1)
// with the store in a fresh natstest.StoreDir, a random client port, store
// limits of 1 GiB on file and 64 MiB in memory, no HTTP listener and no
// in-process workers. It is validated.
func Default(t testing.TB) *config.Config {
	t.Helper()
	cfg := config.DefaultConfig()
	cfg.Server.Name = "holdfast-test"
	cfg.Server.Port = -1
	cfg.JetStream.StoreDir = natstest.StoreDir(t)
	cfg.JetStream.MaxFileStore = config.Bytes(1 << 30)
	cfg.JetStream.MaxMemoryStore = config.Bytes(64 << 20)
	cfg.HTTP.Listen = ""
	for _, c := range cfg.Consumers {
		c.Workers = 0
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("test config does not validate: %v", err)
	}
	return cfg
}

// Cluster returns the configs of n nodes (node1, node2, ...) that form
// the JetStream cluster name on 127.0.0.1, each a Default with its own
// store and a free cluster port, changed by tweak (may be nil) and
// validated.
func Cluster(t testing.TB, n int, name string, tweak func(*config.Config)) []*config.Config {
	t.Helper()
	ports := make([]int, n)
	var routes []string
	for i := range ports {
		ports[i] = natstest.FreePort(t)
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", ports[i]))
	}
	cfgs := make([]*config.Config, n)
	for i, p := range ports {
		cfg := Default(t)
		cfg.Server.Name = fmt.Sprintf("node%d", i+1)
		cfg.Cluster = config.ClusterConfig{Name: name, Listen: fmt.Sprintf("127.0.0.1:%d", p), Routes: routes}
		if tweak != nil {
			tweak(cfg)
		}
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		cfgs[i] = cfg
	}
	return cfgs
}
