// Command mqtt measures QoS 1 publishing over MQTT — throughput and the
// PUBACK latency a device sees — into holdfast's [mqtt] listener, stock
// nats-server's MQTT, and Mosquitto (when installed), in the same runs on
// the same machine, with what each one's PUBACK guarantees beside it
// (make bench-mqtt).
//
// Each device is a paho client that publishes one message and waits for
// its PUBACK before the next, as a sensor does; 1 and 16 devices at once.
// holdfast runs on its defaults (sync = "always"); stock nats-server with
// `sync_interval: always` and a stream on the same subjects; Mosquitto 2
// with `persistence true`.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/bench/benchkit"
)

var (
	holdfast   = flag.String("holdfast", "bin/holdfast", "the holdfast binary (make build)")
	duration   = flag.Duration("duration", 5*time.Second, "how long each figure publishes")
	runs       = flag.Int("runs", 3, "runs; each measures every broker in turn")
	size       = flag.Int("size", 64, "payload bytes")
	publishers = flag.String("publishers", "1,16", "device counts, comma-separated")
	dir        = flag.String("dir", "", "parent of the work directory (default: the working directory; must not be tmpfs)")
	out        = flag.String("out", "", "also write the markdown report to this file")
)

func main() {
	flag.Parse()
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

// broker is one MQTT server under test.
type broker struct {
	name, guarantee string
	start           func(work string, port int) (*exec.Cmd, error)
}

type figure struct {
	msgsPerSec float64
	p50, p99   time.Duration
}

func run() error {
	work, err := os.MkdirTemp(*dir, "bench-mqtt-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	natsServer := filepath.Join(work, "nats-server")
	log.Printf("building nats-server in %s", work)
	if o, err := exec.Command("go", "build", "-o", natsServer, "github.com/nats-io/nats-server/v2").CombinedOutput(); err != nil {
		return fmt.Errorf("go build nats-server: %v\n%s", err, o)
	}
	var counts []int
	for _, f := range strings.Split(*publishers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("-publishers %q: %v", *publishers, err)
		}
		counts = append(counts, n)
	}
	brokers := []broker{
		{"holdfast [mqtt]", "PUBACK once the configured stream has it on disk (sync = \"always\")", startHoldfast},
		{"nats-server MQTT", "PUBACK once its session stream $MQTT_msgs has it on disk; the configured stream stores its copy later", func(w string, p int) (*exec.Cmd, error) {
			return startStock(natsServer, w, p)
		}},
	}
	if mosq, err := exec.LookPath("mosquitto"); err == nil {
		brokers = append(brokers, broker{"Mosquitto", "PUBACK from memory; written to disk every autosave_interval (1800 s) and at exit", func(w string, p int) (*exec.Cmd, error) {
			return startMosquitto(mosq, w, p)
		}})
	} else {
		log.Printf("mosquitto not installed (apt-get install mosquitto): measured without it")
	}

	results := map[string]map[int][]figure{}
	for r := 1; r <= *runs; r++ {
		for _, b := range brokers {
			if results[b.name] == nil {
				results[b.name] = map[int][]figure{}
			}
			for _, n := range counts {
				f, err := measure(b, work, n)
				if err != nil {
					return fmt.Errorf("%s, %d devices: %w", b.name, n, err)
				}
				log.Printf("run %d: %s, %d device(s): %.0f msg/s, p50 %s, p99 %s", r, b.name, n, f.msgsPerSec, f.p50, f.p99)
				results[b.name][n] = append(results[b.name][n], f)
			}
		}
	}
	report := reportOf(brokers, counts, results)
	fmt.Print(report)
	if *out != "" {
		return os.WriteFile(*out, []byte(report), 0o644)
	}
	return nil
}

// measure starts b on a fresh directory, publishes from n devices for
// -duration and stops it.
func measure(b broker, work string, n int) (figure, error) {
	port, err := benchkit.FreePort()
	if err != nil {
		return figure{}, err
	}
	dir, err := os.MkdirTemp(work, "broker-")
	if err != nil {
		return figure{}, err
	}
	defer os.RemoveAll(dir)
	cmd, err := b.start(dir, port)
	if err != nil {
		return figure{}, err
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}()
	addr := fmt.Sprintf("tcp://127.0.0.1:%d", port)
	clients := make([]paho.Client, n)
	for i := range clients {
		o := paho.NewClientOptions().AddBroker(addr).SetClientID(fmt.Sprintf("bench-%d", i)).
			SetAutoReconnect(false).SetConnectTimeout(5 * time.Second)
		c := paho.NewClient(o)
		deadline := time.Now().Add(30 * time.Second)
		for {
			tok := c.Connect()
			if tok.WaitTimeout(5*time.Second) && tok.Error() == nil {
				break
			}
			if time.Now().After(deadline) {
				return figure{}, fmt.Errorf("connect %s: %v", addr, tok.Error())
			}
			time.Sleep(100 * time.Millisecond)
		}
		clients[i] = c
		defer c.Disconnect(100)
	}
	payload := make([]byte, *size)
	var mu sync.Mutex
	var lat []time.Duration
	var firstErr error
	var wg sync.WaitGroup
	stop := time.Now().Add(*duration)
	for i, c := range clients {
		wg.Go(func() {
			var mine []time.Duration
			topic := "sensors/bench/" + strconv.Itoa(i)
			for time.Now().Before(stop) {
				t0 := time.Now()
				tok := c.Publish(topic, 1, false, payload)
				if !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
					mu.Lock()
					firstErr = fmt.Errorf("no PUBACK: %v", tok.Error())
					mu.Unlock()
					return
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	if firstErr != nil {
		return figure{}, firstErr
	}
	slices.Sort(lat)
	if len(lat) == 0 {
		return figure{}, fmt.Errorf("no message acknowledged")
	}
	return figure{
		msgsPerSec: float64(len(lat)) / duration.Seconds(),
		p50:        lat[len(lat)/2],
		p99:        lat[len(lat)*99/100],
	}, nil
}

func startHoldfast(dir string, port int) (*exec.Cmd, error) {
	nport, err := benchkit.FreePort()
	if err != nil {
		return nil, err
	}
	cfg := fmt.Sprintf(`[server]
name = "bench"
port = %d
[jetstream]
store_dir = %q
max_file_store = "4GB"
[http]
listen = ""
[mqtt]
listen = "127.0.0.1:%d"
[streams.SENSORS]
subjects = ["sensors.>"]
max_age = "1h"
`, nport, filepath.Join(dir, "store"), port)
	path := filepath.Join(dir, "holdfast.toml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	return startLogged(dir, *holdfast, "run", "--config", path)
}

func startStock(bin, dir string, port int) (*exec.Cmd, error) {
	nport, err := benchkit.FreePort()
	if err != nil {
		return nil, err
	}
	conf := fmt.Sprintf("server_name: stock\nlisten: 127.0.0.1:%d\njetstream { store_dir: %q, sync_interval: always, max_file_store: 4GB }\nmqtt { listen: 127.0.0.1:%d }\n",
		nport, filepath.Join(dir, "store"), port)
	path := filepath.Join(dir, "nats-server.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	cmd, err := startLogged(dir, bin, "-c", path)
	if err != nil {
		return nil, err
	}
	// The server starts in the background: try until it listens.
	var js jetstream.JetStream
	for deadline := time.Now().Add(30 * time.Second); ; {
		var nc *nats.Conn
		if nc, js, err = benchkit.Connect(fmt.Sprintf("nats://127.0.0.1:%d", nport), 5*time.Second); err == nil {
			defer nc.Close()
			break
		}
		if time.Now().After(deadline) {
			return cmd, err
		}
		time.Sleep(100 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "SENSORS", Subjects: []string{"sensors.>"}, MaxAge: time.Hour})
	return cmd, err
}

func startMosquitto(bin, dir string, port int) (*exec.Cmd, error) {
	conf := fmt.Sprintf("listener %d 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location %s/\nlog_dest stderr\n", port, dir)
	path := filepath.Join(dir, "mosquitto.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	return startLogged(dir, bin, "-c", path)
}

func startLogged(dir, bin string, args ...string) (*exec.Cmd, error) {
	logf, err := os.Create(filepath.Join(dir, "log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	return cmd, cmd.Start()
}

func reportOf(brokers []broker, counts []int, results map[string]map[int][]figure) string {
	var b strings.Builder
	fmt.Fprintf(&b, "## MQTT QoS 1 publishing\n\npaho devices on 127.0.0.1, each publishing %d-byte messages one at a time (the next after the PUBACK), for %s per figure; %d runs, each broker in turn. Figures: median over the runs, [range]; latency from publish to PUBACK.\n\n", *size, *duration, *runs)
	fmt.Fprintf(&b, "| broker | devices | msg/s | p50 | p99 | its PUBACK means |\n| --- | ---: | ---: | ---: | ---: | --- |\n")
	for _, br := range brokers {
		for _, n := range counts {
			fs := results[br.name][n]
			rate := func(f figure) float64 { return f.msgsPerSec }
			fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s |\n", br.name, n, rng(fs, rate, "%.0f"),
				rng(fs, func(f figure) float64 { return float64(f.p50.Microseconds()) / 1000 }, "%.2f ms"),
				rng(fs, func(f figure) float64 { return float64(f.p99.Microseconds()) / 1000 }, "%.2f ms"), br.guarantee)
		}
	}
	if len(brokers) > 1 {
		fmt.Fprintf(&b, "\nholdfast against the others, msg/s ratio per run [range]:\n\n")
		for _, other := range brokers[1:] {
			for _, n := range counts {
				h, o := results[brokers[0].name][n], results[other.name][n]
				var ratios []float64
				for i := range min(len(h), len(o)) {
					ratios = append(ratios, h[i].msgsPerSec/o[i].msgsPerSec)
				}
				slices.Sort(ratios)
				fmt.Fprintf(&b, "- %d device(s), against %s: %.2f× [%.2f–%.2f]\n", n, other.name, ratios[len(ratios)/2], ratios[0], ratios[len(ratios)-1])
			}
		}
	}
	return b.String()
}

// rng is the median and range of fs by v.
func rng(fs []figure, v func(figure) float64, format string) string {
	xs := make([]float64, len(fs))
	for i, f := range fs {
		xs[i] = v(f)
	}
	slices.Sort(xs)
	return fmt.Sprintf(format+" ["+format+"–"+format+"]", xs[len(xs)/2], xs[0], xs[len(xs)-1])
}
