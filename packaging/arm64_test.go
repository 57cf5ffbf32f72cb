package packaging

import (
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/internal/natstest"
)

// TestArm64BinaryRuns: the arm64 binary the packages ship (built as
// build.sh builds it: static, -trimpath) runs, under qemu-user on this
// amd64 machine: `holdfast version`, `holdfast check` of a config, and
// `holdfast run` on a temporary store taking messages that its workers
// handle and ack, then a clean stop on SIGTERM. Edge boards are mostly
// arm64; without this no test ever executed that binary.
//
// It skips without qemu-aarch64-static (Debian: qemu-user-static), unless
// HOLDFAST_REQUIRE_QEMU is set: .ci/run installs it and sets that, so CI
// never skips it.
func TestArm64BinaryRuns(t *testing.T) {
	t.Parallel()
	qemu, err := exec.LookPath("qemu-aarch64-static")
	if err != nil {
		if os.Getenv("HOLDFAST_REQUIRE_QEMU") != "" {
			t.Fatal("qemu-aarch64-static not installed (apt-get install qemu-user-static), and HOLDFAST_REQUIRE_QEMU is set")
		}
		t.Skip("qemu-aarch64-static not installed (apt-get install qemu-user-static); .ci/run installs it")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "holdfast")
	build := exec.Command("go", "build", "-trimpath", "-o", bin, "../cmd/holdfast")
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=arm64")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build for arm64: %v\n%s", err, out)
	}
	if f, err := elf.Open(bin); err != nil || f.Machine != elf.EM_AARCH64 {
		t.Fatalf("the binary built for arm64 is not an aarch64 ELF: %v %v", f, err)
	}
	if out := run(t, qemu, bin, "version"); !strings.HasPrefix(out, "holdfast ") {
		t.Errorf("holdfast version under qemu: %q", out)
	}

	port := natstest.FreePort(t)
	cfg := filepath.Join(dir, "holdfast.toml")
	text := fmt.Sprintf(`[server]
host = "127.0.0.1"
port = %d

[jetstream]
store_dir = %q
max_file_store = "256MB"
max_memory_store = "64MB"

[http]
listen = ""

[streams.ORDERS]
subjects = ["orders.*"]

[consumers.WORKER1]
stream = "ORDERS"
workers = 2
handler = "log"
`, port, filepath.Join(dir, "store"))
	if err := os.WriteFile(cfg, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	run(t, qemu, bin, "check", "--config", cfg)

	var stderr natstest.Buffer
	holdfast := exec.Command(qemu, bin, "run", "--config", cfg)
	holdfast.Stdout, holdfast.Stderr = &stderr, &stderr
	if err := holdfast.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- holdfast.Wait() }()
	t.Cleanup(func() {
		_ = holdfast.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("holdfast (arm64, qemu) log:\n%s", stderr.String())
		}
	})
	natstest.CheckFor(t, 2*time.Minute, 100*time.Millisecond, func() error {
		if !strings.Contains(stderr.String(), "holdfast ready") {
			return fmt.Errorf("not ready")
		}
		return nil
	})
	nc, err := nats.Connect(fmt.Sprintf("nats://127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 50
	for i := range n {
		if _, err := js.Publish(ctx, "orders.created", fmt.Appendf(nil, "%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	natstest.CheckFor(t, time.Minute, 200*time.Millisecond, func() error {
		c, err := js.Consumer(ctx, "ORDERS", "WORKER1")
		if err != nil {
			return err
		}
		if f := c.CachedInfo().AckFloor.Stream; f != n {
			return fmt.Errorf("ack floor %d, want %d: the arm64 workers did not handle every message", f, n)
		}
		return nil
	})
	if err := holdfast.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		done <- err
		if err != nil {
			t.Fatalf("holdfast (arm64) after SIGTERM: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("holdfast (arm64) did not stop within a minute of SIGTERM")
	}
}
