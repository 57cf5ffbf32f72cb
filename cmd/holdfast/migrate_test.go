package main

import (
	"cmp"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/internal/natstest"
)

// TestMigrateFromNatsServer walks docs/migrating.md: a hand-run stock
// nats-server (built from the module cache, the version in go.mod) holds
// ORDERS with 100 messages, a durable consumer WORKER1 that has acked 40,
// and a stream EVENTS holdfast is not told of. holdfast started on the
// same store directory with a config naming ORDERS and WORKER1 keeps every
// message, hands its exec handler exactly 41..100, and leaves EVENTS as it
// was.
func TestMigrateFromNatsServer(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin := filepath.Join(dir, "nats-server")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/nats-io/nats-server/v2").CombinedOutput(); err != nil {
		t.Fatalf("building the stock nats-server: %v\n%s", err, out)
	}
	store := filepath.Join(dir, "data")
	port := natstest.FreePort(t)
	conf := filepath.Join(dir, "nats-server.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf("listen: 127.0.0.1:%d\njetstream {\n  store_dir: %q\n  max_file_store: 1GB\n}\n", port, store)), 0o600); err != nil {
		t.Fatal(err)
	}
	stock := exec.Command(bin, "-c", conf)
	var stockLog natstest.Buffer
	stock.Stdout, stock.Stderr = &stockLog, &stockLog
	if err := stock.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stock.Process.Kill(); _ = stock.Wait() })

	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	var nc *nats.Conn
	natstest.CheckFor(t, 20*time.Second, 50*time.Millisecond, func() (err error) {
		nc, err = nats.Connect(url, nats.MaxReconnects(0))
		return err
	})
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := natstest.Context(t)
	// As `nats stream add` and `nats consumer add` with their defaults.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.*"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	c, err := js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{Durable: "WORKER1", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 100; i++ {
		if _, err := js.Publish(ctx, "orders.created", []byte(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i <= 10; i++ {
		if _, err := js.Publish(ctx, "events.login", []byte(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	batch, err := c.Fetch(40, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if fl := natstest.ConsumerInfo(t, js, "ORDERS", "WORKER1").AckFloor.Stream; fl != 40 {
		t.Fatalf("stock WORKER1 ack floor %d, want 40", fl)
	}
	nc.Close()
	if err := stock.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := stock.Wait(); err != nil {
		t.Logf("stock nats-server: %v", err)
	}

	// The doc's holdfast.toml: the same store and port, ORDERS as the
	// stock server had it (no age or count limit), WORKER1 with a handler.
	out := filepath.Join(dir, "handled")
	script := e2eScript(t, fmt.Sprintf("cat >/dev/null\necho \"$HOLDFAST_SEQ\" >> %q\n", out))
	in := &e2eInstance{store: store, port: port}
	in.cfg = e2eWriteConfig(t, fmt.Sprintf(`[server]
port = %d

[jetstream]
store_dir = %q
max_file_store = "1GB"

[http]
listen = ""

[streams.ORDERS]
subjects = ["orders.*"]
max_msgs = -1
max_age = "0s"

[consumers.WORKER1]
stream = "ORDERS"
handler = "exec"
exec.command = [%q]
`, port, store, script))
	if res := runHoldfast(t, nil, "check", "--config", in.cfg); res.code != 0 {
		t.Fatalf("holdfast check on the stock server's store: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	p := startHoldfast(t, in.cfg)
	p.waitReady()
	natstest.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		b, _ := os.ReadFile(out)
		if n := strings.Count(string(b), "\n"); n < 60 {
			return fmt.Errorf("the handler got %d of 60", n)
		}
		return nil
	})
	_, hjs := e2eConnect(t, in)
	natstest.CheckFor(t, 10*time.Second, 100*time.Millisecond, func() error {
		if fl := natstest.ConsumerInfo(t, hjs, "ORDERS", "WORKER1").AckFloor.Stream; fl != 100 {
			return fmt.Errorf("WORKER1 ack floor %d, want 100", fl)
		}
		return nil
	})
	b, _ := os.ReadFile(out)
	var want []string
	for i := 41; i <= 100; i++ {
		want = append(want, fmt.Sprint(i))
	}
	got := strings.Fields(string(b))
	slices.SortFunc(got, func(a, b string) int { return cmp.Compare(len(a), len(b))*2 + strings.Compare(a, b) })
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("the exec handler got %v, want 41..100 each once", got)
	}
	if n := natstest.StreamInfo(t, hjs, "ORDERS").State.Msgs; n != 100 {
		t.Errorf("ORDERS holds %d after the move, want 100", n)
	}
	if n := natstest.StreamInfo(t, hjs, "EVENTS").State.Msgs; n != 10 {
		t.Errorf("EVENTS holds %d after the move, want 10 (left as it was)", n)
	}
	p.stop()
	if t.Failed() {
		t.Logf("stock nats-server log:\n%s", stockLog.String())
	}
}
