package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/internal/natstest"
)

// TestClosedInProcessConnectionFails: the server closes a connection that
// breaks a protocol limit (here a control line over 4096 bytes), and an
// in-process one does not come back. holdfast went on without it: no
// worker, dead letter or status answer, while /healthz said OK. The
// daemon now fails (holdfast run exits 1, systemd restarts it).
func TestClosedInProcessConnectionFails(t *testing.T) {
	d := openDefault(t)
	if err := d.srv.Conn().Publish("orders."+strings.Repeat("x", 5000), nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.Failed():
		if err := d.Err(); !strings.Contains(err.Error(), "holdfast-internal") {
			t.Fatalf("failed with %v, want the connection named", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the daemon goes on without its in-process connection")
	}
}

// TestReconnectingInProcessConnectionUnhealthy: an in-process connection
// that lost its link reconnects (the client asks the server for a new
// pipe), but the server refuses it while server.max_connections is
// reached. Workers, dead letters and status then wait for it while
// /healthz and the watchdog said OK. Past reconnectGrace both fail,
// naming the connection; once it is back they pass again.
func TestReconnectingInProcessConnectionUnhealthy(t *testing.T) {
	cfg := config.DefaultConfig()
	cfg.Server.Port = -1
	cfg.Server.MaxConnections = 2
	cfg.HTTP.Listen = ""
	cfg.JetStream.StoreDir = t.TempDir()
	cfg.JetStream.MaxFileStore = config.Bytes(1 << 30)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	d := New(cfg, Options{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := d.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close(context.Background()) })
	ns, nc := d.srv.NATS(), d.srv.Conn()
	var others []*nats.Conn
	defer func() {
		for _, c := range others {
			c.Close()
		}
	}()
	// Take every free connection, then drop the in-process one until
	// another client has taken its place.
	fill := func() {
		for {
			c, err := nats.Connect(ns.ClientURL(), nats.NoReconnect())
			if err != nil {
				return
			}
			others = append(others, c)
		}
	}
	natstest.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		fill()
		if nc.IsReconnecting() {
			return nil
		}
		id, err := nc.GetClientID()
		if err != nil {
			return err
		}
		if err := ns.DisconnectClientByID(id); err != nil {
			return err
		}
		return errors.New("the in-process connection came back before the server was full")
	})
	natstest.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		err := d.Healthy(context.Background())
		if err == nil || !strings.Contains(err.Error(), "holdfast-internal has been reconnecting") {
			return fmt.Errorf("watchdog health: %v", err)
		}
		if h := d.monitor.Health(); !strings.Contains(h.Reason, "holdfast-internal has been reconnecting") || h.HTTPStatus() != 503 {
			return fmt.Errorf("/healthz %d: %s", h.HTTPStatus(), h.Reason)
		}
		return nil
	})
	for _, c := range others {
		c.Close()
	}
	others = nil
	natstest.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		if err := d.connectionProblem(); err != nil {
			return err
		}
		return nil
	})
}
