package handler

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/holdfast-io/holdfast/internal/natstest"
)

// receivedRequest is what a test server saw of one request.
type receivedRequest struct {
	Method string
	Path   string
	Host   string
	Header http.Header
	Body   []byte
}

// newHTTP returns an HTTP handler for opts, failing the test on error, and
// closes its idle connections at cleanup.
func newHTTP(t *testing.T, opts HTTPOptions, logger *slog.Logger) *HTTP {
	t.Helper()
	h, err := NewHTTP(opts, logger)
	if err != nil {
		t.Fatalf("NewHTTP(%q): %v", opts.URL, err)
	}
	t.Cleanup(h.CloseIdleConnections)
	return h
}

// newRecordingServer starts a loopback server that records each request and
// answers with respond.
func newRecordingServer(t *testing.T, respond http.HandlerFunc) (*httptest.Server, <-chan receivedRequest) {
	t.Helper()
	requests := make(chan receivedRequest, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("server: reading body: %v", err)
		}
		requests <- receivedRequest{Method: r.Method, Path: r.URL.Path, Host: r.Host, Header: r.Header.Clone(), Body: body}
		respond(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, requests
}

func TestNewHTTPValidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts HTTPOptions
		want string // in the error; "" means no error
	}{
		{"empty", HTTPOptions{}, "scheme must be http or https"},
		{"no scheme", HTTPOptions{URL: "127.0.0.1:8080/orders"}, "invalid url"},
		{"ftp", HTTPOptions{URL: "ftp://127.0.0.1/orders"}, "ftp://127.0.0.1/orders: scheme must be http or https"},
		{"no host", HTTPOptions{URL: "http:///orders"}, "no host"},
		{"port only", HTTPOptions{URL: "http://:8080/orders"}, "no host"},
		{"password is not shown", HTTPOptions{URL: "http://user:hunter2@/orders"}, "user:xxxxx@"},
		{"bad escape", HTTPOptions{URL: "http://127.0.0.1/%zz"}, "invalid url"},
		{"port too big", HTTPOptions{URL: "http://u:hunter2@127.0.0.1:99999/orders"}, "url http://u:xxxxx@127.0.0.1:99999/orders: port 99999 is not between 1 and 65535"},
		{"port 0", HTTPOptions{URL: "http://127.0.0.1:0/orders"}, "port 0 is not between 1 and 65535"},
		{"negative timeout", HTTPOptions{URL: "http://127.0.0.1/", Timeout: -time.Second}, "timeout -1s is negative"},
		{"http", HTTPOptions{URL: "http://127.0.0.1:8080/orders", Timeout: time.Second}, ""},
		{"https", HTTPOptions{URL: "https://localhost/orders?team=a"}, ""},
		{"upper-case scheme", HTTPOptions{URL: "HTTP://127.0.0.1/"}, ""},
		{"ipv6", HTTPOptions{URL: "http://[::1]:8080/"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := NewHTTP(tc.opts, nil)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				h.CloseIdleConnections()
				return
			}
			if err == nil {
				t.Fatalf("no error, want one containing %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("error %q shows the password", err)
			}
		})
	}
}

