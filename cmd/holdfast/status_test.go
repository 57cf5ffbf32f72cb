package main

// End-to-end tests of holdfast's operations surface against the built
// binary: /metrics, /healthz, /readyz, /nats/*, `holdfast status`,
// retention-loss detection and `holdfast pub --id`. They use the helpers
// of main_test.go.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/holdfast-io/holdfast/daemon"
	"github.com/holdfast-io/holdfast/internal/natstest"
	"github.com/holdfast-io/holdfast/pipeline/monitor"
)

// opsInstance is an instance with the HTTP listener on a free port.
type opsInstance struct {
	*e2eInstance
	http string
}

// newOpsInstance writes a config with [http] listen on a free port,
// httpExtra added to [http] and consumerExtra to [consumers.WORKER1]
// (which has workers = 0 unless consumerExtra says otherwise), streamExtra
// to [streams.ORDERS], and tail appended.
func newOpsInstance(t *testing.T, httpExtra, streamExtra, consumerExtra, tail string) *opsInstance {
	t.Helper()
	in := newE2EInstance(t)
	o := &opsInstance{e2eInstance: in, http: fmt.Sprintf("127.0.0.1:%d", natstest.FreePort(t))}
	text := e2eConfigTOML(in.store, in.port, "")
	text = strings.Replace(text, "listen = \"\"\n", fmt.Sprintf("listen = %q\n%s\n", o.http, httpExtra), 1)
	text = strings.Replace(text, "subjects = [\"orders.*\"]\n", "subjects = [\"orders.*\"]\n"+streamExtra+"\n", 1)
	if strings.Contains(consumerExtra, "workers =") {
		text = strings.Replace(text, "workers = 0\n", "", 1)
	}
	text += consumerExtra + "\n" + tail
	in.cfg = e2eWriteConfig(t, text)
	return o
}

func (o *opsInstance) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + o.http + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

func (o *opsInstance) health(t *testing.T) (int, monitor.Health) {
	t.Helper()
	code, body := o.get(t, "/healthz")
	var h monitor.Health
	if err := json.Unmarshal([]byte(body), &h); err != nil {
		t.Fatalf("/healthz is not JSON: %v\n%s", err, body)
	}
	return code, h
}

// metrics scrapes /metrics with the Prometheus text parser.
func (o *opsInstance) metrics(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + o.http + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.LegacyValidation)
	families, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	return families
}

// metricValue sums the samples of name with the given labels (a
// histogram's sample count); ok is false when there is none.
func metricValue(families map[string]*dto.MetricFamily, name string, labels ...string) (v float64, ok bool) {
	f := families[name]
	if f == nil {
		return 0, false
	}
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
next:
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, lp := range m.GetLabel() {
			have[lp.GetName()] = lp.GetValue()
		}
		for k, val := range want {
			if have[k] != val {
				continue next
			}
		}
		ok = true
		switch {
		case m.Counter != nil:
			v += m.Counter.GetValue()
		case m.Gauge != nil:
			v += m.Gauge.GetValue()
		case m.Histogram != nil:
			v += float64(m.Histogram.GetSampleCount())
		}
	}
	return v, ok
}

func (o *opsInstance) status(t *testing.T) (daemon.ClientStatus, e2eResult) {
	t.Helper()
	res := runHoldfast(t, nil, "status", "--config", o.cfg, "--json")
	var out daemon.ClientStatus
	if err := json.Unmarshal([]byte(res.stdout), &out); err != nil {
		t.Fatalf("holdfast status --json exited %d with no JSON: %v\nstdout:\n%s\nstderr:\n%s", res.code, err, res.stdout, res.stderr)
	}
	return out, res
}

