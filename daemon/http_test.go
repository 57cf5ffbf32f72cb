package daemon

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"testing"
	"time"

	"github.com/holdfast-io/holdfast/internal/natstest"
	"github.com/holdfast-io/holdfast/pipeline/monitor"
)

// TestHTTPServerClosesIdleAndSlowConnections: a client that keeps a
// connection open after its request, or that announces a body and never
// sends it, must not hold the connection (a file descriptor the NATS
// server shares) for ever. Before, both stayed open as long as the client
// liked.
func TestHTTPServerClosesIdleAndSlowConnections(t *testing.T) {
	h := newHTTPServer("127.0.0.1:0", monitor.NewMetrics("test", "test"), slog.New(slog.NewTextHandler(io.Discard, nil)), "test")
	h.readTimeout, h.writeTimeout, h.idleTimeout = 500*time.Millisecond, 500*time.Millisecond, 500*time.Millisecond
	if err := h.Open(natstest.Context(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close(natstest.Context(t)) })

	for name, request := range map[string]string{
		"idle keep-alive": "GET /readyz HTTP/1.1\r\nHost: holdfast\r\n\r\n",
		"body never sent": "GET /readyz HTTP/1.1\r\nHost: holdfast\r\nContent-Length: 1000\r\n\r\n",
	} {
		t.Run(name, func(t *testing.T) {
			c, err := net.Dial("tcp", h.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := io.WriteString(c, request); err != nil {
				t.Fatal(err)
			}
			// The server answers (or gives up on the request) and closes
			// the connection: reading it ends.
			_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
			if _, err := io.Copy(io.Discard, c); errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatal("connection still open after 30s, with 500ms timeouts")
			}
		})
	}
}