func TestHTTPStatus(t *testing.T) {
	// The server answers /CODE with that status, the Retry-After given in
	// ?retry-after= and a body naming the status.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		code, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/"))
		if err != nil {
			http.Error(w, "bad path", http.StatusTeapot)
			return
		}
		if ra := r.URL.Query().Get("retry-after"); ra != "" {
			w.Header().Set("Retry-After", ra)
		}
		switch code {
		case http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther:
			w.Header().Set("Location", "/200")
		case http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
			w.Header().Set("Location", "/201")
		}
		w.WriteHeader(code)
		if code != http.StatusNoContent && code != http.StatusNotModified {
			_, _ = io.WriteString(w, "body of "+strconv.Itoa(code)+"\nsecond line")
		}
	}))
	t.Cleanup(srv.Close)

	httpDate := time.Now().Add(2 * time.Minute).UTC().Format(http.TimeFormat)
	for _, tc := range []struct {
		path           string
		want           Outcome
		reason         string // in the reason
		minRA, maxRA   time.Duration
		reasonNotEmpty bool
	}{
		{path: "/200", want: Success},
		{path: "/201", want: Success},
		{path: "/202", want: Success},
		{path: "/204", want: Success},
		{path: "/299", want: Success},
		{path: "/400", want: Permanent, reason: "HTTP 400 Bad Request: body of 400 second line"},
		{path: "/401", want: Permanent, reason: "HTTP 401 Unauthorized"},
		{path: "/404", want: Permanent, reason: "HTTP 404 Not Found: body of 404"},
		{path: "/409", want: Permanent, reason: "HTTP 409 Conflict"},
		{path: "/422", want: Permanent, reason: "HTTP 422 Unprocessable Entity: body of 422"},
		// The endpoint did not take the request: a timeout, not a verdict.
		{path: "/408", want: Retry, reason: "HTTP 408 Request Timeout: body of 408"},
		{path: "/425", want: Retry, reason: "HTTP 425 Too Early"},
		{path: "/429?retry-after=7", want: Retry, reason: "HTTP 429 Too Many Requests: body of 429", minRA: 7 * time.Second, maxRA: 7 * time.Second},
		{path: "/429", want: Retry, reason: "HTTP 429"},
		{path: "/429?retry-after=soon", want: Retry, reason: "HTTP 429"},
		{path: "/429?retry-after=86400", want: Retry, reason: "HTTP 429", minRA: time.Hour, maxRA: time.Hour},
		{path: "/503?retry-after=" + strings.ReplaceAll(httpDate, " ", "%20"), want: Retry, reason: "HTTP 503 Service Unavailable", minRA: time.Minute, maxRA: 2 * time.Minute},
		{path: "/503", want: Retry, reason: "HTTP 503 Service Unavailable: body of 503"},
		{path: "/500?retry-after=9", want: Retry, reason: "HTTP 500 Internal Server Error: body of 500"},
		{path: "/502", want: Retry, reason: "HTTP 502 Bad Gateway"},
		{path: "/504", want: Retry, reason: "HTTP 504 Gateway Timeout"},
		{path: "/599", want: Retry, reason: "HTTP 599"},
		{path: "/301", want: Permanent, reason: "HTTP 301 Moved Permanently to /200 (not followed"},
		{path: "/302", want: Permanent, reason: "HTTP 302 Found to /200"},
		{path: "/303", want: Permanent, reason: "HTTP 303 See Other to /200"},
		{path: "/304", want: Permanent, reason: "HTTP 304 Not Modified"},
		{path: "/307", want: Success}, // followed to /201
		{path: "/308", want: Success},
	} {
		t.Run(strings.TrimPrefix(tc.path, "/"), func(t *testing.T) {
			h := newHTTP(t, HTTPOptions{URL: srv.URL + tc.path, Timeout: time.Minute}, nil)
			r := h.Handle(context.Background(), testMessage())
			if r.Outcome != tc.want {
				t.Fatalf("outcome = %s (%q), want %s", r.Outcome, r.Reason, tc.want)
			}
			if tc.want == Success && r != Ok() {
				t.Errorf("result = %+v, want Ok()", r)
			}
			if !strings.Contains(r.Reason, tc.reason) {
				t.Errorf("reason %q does not contain %q", r.Reason, tc.reason)
			}
			if r.RetryAfter < tc.minRA || r.RetryAfter > tc.maxRA {
				t.Errorf("RetryAfter = %s, want between %s and %s", r.RetryAfter, tc.minRA, tc.maxRA)
			}
			if strings.ContainsAny(r.Reason, "\r\n") {
				t.Errorf("reason %q has a line break", r.Reason)
			}
		})
	}
}

func TestHTTPLongErrorBodyIsCut(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, strings.Repeat("e", 1<<20))
	}))
	t.Cleanup(srv.Close)
	h := newHTTP(t, HTTPOptions{URL: srv.URL}, nil)
	r := h.Handle(context.Background(), testMessage())
	if r.Outcome != Permanent {
		t.Fatalf("result = %+v, want permanent", r)
	}
	want := "HTTP 400 Bad Request: " + strings.Repeat("e", bodySnippetLimit) + "..."
	if r.Reason != want {
		t.Errorf("reason = %q (%d bytes), want %d bytes", r.Reason, len(r.Reason), len(want))
	}
}

