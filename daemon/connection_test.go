package daemon

import (
	"strings"
	"testing"
	"time"
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
