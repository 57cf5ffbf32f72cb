package pipeline

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/internal/natstest"
)

// Fuzz targets for what holdfast reads from outside: dead-letter headers,
// message headers mapped to the exec handler's environment, and HTTP
// responses judged by the http handler. Their seed corpora run in every
// `go test`; `make fuzz` runs each for FUZZTIME.

// plainNATS starts a core NATS server (no JetStream) for wire round trips
// and returns an in-process connection to it.
func plainNATS(f *testing.F) *nats.Conn {
	f.Helper()
	ns := natstest.RunServer(f, func(o *server.Options) { o.JetStream = false })
	return natstest.Connect(f, ns, nats.InProcessServer(ns))
}

// validSubject reports whether s is a literal NATS subject a message can
// be published on.
func validSubject(s string) bool {
	if s == "" || strings.ContainsAny(s, " \t\r\n*>") {
		return false
	}
	for _, tok := range strings.Split(s, ".") {
		if tok == "" {
			return false
		}
	}
	return utf8.ValidString(s)
}

// validHeaderKey reports whether a message header could carry key: a
// printable ASCII name without ':' or spaces.
func validHeaderKey(key string) bool {
	if key == "" {
		return false
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c <= ' ' || c >= 0x7f || c == ':' {
			return false
		}
	}
	return true
}

// FuzzDeadLetterRoundTrip builds a dead letter with NewDeadLetter, sends
// it over the NATS wire and reads it back with ParseDeadLetter: every
// Holdfast-* field survives, the reason stays one header line, the
// original's own headers and payload are kept and its Nats-Msg-Id moves to
// Holdfast-Original-Msg-Id.
func FuzzDeadLetterRoundTrip(f *testing.F) {
	f.Add("orders.created", "WORKER1", "ORDERS", uint64(42), uint64(5), "exit status 65 (EX_DATAERR): bad order", "X-Trace", "abc", "order-1", []byte("payload"))
	f.Add("orders.x", "W", "S", uint64(1), uint64(1), "", "Content-Type", "application/json", "", []byte{})
	f.Add("a.b.c", "C-1", "ST_2", uint64(1<<63), uint64(0), "line one\r\nNats-Msg-Id: injected\r\n\r\nbody", "Nats-Expected-Stream", "OTHER", "id with spaces", []byte("\x00\xff"))
	f.Add("orders.ü", "WORKER1", "ORDERS", uint64(7), uint64(3), " \t padded reason \t ", "X-Ctl", "tab\there", "x", []byte("p"))
	f.Add("orders.created", "WORKER1", "ORDERS", uint64(9), uint64(2), strings.Repeat("long reason ", 200), "Holdfast-Error", "spoofed", "dup", []byte("p"))
	nc := plainNATS(f)
	failedAt := time.Date(2026, 11, 30, 12, 0, 0, 123456789, time.UTC)
	created := time.Date(2026, 10, 1, 8, 0, 0, 987654321, time.UTC)
	f.Fuzz(func(t *testing.T, subject, consumer, stream string, seq, delivery uint64, reason, hkey, hval, msgID string, data []byte) {
		if !validSubject(subject) || !validSubject(consumer) || strings.Contains(consumer, ".") || stream == "" ||
			strings.ContainsAny(stream, " .*>\r\n\t") || !validHeaderKey(hkey) || len(data) > 64<<10 {
			return
		}
		hval = strings.NewReplacer("\r", "", "\n", "").Replace(hval)
		msgID = strings.NewReplacer("\r", "", "\n", "").Replace(msgID)
		m := &Message{Subject: subject, Stream: stream, Consumer: consumer, Sequence: seq, Delivery: delivery,
			Header: nats.Header{}, Data: data}
		m.Header.Set(hkey, hval)
		if msgID != "" {
			m.Header.Set(nats.MsgIdHdr, msgID)
		}
		dl := NewDeadLetter(consumer, m, created, reason, failedAt)
		if dl.Subject != DeadLetterSubject(consumer, subject) {
			t.Fatalf("dead letter on %q", dl.Subject)
		}

		sub, err := nc.SubscribeSync(dl.Subject)
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		if err := nc.PublishMsg(dl); err != nil {
			t.Fatalf("publish dead letter: %v", err)
		}
		got, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("receive dead letter: %v", err)
		}
		parsed := ParseDeadLetter("DLQ", &jetstream.RawStreamMsg{Subject: got.Subject, Sequence: 3, Header: got.Header, Data: got.Data})

		if parsed.Stream != "DLQ" || parsed.Seq != 3 || parsed.Consumer != consumer || parsed.OriginalSubject != subject ||
			parsed.OriginalStream != stream || parsed.OriginalSeq != seq || parsed.Deliveries != delivery || !parsed.FailedAt.Equal(failedAt) {
			t.Fatalf("round trip changed the dead letter: %+v", parsed)
		}
		if !bytes.Equal(parsed.Data, data) {
			t.Fatalf("payload changed: %q, want %q", parsed.Data, data)
		}
		if strings.ContainsAny(parsed.Error, "\r\n") {
			t.Fatalf("Holdfast-Error spans lines: %q", parsed.Error)
		}
		if want := strings.TrimSpace(reason); validHeaderValue(reason) && !strings.Contains(reason, "\t") && parsed.Error != want {
			t.Fatalf("Holdfast-Error = %q, want %q", parsed.Error, want)
		}
		if ids := got.Header.Values(nats.MsgIdHdr); len(ids) != 1 || ids[0] != DeadLetterMsgID(stream, consumer, seq, created) {
			t.Fatalf("Nats-Msg-Id = %q, want only %q", ids, DeadLetterMsgID(stream, consumer, seq, created))
		}
		if !parsed.OriginalStreamCreated.Equal(created) {
			t.Fatalf("Holdfast-Original-Stream-Created = %q, want %s", got.Header.Get(HeaderOriginalStreamCreated), created)
		}
		if want := strings.TrimSpace(msgID); got.Header.Get(HeaderOriginalMsgID) != want && msgID != "" {
			t.Fatalf("Holdfast-Original-Msg-Id = %q, want %q", got.Header.Get(HeaderOriginalMsgID), want)
		}
		// The original's own header comes back, unless it is one holdfast
		// sets or must drop.
		if !strings.HasPrefix(strings.ToLower(hkey), "holdfast-") && !strings.HasPrefix(strings.ToLower(hkey), "nats-") {
			if v := got.Header.Get(hkey); v != strings.TrimSpace(hval) {
				t.Fatalf("header %q = %q, want %q", hkey, v, strings.TrimSpace(hval))
			}
		}
		for _, h := range []string{nats.ExpectedStreamHdr, nats.ExpectedLastSeqHdr, nats.ExpectedLastSubjSeqHdr, nats.ExpectedLastMsgIdHdr} {
			if got.Header.Get(h) != "" {
				t.Fatalf("dead letter carries %s: it would steer its own publish", h)
			}
		}
	})
}