func TestHTTPRequest(t *testing.T) {
	logger, logs := newTestLogger(t, slog.LevelInfo)
	srv, requests := newRecordingServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
	})
	h := newHTTP(t, HTTPOptions{URL: srv.URL + "/orders?team=a", Timeout: time.Minute}, logger)

	msg := testMessage()
	msg.Data = []byte("\x00binary\xffpayload")
	msg.IdempotencyKey = "order-42"
	msg.Header = nats.Header{
		"Nats-Msg-Id":          {"order-42"},
		"Nats-Expected-Stream": {"ORDERS"}, // JetStream's, not sent
		"nats-rollup":          {"sub"},    // JetStream's, not sent
		"Content-Type":         {"application/json"},
		"x-tenant":             {"acme"},
		"X-Multi":              {"a", "b"},
		"Connection":           {"close"},   // hop-by-hop, sent only as Holdfast-Header-Connection
		"Holdfast-Seq":         {"999"},     // holdfast's own wins
		"Idempotency-Key":      {"spoofed"}, // holdfast's own wins
		"bad name":             {"x"},       // not a token, not sent
		"X-Control":            {"a\x01b"},  // control character, not sent
		"X-Tab":                {"a\tb"},
	}
	if r := h.Handle(context.Background(), msg); r != Ok() {
		t.Fatalf("result = %+v, want Ok", r)
	}
	req := <-requests

	if req.Method != http.MethodPost || req.Path != "/orders" {
		t.Errorf("request = %s %s, want POST /orders", req.Method, req.Path)
	}
	if string(req.Body) != string(msg.Data) {
		t.Errorf("body = %q, want %q", req.Body, msg.Data)
	}
	want := map[string][]string{
		"Holdfast-Subject":  {"orders.created"},
		"Holdfast-Stream":   {"ORDERS"},
		"Holdfast-Consumer": {"WORKER1"},
		"Holdfast-Seq":      {"42"},
		"Holdfast-Delivery": {"3"},
		"Idempotency-Key":   {"order-42"},
		"Nats-Msg-Id":       {"order-42"},
		"Content-Type":      {"application/json"},
		"X-Tenant":          {"acme"},
		"X-Multi":           {"a", "b"},
		"X-Tab":             {"a\tb"},
		"Content-Length":    {strconv.Itoa(len(msg.Data))},
		"User-Agent":        {"holdfast"},
	}
	for name, values := range want {
		if got := req.Header.Values(name); strings.Join(got, "|") != strings.Join(values, "|") {
			t.Errorf("header %s = %q, want %q", name, got, values)
		}
	}
	for _, name := range []string{"Nats-Expected-Stream", "Nats-Rollup", "X-Control", "Bad Name", "bad name"} {
		if v, ok := req.Header[name]; ok {
			t.Errorf("header %s = %q was sent", name, v)
		}
	}
	if got := req.Header.Get("Connection"); got == "close" {
		t.Errorf("message's Connection: close was sent")
	}
	warnings := logs.Entries("message headers not sent: HTTP cannot carry them")
	if len(warnings) != 1 || !strings.Contains(warnings[0].Attrs["headers"], "bad name") || !strings.Contains(warnings[0].Attrs["headers"], "X-Control") {
		t.Errorf("warnings = %v, want one naming the skipped headers", warnings)
	}
}

func TestHTTPUnsendableIdempotencyKeyFails(t *testing.T) {
	srv, requests := newRecordingServer(t, func(w http.ResponseWriter, r *http.Request) {})
	h := newHTTP(t, HTTPOptions{URL: srv.URL}, nil)
	msg := testMessage()
	msg.IdempotencyKey = "order\x0142"
	r := h.Handle(context.Background(), msg)
	if r.Outcome != Permanent || !strings.Contains(r.Reason, "Idempotency-Key") {
		t.Fatalf("result = %+v, want a permanent failure naming Idempotency-Key", r)
	}
	if len(requests) != 0 {
		t.Errorf("a request was sent")
	}
}

func TestHTTPDefaultContentType(t *testing.T) {
	srv, requests := newRecordingServer(t, func(w http.ResponseWriter, r *http.Request) {})
	h := newHTTP(t, HTTPOptions{URL: srv.URL}, nil)
	msg := testMessage()
	msg.Data = nil
	if r := h.Handle(context.Background(), msg); r != Ok() {
		t.Fatalf("result = %+v, want Ok", r)
	}
	req := <-requests
	if got := req.Header.Get("Content-Type"); got != "application/octet-stream" {
		t.Errorf("Content-Type = %q, want application/octet-stream", got)
	}
	if len(req.Body) != 0 {
		t.Errorf("body = %q, want empty", req.Body)
	}
}

