package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/internal/natstest"
)

// exampleConfigs copies the configs of examples/DIR for a test: each port
// they name (port = N, 127.0.0.1:N) becomes a free one, the same in every
// file, and each store dir one in t.TempDir(). It returns the copies by
// file name.
func exampleConfigs(t *testing.T, dir string) (map[string]string, map[int]int) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "..", "examples", dir, "*.toml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no configs in examples/%s: %v", dir, err)
	}
	ports := map[int]int{}
	portRe := regexp.MustCompile(`(port = |127\.0\.0\.1:)(\d+)`)
	storeRe := regexp.MustCompile(`store_dir = "([^"]+)"`)
	stores := t.TempDir()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, f := range files {
		text, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		s := portRe.ReplaceAllStringFunc(string(text), func(m string) string {
			sub := portRe.FindStringSubmatch(m)
			n, _ := strconv.Atoi(sub[2])
			if ports[n] == 0 {
				ports[n] = natstest.FreePort(t)
			}
			return sub[1] + strconv.Itoa(ports[n])
		})
		// Paths relative to the repository's root (a handler script).
		s = strings.ReplaceAll(s, `"examples/`, `"`+root+"/examples/")
		s = storeRe.ReplaceAllStringFunc(s, func(m string) string {
			return fmt.Sprintf("store_dir = %q", filepath.Join(stores, filepath.Base(storeRe.FindStringSubmatch(m)[1])))
		})
		out[filepath.Base(f)] = e2eWriteConfig(t, s)
	}
	return out, ports
}

// Every example config passes holdfast check as written.
func TestExamplesCheck(t *testing.T) {
	t.Parallel()
	dirs, _ := filepath.Glob(filepath.Join("..", "..", "examples", "*"))
	n := 0
	for _, d := range dirs {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			continue
		}
		cfgs, _ := exampleConfigs(t, filepath.Base(d))
		for name, path := range cfgs {
			n++
			if res := runHoldfast(t, nil, "check", "--config", path); res.code != 0 {
				t.Errorf("examples/%s/%s: check exit %d\n%s%s", filepath.Base(d), name, res.code, res.stdout, res.stderr)
			}
		}
	}
	if n < 6 {
		t.Fatalf("only %d example configs found", n)
	}
}

func exampleJetStream(t *testing.T, port int) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(fmt.Sprintf("nats://127.0.0.1:%d", port), nats.MaxReconnects(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	return js
}

func waitStreamMsgs(t *testing.T, js jetstream.JetStream, stream string, want uint64, within time.Duration) *jetstream.StreamInfo {
	t.Helper()
	var si *jetstream.StreamInfo
	natstest.CheckFor(t, within, 200*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := js.Stream(ctx, stream)
		if err != nil {
			return err
		}
		if si, err = s.Info(ctx); err != nil {
			return err
		}
		if si.State.Msgs != want {
			return fmt.Errorf("%s holds %d messages, want %d", stream, si.State.Msgs, want)
		}
		return nil
	})
	return si
}