func findConsumer(t *testing.T, out daemon.ClientStatus, name string) daemon.ConsumerStatus {
	t.Helper()
	for _, c := range out.Consumers {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("status has no consumer %s: %+v", name, out.Consumers)
	return daemon.ConsumerStatus{}
}

func findStream(t *testing.T, out daemon.ClientStatus, name string) daemon.StreamStatus {
	t.Helper()
	for _, s := range out.Streams {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("status has no stream %s: %+v", name, out.Streams)
	return daemon.StreamStatus{}
}

// A stream that keeps 10 messages and a consumer that reads nothing:
// after 25 publishes, the log, /metrics, /healthz and status all say 15
// messages were lost.
func TestRetentionLossReportedEverywhere(t *testing.T) {
	t.Parallel()
	o := newOpsInstance(t, "", "max_msgs = 10", "", "")
	d := startHoldfast(t, o.cfg)
	d.waitReady()
	if code, h := o.health(t); code != http.StatusOK || h.Status != "ok" {
		t.Fatalf("/healthz before any message = %d %+v, want 200 ok", code, h)
	}
	_, js := e2eConnect(t, o.e2eInstance)
	for i := 0; i < 25; i++ {
		if _, err := js.Publish(natstest.Context(t), "orders.created", []byte(fmt.Sprintf("m-%d", i))); err != nil {
			t.Fatal(err)
		}
	}

	natstest.CheckFor(t, 20*time.Second, 50*time.Millisecond, func() error {
		code, h := o.health(t)
		if code != http.StatusServiceUnavailable || h.Status != "degraded" || h.LostToRetention["ORDERS/WORKER1"] != 15 {
			return fmt.Errorf("/healthz = %d %+v, want 503 degraded with 15 lost", code, h)
		}
		return nil
	})
	if _, h := o.health(t); !strings.Contains(h.Reason, "lost 15 message(s)") {
		t.Errorf("/healthz reason does not say 15 were lost: %q", h.Reason)
	}
	if v, ok := metricValue(o.metrics(t), "holdfast_messages_lost_to_retention_total", "stream", "ORDERS", "consumer", "WORKER1"); !ok || v != 15 {
		t.Errorf("holdfast_messages_lost_to_retention_total = %v (present %v), want 15", v, ok)
	}
	// The log names the consumer, the count and the sequences (1..15,
	// possibly over several lines).
	log := d.stderr.String()
	if !regexp.MustCompile(`level=WARN msg="messages removed from the stream before the consumer acknowledged them".*consumer=WORKER1.*lost_total=15 `).MatchString(log) {
		t.Errorf("no warning with lost_total=15 in the log:\n%s", log)
	}
	if !strings.Contains(log, "seq_from=1 ") || !strings.Contains(log, "seq_to=15 ") {
		t.Errorf("the loss warnings do not give the sequence range 1..15:\n%s", log)
	}

	out, res := o.status(t)
	if res.code != 1 || out.Healthy {
		t.Errorf("holdfast status exited %d (healthy %v) after a loss, want 1", res.code, out.Healthy)
	}
	c := findConsumer(t, out, "WORKER1")
	if c.LostToRetention == nil || *c.LostToRetention != 15 {
		t.Errorf("status lost_to_retention = %v, want 15", c.LostToRetention)
	}
	if c.LastLoss == nil || c.LastLoss.Cause != "max_msgs" || c.LastLoss.LastSeq != 15 {
		t.Errorf("status last_loss = %+v, want up to seq 15 by max_msgs", c.LastLoss)
	}
	if c.Pending != 10 || len(c.Warnings) == 0 {
		t.Errorf("status: pending %d, warnings %q; want 10 pending and a max_msgs warning", c.Pending, c.Warnings)
	}
	text := runHoldfast(t, nil, "status", "--config", o.cfg)
	if text.code != 1 || !regexp.MustCompile(`(?m)^WORKER1\s+ORDERS\s+10\s+0/1000\s+0\s+0\s+15\s+none$`).MatchString(text.stdout) {
		t.Errorf("holdfast status (exit %d) does not show WORKER1 with 10 pending and 15 lost:\n%s", text.code, text.stdout)
	}
	d.stop()
}

// With discard = "new" a full stream refuses publishes and loses nothing.
func TestDiscardNewRefusesPublishes(t *testing.T) {
	t.Parallel()
	o := newOpsInstance(t, "", "max_msgs = 10\ndiscard = \"new\"", "", "")
	d := startHoldfast(t, o.cfg)
	d.waitReady()
	for i := 0; i < 10; i++ {
		if res := runHoldfast(t, nil, "pub", "--config", o.cfg, "orders.created", fmt.Sprint(i)); res.code != 0 {
			t.Fatalf("pub %d exited %d: %s", i, res.code, res.stderr)
		}
	}
	res := runHoldfast(t, nil, "pub", "--config", o.cfg, "orders.created", "one too many")
	if res.code != 1 || !strings.Contains(res.stderr, "maximum messages exceeded") {
		t.Errorf("pub to a full discard=new stream exited %d, want 1 with the server's refusal:\n%s", res.code, res.stderr)
	}
	_, js := e2eConnect(t, o.e2eInstance)
	if st := natstest.StreamInfo(t, js, "ORDERS").State; st.Msgs != 10 || st.FirstSeq != 1 {
		t.Errorf("ORDERS holds %d messages from seq %d, want the first 10", st.Msgs, st.FirstSeq)
	}
	out, _ := o.status(t)
	if c := findConsumer(t, out, "WORKER1"); c.LostToRetention == nil || *c.LostToRetention != 0 {
		t.Errorf("status lost_to_retention = %v, want 0", c.LostToRetention)
	}
	if code, h := o.health(t); code != http.StatusOK || h.Status != "ok" || len(h.Warnings) == 0 {
		t.Errorf("/healthz = %d %+v, want 200 ok with a warning that the stream is full", code, h)
	}
	d.stop()
}

// The counters of /metrics, read with the Prometheus text parser, move
// as messages are processed, retried and dead-lettered.
func TestMetricsMoveWithProcessing(t *testing.T) {
	t.Parallel()
	script := e2eScript(t, `case "$HOLDFAST_SUBJECT" in
orders.fail) echo "always failing" >&2; exit 1 ;;
orders.bad) echo "malformed" >&2; exit 65 ;;
esac
cat >/dev/null
`)
	o := newOpsInstance(t, "", "", fmt.Sprintf(`workers = 2
max_deliver = 3
backoff = ["100ms"]
handler = "exec"
[consumers.WORKER1.exec]
command = [%q]
`, script), "")
	d := startHoldfast(t, o.cfg)
	d.waitReady()
	l := []string{"stream", "ORDERS", "consumer", "WORKER1"}
	before := o.metrics(t)
	for _, name := range []string{"holdfast_messages_processed_total", "holdfast_messages_acked_total",
		"holdfast_messages_retried_total", "holdfast_messages_dead_lettered_total", "holdfast_messages_lost_to_retention_total"} {
		if f := before[name]; f == nil || f.GetType() != dto.MetricType_COUNTER {
			t.Errorf("%s is not a counter", name)
		}
		if v, ok := metricValue(before, name, l...); !ok || v != 0 {
			t.Errorf("%s = %v (present %v) before any message, want 0", name, v, ok)
		}
	}
	for _, name := range []string{"process_resident_memory_bytes", "go_goroutines", "holdfast_build_info",
		"holdfast_jetstream_storage_used_bytes", "holdfast_jetstream_storage_reserved_bytes", "holdfast_stream_max_messages",
		"holdfast_consumer_pending_messages", "holdfast_consumer_ack_pending_messages", "holdfast_consumer_redelivered_messages",
		"holdfast_handlers_in_flight", "holdfast_stream_first_seq", "holdfast_stream_last_seq"} {
		if before[name] == nil {
			t.Errorf("/metrics has no %s", name)
		}
	}

	_, js := e2eConnect(t, o.e2eInstance)
	for _, subj := range []string{"orders.ok", "orders.ok", "orders.ok", "orders.fail", "orders.bad"} {
		if _, err := js.Publish(natstest.Context(t), subj, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]float64{
		"holdfast_messages_processed_total":     3 + 3 + 1,
		"holdfast_messages_acked_total":         3,
		"holdfast_messages_retried_total":       2,
		"holdfast_messages_dead_lettered_total": 2,
		"holdfast_handler_duration_seconds":     7,
		"holdfast_consumer_pending_messages":    0,
		"holdfast_handlers_in_flight":           0,
	}
	natstest.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		f := o.metrics(t)
		var bad []string
		for name, w := range want {
			if v, ok := metricValue(f, name, l...); !ok || v != w {
				bad = append(bad, fmt.Sprintf("%s = %v, want %v", name, v, w))
			}
		}
		if v, _ := metricValue(f, "holdfast_stream_messages", "stream", "ORDERS_DLQ"); v != 2 {
			bad = append(bad, fmt.Sprintf("ORDERS_DLQ holds %v, want 2", v))
		}
		if v, _ := metricValue(f, "holdfast_handler_duration_seconds", "consumer", "WORKER1", "outcome", "permanent"); v != 1 {
			bad = append(bad, fmt.Sprintf("%v permanent outcomes, want 1", v))
		}
		if len(bad) > 0 {
			return fmt.Errorf("%s", strings.Join(bad, "; "))
		}
		return nil
	})
	d.stop()
}

// /healthz is 200 when healthy and 503 with a reason when the consumer
// is deleted with the nats CLI; /readyz and the NATS endpoints answer.
func TestHealthzConsumerDeleted(t *testing.T) {
	t.Parallel()
	o := newOpsInstance(t, "", "", "", "")
	d := startHoldfast(t, o.cfg)
	d.waitReady()
	code, body := o.get(t, "/healthz")
	if code != http.StatusOK || strings.Join(strings.Fields(body), "") != `{"status":"ok"}` {
		t.Fatalf("/healthz = %d %s, want 200 {\"status\":\"ok\"}", code, body)
	}
	if code, body := o.get(t, "/readyz"); code != http.StatusOK || !strings.Contains(body, `"ready"`) {
		t.Errorf("/readyz = %d %s, want 200 ready", code, body)
	}
	for path, want := range map[string]string{
		"/nats/varz":    `"server_name": "holdfast-e2e"`,
		"/nats/jsz":     `"streams": 2`,
		"/nats/connz":   `"connections"`,
		"/nats/healthz": `"status":"ok"`,
	} {
		code, body := o.get(t, path)
		var v map[string]any
		if code != http.StatusOK || json.Unmarshal([]byte(body), &v) != nil || !strings.Contains(body, want) {
			t.Errorf("GET %s = %d, want 200 JSON with %s:\n%.400s", path, code, want, body)
		}
	}
	// Every monitoring endpoint of the server is served, under /nats/ and
	// at the root where stock has them, but for holdfast's own /healthz
	// (raftz answers 404 on a single node: the server's own answer).
	for _, ep := range daemon.NATSEndpoints {
		paths := []string{"/nats/" + ep, "/" + ep}
		if ep == "healthz" {
			paths = paths[:1]
		}
		for _, path := range paths {
			code, body := o.get(t, path)
			if ep == "raftz" && code == http.StatusNotFound && strings.Contains(body, "No Raft nodes") {
				continue
			}
			if code != http.StatusOK || len(body) == 0 {
				t.Errorf("GET %s = %d %.200s, want 200", path, code, body)
			}
		}
	}

	res := e2eRunBinary(t, natsBin, nil, nil, "--server", o.url(), "consumer", "rm", "ORDERS", "WORKER1", "--force")
	if res.code != 0 {
		t.Fatalf("nats consumer rm exited %d: %s%s", res.code, res.stdout, res.stderr)
	}
	// The consumer is created again, with an error line, and health is
	// back to ok.
	natstest.CheckFor(t, 20*time.Second, 50*time.Millisecond, func() error {
		if !strings.Contains(d.stderr.String(), "disappeared while running") {
			return errors.New("no error line about the deleted consumer")
		}
		code, h := o.health(t)
		if code != http.StatusOK || h.Status != "ok" {
			return fmt.Errorf("/healthz = %d %+v", code, h)
		}
		return nil
	})
	out, res := o.status(t)
	if res.code != 0 || !out.Healthy || !findConsumer(t, out, "WORKER1").Exists {
		t.Errorf("holdfast status exited %d with consumer %+v, want 0 and the consumer created again", res.code, findConsumer(t, out, "WORKER1"))
	}
	d.stop()
}

// A handler running long within its exec timeout (stall_timeout far
// shorter) is working, not stalled: /healthz stays 200 and the watchdog is
// not involved; SIGTERM still stops holdfast.
func TestHealthzLongHandlerIsNotStalled(t *testing.T) {
	t.Parallel()
	started := filepath.Join(t.TempDir(), "started")
	script := e2eScript(t, fmt.Sprintf("touch %s\nexec sleep 600\n", started))
	o := newOpsInstance(t, `stall_timeout = "1s"`, "", fmt.Sprintf(`workers = 1
handler = "exec"
[consumers.WORKER1.exec]
command = [%q]
timeout = "10m"
`, script), `
[run]
shutdown_timeout = "1s"
`)
	d := startHoldfast(t, o.cfg)
	d.waitReady()
	if res := runHoldfast(t, nil, "pub", "--config", o.cfg, "orders.created", "long"); res.code != 0 {
		t.Fatal(res.stderr)
	}
	natstest.CheckFor(t, 20*time.Second, 50*time.Millisecond, func() error {
		_, err := os.Stat(started)
		return err
	})
	// Many times the stall timeout, checked every 100ms.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if code, h := o.health(t); code != http.StatusOK {
			t.Fatalf("/healthz = %d %+v while a handler runs within its timeout", code, h)
		}
	}
	if v, _ := metricValue(o.metrics(t), "holdfast_consumer_stalled", "consumer", "WORKER1"); v != 0 {
		t.Errorf("holdfast_consumer_stalled = %v, want 0", v)
	}
	if code := d.signal(syscall.SIGTERM); code != 0 {
		t.Errorf("holdfast exited %d after SIGTERM with a long handler, want 0", code)
	}
}