// FuzzParseDeadLetter feeds arbitrary headers to ParseDeadLetter: it never
// panics, and what it cannot parse is zero.
func FuzzParseDeadLetter(f *testing.F) {
	f.Add("dlq.WORKER1.orders.created", "orders.created", "42", "5", "2026-11-30T12:00:00.5Z", "reason")
	f.Add("dlq.", "", "-1", "18446744073709551616", "not a time", "")
	f.Add("orders.created", "x", "0x10", " 3", "2026-13-45T99:00:00Z", "\x00")
	f.Add("dlq.C", "", "", "", "", "")
	f.Fuzz(func(t *testing.T, subject, origSubject, origSeq, deliveries, failedAt, reason string) {
		h := nats.Header{}
		h.Set(HeaderOriginalSubject, origSubject)
		h.Set(HeaderOriginalSeq, origSeq)
		h.Set(HeaderDeliveries, deliveries)
		h.Set(HeaderFailedAt, failedAt)
		h.Set(HeaderError, reason)
		dl := ParseDeadLetter("DLQ", &jetstream.RawStreamMsg{Subject: subject, Sequence: 1, Header: h})
		if n, _ := strconv.ParseUint(origSeq, 10, 64); dl.OriginalSeq != n {
			t.Fatalf("Holdfast-Original-Seq %q parsed as %d, want %d", origSeq, dl.OriginalSeq, n)
		}
		if n, _ := strconv.ParseUint(deliveries, 10, 64); dl.Deliveries != n {
			t.Fatalf("Holdfast-Deliveries %q parsed as %d, want %d", deliveries, dl.Deliveries, n)
		}
		if dl.OriginalSubject != origSubject || dl.Error != reason {
			t.Fatalf("headers changed: %q %q", dl.OriginalSubject, dl.Error)
		}
		if rest, ok := strings.CutPrefix(subject, "dlq."); ok {
			if c, _, _ := strings.Cut(rest, "."); dl.Consumer != c {
				t.Fatalf("consumer %q from subject %q", dl.Consumer, subject)
			}
		} else if dl.Consumer != "" {
			t.Fatalf("consumer %q from a subject outside dlq.>: %q", dl.Consumer, subject)
		}
		_ = ParseDeadLetter("DLQ", &jetstream.RawStreamMsg{Subject: subject})
		// A replay rebuilds the original from the same headers: the
		// idempotency key is never empty and no Holdfast-* header of the
		// dead letter reaches the handler, except where it came from.
		h.Set(HeaderOriginalStream, "ORDERS")
		if m, err := ReplayMessage(ParseDeadLetter("DLQ", &jetstream.RawStreamMsg{Subject: subject, Sequence: 1, Header: h})); err == nil {
			if m.IdempotencyKey == "" || m.Subject != origSubject || m.Header.Get(HeaderReplayedFrom) != "DLQ:1" {
				t.Fatalf("replay message %+v", m)
			}
			for k := range m.Header {
				if strings.HasPrefix(k, "Holdfast-") && k != HeaderReplayedFrom {
					t.Fatalf("replay passes %s to the handler", k)
				}
			}
		} else if origSubject != "" && dl.OriginalSeq != 0 {
			t.Fatalf("replay refused a dead letter with subject and sequence: %v", err)
		}
	})
}

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
	h, err := NewHTTPHandler(HTTPOptions{URL: srv.URL, Timeout: 10 * time.Second}, slog.New(slog.NewTextHandler(io.Discard, nil)))
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