func TestHTTPIdempotencyKeyIsStable(t *testing.T) {
	srv, requests := newRecordingServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	h := newHTTP(t, HTTPOptions{URL: srv.URL}, nil)

	for _, key := range []string{"order-42", ""} {
		msg := testMessage()
		msg.IdempotencyKey = key
		first := h.Handle(context.Background(), msg)
		msg.Delivery++ // the redelivery
		second := h.Handle(context.Background(), msg)
		if first.Outcome != Retry || second.Outcome != Retry {
			t.Fatalf("results = %+v, %+v, want retries", first, second)
		}
		a, b := <-requests, <-requests
		wantKey := key
		if key == "" {
			wantKey = "ORDERS:42"
		}
		if a.Header.Get("Idempotency-Key") != wantKey || b.Header.Get("Idempotency-Key") != wantKey {
			t.Errorf("Idempotency-Key = %q then %q, want %q both times",
				a.Header.Get("Idempotency-Key"), b.Header.Get("Idempotency-Key"), wantKey)
		}
		if a.Header.Get("Holdfast-Delivery") != "3" || b.Header.Get("Holdfast-Delivery") != "4" {
			t.Errorf("Holdfast-Delivery = %q then %q, want 3 then 4",
				a.Header.Get("Holdfast-Delivery"), b.Header.Get("Holdfast-Delivery"))
		}
	}
}

func TestHTTPRedirectKeepsPayload(t *testing.T) {
	srv, requests := newRecordingServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/old" {
			http.Redirect(w, r, "/new", http.StatusPermanentRedirect)
		}
	})
	h := newHTTP(t, HTTPOptions{URL: srv.URL + "/old"}, nil)
	msg := testMessage()
	if r := h.Handle(context.Background(), msg); r != Ok() {
		t.Fatalf("result = %+v, want Ok", r)
	}
	for _, path := range []string{"/old", "/new"} {
		req := <-requests
		if req.Method != http.MethodPost || req.Path != path || string(req.Body) != string(msg.Data) {
			t.Errorf("request = %s %s %q, want POST %s with the payload", req.Method, req.Path, req.Body, path)
		}
		if req.Header.Get("Idempotency-Key") != "ORDERS:42" {
			t.Errorf("%s: Idempotency-Key = %q", path, req.Header.Get("Idempotency-Key"))
		}
	}
}

// TestHTTPStatusAfterRedirectNamesIt: a status that fails the message
// after a 307 or 308 names where the redirect led, without its query: the
// configured URL itself answers with the redirect, so a dead letter that
// said only "HTTP 404 Not Found" sent the operator to the wrong endpoint.
func TestHTTPStatusAfterRedirectNamesIt(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/orders":
			http.Redirect(w, r, "/v2/orders?token=s3cret", http.StatusPermanentRedirect)
		case "/v2/orders":
			http.Error(w, "no such route", http.StatusNotFound)
		case "/busy":
			http.Redirect(w, r, "/v2/busy", http.StatusTemporaryRedirect)
		default:
			http.Error(w, "overloaded", http.StatusBadGateway)
		}
	}))
	t.Cleanup(srv.Close)
	for _, tc := range []struct {
		path    string
		outcome Outcome
		want    string
	}{
		{"/orders", Permanent, "HTTP 404 Not Found (after a redirect to " + srv.URL + "/v2/orders): no such route"},
		{"/busy", Retry, "HTTP 502 Bad Gateway (after a redirect to " + srv.URL + "/v2/busy): overloaded"},
	} {
		h := newHTTP(t, HTTPOptions{URL: srv.URL + tc.path, Timeout: 5 * time.Second}, nil)
		r := h.Handle(context.Background(), testMessage())
		if r.Outcome != tc.outcome || r.Reason != tc.want {
			t.Errorf("%s: result = %+v, want %s with reason %q", tc.path, r, tc.outcome, tc.want)
		}
	}
	// Without a redirect the reason stays as it was.
	h := newHTTP(t, HTTPOptions{URL: srv.URL + "/v2/orders", Timeout: 5 * time.Second}, nil)
	if r := h.Handle(context.Background(), testMessage()); r.Reason != "HTTP 404 Not Found: no such route" {
		t.Errorf("no redirect: reason = %q", r.Reason)
	}
}

