package daemon

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
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

// Until holdfast serves, /status.json answers 503 with the layout version
// and the reason /healthz gives, not an empty document that reads as "no
// streams".
func TestStatusJSONBeforeReady(t *testing.T) {
	h := newHTTPServer("127.0.0.1:0", monitor.NewMetrics("test", "test"), slog.New(slog.NewTextHandler(io.Discard, nil)), "test")
	h.setStep("recovering the store")
	rec := httptest.NewRecorder()
	h.routes().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/status.json", nil))
	var st ClientStatus
	if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil {
		t.Fatalf("%v: %s", err, rec.Body)
	}
	if rec.Code != http.StatusServiceUnavailable || st.Version != StatusVersion || st.Health == nil ||
		st.Health.Status != monitor.HealthUnhealthy || st.Error != "starting: not serving yet: recovering the store" {
		t.Fatalf("GET /status.json while starting: %d %s", rec.Code, rec.Body)
	}
}

// Every path /endpoints lists is served (the list had missed the page's
// script, /login and the admin API).
func TestEndpointsListed(t *testing.T) {
	h := newHTTPServer("127.0.0.1:0", monitor.NewMetrics("test", "test"), slog.New(slog.DiscardHandler), "test")
	mux := h.routes().(*http.ServeMux)
	for _, e := range endpoints {
		method, path, _ := strings.Cut(e[0], " ")
		_, pattern := mux.Handler(httptest.NewRequest(method, path, nil))
		if want := e[0]; pattern != want && !(path == "/" && pattern == "GET /{$}") {
			t.Errorf("%s is listed, but the listener serves it with %q", e[0], pattern)
		}
	}
}

// TestHTTPServerBoundsConnections: connections beyond the bound are
// closed as soon as they are accepted, so that clients that need no
// credentials to connect cannot take the file descriptors the NATS
// server and the store share with the listener; once some close, the
// listener answers again.
func TestHTTPServerBoundsConnections(t *testing.T) {
	t.Parallel()
	h := newHTTPServer("127.0.0.1:0", monitor.NewMetrics("test", "test"), slog.New(slog.DiscardHandler), "test")
	h.maxConns = 8
	if err := h.Open(natstest.Context(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close(natstest.Context(t)) })

	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range 4 * h.maxConns {
		c, err := net.Dial("tcp", h.Addr())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	// A connection the server holds stays silent; one it closed reads EOF.
	var held atomic.Int32
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() {
			_ = c.SetReadDeadline(time.Now().Add(time.Second))
			if _, err := c.Read(make([]byte, 1)); errors.Is(err, os.ErrDeadlineExceeded) {
				held.Add(1)
			}
		})
	}
	wg.Wait()
	if n := int(held.Load()); n > h.maxConns {
		t.Fatalf("%d connections held open at once, want at most %d", n, h.maxConns)
	}
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	natstest.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		resp, err := http.Get("http://" + h.Addr() + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	})
}
