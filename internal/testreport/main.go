// Command testreport reads `go test -json` on stdin and prints what
// `go test` prints without -v — a line per package, and the whole output
// of each failed test — followed by every skipped test with its reason,
// so that `make test` shows which tests skipped and why, and by the
// slowest tests, so that the suite's time budget is seen where it goes.
// It exits 1 when
// a test or a build failed, or when the input held no package result.
package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
)

// slowestShown is how many of the slowest tests the report lists.
const slowestShown = 10

// timing is how long a top-level test took.
type timing struct {
	name    string
	elapsed float64
}

type event struct {
	Action  string
	Package string
	Test    string
	Output  string
	Elapsed float64
}

type key struct{ pkg, test string }

func main() {
	os.Exit(report(os.Stdin, os.Stdout))
}

func report(in io.Reader, out io.Writer) int {
	outputs := map[key][]string{}
	var skips []string
	var timings []timing
	failed, packages := false, 0
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if err := json.Unmarshal(line, &e); err != nil || e.Action == "" {
			// Build errors and other non-JSON lines go through as they are.
			fmt.Fprintln(out, string(line))
			continue
		}
		k := key{e.Package, e.Test}
		if (e.Action == "pass" || e.Action == "fail") && e.Test != "" && !strings.Contains(e.Test, "/") {
			timings = append(timings, timing{e.Package + " " + e.Test, e.Elapsed})
		}
		switch e.Action {
		case "output", "build-output":
			outputs[k] = append(outputs[k], e.Output)
		case "build-fail":
			failed = true
		case "fail":
			failed = true
			if e.Test == "" {
				packages++ // its output outside any test: a panic, a TestMain failure
			}
			printLines(out, outputs[k], func(s string) bool { return !strings.HasPrefix(s, "=== ") })
			if e.Test != "" {
				printRecap(out, outputs[k])
			}
		case "pass":
			if e.Test != "" {
				// What a passing test printed itself (not its t.Log lines,
				// which -json includes and `go test` hides): summaries.
				printLines(out, outputs[k], func(s string) bool {
					return !strings.HasPrefix(s, "=== ") && !strings.HasPrefix(s, "--- PASS") && !strings.HasPrefix(s, "    ")
				})
			}
			if e.Test == "" {
				packages++
				// What tests print to stdout themselves (summaries), then ok.
				printLines(out, outputs[k], func(s string) bool {
					return !strings.HasPrefix(s, "=== ") && s != "PASS\n" && !strings.HasPrefix(s, "ok  \t")
				})
				fmt.Fprintf(out, "ok  \t%s\t%.3fs\n", e.Package, e.Elapsed)
			}
		case "skip":
			if e.Test == "" {
				packages++
				fmt.Fprintf(out, "?   \t%s\t[no test files]\n", e.Package)
				continue
			}
			reason := ""
			for _, o := range outputs[k] {
				if s := strings.TrimSpace(o); s != "" && !strings.HasPrefix(s, "=== ") && !strings.HasPrefix(s, "--- SKIP") {
					reason = s
				}
			}
			skips = append(skips, fmt.Sprintf("%s %s: %s", e.Package, e.Test, reason))
		}
		if e.Action == "pass" || e.Action == "skip" || e.Action == "fail" {
			delete(outputs, k)
		}
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintln(out, "testreport:", err)
		return 1
	}
	fmt.Fprintf(out, "\n%d test(s) skipped", len(skips))
	if len(skips) > 0 {
		fmt.Fprint(out, ":")
	}
	fmt.Fprintln(out)
	for _, s := range skips {
		fmt.Fprintln(out, "  SKIP", s)
	}
	slices.SortStableFunc(timings, func(a, b timing) int { return cmp.Compare(b.elapsed, a.elapsed) })
	if len(timings) > 0 {
		fmt.Fprintf(out, "\nslowest tests:\n")
	}
	for _, t := range timings[:min(slowestShown, len(timings))] {
		fmt.Fprintf(out, "  %7.1fs %s\n", t.elapsed, t.name)
	}
	if failed || packages == 0 {
		return 1
	}
	return 0
}

// Recapping a failed test's own messages: its last recapShown lines from
// _test.go files (t.Fatal, t.Error, t.Log there), when more than
// recapAfter lines (a server's shutdown log, say) came after them. A CI
// excerpt shows a few lines around "--- FAIL"; without this the reason
// could be cut off.
const (
	recapShown = 3
	recapAfter = 8
)

var testFileLine = regexp.MustCompile(`^\s+[^\s:]+_test\.go:\d+: `)

func printRecap(out io.Writer, lines []string) {
	var own []int
	for i, l := range lines {
		if testFileLine.MatchString(l) {
			own = append(own, i)
		}
	}
	if len(own) == 0 || len(lines)-1-own[len(own)-1] <= recapAfter {
		return
	}
	fmt.Fprintln(out, "    (its last messages from _test.go files, again:)")
	for _, i := range own[max(0, len(own)-recapShown):] {
		l := strings.TrimRight(lines[i], "\n")
		if len(l) > 500 {
			l = l[:500] + "…"
		}
		fmt.Fprintln(out, l)
	}
}

func printLines(out io.Writer, lines []string, keep func(string) bool) {
	for _, l := range lines {
		if keep(l) {
			fmt.Fprint(out, l)
		}
	}
}