// holdfast status and status --json against a running binary, field by
// field.
func TestStatusFields(t *testing.T) {
	t.Parallel()
	script := e2eScript(t, `[ "$HOLDFAST_SUBJECT" = orders.bad ] && exit 65
cat >/dev/null
`)
	o := newOpsInstance(t, "", "max_msgs = 100\nmax_bytes = \"1MiB\"", fmt.Sprintf(`workers = 1
max_ack_pending = 50
handler = "exec"
[consumers.WORKER1.exec]
command = [%q]
`, script), "")
	d := startHoldfast(t, o.cfg)
	d.waitReady()
	_, js := e2eConnect(t, o.e2eInstance)
	for _, subj := range []string{"orders.created", "orders.created", "orders.bad", "orders.created"} {
		if _, err := js.Publish(natstest.Context(t), subj, []byte("payload")); err != nil {
			t.Fatal(err)
		}
	}
	var out daemon.ClientStatus
	natstest.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		var res e2eResult
		out, res = o.status(t)
		if res.code != 0 {
			return fmt.Errorf("status exited %d: %s", res.code, res.stderr)
		}
		if c := findConsumer(t, out, "WORKER1"); c.Workers == nil || c.Workers.Processed != 4 || c.AckFloorSeq != 4 ||
			c.Workers.Acked+c.Workers.DeadLettered != 4 {
			// The server moves the ack floor before its confirmation reaches
			// the worker that counts the ack: wait for both.
			return fmt.Errorf("not processed yet: %+v", c)
		}
		return nil
	})

	if !out.Healthy || out.Health == nil || out.Health.Status != "ok" || len(out.Problems) != 0 {
		t.Errorf("healthy = %v, health %+v, problems %q; want healthy", out.Healthy, out.Health, out.Problems)
	}
	if out.URL != o.url() {
		t.Errorf("url = %q, want %q", out.URL, o.url())
	}
	if dm := out.Daemon; dm == nil || dm.ServerName != "holdfast-e2e" || dm.PID != d.cmd.Process.Pid || dm.NATSServer == "" ||
		dm.HTTPListen != o.http || !dm.FailOnLoss {
		t.Errorf("daemon = %+v", out.Daemon)
	}
	js0 := out.JetStream
	store, _ := filepath.Abs(o.store)
	if !js0.Enabled || js0.StoreDir != store || js0.Sync != "always" ||
		js0.File.Limit != 1<<30 || js0.Memory.Limit != 64<<20 || js0.File.Used == 0 || js0.Streams != 2 || js0.Consumers != 1 {
		t.Errorf("jetstream = %+v, want enabled, store %s, sync always, limits 1GiB/64MiB, 2 streams, 1 consumer", js0, store)
	}

	s := findStream(t, out, "ORDERS")
	if !s.Exists || s.DeadLetter || s.Messages != 4 || s.FirstSeq != 1 || s.LastSeq != 4 || s.Bytes == 0 ||
		s.MaxMsgs != 100 || s.MaxBytes != 1<<20 || s.MaxAgeSeconds != 72*3600 || s.Discard != "old" || s.Retention != "limits" || s.Storage != "file" ||
		s.LimitRatio["max_msgs"] != 0.04 {
		t.Errorf("stream ORDERS = %+v", s)
	}
	dl := findStream(t, out, "ORDERS_DLQ")
	if !dl.Exists || !dl.DeadLetter || dl.Messages != 1 || dl.LastSeq != 1 || dl.MaxMsgs != -1 {
		t.Errorf("stream ORDERS_DLQ = %+v", dl)
	}

	c := findConsumer(t, out, "WORKER1")
	if !c.Exists || c.Stream != "ORDERS" || c.Pending != 0 || c.AckPending != 0 || c.Redelivered != 0 || c.MaxAckPending != 50 ||
		c.DeliveredSeq != 4 || c.AckFloorSeq != 4 || c.Stalled || len(c.Warnings) != 0 {
		t.Errorf("consumer WORKER1 = %+v", c)
	}
	if c.DeadLetterStream != "ORDERS_DLQ" || c.DeadLetters == nil || *c.DeadLetters != 1 {
		t.Errorf("consumer WORKER1 dead letters = %v in %q, want 1 in ORDERS_DLQ", c.DeadLetters, c.DeadLetterStream)
	}
	if c.LostToRetention == nil || *c.LostToRetention != 0 {
		t.Errorf("consumer WORKER1 lost_to_retention = %v, want 0", c.LostToRetention)
	}
	if w := c.Workers; w == nil || w.Configured != 1 || !w.Running || w.InFlight != 0 || w.Processed != 4 || w.Acked != 3 || w.Retried != 0 || w.DeadLettered != 1 {
		t.Errorf("consumer WORKER1 workers = %+v, want 1 running, 4 processed, 3 acked, 1 dead-lettered", c.Workers)
	}

	res := runHoldfast(t, nil, "status", "--config", o.cfg)
	if res.code != 0 {
		t.Fatalf("holdfast status exited %d: %s", res.code, res.stderr)
	}
	for _, re := range []string{
		`(?m)^holdfast on holdfast-e2e at ` + regexp.QuoteMeta(o.url()) + `: OK$`,
		`(?m)^JetStream  enabled, store ` + regexp.QuoteMeta(store) + `, sync always$`,
		`(?m)^  file     \d+ B used of 1\.0 GiB \(0%\), 1\.0 MiB reserved$`,
		`(?m)^ORDERS\s+4\s+\d+ B\s+1\s+4\s+max_msgs 100 \(4%\), max_bytes 1\.0 MiB \(0%\), max_age 72h0m0s \(0%\), discard old\s+off$`,
		`(?m)^ORDERS_DLQ\s+1\s+\d+ B\s+1\s+1\s+unlimited, discard new\s+off$`,
		`(?m)^WORKER1\s+ORDERS\s+0\s+0/50\s+0\s+1\s+0\s+1 \(0 busy; 4 processed, 3 acked, 0 retried, 1 dead-lettered\)$`,
	} {
		if !regexp.MustCompile(re).MatchString(res.stdout) {
			t.Errorf("holdfast status does not match %s:\n%s", re, res.stdout)
		}
	}
	// A single node has no Raft groups: no "ORDERS: leader holdfast-e2e;
	// replicas " line with nothing after it under the tables.
	if strings.Contains(res.stdout, "; replicas") {
		t.Errorf("holdfast status of a single node lists leaders and replicas:\n%s", res.stdout)
	}

	// With the daemon gone, status fails.
	d.stop()
	if res := runHoldfast(t, nil, "status", "--config", o.cfg); res.code != 1 || !strings.Contains(res.stderr, "cannot connect") {
		t.Errorf("holdfast status without a daemon exited %d: %s", res.code, res.stderr)
	}
}

