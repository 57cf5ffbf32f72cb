package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/internal/natstest"
)

// Hostile and broken input at holdfast's edges, against the running
// binary: each is handled with a clear error or a dead letter with a
// reason, nothing acknowledged is lost, and holdfast stays up.

// badInputConfig runs two consumers: WORKER1 on ORDERS with an exec
// handler, WEB on HOOKS with an http handler, both with short timeouts and
// two deliveries.
func badInputConfig(t *testing.T, port int, script, url string) string {
	t.Helper()
	return e2eWriteConfig(t, fmt.Sprintf(`[server]
name = "holdfast-badinput"
host = "127.0.0.1"
port = %d

[jetstream]
store_dir = %q
max_file_store = "1GB"
max_memory_store = "64MB"

[http]
listen = ""

[run]
shutdown_timeout = "2s"

[streams.ORDERS]
subjects = ["orders.*"]

[streams.HOOKS]
subjects = ["hooks.*"]

[consumers.WORKER1]
stream = "ORDERS"
workers = 2
handler = "exec"
ack_wait = "5s"
max_deliver = 2
backoff = ["100ms"]
dead_letter = "ORDERS_DLQ"

[consumers.WORKER1.exec]
command = [%q]
timeout = "2s"

[consumers.WEB]
stream = "HOOKS"
workers = 2
handler = "http"
ack_wait = "5s"
max_deliver = 2
backoff = ["100ms"]
dead_letter = "HOOKS_DLQ"

[consumers.WEB.http]
url = %q
timeout = "1s"
`, port, filepath.Join(t.TempDir(), "store"), script, url))
}

