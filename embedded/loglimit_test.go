package embedded

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/holdfast-io/holdfast/internal/configtest"
	"github.com/holdfast-io/holdfast/internal/natstest"
)

func TestRepeatLimit(t *testing.T) {
	var r repeatLimit
	now := time.Unix(1_800_000_000, 0)
	logged := 0
	for range 3 * repeatBurst {
		if ok, held := r.allow("a", now); ok {
			logged++
			if held != 0 {
				t.Fatalf("held %d before the burst was used", held)
			}
		}
	}
	if logged != repeatBurst {
		t.Fatalf("%d of one kind logged in a window, want %d", logged, repeatBurst)
	}
	if ok, _ := r.allow("b", now); !ok {
		t.Fatal("another kind held back")
	}
	ok, held := r.allow("a", now.Add(repeatWindow))
	if !ok || held != 2*repeatBurst {
		t.Fatalf("next window: logged %v, held back %d, want true and %d", ok, held, 2*repeatBurst)
	}
	for i := range 2 * repeatKinds {
		r.allow(strings.Repeat("k", i%40)+string(rune('a'+i%26))+time.Duration(i).String(), now.Add(2*repeatWindow))
	}
	if n := len(r.kinds); n > repeatKinds {
		t.Fatalf("%d kinds remembered, more than %d", n, repeatKinds)
	}
}

// TestInProcessViolationsDoNotFloodTheLog: a client that makes holdfast's
// own connection break its permissions once per message (a reply subject
// reused under group commit with [auth]) made the server and the
// connection's error handler log a line each: 20,000 publishes, 20,400
// lines, 1.6 GB in 3 minutes of a flood (found 2026-12-05).
func TestInProcessViolationsDoNotFloodTheLog(t *testing.T) {
	log, buf := natstest.Logger(t)
	cfg := configtest.Default(t)
	cfg.Auth.Token = "a-token-for-the-clients-0123456789" // the in-process identity gets its permissions
	s := runServerWithLog(t, cfg, log)
	nc, err := s.Connect("holdfast-test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	const n = 500
	for range n {
		if err := nc.Publish("not.for.holdfast", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		if !strings.Contains(buf.String(), "in-process connection error") {
			return errors.New("no violation logged yet")
		}
		return nil
	})
	time.Sleep(500 * time.Millisecond) // the rest of the asynchronous errors
	text := buf.String()
	for _, line := range []string{"Publish Violation", "in-process connection error"} {
		if got := strings.Count(text, line); got == 0 || got > repeatBurst {
			t.Errorf("%d lines with %q for %d violations, want 1 to %d", got, line, n, repeatBurst)
		}
	}
}
