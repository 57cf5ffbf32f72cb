package handler

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
)

// Fuzz targets for what the handlers read from outside: message headers
// mapped to the exec handler's environment, and HTTP responses judged by
// the http handler. Their seed corpora run in every `go test`; `make fuzz`
// runs each for FUZZTIME.

// FuzzMessageEnv maps arbitrary headers to the exec handler's environment:
// every variable name is HOLDFAST_HEADER_ and [A-Z0-9_], the metadata
// variables appear once and cannot be overridden by a header or by the
// parent environment, and only a NUL byte is refused.
func FuzzMessageEnv(f *testing.F) {
	f.Add("X-Trace.Id", "abc", "x-trace-id", "def", "orders.created", "id-1")
	f.Add("HOLDFAST_SEQ", "999", "Holdfast-Subject", "spoofed", "orders.x", "")
	f.Add("ü", "\x00", "a=b", "c=d", "s", "k")
	f.Add("", "v", "\xff\xfe", "line1\nline2", "orders.created", strings.Repeat("k", 300))
	parent := []string{"PATH=/usr/bin", "HOLDFAST_HEADER_STALE=1", "HOLDFAST_SEQ=stale", "HOME=/root"}
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2, subject, msgID string) {
		for _, k := range []string{k1, k2} {
			name := headerEnvName(k)
			if utf8.RuneCountInString(k) != len(name) {
				t.Fatalf("headerEnvName(%q) = %q: one character for each of the header's", k, name)
			}
			for i := 0; i < len(name); i++ {
				if c := name[i]; !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
					t.Fatalf("headerEnvName(%q) = %q", k, name)
				}
			}
		}
		m := &Message{Subject: subject, Stream: "ORDERS", Consumer: "WORKER1", Sequence: 7, Delivery: 2, Header: nats.Header{}}
		m.Header.Add(k1, v1)
		m.Header.Add(k2, v2)
		if msgID != "" {
			m.Header.Set(nats.MsgIdHdr, msgID)
		}
		env, err := messageEnv(parent, m)
		nul := strings.Contains(subject+idempotencyKey(m), "\x00")
		for name, vs := range m.Header {
			if name != "" && strings.Contains(strings.Join(vs, ""), "\x00") {
				nul = true
			}
		}
		if err != nil {
			if !strings.Contains(err.Error(), "NUL") {
				t.Fatalf("messageEnv: %v", err)
			}
			if !nul {
				t.Fatalf("messageEnv refused headers without a NUL byte: %v", err)
			}
			return
		}
		seen := map[string]string{}
		for _, kv := range env {
			name, val, ok := strings.Cut(kv, "=")
			if !ok {
				t.Fatalf("environment entry without '=': %q", kv)
			}
			if strings.IndexByte(kv, 0) >= 0 {
				t.Fatalf("environment entry with a NUL byte: %q", kv)
			}
			if _, dup := seen[name]; dup {
				t.Fatalf("%s set twice in %q", name, env)
			}
			seen[name] = val
			if rest, ok := strings.CutPrefix(name, headerEnvPrefix); ok && rest != headerEnvName(rest) {
				t.Fatalf("header variable %q has characters outside [A-Z0-9_]", name)
			}
		}
		if seen["HOLDFAST_SEQ"] != "7" || seen["HOLDFAST_DELIVERY"] != "2" || seen["HOLDFAST_SUBJECT"] != subject ||
			seen["HOLDFAST_STREAM"] != "ORDERS" || seen["HOLDFAST_MSG_ID"] != idempotencyKey(m) {
			t.Fatalf("metadata variables wrong: %v", seen)
		}
		if _, stale := seen["HOLDFAST_HEADER_STALE"]; stale && headerEnvName(k1) != "STALE" && headerEnvName(k2) != "STALE" {
			t.Fatal("the parent's HOLDFAST_HEADER_STALE was passed on")
		}
	})
}

// FuzzHTTPResponse answers the http handler with arbitrary status codes,
// Retry-After values and bodies: the verdict follows the contract (2xx
// success; 429 and 503 retry after at most an hour; other 5xx retry;
// everything else permanent) and the reason is one bounded line.
func FuzzHTTPResponse(f *testing.F) {
	f.Add(200, "", []byte("ok"))
	f.Add(429, "120", []byte("slow down"))
	f.Add(503, "Sun, 01 Jun 2099 12:00:30 GMT", []byte{})
	f.Add(503, "99999999999999999999", []byte("x"))
	f.Add(500, "", []byte("line1\nline2\r\n\x00\xff"))
	f.Add(404, "", []byte(strings.Repeat("é", 300)))
	f.Add(302, "", []byte("moved"))
	f.Add(418, "-5", []byte("teapot"))
	var mu sync.Mutex
	var code int
	var retryAfter string
	var body []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		c, ra, b := code, retryAfter, body
		mu.Unlock()
		if ra != "" {
			w.Header().Set("Retry-After", ra)
		}
		w.WriteHeader(c)
		_, _ = w.Write(b)
	}))
	f.Cleanup(srv.Close)
	h, err := NewHTTP(HTTPOptions{URL: srv.URL, Timeout: 10 * time.Second}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(h.CloseIdleConnections)
	msg := &Message{Subject: "orders.created", Stream: "ORDERS", Consumer: "WORKER1", Sequence: 1, Delivery: 1, Data: []byte("p")}
	f.Fuzz(func(t *testing.T, c int, ra string, b []byte) {
		if c < 200 || c > 599 || !validHeaderValue(ra) || strings.ContainsAny(ra, "\r\n") || len(b) > 1<<20 {
			return
		}
		mu.Lock()
		code, retryAfter, body = c, ra, b
		mu.Unlock()
		res := h.Handle(context.Background(), msg)
		var want Outcome
		switch {
		case c >= 200 && c <= 299:
			want = Success
		case c >= 500 || c == http.StatusTooManyRequests:
			want = Retry
		default:
			want = Permanent
		}
		if res.Outcome != want {
			t.Fatalf("HTTP %d: outcome %v (%s), want %v", c, res.Outcome, res.Reason, want)
		}
		if res.RetryAfter < 0 || res.RetryAfter > maxRetryAfter {
			t.Fatalf("HTTP %d Retry-After %q: retry after %s", c, ra, res.RetryAfter)
		}
		if res.RetryAfter > 0 && c != http.StatusTooManyRequests && c != http.StatusServiceUnavailable {
			t.Fatalf("HTTP %d: Retry-After honoured outside 429/503", c)
		}
		if !utf8.ValidString(res.Reason) || !validHeaderValue(res.Reason) || len(res.Reason) > 600 {
			t.Fatalf("HTTP %d: reason not one bounded line: %q", c, res.Reason)
		}
	})
}