// rawNATS sends raw bytes to the NATS port and returns what the server
// answered until it closed the connection or went quiet.
func rawNATS(t *testing.T, addr string, payload []byte) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	r := bufio.NewReader(c)
	if _, err := r.ReadString('\n'); err != nil { // INFO
		t.Fatalf("no INFO from %s: %v", addr, err)
	}
	_, _ = c.Write(payload)
	out, _ := io.ReadAll(io.LimitReader(r, 1<<16))
	return string(out)
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("end-to-end bad-input table")
	}
	dir := t.TempDir()
	done := filepath.Join(dir, "done")
	script := e2eScript(t, fmt.Sprintf(`id=$(cat)
case "$id" in
flood) head -c 2000000 /dev/zero | tr '\0' 'e' >&2; exit 65 ;;
ignore-term) trap '' TERM; sleep 30 & while kill -0 $! 2>/dev/null; do wait $! ; done; exit 0 ;;
*) echo "$id" >> %q ;;
esac
`, done))
	var hung = make(chan struct{})
	defer close(hung)
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if string(body) == "never-answers" {
			select {
			case <-hung:
			case <-r.Context().Done():
			}
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer web.Close()

	port := natstest.FreePort(t)
	in := &e2eInstance{port: port, cfg: badInputConfig(t, port, script, web.URL)}
	p := startHoldfast(t, in.cfg)
	p.waitReady()
	nc, js := e2eConnect(t, in)
	ctx := natstest.Context(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)

	publish := func(subject, data string, h nats.Header) error {
		m := &nats.Msg{Subject: subject, Data: []byte(data), Header: h}
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := js.PublishMsg(pctx, m)
		return err
	}
	// deadLetter waits for the dead letter whose payload is data.
	deadLetter := func(stream, data string) string {
		t.Helper()
		var reason string
		natstest.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
			for _, dl := range e2eDeadLetters(t, js, stream) {
				if string(dl.Data) == data {
					reason = dl.Error
					return nil
				}
			}
			return fmt.Errorf("no dead letter for %q in %s", data, stream)
		})
		return reason
	}
	stillServing := func(what string) {
		t.Helper()
		if p.exited() {
			t.Fatalf("after %s holdfast exited: %v", what, p.state)
		}
		if err := publish("orders.created", "alive", nil); err != nil {
			t.Fatalf("after %s a publish fails: %v", what, err)
		}
	}
	msgs := func() uint64 { return natstest.StreamInfo(t, js, "ORDERS").State.Msgs }

	t.Run("oversized payload", func(t *testing.T) {
		before := msgs()
		big := strings.Repeat("x", int(nc.MaxPayload())+1)
		if err := publish("orders.created", big, nil); !errors.Is(err, nats.ErrMaxPayload) {
			t.Fatalf("publish over max_payload: %v, want %v", err, nats.ErrMaxPayload)
		}
		// A client that does not check: the server refuses it on the wire.
		out := rawNATS(t, addr, []byte(fmt.Sprintf("CONNECT {\"verbose\":false}\r\nPUB orders.created %d\r\n%s\r\n", len(big), big)))
		if !strings.Contains(strings.ToLower(out), "maximum payload") {
			t.Fatalf("raw publish over max_payload: server answered %q", out)
		}
		if after := msgs(); after != before {
			t.Fatalf("stream grew from %d to %d messages", before, after)
		}
		stillServing("an oversized payload")
	})

	t.Run("invalid subjects", func(t *testing.T) {
		before := msgs()
		for _, subj := range []string{"", "orders..created", "orders created"} {
			if err := publish(subj, "bad-subject", nil); err == nil {
				t.Errorf("publish to %q was acknowledged", subj)
			}
			if after := msgs(); after != before {
				t.Fatalf("publish to %q: stream grew from %d to %d messages", subj, before, after)
			}
		}
		out := rawNATS(t, addr, []byte("CONNECT {\"verbose\":true,\"pedantic\":true}\r\nPUB orders.* 1\r\nx\r\nPUB orders..a 1\r\nx\r\nPING\r\n"))
		if !strings.Contains(out, "-ERR") {
			t.Errorf("pedantic raw publish to invalid subjects: server answered %q", out)
		}
		// (A wildcard subject on a raw connection may still be stored:
		// NATS stores what it cannot route literally; see below.)
		// A non-pedantic client may publish to a wildcard subject: the
		// server stores it literally (NATS behaviour), and it is processed
		// like any other message.
		if err := publish("orders.*", "wildcard-subject", nil); err == nil {
			natstest.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
				if !strings.Contains(strings.Join(e2eLines(t, done), "\n"), "wildcard-subject") {
					return errors.New("message on a wildcard subject not processed")
				}
				return nil
			})
		}
		stillServing("invalid subjects")
	})

	t.Run("garbage on the NATS port", func(t *testing.T) {
		junk := make([]byte, 64<<10)
		_, _ = rand.Read(junk)
		for _, b := range [][]byte{junk, []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), []byte("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"), []byte(strings.Repeat("PUB ", 1<<14))} {
			_ = rawNATS(t, addr, b)
		}
		stillServing("junk on the NATS port")
	})

	t.Run("exec: header with a NUL byte", func(t *testing.T) {
		if err := publish("orders.created", "nul-header", nats.Header{"X-Bad": []string{"a\x00b"}}); err != nil {
			t.Fatal(err)
		}
		if r := deadLetter("ORDERS_DLQ", "nul-header"); !strings.Contains(r, "NUL") {
			t.Errorf("dead letter reason %q does not name the NUL byte", r)
		}
	})

	t.Run("exec: control characters in headers pass", func(t *testing.T) {
		if err := publish("orders.created", "ctl-header", nats.Header{"X-Ctl": []string{"a\x01\x1b[31m\x7fb\tc"}}); err != nil {
			t.Fatal(err)
		}
		natstest.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
			if !strings.Contains(strings.Join(e2eLines(t, done), "\n"), "ctl-header") {
				return errors.New("not processed")
			}
			return nil
		})
	})

	t.Run("huge headers", func(t *testing.T) {
		before := msgs()
		var apiErr *jetstream.APIError
		err := publish("orders.created", "huge-header", nats.Header{"X-Huge": []string{strings.Repeat("h", 200<<10)}})
		if !errors.As(err, &apiErr) {
			t.Fatalf("publish with a 200 KiB header: %v, want a JetStream error", err)
		}
		if after := msgs(); after != before {
			t.Fatalf("stream grew from %d to %d messages", before, after)
		}
		// Just under the server's 64 KiB header limit: both handlers take it.
		big := nats.Header{"X-Big": []string{strings.Repeat("h", 60<<10)}}
		if err := publish("orders.created", "big-header", big); err != nil {
			t.Fatal(err)
		}
		if err := publish("hooks.x", "big-header", big); err != nil {
			t.Fatal(err)
		}
		natstest.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
			if !strings.Contains(strings.Join(e2eLines(t, done), "\n"), "big-header") {
				return errors.New("exec handler did not process the message with a 60 KiB header")
			}
			return nil
		})
		stillServing("huge headers")
	})

	t.Run("exec: handler floods stderr", func(t *testing.T) {
		before := len(p.stderr.String())
		if err := publish("orders.created", "flood", nil); err != nil {
			t.Fatal(err)
		}
		r := deadLetter("ORDERS_DLQ", "flood")
		if !strings.Contains(r, "65") || len(r) > 1024 {
			t.Errorf("dead letter reason %d bytes: %.300q", len(r), r)
		}
		if grew := len(p.stderr.String()) - before; grew > 1<<20 {
			t.Errorf("2 MB of handler stderr grew holdfast's log by %d bytes", grew)
		}
		if !p.logs("truncated") {
			t.Errorf("the log does not say the handler's stderr was truncated")
		}
	})

	t.Run("exec: handler ignores SIGTERM", func(t *testing.T) {
		if err := publish("orders.created", "ignore-term", nil); err != nil {
			t.Fatal(err)
		}
		if r := deadLetter("ORDERS_DLQ", "ignore-term"); !strings.Contains(r, "timed out") || !strings.Contains(r, "killed") {
			t.Errorf("dead letter reason %q does not say the timeout killed the process group", r)
		}
	})

	t.Run("http: control characters in headers", func(t *testing.T) {
		if err := publish("hooks.x", "http-ctl-header", nats.Header{"X-Ctl": []string{"a\x01b"}}); err != nil {
			t.Fatal(err)
		}
		// The header HTTP cannot carry is left out (and logged); the
		// message is delivered.
		natstest.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
			c, err := js.Consumer(ctx, "HOOKS", "WEB")
			if err != nil {
				return err
			}
			info, err := c.Info(ctx)
			if err != nil {
				return err
			}
			if info.AckFloor.Stream < 1 {
				return errors.New("not acknowledged")
			}
			return nil
		})
		if !p.logs("HTTP cannot carry them") {
			t.Errorf("no log line about the header left out")
		}
		// An idempotency key HTTP cannot carry fails the message.
		if err := publish("hooks.x", "http-ctl-id", nats.Header{nats.MsgIdHdr: []string{"id\x01"}}); err != nil {
			t.Fatal(err)
		}
		if r := deadLetter("HOOKS_DLQ", "http-ctl-id"); !strings.Contains(r, "Idempotency-Key") {
			t.Errorf("dead letter reason %q", r)
		}
	})

	t.Run("http: endpoint never answers", func(t *testing.T) {
		if err := publish("hooks.x", "never-answers", nil); err != nil {
			t.Fatal(err)
		}
		r := deadLetter("HOOKS_DLQ", "never-answers")
		if !strings.Contains(r, "gave up after 2 deliveries") || !strings.Contains(r, "timed out") {
			t.Errorf("dead letter reason %q: want a retried timeout", r)
		}
	})

	stillServing("the bad-input table")
	p.stop()
}