// `holdfast pub --id` twice stores one message.
func TestPubIDStoresOnce(t *testing.T) {
	t.Parallel()
	o := newOpsInstance(t, "", "", "", "")
	d := startHoldfast(t, o.cfg)
	d.waitReady()
	first := runHoldfast(t, nil, "pub", "--config", o.cfg, "--id", "order-42", "orders.created", `{"id":42}`)
	if first.code != 0 || !strings.Contains(first.stdout, "stored in ORDERS as seq 1") || strings.Contains(first.stdout, "duplicate") {
		t.Fatalf("first pub --id: exit %d\n%s%s", first.code, first.stdout, first.stderr)
	}
	second := runHoldfast(t, nil, "pub", "--config", o.cfg, "--id", "order-42", "orders.created", `{"id":42}`)
	if second.code != 0 || !strings.Contains(second.stdout, "duplicate") {
		t.Errorf("second pub --id: exit %d, want 0 and \"duplicate\"\n%s%s", second.code, second.stdout, second.stderr)
	}
	_, js := e2eConnect(t, o.e2eInstance)
	if st := natstest.StreamInfo(t, js, "ORDERS").State; st.Msgs != 1 || st.LastSeq != 1 {
		t.Errorf("ORDERS holds %d messages (last seq %d) after the same --id twice, want 1", st.Msgs, st.LastSeq)
	}
	d.stop()
}