func TestHTTPRedirectLoopFails(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, r.URL.Path, http.StatusTemporaryRedirect)
	}))
	t.Cleanup(srv.Close)
	h := newHTTP(t, HTTPOptions{URL: srv.URL + "/loop"}, nil)
	if r := h.Handle(context.Background(), testMessage()); r.Outcome != Permanent || !strings.Contains(r.Reason, "HTTP 307 Temporary Redirect to /loop (not followed: more than 10 redirects)") {
		t.Fatalf("result = %+v, want a permanent failure with the 307", r)
	}
}

func TestHTTPTimeout(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) }) // runs before srv.Close

	h := newHTTP(t, HTTPOptions{URL: srv.URL, Timeout: 50 * time.Millisecond}, nil)
	r := h.Handle(context.Background(), testMessage())
	if r.Outcome != Retry || r.Reason != "timed out after 50ms" {
		t.Fatalf("result = %+v, want a retry saying it timed out", r)
	}
}

func TestHTTPCancel(t *testing.T) {
	arrived := make(chan struct{}, 1)
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })

	h := newHTTP(t, HTTPOptions{URL: srv.URL, Timeout: time.Minute}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-arrived
		cancel()
	}()
	r := h.Handle(ctx, testMessage())
	if r.Outcome != Retry || r.Reason != "stopped: context canceled" {
		t.Fatalf("result = %+v, want a retry saying it was stopped", r)
	}
}

func TestHTTPConnectionRefused(t *testing.T) {
	addr := fmt.Sprintf("127.0.0.1:%d", natstest.FreePort(t)) // nothing listens there
	h := newHTTP(t, HTTPOptions{URL: "http://" + addr + "/orders?token=s3cret", Timeout: time.Minute}, nil)
	r := h.Handle(context.Background(), testMessage())
	if r.Outcome != Retry || !strings.Contains(r.Reason, "POST failed") {
		t.Fatalf("result = %+v, want a retry", r)
	}
	if strings.Contains(r.Reason, "s3cret") {
		t.Errorf("reason %q shows the URL's query", r.Reason)
	}
}

func TestHTTPConcurrentMessages(t *testing.T) {
	// The server echoes Holdfast-Seq in the status: seq 200+i.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if string(body) != r.Header.Get("Holdfast-Seq") {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	h := newHTTP(t, HTTPOptions{URL: srv.URL, Timeout: time.Minute}, nil)

	handleConcurrently(t, h, 32)
}

