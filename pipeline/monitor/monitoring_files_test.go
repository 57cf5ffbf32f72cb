package monitor_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/holdfast-io/holdfast/embedded/mqtt"
	"github.com/holdfast-io/holdfast/internal/natstest"
	"github.com/holdfast-io/holdfast/pipeline"
	"github.com/holdfast-io/holdfast/pipeline/forward"
	"github.com/holdfast-io/holdfast/pipeline/handler"
	"github.com/holdfast-io/holdfast/pipeline/monitor"
)

// The shipped Grafana dashboard and Prometheus alert rules
// (packaging installs them under /usr/share/holdfast/).
const (
	dashboardFile = "../../monitoring/grafana/holdfast.json"
	rulesFile     = "../../monitoring/prometheus/holdfast-rules.yml"
)

// metricNameRe finds the metric names in a PromQL expression: holdfast's
// own, the process collector's, and Prometheus' up.
var metricNameRe = regexp.MustCompile(`\b(holdfast_[a-z_]+|process_[a-z_]+|go_[a-z_]+|up)\b`)

// conditionalMetric: exported only by a cluster node, an edge or a hub.
func conditionalMetric(name string) bool {
	for _, p := range []string{"holdfast_cluster_", "holdfast_stream_leader", "holdfast_replica_lag", "holdfast_leafnode_", "holdfast_forward_", "holdfast_edge_", "holdfast_mqtt_"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// dashboardExprs returns every query of the dashboard: panel targets
// (rows nest panels) and template variable queries.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
		Panels []json.RawMessage `json:"panels"`
	}
	var dash struct {
		Title      string            `json:"title"`
		Panels     []json.RawMessage `json:"panels"`
		Templating struct {
			List []struct {
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var exprs []string
	var walk func([]json.RawMessage)
	walk = func(raw []json.RawMessage) {
		for _, r := range raw {
			var p panel
			if err := json.Unmarshal(r, &p); err != nil {
				t.Fatalf("%s: panel: %v", dashboardFile, err)
			}
			for _, tg := range p.Targets {
				if strings.TrimSpace(tg.Expr) == "" {
					t.Errorf("%s: panel %q has a target without a query", dashboardFile, p.Title)
				}
				exprs = append(exprs, tg.Expr)
			}
			walk(p.Panels)
		}
	}
	walk(dash.Panels)
	for _, v := range dash.Templating.List {
		exprs = append(exprs, v.Definition)
	}
	return exprs
}

// ruleExprs returns the expr of every rule (the file is checked as YAML
// by promtool; here its expr lines are enough).
func ruleExprs(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var exprs []string
	for _, m := range regexp.MustCompile(`(?m)^\s+expr: (.+)$`).FindAllStringSubmatch(string(data), -1) {
		exprs = append(exprs, m[1])
	}
	return exprs
}

// TestMonitoringFiles: every metric the dashboard and the alert rules
// query is one holdfast exports — present in a live scrape of a running
// pipeline, or (cluster, edge and hub metrics) one holdfast describes —
// and promtool accepts the rules.
func TestMonitoringFiles(t *testing.T) {
	e := newMonitorEnv(t, nil)
	metrics := monitor.NewMetrics("test", "2.15.2")
	w := e.startWorkersWith(pipeline.ConsumerOptions{
		Stream: "ORDERS", Consumer: "WORKER1", Workers: 1, AckWait: 30 * time.Second, MaxDeliver: 3,
		Backoff: []time.Duration{20 * time.Millisecond}, DeadLetter: "ORDERS_DLQ",
		Handler:  handler.Func(func(context.Context, *handler.Message) handler.Result { return handler.Ok() }),
		OnResult: metrics.ObserveResult("ORDERS"),
	})
	// As the daemon sets it up (daemon/daemon.go).
	m := e.monitor(monitor.Options{
		FileStoreLimit:   e.cfg.JetStream.MaxFileStore.Bytes,
		MemoryStoreLimit: e.cfg.JetStream.MaxMemoryStore.Bytes,
		StoreWriteErrors: e.srv.StoreWriteErrors,
	}, map[string]*pipeline.Workers{"WORKER1": w})
	metrics.SetMonitor(m)
	ts := httptest.NewServer(metrics.Handler())
	defer ts.Close()
	e.publish("orders.created", 3)
	var live map[string]bool
	natstest.CheckFor(t, 15*time.Second, 10*time.Millisecond, func() error {
		m.CheckNow(context.Background())
		live = map[string]bool{}
		for name := range scrape(t, ts.URL) {
			live[name] = true
		}
		if !live["holdfast_handler_duration_seconds"] {
			return errors.New("no handler duration observed yet")
		}
		return nil
	})
	// The MQTT gate's metrics exist with [mqtt] only (embedded/mqtt's
	// tests scrape them).
	described := append(monitor.MetricNames(&forward.EdgeView{}), mqtt.MetricNames()...)

	dash, rules := dashboardExprs(t), ruleExprs(t)
	if len(dash) < 15 || len(rules) < 10 {
		t.Fatalf("%d dashboard queries, %d rules: the files are not what they should be", len(dash), len(rules))
	}
	for file, exprs := range map[string][]string{dashboardFile: dash, rulesFile: rules} {
		for _, expr := range exprs {
			for _, name := range metricNameRe.FindAllString(expr, -1) {
				base := name
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if b, ok := strings.CutSuffix(name, suffix); ok && live[b] {
						base = b
					}
				}
				switch {
				case base == "up" || live[base]:
				case conditionalMetric(base) && slices.Contains(described, base):
				case slices.Contains(described, base):
					t.Errorf("%s: %s is described but was not in a live scrape of a single node (query %q)", file, base, expr)
				default:
					t.Errorf("%s: holdfast exports no metric %s (query %q)", file, base, expr)
				}
			}
		}
	}

	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed (Debian: apt-get install prometheus; .ci/run does): the rules file is not checked by it")
	}
	if out, err := exec.Command(promtool, "check", "rules", rulesFile).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules %s: %v\n%s", rulesFile, err, out)
	}
}
