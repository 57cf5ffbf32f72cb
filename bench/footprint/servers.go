package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/holdfast-io/holdfast/bench/benchkit"
	"github.com/nats-io/nats.go/jetstream"
)

// server is one kind of server the benchmark measures: stock nats-server
// or a holdfast binary.
type server struct {
	name string
	bin  string
	// config writes the config of a server on store listening on port
	// into work and returns the arguments to run it with. fill asks for
	// the config the store is filled with.
	config func(work, store string, port int, fill bool) ([]string, error)
	// holdfast is set for a holdfast binary: it is ready once its
	// bootstrap created the default stream.
	holdfast bool
	// setup, when set, runs on each start once the server is ready.
	setup func(p *proc) error
	// readyStream is the stream a holdfast server's bootstrap creates,
	// which start waits for ("": ORDERS).
	readyStream string
	// companion, when set, starts what the server needs running beside
	// it (an edge's hub) before each start, and returns how to stop it.
	companion func(work string) (stop func(), err error)
}

// stockServer is nats-server with JetStream on the file store: measured
// with sync_interval always (holdfast's default), filled with the default
// interval.
func stockServer(bin string) *server {
	return stockServerSync("stock", bin, true)
}

// stockServerSync is stockServer, measured with sync_interval always or,
// with always false, the server's default interval (2 minutes).
func stockServerSync(name, bin string, always bool) *server {
	return &server{name: name, bin: bin, config: func(work, store string, port int, fill bool) ([]string, error) {
		sync := "sync_interval: always"
		if fill || !always {
			sync = ""
		}
		text := fmt.Sprintf("listen: 127.0.0.1:%d\njetstream {\n  store_dir: %q\n  max_file_store: 10GB\n  max_memory_store: 1GB\n  %s\n}\n", port, store, sync)
		path := filepath.Join(work, name+".conf")
		return []string{"-c", path}, os.WriteFile(path, []byte(text), 0o644)
	}}
}

// stockStreamsServer is stockServer with what holdfast's defaults create
// in it: the streams ORDERS and ORDERS_DLQ and the durable pull consumer
// WORKER1, nothing pulling. Idle, it is the share of holdfast's idle cost
// that is the server's own for those streams.
func stockStreamsServer(bin string) *server {
	srv := stockServer(bin)
	srv.name = "stock+streams"
	srv.setup = func(p *proc) error {
		nc, js, err := benchkit.Connect(p.url, 2*time.Second)
		if err != nil {
			return err
		}
		defer nc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, sc := range []jetstream.StreamConfig{
			{Name: "ORDERS", Subjects: []string{"orders.*"}, Storage: jetstream.FileStorage, MaxMsgs: 1_000_000, MaxAge: 72 * time.Hour},
			{Name: "ORDERS_DLQ", Subjects: []string{"dlq.WORKER1.>"}, Storage: jetstream.FileStorage},
		} {
			if _, err := js.CreateOrUpdateStream(ctx, sc); err != nil {
				return fmt.Errorf("create stream %s: %w", sc.Name, err)
			}
		}
		_, err = js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{Durable: "WORKER1",
			AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxDeliver: 5})
		return err
	}
	return srv
}

// holdfastServer is `holdfast run` on its defaults (the stream ORDERS,
// its consumer's four workers, the monitor, HTTP on): only the store, the
// client port and the HTTP port are set. It is filled with sync = "2m".
func holdfastServer(name, bin string) *server {
	return holdfastServerWith(name, bin, "")
}

// holdfastServerWith is holdfastServer with extra appended to its config.
func holdfastServerWith(name, bin, extra string) *server {
	return holdfastServerWindow(name, bin, "", extra)
}

// holdfastServerWindow is holdfastServerWith with jetstream.commit_window
// set to window (unless "").
func holdfastServerWindow(name, bin, window, extra string) *server {
	return &server{name: name, bin: bin, holdfast: true, config: holdfastConfig(name, "", "", window, func() string { return extra })}
}

// holdfastConfig writes the config of a holdfast server: only ports and
// store set, serverName as server.name and domain as jetstream.domain
// (unless ""), window as jetstream.commit_window (unless ""; filled with
// sync = "2m"), and what extra returns at each start appended.
func holdfastConfig(name, serverName, domain, window string, extra func() string) func(work, store string, port int, fill bool) ([]string, error) {
	return func(work, store string, port int, fill bool) ([]string, error) {
		httpPort, err := benchkit.FreePort()
		if err != nil {
			return nil, err
		}
		sync := ""
		if fill {
			sync = `sync = "2m"`
		} else if window != "" {
			sync = fmt.Sprintf("commit_window = %q", window)
		}
		named := ""
		if serverName != "" {
			named = fmt.Sprintf("name = %q\n", serverName)
		}
		if domain != "" {
			sync += fmt.Sprintf("\ndomain = %q", domain)
		}
		text := fmt.Sprintf("[server]\n%shost = \"127.0.0.1\"\nport = %d\n[jetstream]\nstore_dir = %q\n%s\n[http]\nlisten = \"127.0.0.1:%d\"\n%s",
			named, port, store, sync, httpPort, extra())
		path := filepath.Join(work, name+".toml")
		return []string{"run", "--config", path}, os.WriteFile(path, []byte(text), 0o644)
	}
}