// examples/edge-hub as its README runs it: a message published on the
// edge reaches the hub's EDGE stream.
func TestExampleEdgeHub(t *testing.T) {
	t.Parallel()
	cfgs, ports := exampleConfigs(t, "edge-hub")
	hub := startHoldfast(t, cfgs["hub.toml"])
	hub.waitReady()
	edge := startHoldfast(t, cfgs["edge.toml"])
	edge.waitReady()
	if res := runHoldfast(t, nil, "pub", "--config", cfgs["edge.toml"], "orders.created", `{"id":1}`); res.code != 0 {
		t.Fatalf("pub on the edge: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	js := exampleJetStream(t, ports[4222])
	waitStreamMsgs(t, js, "EDGE", 1, 60*time.Second)
	m, err := mustStream(t, js, "EDGE").GetLastMsgForSubject(natstest.Context(t), "edge.edge-01.orders.created")
	if err != nil || string(m.Data) != `{"id":1}` {
		t.Fatalf("the hub's copy: %v %v", m, err)
	}
}

// examples/cluster: three nodes form the cluster, a message published on
// one is in ORDERS, with three replicas, seen from another.
func TestExampleCluster(t *testing.T) {
	t.Parallel()
	cfgs, ports := exampleConfigs(t, "cluster")
	var nodes []*e2eProc
	for _, name := range []string{"node1.toml", "node2.toml", "node3.toml"} {
		nodes = append(nodes, startHoldfast(t, cfgs[name]))
	}
	for _, n := range nodes {
		n.waitReadyWithin(90 * time.Second)
	}
	if res := runHoldfast(t, nil, "pub", "--config", cfgs["node1.toml"], "orders.created", `{"id":1}`); res.code != 0 {
		t.Fatalf("pub: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	si := waitStreamMsgs(t, exampleJetStream(t, ports[4232]), "ORDERS", 1, 30*time.Second)
	if si.Config.Replicas != 3 {
		t.Fatalf("ORDERS has %d replicas, want 3", si.Config.Replicas)
	}
}

// examples/mqtt: a device's QoS 1 reading is in SENSORS.
func TestExampleMQTT(t *testing.T) {
	t.Parallel()
	cfgs, ports := exampleConfigs(t, "mqtt")
	p := startHoldfast(t, cfgs["holdfast.toml"])
	p.waitReady()
	dev := pahoClient(t, fmt.Sprintf("tcp://127.0.0.1:%d", ports[1883]), "thermometer", nil)
	if tok := dev.Publish("sensors/line1/temp", 1, false, "21.5"); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("publish: %v", tok.Error())
	}
	waitStreamMsgs(t, exampleJetStream(t, ports[4240]), "SENSORS", 1, 10*time.Second)
	if !strings.Contains(p.stderr.String(), "sensors.line1.temp") {
		t.Fatal("READINGS did not log the reading")
	}
}

func mustStream(t *testing.T, js jetstream.JetStream, name string) jetstream.Stream {
	t.Helper()
	s, err := js.Stream(natstest.Context(t), name)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// examples/exec-handler as its README runs it: a good order is processed,
// one without a sku is dead-lettered at once with the handler's exit 65.
func TestExampleExecHandler(t *testing.T) {
	t.Parallel()
	cfgs, _ := exampleConfigs(t, "exec-handler")
	cfg := cfgs["holdfast.toml"]
	p := startHoldfast(t, cfg)
	p.waitReady()
	for _, order := range []string{`{"id":1,"sku":"A-7"}`, `{"id":2}`} {
		if res := runHoldfast(t, nil, "pub", "--config", cfg, "orders.created", order); res.code != 0 {
			t.Fatalf("pub %s: exit %d\n%s%s", order, res.code, res.stdout, res.stderr)
		}
	}
	natstest.CheckFor(t, 20*time.Second, 100*time.Millisecond, func() error {
		log := p.stderr.String()
		if !strings.Contains(log, `order 1 (orders.created, delivery 1) processed: {\"id\":1,\"sku\":\"A-7\"}`) ||
			!strings.Contains(log, "order 2 has no sku: refused") {
			return errors.New("the handler's lines are not in the log yet")
		}
		return nil
	})
	var ls e2eResult
	natstest.CheckFor(t, 10*time.Second, 100*time.Millisecond, func() error {
		ls = runHoldfast(t, nil, "dlq", "ls", "--config", cfg)
		if ls.code != 0 || !strings.Contains(ls.stdout, "exit status 65") {
			return fmt.Errorf("dlq ls: exit %d\n%s%s", ls.code, ls.stdout, ls.stderr)
		}
		return nil
	})
	t.Logf("dlq ls:\n%s", ls.stdout)
	if strings.Count(ls.stdout, "orders.created") != 1 {
		t.Errorf("dlq ls lists other than the one bad order:\n%s", ls.stdout)
	}
}

// examples/http-receiver as its README runs it: the service refuses the
// first delivery with 503 and Retry-After, holdfast delivers it again and
// it is taken once.
func TestExampleHTTPReceiver(t *testing.T) {
	t.Parallel()
	cfgs, ports := exampleConfigs(t, "http-receiver")
	bin := filepath.Join(t.TempDir(), "http-receiver")
	if out, err := exec.Command("go", "build", "-o", bin, "../../examples/http-receiver").CombinedOutput(); err != nil {
		t.Fatalf("go build examples/http-receiver: %v\n%s", err, out)
	}
	recv := exec.Command(bin, "-listen", fmt.Sprintf("127.0.0.1:%d", ports[8080]))
	var out natstest.Buffer
	recv.Stdout, recv.Stderr = &out, &out
	if err := recv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = recv.Process.Kill(); _ = recv.Wait() })
	cfg := cfgs["holdfast.toml"]
	p := startHoldfast(t, cfg)
	p.waitReady()
	if res := runHoldfast(t, nil, "pub", "--config", cfg, "orders.created", `{"id":1}`); res.code != 0 {
		t.Fatalf("pub: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	natstest.CheckFor(t, 20*time.Second, 100*time.Millisecond, func() error {
		if !strings.Contains(out.String(), `took ORDERS:1 (delivery 2): {"id":1}`) {
			return fmt.Errorf("the service printed:\n%s", out.String())
		}
		return nil
	})
	if !strings.Contains(out.String(), "busy: refused ORDERS:1 (delivery 1) with 503") {
		t.Errorf("the first delivery was not refused:\n%s", out.String())
	}
	if n := strings.Count(out.String(), "took "); n != 1 {
		t.Errorf("the service took %d orders, want 1:\n%s", n, out.String())
	}
}

// make demo-cluster, demo-edge and demo-stop (examples/demo.sh) start an
// example's processes in the background, each ready with its status
// printed, and stop them all.
func TestExampleDemo(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ demo, dir string }{{"cluster", "cluster"}, {"edge", "edge-hub"}} {
		t.Run(tc.demo, func(t *testing.T) {
			t.Parallel()
			cfgs, _ := exampleConfigs(t, tc.dir)
			root := t.TempDir()
			if err := os.MkdirAll(filepath.Join(root, "examples", tc.dir), 0o755); err != nil {
				t.Fatal(err)
			}
			for name, path := range cfgs {
				if err := os.WriteFile(filepath.Join(root, "examples", tc.dir, name), []byte(readFile(t, path)), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			demo := func(arg string) string {
				cmd := exec.Command("../../examples/demo.sh", arg)
				cmd.Env = append(e2eEnv(), "DEMO_DIR="+root, "HOLDFAST="+holdfastBin)
				out, err := cmd.CombinedOutput()
				if err != nil {
					t.Fatalf("demo.sh %s: %v\n%s", arg, err, out)
				}
				return string(out)
			}
			t.Cleanup(func() {
				if _, err := os.Stat(filepath.Join(root, "data", "demo.pids")); err == nil {
					demo("stop")
				}
			})
			out := demo(tc.demo)
			pids := readFile(t, filepath.Join(root, "data", "demo.pids"))
			for name := range cfgs {
				if !strings.Contains(out, "== examples/"+tc.dir+"/"+name+"\n") {
					t.Errorf("demo.sh %s printed no status of %s:\n%s", tc.demo, name, out)
				}
			}
			if n := strings.Count(out, "holdfast "); n < len(cfgs) {
				t.Errorf("demo.sh %s:\n%s", tc.demo, out)
			}
			stopped := demo("stop")
			for _, line := range strings.Split(strings.TrimSpace(pids), "\n") {
				pid, _ := strconv.Atoi(strings.Fields(line)[0])
				if syscall.Kill(pid, 0) == nil {
					t.Errorf("pid %d still runs after demo.sh stop:\n%s", pid, stopped)
				}
			}
		})
	}
}
