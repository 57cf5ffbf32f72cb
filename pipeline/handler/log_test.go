package handler

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// logEntry is one record a logRecorder saw, with its attributes as text.
type logEntry struct {
	Level   slog.Level
	Message string
	Attrs   map[string]string
}

// logStore holds the records of a logger made by newTestLogger.
type logStore struct {
	mu      sync.Mutex
	entries []logEntry
}

// Entries returns the records logged with the given message.
func (s *logStore) Entries(message string) []logEntry {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []logEntry
	for _, e := range s.entries {
		if e.Message == message {
			out = append(out, e)
		}
	}
	return out
}

// logRecorder is a slog.Handler that keeps records in a logStore.
type logRecorder struct {
	store *logStore
	level slog.Level
	attrs []slog.Attr
}

func (r *logRecorder) Enabled(_ context.Context, level slog.Level) bool { return level >= r.level }

func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	e := logEntry{Level: rec.Level, Message: rec.Message, Attrs: map[string]string{}}
	for _, a := range r.attrs {
		e.Attrs[a.Key] = a.Value.String()
	}
	rec.Attrs(func(a slog.Attr) bool {
		e.Attrs[a.Key] = a.Value.String()
		return true
	})
	r.store.mu.Lock()
	defer r.store.mu.Unlock()
	r.store.entries = append(r.store.entries, e)
	return nil
}

func (r *logRecorder) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &logRecorder{store: r.store, level: r.level, attrs: append(append([]slog.Attr(nil), r.attrs...), attrs...)}
}

func (r *logRecorder) WithGroup(string) slog.Handler { return r }

// newTestLogger returns a logger enabled from level on, and what it logged.
func newTestLogger(t *testing.T, level slog.Level) (*slog.Logger, *logStore) {
	t.Helper()
	store := &logStore{}
	return slog.New(&logRecorder{store: store, level: level}), store
}

func testMessage() *Message {
	return &Message{
		Subject:        "orders.created",
		Stream:         "ORDERS",
		Consumer:       "WORKER1",
		Sequence:       42,
		Delivery:       3,
		IdempotencyKey: "ORDERS:42",
		Header:         nats.Header{},
		Data:           []byte(`{"id":42}`),
	}
}

func TestLogInfo(t *testing.T) {
	logger, logs := newTestLogger(t, slog.LevelInfo)
	msg := testMessage()
	msg.Data = []byte("secret-ish payload")

	if r := NewLog(logger).Handle(context.Background(), msg); r != Ok() {
		t.Fatalf("result = %+v, want Ok", r)
	}

	entries := logs.Entries("message")
	if len(entries) != 1 {
		t.Fatalf("got %d records %v, want 1", len(entries), entries)
	}
	e := entries[0]
	if e.Level != slog.LevelInfo {
		t.Errorf("level = %s, want INFO", e.Level)
	}
	want := map[string]string{
		"subject":  "orders.created",
		"stream":   "ORDERS",
		"consumer": "WORKER1",
		"seq":      "42",
		"delivery": "3",
		"msg_id":   "ORDERS:42",
		"size":     "18",
	}
	for k, v := range want {
		if e.Attrs[k] != v {
			t.Errorf("attr %s = %q, want %q", k, e.Attrs[k], v)
		}
	}
	for _, e := range logs.entries {
		for k, v := range e.Attrs {
			if strings.Contains(v, "secret-ish") {
				t.Errorf("payload logged at %s in attr %s", e.Level, k)
			}
		}
	}
}

func TestLogDebugPayload(t *testing.T) {
	for _, tc := range []struct {
		name          string
		size          int
		wantLen       int
		wantTruncated string
	}{
		{"empty", 0, 0, "false"},
		{"short", 10, 10, "false"},
		{"exactly the limit", 256, 256, "false"},
		{"long", 1000, 256, "true"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logger, logs := newTestLogger(t, slog.LevelDebug)
			msg := testMessage()
			msg.Data = []byte(strings.Repeat("x", tc.size))

			if r := NewLog(logger).Handle(context.Background(), msg); r != Ok() {
				t.Fatalf("result = %+v, want Ok", r)
			}
			if n := len(logs.Entries("message")); n != 1 {
				t.Fatalf("got %d info records, want 1", n)
			}
			entries := logs.Entries("message payload")
			if len(entries) != 1 {
				t.Fatalf("got %d payload records, want 1", len(entries))
			}
			e := entries[0]
			if e.Level != slog.LevelDebug {
				t.Errorf("level = %s, want DEBUG", e.Level)
			}
			if got := len(e.Attrs["payload"]); got != tc.wantLen {
				t.Errorf("payload length = %d, want %d", got, tc.wantLen)
			}
			if e.Attrs["truncated"] != tc.wantTruncated {
				t.Errorf("truncated = %s, want %s", e.Attrs["truncated"], tc.wantTruncated)
			}
			if e.Attrs["seq"] != "42" {
				t.Errorf("seq = %s, want 42", e.Attrs["seq"])
			}
		})
	}
}

func TestLogNilLogger(t *testing.T) {
	if r := NewLog(nil).Handle(context.Background(), testMessage()); r != Ok() {
		t.Fatalf("result = %+v, want Ok", r)
	}
}

func TestIdempotencyKey(t *testing.T) {
	for _, tc := range []struct {
		name   string
		key    string
		header nats.Header
		want   string
	}{
		{"set by the worker", "abc", nats.Header{"Nats-Msg-Id": {"other"}}, "abc"},
		{"from Nats-Msg-Id", "", nats.Header{"Nats-Msg-Id": {"order-7"}}, "order-7"},
		{"from nats-msg-id in lower case", "", nats.Header{"nats-msg-id": {"order-8"}}, "order-8"},
		{"empty Nats-Msg-Id", "", nats.Header{"Nats-Msg-Id": {""}}, "ORDERS:42"},
		{"stream and sequence", "", nil, "ORDERS:42"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := testMessage()
			msg.IdempotencyKey = tc.key
			msg.Header = tc.header
			if got := idempotencyKey(msg); got != tc.want {
				t.Errorf("idempotencyKey = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestLogUnderLoad: at info level at most logLinesPerSecond
// messages a second get their own line; the others are counted in one
// summary line at the end of the second. At debug level every one is
// logged.
func TestLogUnderLoad(t *testing.T) {
	logger, logs := newTestLogger(t, slog.LevelInfo)
	h := NewLog(logger)
	for range 500 {
		if r := h.Handle(context.Background(), testMessage()); r != Ok() {
			t.Fatalf("result = %+v, want Ok", r)
		}
	}
	var summary []logEntry
	deadline := time.Now().Add(5 * time.Second)
	for len(summary) == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		summary = logs.Entries("messages handled without a line each")
	}
	lines := len(logs.Entries("message"))
	if lines < logLinesPerSecond || lines > 3*logLinesPerSecond {
		t.Errorf("%d messages logged one by one, want about %d (one or two windows)", lines, logLinesPerSecond)
	}
	if len(summary) != 1 {
		t.Fatalf("%d summary lines, want 1", len(summary))
	}
	if got := summary[0].Attrs["count"]; got != strconv.Itoa(500-lines) {
		t.Errorf("summary count = %s, want %d (500 handled, %d logged)", got, 500-lines, lines)
	}

	debug, dlogs := newTestLogger(t, slog.LevelDebug)
	h = NewLog(debug)
	for range 100 {
		h.Handle(context.Background(), testMessage())
	}
	if n := len(dlogs.Entries("message")); n != 100 {
		t.Errorf("at debug level %d of 100 messages logged", n)
	}
}
