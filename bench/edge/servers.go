package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/holdfast-io/holdfast/bench/benchkit"
)

// env is what every run shares: the binaries and where runs keep their
// stores.
type env struct {
	holdfast, nats string
	parent         string
}

// node is one holdfast of a run: its config file, client URL and, once
// started, its process.
type node struct {
	name, config, url string
	cmd               *exec.Cmd
	done              chan struct{}
	stopped           bool
}

// hubConfig is the hub: JetStream domain "hub", a leafnode listener on
// leafPort and the stream EDGE on edge.>; every other key is the default.
func hubConfig(work string, port, leafPort int) string {
	return fmt.Sprintf(`[server]
name = "hub"
host = "127.0.0.1"
port = %d

[jetstream]
store_dir = %q
sync = "always" # the default, written out
domain = "hub"

[http]
listen = ""

[leafnodes]
listen = "127.0.0.1:%d"

[streams.EDGE]
subjects = ["edge.>"]
`, port, filepath.Join(work, "hub"), leafPort)
}

// edgeConfig is the edge "edge1": one remote at the hub's leafPort, the
// stream ORDERS on orders.* and the consumer FORWARD that forwards it.
func edgeConfig(work string, port, hubLeafPort int) string {
	return fmt.Sprintf(`[server]
name = "edge1"
host = "127.0.0.1"
port = %d

[jetstream]
store_dir = %q
sync = "always" # the default, written out

[http]
listen = ""

[[leafnodes.remotes]]
url = "nats-leaf://127.0.0.1:%d"

[streams.ORDERS]
subjects = ["orders.*"]

[consumers.FORWARD]
stream = "ORDERS"
handler = "forward"
`, port, filepath.Join(work, "edge"), hubLeafPort)
}

// newNode writes a node's config into work.
func newNode(work, name, text string, port int) (*node, error) {
	path := filepath.Join(work, name+".toml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		return nil, err
	}
	return &node{name: name, config: path, url: fmt.Sprintf("nats://127.0.0.1:%d", port)}, nil
}

// start runs `holdfast run` on the node's config, its output in
// work/<name>.log, and returns without waiting for it to be ready.
func (n *node) start(e *env, work string) error {
	logFile, err := os.OpenFile(filepath.Join(work, n.name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logFile.Close()
	n.cmd = exec.Command(e.holdfast, "run", "--config", n.config)
	n.cmd.Stdout, n.cmd.Stderr = logFile, logFile
	if err := n.cmd.Start(); err != nil {
		return err
	}
	n.done = make(chan struct{})
	go func() { _ = n.cmd.Wait(); close(n.done) }()
	return nil
}

func (n *node) exited() bool {
	select {
	case <-n.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM and waits up to 30 s (then kills); it says so when the
// node did not exit cleanly. Stopping a node never started or already
// stopped does nothing.
func (n *node) stop() error {
	if n.cmd == nil || n.stopped {
		return nil
	}
	n.stopped = true
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.done:
	case <-time.After(30 * time.Second):
		_ = n.cmd.Process.Kill()
		<-n.done
		return fmt.Errorf("%s did not stop within 30s of SIGTERM: killed", n.name)
	}
	if !n.cmd.ProcessState.Success() {
		return fmt.Errorf("%s exited with %s after SIGTERM", n.name, n.cmd.ProcessState)
	}
	return nil
}

// peakRSS reads the node's VmHWM, the most resident memory it ever had.
func (n *node) peakRSS() (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", n.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmHWM in /proc/PID/status")
}

// waitStream waits until the node answers for stream, which its bootstrap
// creates after the server is up.
func (n *node) waitStream(stream string) error {
	deadline := time.Now().Add(time.Minute)
	for {
		msgs, err := n.streamMsgs(stream)
		if err == nil && msgs == 0 {
			return nil
		}
		if err == nil {
			return fmt.Errorf("%s: stream %s holds %d messages at start", n.name, stream, msgs)
		}
		if n.exited() {
			return fmt.Errorf("%s exited at start-up: see its log", n.name)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: stream %s not there after a minute: %v", n.name, stream, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// streamMsgs connects and reads how many messages stream holds.
func (n *node) streamMsgs(stream string) (uint64, error) {
	nc, js, err := benchkit.Connect(n.url, time.Second)
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	return benchkit.StreamMsgs(js, stream, 2*time.Second)
}
