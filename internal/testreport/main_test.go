package main

import (
	"strings"
	"testing"
)

// TestReport: packages' results, a failed test's whole output (and its
// own messages again below it when much came after them), output
// tests print themselves, and the skip summary with each reason.
func TestReport(t *testing.T) {
	in := strings.Join([]string{
		`{"Action":"start","Package":"p/a"}`,
		`{"Action":"run","Package":"p/a","Test":"TestOK"}`,
		`{"Action":"output","Package":"p/a","Test":"TestOK","Output":"=== RUN   TestOK\n"}`,
		`{"Action":"output","Package":"p/a","Test":"TestOK","Output":"chaos: 6 cycles, 0 lost\n"}`,
		`{"Action":"pass","Package":"p/a","Test":"TestOK","Elapsed":0.5}`,
		`{"Action":"output","Package":"p/a","Test":"TestSkip","Output":"=== RUN   TestSkip\n"}`,
		`{"Action":"output","Package":"p/a","Test":"TestSkip","Output":"    x_test.go:9: needs root\n"}`,
		`{"Action":"output","Package":"p/a","Test":"TestSkip","Output":"--- SKIP: TestSkip (0.00s)\n"}`,
		`{"Action":"skip","Package":"p/a","Test":"TestSkip"}`,
		`{"Action":"output","Package":"p/a","Output":"PASS\n"}`,
		`{"Action":"pass","Package":"p/a","Elapsed":1.5}`,
		`{"Action":"output","Package":"p/b","Test":"TestBad","Output":"=== RUN   TestBad\n"}`,
		`{"Action":"output","Package":"p/b","Test":"TestBad","Output":"    b_test.go:3: want 3, got 2\n"}`,
		`{"Action":"output","Package":"p/b","Test":"TestBad","Output":"--- FAIL: TestBad (0.10s)\n"}`,
		`{"Action":"pass","Package":"p/b","Test":"TestBad/sub","Elapsed":9}`,
		`{"Action":"fail","Package":"p/b","Test":"TestBad","Elapsed":9.5}`,
		`{"Action":"output","Package":"p/b","Test":"TestNoisy","Output":"=== RUN   TestNoisy\n"}`,
		`{"Action":"output","Package":"p/b","Test":"TestNoisy","Output":"    n_test.go:7: first\n"}`,
		`{"Action":"output","Package":"p/b","Test":"TestNoisy","Output":"    n_test.go:8: not kept: ack pending 0\n"}`,
		strings.Repeat(`{"Action":"output","Package":"p/b","Test":"TestNoisy","Output":"    helper.go:95: server shutting down\n"}`+"\n", 7) +
			`{"Action":"output","Package":"p/b","Test":"TestNoisy","Output":"    helper.go:95: server stopped\n"}`,
		`{"Action":"output","Package":"p/b","Test":"TestNoisy","Output":"--- FAIL: TestNoisy (8.00s)\n"}`,
		`{"Action":"fail","Package":"p/b","Test":"TestNoisy","Elapsed":8}`,
		`{"Action":"fail","Package":"p/b","Elapsed":0.2}`,
	}, "\n")
	var out strings.Builder
	if code := report(strings.NewReader(in), &out); code != 1 {
		t.Errorf("exit %d with a failed test, want 1", code)
	}
	for _, want := range []string{
		"chaos: 6 cycles, 0 lost\nok  \tp/a\t1.500s\n",
		"    b_test.go:3: want 3, got 2\n--- FAIL: TestBad (0.10s)\n",
		// Its message far above "--- FAIL" is repeated below it; TestBad's
		// is right above it.
		"--- FAIL: TestNoisy (8.00s)\n    (its last messages from _test.go files, again:)\n    n_test.go:7: first\n    n_test.go:8: not kept: ack pending 0\n",
		"1 test(s) skipped:\n  SKIP p/a TestSkip: x_test.go:9: needs root\n",
		"slowest tests:\n      9.5s p/b TestBad\n      8.0s p/b TestNoisy\n      0.5s p/a TestOK\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	if n := strings.Count(out.String(), "again:"); n != 1 {
		t.Errorf("%d recaps, want 1 (TestNoisy's):\n%s", n, out.String())
	}
	if strings.Contains(out.String(), "=== RUN") {
		t.Errorf("report shows -v noise:\n%s", out.String())
	}

	out.Reset()
	if code := report(strings.NewReader(`{"Action":"pass","Package":"p/a","Elapsed":1}`), &out); code != 0 {
		t.Errorf("exit %d for a passing package, want 0", code)
	}
	if code := report(strings.NewReader("# p/c\nc.go:1: syntax error\n"), &out); code != 1 {
		t.Errorf("exit %d with no package result (a build error), want 1", code)
	}
}
