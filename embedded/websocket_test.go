package embedded

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/internal/configtest"
	"github.com/holdfast-io/holdfast/internal/natstest"
)

// TestWebSocketOrigins: a browser sends its page's origin with a
// WebSocket handshake. Only the pages of websocket.allowed_origins may
// connect: with none listed (the default), a page of any web site open in
// a browser on the host could otherwise connect with the host's rights —
// without [auth], purge every stream. Clients that are not browsers send
// no Origin and connect as before.
func TestWebSocketOrigins(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		allowed []string
		auth    bool
		// origin -> whether the handshake is accepted
		want map[string]bool
	}{
		{"default", nil, false, map[string]bool{
			"": true, "http://evil.example": false, "http://127.0.0.1": false, "null": false}},
		{"listed", []string{"https://app.example.com", "http://localhost:3000"}, false, map[string]bool{
			"": true, "https://app.example.com": true, "http://localhost:3000": true,
			"http://app.example.com": false, "http://evil.example": false}},
		{"any, with auth", []string{config.AnyOrigin}, true, map[string]bool{
			"": true, "http://evil.example": true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := configtest.Default(t)
			port := natstest.FreePort(t)
			cfg.WebSocket.Listen = fmt.Sprintf("127.0.0.1:%d", port)
			cfg.WebSocket.NoTLS = true
			cfg.WebSocket.AllowedOrigins = tc.allowed
			if tc.auth {
				cfg.Auth.Token = "origin-test-token-0123456789"
			}
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			runServer(t, cfg)
			for origin, want := range tc.want {
				if got := wsHandshake(t, port, origin); got != want {
					t.Errorf("handshake with Origin %q accepted %v, want %v", origin, got, want)
				}
			}
		})
	}
}

// wsHandshake opens a WebSocket handshake to the listener on port with
// the Origin header origin (none when "") and reports whether the server
// switched protocols.
func wsHandshake(t *testing.T, port int, origin string) bool {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/", port), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "13")
	req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusSwitchingProtocols:
		return true
	case http.StatusForbidden:
		return false
	}
	t.Fatalf("handshake with Origin %q: %s", origin, resp.Status)
	return false
}