// TestBadConfigFiles: a config file of binary junk, and store dirs on
// /proc, /sys, a device and a devtmpfs are refused with a clear message.
func TestBadConfigFiles(t *testing.T) {
	t.Parallel()
	junk := make([]byte, 4096)
	_, _ = rand.Read(junk)
	path := filepath.Join(t.TempDir(), "holdfast.toml")
	if err := os.WriteFile(path, junk, 0o600); err != nil {
		t.Fatal(err)
	}
	res := runHoldfast(t, nil, "run", "--config", path)
	if res.code != 2 || !strings.Contains(res.stderr, "Error:") || !strings.Contains(res.stderr, path) {
		t.Errorf("holdfast run with a binary config exited %d, want 2 and the file named:\n%.2000s", res.code, res.stderr)
	}
	if len(res.stderr) > 8<<10 {
		t.Errorf("the error for a binary config is %d bytes long", len(res.stderr))
	}

	for _, dir := range []string{"/proc", "/proc/self", "/sys", "/dev/null", "/dev"} {
		t.Run(dir, func(t *testing.T) {
			if _, err := os.Stat(dir); err != nil {
				t.Skip(err)
			}
			cfg := e2eWriteConfig(t, e2eConfigTOML(dir, natstest.FreePort(t), ""))
			res := runHoldfast(t, nil, "run", "--config", cfg)
			if res.code == 0 || !strings.Contains(res.stderr, "Error:") || !strings.Contains(res.stderr, dir) {
				t.Fatalf("store_dir %s: exit %d, want a refusal that names it:\n%s", dir, res.code, res.stderr)
			}
			t.Logf("store_dir %s: exit %d: %s", dir, res.code, lastNonEmptyLine(res.stderr))
		})
	}
}

func lastNonEmptyLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