func TestHTTPReusesConnections(t *testing.T) {
	var mu sync.Mutex
	conns := 0
	// The payload picks the response: bodies that must be drained, none.
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch string(body) {
		case "404":
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, strings.Repeat("not found ", 1000))
		case "503":
			w.WriteHeader(http.StatusServiceUnavailable)
		case "204":
			w.WriteHeader(http.StatusNoContent)
		default:
			_, _ = io.WriteString(w, strings.Repeat("ok ", 1000))
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, state http.ConnState) {
		if state == http.StateNew {
			mu.Lock()
			conns++
			mu.Unlock()
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)

	h := newHTTP(t, HTTPOptions{URL: srv.URL}, nil)
	for i := range 8 {
		msg := testMessage()
		msg.Data = []byte([]string{"200", "404", "503", "204"}[i%4])
		h.Handle(context.Background(), msg)
	}
	mu.Lock()
	defer mu.Unlock()
	if conns != 1 {
		t.Errorf("%d connections for 8 sequential requests, want 1", conns)
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"", 0},
		{"0", 0},
		{"1", time.Second},
		{" 120 ", 2 * time.Minute},
		{"3599", 3599 * time.Second},
		{"3600", time.Hour},
		{"3601", time.Hour},
		{"99999999999999999999999", time.Hour},
		{"-5", 0},
		{"1.5", 0},
		{"5s", 0},
		{"soon", 0},
		{"Sun, 01 Jun 2025 12:00:30 GMT", 30 * time.Second},
		{"Sunday, 01-Jun-25 12:01:00 GMT", time.Minute},
		{"Sun Jun  1 12:02:00 2025", 2 * time.Minute},
		{"Sun, 01 Jun 2025 11:59:00 GMT", 0},
		{"Mon, 02 Jun 2025 12:00:00 GMT", time.Hour},
		{"Sun, 01 Jun 2025 25:00:00 GMT", 0},
	} {
		if got := parseRetryAfter(tc.in, now); got != tc.want {
			t.Errorf("parseRetryAfter(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

func FuzzParseRetryAfter(f *testing.F) {
	for _, seed := range []string{"", "0", "120", "-1", "1e9", "Sun, 01 Jun 2025 12:00:30 GMT", "999999999999999999999"} {
		f.Add(seed)
	}
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, v string) {
		if d := parseRetryAfter(v, now); d < 0 || d > maxRetryAfter {
			t.Errorf("parseRetryAfter(%q) = %s, outside [0, %s]", v, d, maxRetryAfter)
		}
	})
}

func TestRequestHeaderName(t *testing.T) {
	for name, want := range map[string]string{
		"Nats-Msg-Id":                 "Nats-Msg-Id",
		"nats-msg-id":                 "nats-msg-id",
		"Nats-Expected-Last-Sequence": "",
		"NATS-TTL":                    "",
		"Nats":                        "Nats",
		"Natsy-Thing":                 "Natsy-Thing",
		"Connection":                  "Holdfast-Header-Connection",
		"transfer-encoding":           "Holdfast-Header-transfer-encoding",
		"Host":                        "Holdfast-Header-Host",
		"Content-Length":              "Holdfast-Header-Content-Length",
		"authorization":               "Holdfast-Header-authorization",
		"Proxy-Anything":              "Holdfast-Header-Proxy-Anything",
		"x-forwarded-for":             "Holdfast-Header-x-forwarded-for",
		"X-Forwardedness":             "X-Forwardedness",
		"Authorization-Hint":          "Authorization-Hint",
		"Content-Type":                "Content-Type",
		"X-Anything":                  "X-Anything",
	} {
		if got := requestHeaderName(name); got != want {
			t.Errorf("requestHeaderName(%q) = %q, want %q", name, got, want)
		}
	}
}

// TestHTTPMessageCannotSetCredentialsOrTrustHeaders: a publisher's
// Authorization, Cookie, Proxy-Authorization, X-Forwarded-*, Forwarded, Host
// and hop-by-hop headers reached the endpoint as themselves, and a message's
// Authorization replaced the credentials configured in the URL. They arrive
// only under Holdfast-Header-, and the URL's credentials authenticate.
func TestHTTPMessageCannotSetCredentialsOrTrustHeaders(t *testing.T) {
	protected := map[string]string{
		"Authorization":          "Bearer publisher-token",
		"Cookie":                 "session=publisher",
		"Proxy-Authorization":    "Basic cHJveHk6c2VjcmV0",
		"Proxy-Connection":       "keep-alive",
		"X-Forwarded-For":        "10.9.8.7",
		"X-Forwarded-Host":       "admin.internal",
		"X-Forwarded-Proto":      "https",
		"Forwarded":              "for=10.9.8.7;proto=https",
		"X-Real-Ip":              "10.9.8.7",
		"Via":                    "1.1 trusted-proxy",
		"X-Http-Method-Override": "DELETE",
		"Host":                   "admin.internal",
		"Connection":             "close",
		"Keep-Alive":             "timeout=600",
		"Te":                     "trailers",
		"Trailer":                "X-Sig",
		"Transfer-Encoding":      "chunked",
		"Upgrade":                "websocket",
		"Expect":                 "100-continue",
	}
	for _, tt := range []struct {
		name     string
		userinfo string
		wantAuth string
	}{
		{"url with credentials", "svc:url-secret@", "Basic c3ZjOnVybC1zZWNyZXQ="},
		{"url without credentials", "", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv, requests := newRecordingServer(t, func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusOK)
			})
			h := newHTTP(t, HTTPOptions{URL: strings.Replace(srv.URL, "://", "://"+tt.userinfo, 1) + "/orders", Timeout: time.Minute}, nil)
			msg := testMessage()
			msg.Header = nats.Header{}
			for name, v := range protected {
				msg.Header[name] = []string{v}
			}
			if r := h.Handle(context.Background(), msg); r != Ok() {
				t.Fatalf("result = %+v, want Ok", r)
			}
			req := <-requests
			if got := req.Header.Get("Authorization"); got != tt.wantAuth {
				t.Errorf("Authorization = %q, want %q (the URL's)", got, tt.wantAuth)
			}
			if req.Method != http.MethodPost {
				t.Errorf("method = %s, want POST", req.Method)
			}
			if want := strings.TrimPrefix(srv.URL, "http://"); req.Host != want {
				t.Errorf("Host = %q, want %q", req.Host, want)
			}
			for name, v := range protected {
				if name != "Authorization" && name != "Host" {
					if got := req.Header.Values(name); len(got) > 0 {
						t.Errorf("the message's %s was sent as itself: %q", name, got)
					}
				}
				if got := req.Header.Get("Holdfast-Header-" + name); got != v {
					t.Errorf("Holdfast-Header-%s = %q, want the message's %q", name, got, v)
				}
			}
		})
	}
}

