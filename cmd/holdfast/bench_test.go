package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/holdfast-io/holdfast/bench"
)

// TestBenchJSON runs `holdfast bench --json` end to end on a small count
// and checks that every field of its report is present and non-zero. It
// asserts no speed.
func TestBenchJSON(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs the whole pipeline: skipped with -short")
	}
	out := runBenchJSON(t, "--msgs", "2000", "--exec-msgs", "100", "--sync", "2m", "--workers", "2")
	var raw map[string]any
	if err := json.Unmarshal(out, &raw); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out)
	}
	checkNonZero(t, "", raw)

	// Every section and figure is there, with the schema the docs describe.
	var rep bench.Report
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Params.Msgs != 2000 || rep.Params.Size != 128 || rep.Params.Workers != 2 || rep.Params.ExecMsgs != 100 {
		t.Errorf("params = %+v", rep.Params)
	}
	if rep.Machine.CPUs < 1 || !strings.HasPrefix(rep.Machine.GoVersion, "go") || rep.Machine.StoreFS == "" {
		t.Errorf("machine = %+v", rep.Machine)
	}
	if len(rep.Runs) != 1 || rep.Runs[0].Sync != "2m" {
		t.Fatalf("runs = %+v, want one with sync 2m", rep.Runs)
	}
	want := []string{"publish async", "publish sync", "consume (noop)", "consume (bare nats.go)", "e2e noop", "e2e bare nats.go", "e2e exec", "e2e http"}
	figs := rep.Runs[0].Figures
	if len(figs) != len(want) {
		t.Fatalf("figures = %+v, want %q", figs, want)
	}
	for i, f := range figs {
		if f.Name != want[i] {
			t.Errorf("figure %d is %q, want %q", i, f.Name, want[i])
		}
		n := 2000
		if f.Name == "e2e exec" {
			n = 100
		}
		if f.Msgs != n || f.Bytes != int64(n)*128 {
			t.Errorf("%s: msgs %d bytes %d, want %d and %d", f.Name, f.Msgs, f.Bytes, n, n*128)
		}
		if !strings.HasPrefix(f.Name, "consume ") && !strings.Contains(f.Name, "bare") && f.Latency == nil {
			t.Errorf("%s: no latency", f.Name)
		}
		if l := f.Latency; l != nil && !(l.P50 <= l.P90 && l.P90 <= l.P99 && l.P99 <= l.Max) {
			t.Errorf("%s: percentiles out of order: %+v", f.Name, *l)
		}
	}
}

// TestBenchGroupCommit: a "+gc" sync mode measures through group commit —
// the report says how the messages were stored, and every published
// message went through the ingest. It asserts no speed.
func TestBenchGroupCommit(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs the whole pipeline: skipped with -short")
	}
	out := runBenchJSON(t, "--msgs", "2000", "--sync", "2m,2m+gc", "--handlers", "", "--workers", "2")
	var rep bench.Report
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out)
	}
	if len(rep.Runs) != 2 || rep.Runs[0].Sync != "2m" || rep.Runs[1].Sync != "2m+gc" {
		t.Fatalf("runs = %+v, want 2m and 2m+gc", rep.Runs)
	}
	if g := rep.Runs[0].GroupCommit; g != nil {
		t.Errorf("2m without +gc reports group commit %+v", *g)
	}
	g := rep.Runs[1].GroupCommit
	if g == nil {
		t.Fatal("2m+gc reports no group commit")
	}
	// publish async and publish sync: 2000 each, all through the ingest,
	// the async ones (500 outstanding) mostly in atomic batches.
	if got := g.BatchedMsgs + g.Alone + g.Forwarded; got != 4000 || g.Forwarded != 0 {
		t.Errorf("group commit stored %d messages (%+v), want 4000, none passed on", got, *g)
	}
	if g.Batches == 0 || g.BatchedMsgs < g.Batches {
		t.Errorf("no atomic batches: %+v", *g)
	}
	for _, run := range rep.Runs {
		for _, f := range run.Figures {
			if f.Msgs != 2000 || f.MsgsPerSec <= 0 {
				t.Errorf("%s %s: %+v", run.Sync, f.Name, f)
			}
		}
	}
}

// runBenchJSON runs `holdfast bench --json` with args on a temporary
// store and returns its standard output. Not runHoldfast: on a loaded
// machine the run may take longer than its 30s limit.
func runBenchJSON(t *testing.T, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	args = append([]string{"bench", "--dir", t.TempDir(), "--json"}, args...)
	cmd := exec.CommandContext(ctx, holdfastBin, args...)
	cmd.Env = e2eEnv()
	cmd.Dir = t.TempDir()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("holdfast %q: %v\nstdout:\n%s\nstderr:\n%s", args, err, stdout.String(), stderr.String())
	}
	return stdout.Bytes()
}

// checkNonZero fails for every null, zero, empty or false value under v.
func checkNonZero(t *testing.T, path string, v any) {
	t.Helper()
	switch v := v.(type) {
	case map[string]any:
		if len(v) == 0 {
			t.Errorf("%s: empty object", path)
		}
		for k, x := range v {
			checkNonZero(t, path+"."+k, x)
		}
	case []any:
		if len(v) == 0 {
			t.Errorf("%s: empty list", path)
		}
		for i, x := range v {
			checkNonZero(t, fmt.Sprintf("%s[%d]", path, i), x)
		}
	case float64:
		if v == 0 {
			t.Errorf("%s: zero", path)
		}
	case string:
		if v == "" {
			t.Errorf("%s: empty", path)
		}
	case bool:
		if !v {
			t.Errorf("%s: false", path)
		}
	default:
		t.Errorf("%s: %v", path, v)
	}
}

func TestBenchUsageErrors(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"bench", "--msgs", "0"},
		{"bench", "--size", "4B"},
		{"bench", "--sync", "sometimes"},
		{"bench", "--sync", "always+gcx"},
		{"bench", "--handlers", "noop,smtp"},
		{"bench", "extra"},
	} {
		res := runHoldfast(t, nil, args...)
		if res.code != 2 || !strings.Contains(res.stderr, "Error:") {
			t.Errorf("holdfast %q: exit %d, stderr %q; want 2 and an error", args, res.code, res.stderr)
		}
	}
}