// holdfastEdgeServer is a holdfast edge whose consumer WORKER1 forwards
// ORDERS to a hub: a second `holdfast run` on the same binary, started
// beside it with the stream EDGE on edge.> and a leafnode listener. The
// edge has commit window window (unless ""), the hub always sync =
// "always" (a hub refuses a commit window: the server would answer the
// edges' publishes before the flush). Only the edge's process is
// measured: the hub stands for the machine across the link.
func holdfastEdgeServer(name, bin, window string) *server {
	leafPort := 0
	hub := &server{name: name + "-hub", bin: bin, holdfast: true, readyStream: "EDGE"}
	hub.config = holdfastConfig(hub.name, "hub", "hub", "", func() string {
		return fmt.Sprintf("[leafnodes]\nlisten = \"127.0.0.1:%d\"\n[streams.EDGE]\nsubjects = [\"edge.>\"]\n%s", leafPort, steadyLog)
	})
	edge := &server{name: name, bin: bin, holdfast: true}
	edge.config = holdfastConfig(name, "edge1", "", window, func() string {
		return fmt.Sprintf("[[leafnodes.remotes]]\nurl = \"nats-leaf://127.0.0.1:%d\"\n%s%s", leafPort, steadyForward, steadyLog)
	})
	edge.companion = func(work string) (func(), error) {
		var err error
		if leafPort, err = benchkit.FreePort(); err != nil {
			return nil, err
		}
		store := filepath.Join(work, hub.name+"-store")
		if err := os.RemoveAll(store); err != nil {
			return nil, err
		}
		p, err := hub.start(work, store, false)
		if err != nil {
			return nil, fmt.Errorf("the hub: %w", err)
		}
		return func() { p.stop(); _ = os.RemoveAll(store) }, nil
	}
	return edge
}

// proc is a running server.
type proc struct {
	cmd  *exec.Cmd
	url  string
	done chan struct{}
	// companion stops what runs beside it (nil: nothing).
	companion func()
}

// start runs srv on store, its output appended to work/<name>.log, and
// waits until it answers JetStream requests and, for holdfast, until its
// bootstrap created the default stream.
func (srv *server) start(work, store string, fill bool) (*proc, error) {
	port, err := benchkit.FreePort()
	if err != nil {
		return nil, err
	}
	var companion func()
	if srv.companion != nil {
		if companion, err = srv.companion(work); err != nil {
			return nil, err
		}
	}
	p, err := srv.startAt(work, store, port, fill)
	if err != nil {
		if companion != nil {
			companion()
		}
		return nil, err
	}
	p.companion = companion
	return p, nil
}

// startAt is start on port, without the companion.
func (srv *server) startAt(work, store string, port int, fill bool) (*proc, error) {
	args, err := srv.config(work, store, port, fill)
	if err != nil {
		return nil, err
	}
	logFile, err := os.OpenFile(filepath.Join(work, srv.name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	cmd := exec.Command(srv.bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, url: fmt.Sprintf("nats://127.0.0.1:%d", port), done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	wantStream := ""
	if srv.holdfast {
		wantStream = cmp.Or(srv.readyStream, "ORDERS")
	}
	deadline := time.Now().Add(time.Minute)
	for {
		err := p.ready(wantStream)
		if err == nil && srv.setup != nil {
			err = srv.setup(p)
		}
		if err == nil {
			return p, nil
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("%s exited at start-up: see %s", srv.name, logFile.Name())
		default:
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, fmt.Errorf("%s not ready after a minute: %v", srv.name, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ready reports whether the server answers JetStream requests and holds
// stream (when not "").
func (p *proc) ready(stream string) error {
	nc, js, err := benchkit.Connect(p.url, 2*time.Second)
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := js.AccountInfo(ctx); err != nil {
		return err
	}
	if stream != "" {
		_, err = js.Stream(ctx, stream)
	}
	return err
}

// stop sends SIGTERM and waits up to 30 s, then kills; then stops the
// companion.
func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	if p.companion != nil {
		p.companion()
	}
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// fillStream is the stream the stored-messages figures keep: created by
// the benchmark's client on either server, no limits, file storage.
const (
	fillStream  = "FOOTPRINT"
	fillSubject = "footprint.data"
)

// fill creates fillStream and publishes n messages of size bytes into it
// with asynchronous publishes, at most 500 PubAcks outstanding.
func (p *proc) fill(n, size int) error {
	nc, js, err := benchkit.Connect(p.url, 2*time.Second, jetstream.WithPublishAsyncMaxPending(500))
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: fillStream, Subjects: []string{fillSubject},
		Storage: jetstream.FileStorage, MaxMsgs: -1, MaxBytes: -1})
	cancel()
	if err != nil {
		return fmt.Errorf("create stream %s: %w", fillStream, err)
	}
	payload := make([]byte, size)
	for i := range payload {
		payload[i] = byte('a' + i%26)
	}
	for i := range n {
		// With 500 PubAcks outstanding a publish waits (200 ms) for room
		// and then fails: it is sent again once the window has room.
		for {
			_, err := js.PublishAsync(fillSubject, payload)
			if err == nil {
				break
			}
			if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
				return fmt.Errorf("publish %d: %w", i+1, err)
			}
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(5 * time.Minute):
		return errors.New("PubAcks missing 5 minutes after the last publish")
	}
	got, err := p.streamMsgs()
	if err != nil {
		return err
	}
	if got != uint64(n) {
		return fmt.Errorf("stream %s holds %d messages after publishing %d", fillStream, got, n)
	}
	return nil
}

// waitStored waits (up to a minute, the store's recovery) until
// fillStream holds n messages.
func (p *proc) waitStored(n int) error {
	deadline := time.Now().Add(time.Minute)
	for {
		got, err := p.streamMsgs()
		if err == nil && got == uint64(n) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("stream %s: %d messages, want %d (%v)", fillStream, got, n, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (p *proc) streamMsgs() (uint64, error) {
	nc, js, err := benchkit.Connect(p.url, 2*time.Second)
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	return benchkit.StreamMsgs(js, fillStream, 5*time.Second)
}