// rawHTTPServer answers every request with resp, written as is, and keeps
// the connection open, sending nothing more, until the test ends.
func rawHTTPServer(t *testing.T, resp string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(func() {
		close(done)
		_ = ln.Close()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
					return
				}
				_, _ = io.WriteString(c, resp)
				<-done
			}()
		}
	}()
	return "http://" + ln.Addr().String() + "/hook"
}

// An endpoint that answers 101 hands over its raw connection; reading it
// must not outlast the timeout, or the worker hangs for as long as the
// endpoint keeps the connection open.
func TestHTTPSwitchingProtocolsFailsWithoutHanging(t *testing.T) {
	url := rawHTTPServer(t, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: other\r\n\r\n")
	h := newHTTP(t, HTTPOptions{URL: url, Timeout: 200 * time.Millisecond}, nil)
	got := make(chan Result, 1)
	go func() { got <- h.Handle(context.Background(), testMessage()) }()
	select {
	case r := <-got:
		if r.Outcome != Permanent || !strings.Contains(r.Reason, "HTTP 101 Switching Protocols") {
			t.Fatalf("result = %+v, want a permanent failure naming the 101", r)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Handle still running 30s after a 101 with a 200ms timeout")
	}
}

// A 2xx whose body never ends is a success, judged by its status; reading
// what is left of the body stops at the timeout.
func TestHTTPEndlessBodyAfterStatus(t *testing.T) {
	for name, resp := range map[string]string{
		"short content-length": "HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\nabc",
		"unfinished chunks":    "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
	} {
		t.Run(name, func(t *testing.T) {
			h := newHTTP(t, HTTPOptions{URL: rawHTTPServer(t, resp), Timeout: 200 * time.Millisecond}, nil)
			got := make(chan Result, 1)
			go func() { got <- h.Handle(context.Background(), testMessage()) }()
			select {
			case r := <-got:
				if r.Outcome != Success {
					t.Fatalf("result = %+v, want success", r)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("Handle still running 30s after the response with a 200ms timeout")
			}
		})
	}
}

// A 307 to a place holdfast cannot POST to failed as a retry whose reason
// named neither the redirect nor (for another scheme) the failure for what
// it is: "POST failed: dial tcp 127.0.0.1:1: ..." for a url the operator
// never configured.
func TestHTTPRedirectFailuresNameTheRedirect(t *testing.T) {
	refused := fmt.Sprintf("127.0.0.1:%d", natstest.FreePort(t)) // nothing listens there
	for _, tc := range []struct {
		name, location string
		outcome        Outcome
		want, not      string
	}{
		{"other scheme", "ftp://127.0.0.1/x", Permanent, "HTTP 307 Temporary Redirect to ftp://127.0.0.1/x (not followed: not an http or https URL)", ""},
		{"no redirect", "", Retry, "POST failed: dial tcp " + refused, "redirect"},
		{"unreachable", "http://u:pw@" + refused + "/x?token=s3cret#frag", Retry, "POST failed after a redirect to http://u:xxxxx@" + refused + "/x: dial tcp " + refused, "s3cret"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := "http://u:pw@" + refused + "/x?token=s3cret"
			if tc.location != "" {
				url = rawHTTPServer(t, "HTTP/1.1 307 Temporary Redirect\r\nLocation: "+tc.location+"\r\nContent-Length: 0\r\n\r\n")
			}
			h := newHTTP(t, HTTPOptions{URL: url, Timeout: 10 * time.Second}, nil)
			r := h.Handle(context.Background(), testMessage())
			if r.Outcome != tc.outcome || !strings.Contains(r.Reason, tc.want) || (tc.not != "" && strings.Contains(r.Reason, tc.not)) {
				t.Fatalf("result = %+v, want %s with %q", r, tc.outcome, tc.want)
			}
		})
	}
}
