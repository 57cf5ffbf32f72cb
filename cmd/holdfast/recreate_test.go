package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/holdfast-io/holdfast/internal/natstest"
)

// `nats stream rm ORDERS` while holdfast runs: holdfast creates the stream
// and its consumer again (an error line, a metric), and the workers resume
// without a restart.
func TestDeletedStreamIsRecreatedWhileRunning(t *testing.T) {
	t.Parallel()
	in := newE2EInstance(t)
	out := filepath.Join(t.TempDir(), "handled")
	script := e2eScript(t, fmt.Sprintf("echo \"$HOLDFAST_SEQ\" >> %s\n", out))
	e2ePipelineConfig(t, in, script, "")
	httpPort := natstest.FreePort(t)
	cfg := e2eWriteConfig(t, strings.Replace(string(must(os.ReadFile(in.cfg))), "[http]\nlisten = \"\"", fmt.Sprintf("[http]\nlisten = \"127.0.0.1:%d\"", httpPort), 1))
	d := startHoldfast(t, cfg)
	d.waitReady()
	_, js := e2eConnect(t, in)
	handled := func(n int) func() error {
		return func() error {
			if got := len(e2eLines(t, out)); got != n {
				return fmt.Errorf("%d message(s) handled, want %d", got, n)
			}
			return nil
		}
	}
	e2ePublishAcked(t, js, 0, 1)
	natstest.CheckFor(t, 20*time.Second, 50*time.Millisecond, handled(1))

	if err := js.DeleteStream(natstest.Context(t), "ORDERS"); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		if _, err := js.Stream(natstest.Context(t), "ORDERS"); err != nil {
			return fmt.Errorf("stream ORDERS: %v", err)
		}
		if _, err := js.Consumer(natstest.Context(t), "ORDERS", "WORKER1"); err != nil {
			return fmt.Errorf("consumer WORKER1: %v", err)
		}
		// The error line follows the creation (it names what was created).
		if log := d.stderr.String(); !strings.Contains(log, "level=ERROR") || !strings.Contains(log, "disappeared while running") {
			return errors.New("no error line about the vanished stream")
		}
		return nil
	})
	e2ePublishAcked(t, js, 0, 2) // the new stream starts at sequence 1
	natstest.CheckFor(t, 30*time.Second, 50*time.Millisecond, handled(3))

	natstest.CheckFor(t, 10*time.Second, 100*time.Millisecond, func() error {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", httpPort))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if want := `holdfast_recreated_total{kind="stream",name="ORDERS",stream="ORDERS"} 1`; !strings.Contains(string(b), want) {
			return fmt.Errorf("metrics lack %s", want)
		}
		return nil
	})
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