// TestStatusWhenNothingRuns: with no holdfast at the configured address,
// `status --json` still prints a JSON object naming the error (exit 1),
// and the plain form's hint fits the machine: systemctl only under
// systemd.
func TestStatusWhenNothingRuns(t *testing.T) {
	t.Parallel()
	path := e2eWriteConfig(t, fmt.Sprintf("[server]\nport = %d\n\n[jetstream]\nstore_dir = %q\n\n[http]\nlisten = \"\"\n", natstest.FreePort(t), t.TempDir()))
	res := runHoldfast(t, nil, "status", "--config", path, "--json")
	var out struct {
		Healthy bool   `json:"healthy"`
		Error   string `json:"error"`
	}
	if err := json.Unmarshal([]byte(res.stdout), &out); err != nil || res.code != 1 {
		t.Fatalf("status --json exited %d, stdout not a JSON object (%v):\n%s\nstderr: %s", res.code, err, res.stdout, res.stderr)
	}
	if out.Healthy || !strings.Contains(out.Error, "cannot connect to holdfast at nats://127.0.0.1:") {
		t.Errorf("status --json = %+v, want healthy false and the connection error", out)
	}
	res = runHoldfast(t, nil, "status", "--config", path)
	hint := "start it with holdfast run"
	if _, err := os.Stat("/run/systemd/system"); err == nil {
		hint = "see systemctl status holdfast"
	}
	if res.code != 1 || !strings.Contains(res.stderr, hint) {
		t.Errorf("status exited %d, want 1 and the hint %q:\n%s", res.code, hint, res.stderr)
	}
}

