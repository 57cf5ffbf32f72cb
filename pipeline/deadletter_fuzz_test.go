package pipeline

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/internal/natstest"
	"github.com/holdfast-io/holdfast/pipeline/handler"
)

// Fuzz targets for what holdfast reads from outside: dead-letter headers.
// Their seed corpora run in every `go test`; `make fuzz` runs each for
// FUZZTIME.

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
		m := &handler.Message{Subject: subject, Stream: stream, Consumer: consumer, Sequence: seq, Delivery: delivery,
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
		if want := strings.TrimSpace(reason); headerValueOK(reason) && !strings.Contains(reason, "\t") && parsed.Error != want {
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

// headerValueOK tells whether v travels in a NATS header unchanged: no
// control character but the tab.
func headerValueOK(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}
