package embedded

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/internal/configtest"
	"github.com/holdfast-io/holdfast/internal/natstest"
	"github.com/holdfast-io/holdfast/internal/testcert"
)

// TestClusterTLS: two nodes whose routes use TLS with a private CA
// (cluster.ca_file) connect to each other and elect a JetStream meta
// leader: each node verifies the certificate of the node it dials with
// that CA.
func TestClusterTLS(t *testing.T) {
	certs, err := testcert.Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ports := []int{natstest.FreePort(t), natstest.FreePort(t)}
	var routes []string
	for _, p := range ports {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", p))
	}
	servers := make([]*Server, len(ports))
	for i, p := range ports {
		cfg := configtest.Default(t)
		cfg.Server.Name = fmt.Sprintf("node%d", i+1)
		cfg.Cluster = config.ClusterConfig{Name: "tls", Listen: fmt.Sprintf("127.0.0.1:%d", p), Routes: routes,
			CertFile: certs.ServerCert, KeyFile: certs.ServerKey, CAFile: certs.CA}
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		log, _ := natstest.Logger(t)
		servers[i] = New(cfg, log)
		servers[i].ReadyTimeout = 20 * time.Second
	}
	// Both at once: neither is ready before the other is up.
	errs := make(chan error, len(servers))
	for _, s := range servers {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			errs <- s.Open(ctx)
		}()
	}
	for range servers {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(func() {
		for _, s := range servers {
			_ = s.Close(context.Background())
		}
	})
	for _, s := range servers {
		if n := s.NATS().NumRoutes(); n == 0 {
			t.Errorf("%s: no route connected", s.NATS().Name())
		}
	}
}