// TestStatusNamesRefusedCredentials: credentials the server refuses are
// named as such (exit 1); it said "the server requires credentials: pass
// --user ..." also to whoever had passed them.
func TestStatusNamesRefusedCredentials(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t, func(o *server.Options) { o.Username, o.Password = "ops", "right" })
	url := s.ClientURL()
	none := runHoldfast(t, nil, "status", "--server", url)
	if none.code != 1 || !strings.Contains(none.stderr, "the server requires credentials") {
		t.Errorf("status without credentials: exit %d\n%s", none.code, none.stderr)
	}
	wrong := e2eRunBinary(t, holdfastBin, []string{"HOLDFAST_PASSWORD=wrong"}, nil, "status", "--server", url, "--user", "ops")
	if wrong.code != 1 || !strings.Contains(wrong.stderr, "the server refused the credentials given") {
		t.Errorf("status with a wrong password: exit %d\n%s", wrong.code, wrong.stderr)
	}
}

// TestStatusCommitWindow: with jetstream.commit_window, publishes are
// answered (after holdfast's flush, through group commit, which the window
// turns on for ORDERS) and holdfast status says the window is on, in text
// and in JSON.
func TestStatusCommitWindow(t *testing.T) {
	t.Parallel()
	in := newE2EInstance(t)
	in.cfg = e2eWriteConfig(t, strings.Replace(e2eConfigTOML(in.store, in.port, ""), "[jetstream]\n", "[jetstream]\ncommit_window = \"40ms\"\n", 1))
	p := startHoldfast(t, in.cfg)
	p.waitReady()
	_, js := e2eConnect(t, in)
	for i := range 3 {
		ack, err := js.Publish(natstest.Context(t), "orders.created", []byte("payload"))
		if err != nil {
			t.Fatal(err)
		}
		if ack.Stream != "ORDERS" || ack.Sequence != uint64(i+1) {
			t.Fatalf("PubAck %+v", ack)
		}
	}
	res := runHoldfast(t, nil, "status", "--config", in.cfg)
	if res.code != 0 || !strings.Contains(res.stdout, "sync always, commit window 40ms") {
		t.Fatalf("holdfast status exited %d:\n%s%s", res.code, res.stdout, res.stderr)
	}
	res = runHoldfast(t, nil, "status", "--json", "--config", in.cfg)
	var st daemon.ClientStatus
	if err := json.Unmarshal([]byte(res.stdout), &st); err != nil {
		t.Fatalf("status --json: %v\n%s", err, res.stdout)
	}
	if st.JetStream.CommitWindow != "40ms" || st.JetStream.Sync != "always" {
		t.Fatalf("status --json jetstream: sync %q, commit_window %q", st.JetStream.Sync, st.JetStream.CommitWindow)
	}
	if s := findStream(t, st, "ORDERS"); s.GroupCommit != "on" {
		t.Fatalf("ORDERS group commit %q with a commit window, want on", s.GroupCommit)
	}
}

// TestStatusPrintsUnknownApartFromMissing: a stream or consumer that did
// not answer is UNKNOWN with the reason, one that does not exist MISSING.
func TestStatusPrintsUnknownApartFromMissing(t *testing.T) {
	out := &daemon.ClientStatus{
		Streams: []daemon.StreamStatus{
			{StreamStatus: monitor.StreamStatus{Name: "ORDERS", Error: "no answer within 5s"}, Unknown: true},
			{StreamStatus: monitor.StreamStatus{Name: "GONE", Error: "stream does not exist"}},
		},
		Consumers: []daemon.ConsumerStatus{
			{Name: "WORKER1", Stream: "ORDERS", Error: "no answer within 5s", Unknown: true},
			{Name: "WORKER2", Stream: "GONE", Error: "consumer does not exist"},
		},
	}
	var b strings.Builder
	printStatus(&b, out)
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`ORDERS +UNKNOWN: no answer within 5s`),
		regexp.MustCompile(`GONE +MISSING: stream does not exist`),
		regexp.MustCompile(`WORKER1 +ORDERS +UNKNOWN: no answer within 5s`),
		regexp.MustCompile(`WORKER2 +GONE +MISSING: consumer does not exist`),
	} {
		if !want.MatchString(b.String()) {
			t.Errorf("status prints no line matching %q:\n%s", want, b.String())
		}
	}
}
