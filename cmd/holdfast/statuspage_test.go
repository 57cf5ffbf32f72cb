package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/holdfast-io/holdfast/daemon"
	"github.com/holdfast-io/holdfast/internal/natstest"
)

// xssReason is what the failing handler prints to stderr: the page must
// show it as text and never run it.
const xssReason = `<img src=x onerror=alert(1)>`

// The status page in headless Chromium against a running holdfast: it
// loads without a console error, shows what /status.json and `holdfast
// status --json` say, follows new messages by polling, stops polling while
// hidden, shows a handler's failure reason as text, and fits 360 px.
func TestStatusPage(t *testing.T) {
	t.Parallel()
	chromium := requireChromium(t)
	parser := e2eScript(t, "cat >/dev/null\necho 'cannot parse: "+xssReason+"' >&2\nexit 65\n")
	httpAddr := fmt.Sprintf("127.0.0.1:%d", natstest.FreePort(t))
	mqttAddr := fmt.Sprintf("127.0.0.1:%d", natstest.FreePort(t))
	in := newE2EInstance(t)
	in.cfg = e2eWriteConfig(t, strings.Replace(e2eConfigTOML(in.store, in.port, fmt.Sprintf(`
[consumers.PARSER]
stream = "ORDERS"
filter_subject = "orders.bad"
workers = 1
handler = "exec"

[consumers.PARSER.exec]
command = [%q]
timeout = "10s"

[mqtt]
listen = %q
`, parser, mqttAddr)), "[http]\nlisten = \"\"", fmt.Sprintf("[http]\nlisten = %q", httpAddr), 1))
	p := startHoldfast(t, in.cfg)
	p.waitReady()
	_, js := e2eConnect(t, in)
	publish := func(subject string, n int) {
		t.Helper()
		for i := range n {
			if _, err := js.Publish(natstest.Context(t), subject, []byte(strconv.Itoa(i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish("orders.created", 5)
	publish("orders.bad", 1)
	dev := pahoClient(t, "tcp://"+mqttAddr, "scanner", nil)
	if tok := dev.Publish("orders/scanned", 1, false, "6"); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("mqtt publish: %v", tok.Error())
	}
	// A QoS 1 publish no stream takes is refused: the device is
	// disconnected, and the page counts it.
	lost := pahoClient(t, "tcp://"+mqttAddr, "misplaced", nil)
	if tok := lost.Publish("elsewhere/scanned", 1, false, "7"); tok.WaitTimeout(5*time.Second) && tok.Error() == nil {
		t.Fatal("a QoS 1 publish no stream takes got its PUBACK")
	}
	base := "http://" + httpAddr
	var st *daemon.ClientStatus
	natstest.CheckFor(t, 15*time.Second, 50*time.Millisecond, func() error {
		st = statusJSON(t, base)
		if c := statusConsumer(st, "PARSER"); c == nil || c.DeadLetters == nil || *c.DeadLetters != 1 {
			return fmt.Errorf("PARSER has not dead-lettered its message yet: %+v", c)
		}
		return nil
	})
	if st.Version != daemon.StatusVersion {
		t.Fatalf("status.json version = %d, want %d", st.Version, daemon.StatusVersion)
	}
	checkDocumentedExample(t, base)
	// One source: the page's JSON and `holdfast status --json` agree.
	res := runHoldfast(t, nil, "status", "--config", in.cfg, "--json")
	var cli daemon.ClientStatus
	if err := json.Unmarshal([]byte(res.stdout), &cli); err != nil {
		t.Fatalf("status --json: %v\n%s%s", err, res.stdout, res.stderr)
	}
	if got, want := streamMessages(&cli, "ORDERS"), streamMessages(st, "ORDERS"); got != want || want != 7 {
		t.Fatalf("ORDERS messages: status --json %d, status.json %d, want 7 in both", got, want)
	}
	if cli.Version != st.Version || cli.Health.Status != st.Health.Status {
		t.Fatalf("status --json says version %d, health %q; status.json %d, %q", cli.Version, cli.Health.Status, st.Version, st.Health.Status)
	}

	b := openBrowser(t, chromium)
	b.do(chromedp.Navigate(base + "/"))
	ordersMessages := `[data-stream="ORDERS"] [data-field="messages"]`
	b.waitText(ordersMessages, "7")
	b.waitText(`[data-consumer="ORDERS/WORKER1"] [data-field="pending"]`, "7")
	b.waitText(`#mqtt [data-field="acked"]`, "1")
	b.waitText(`#mqtt [data-field="refused"]`, "1")
	b.waitText(`#mqtt [data-field="streams"]`, "ORDERS")
	if disk := b.text(`#store [data-field="disk"]`); !strings.Contains(disk, " free of ") {
		t.Fatalf("the store's disk shows %q", disk)
	}

	// The handler's reason is shown as text, and not as an element.
	failure := b.text(`[data-consumer="ORDERS/PARSER"] [data-field="last_failure"]`)
	images := run(b, chromedp.Evaluate[int](`document.querySelectorAll("img").length`))
	if !strings.Contains(failure, xssReason) || images != 0 {
		t.Fatalf("PARSER's last failure shows %q with %d <img> on the page; want the text %q and none", failure, images, xssReason)
	}
	b.waitText(`[data-consumer="ORDERS/PARSER"] [data-field="dead_letters"]`, "1 in ORDERS_DLQ")

	// Polling: new messages show within a few seconds, in the figures and
	// in the chart (once it has its first sample, 10 s after start).
	chartSel := `[data-consumer="ORDERS/WORKER1"] [data-field="chart"]`
	natstest.CheckFor(t, 20*time.Second, 200*time.Millisecond, func() error {
		if got := b.text(chartSel); !strings.Contains(got, "backlog 7 ") {
			return fmt.Errorf("chart legend %q", got)
		}
		return nil
	})
	publish("orders.created", 100)
	b.waitText(ordersMessages, "107")
	natstest.CheckFor(t, 10*time.Second, 200*time.Millisecond, func() error {
		if got := b.text(chartSel); !strings.Contains(got, "backlog 107 ") {
			return fmt.Errorf("chart legend %q after 100 more messages", got)
		}
		return nil
	})

	// Hidden, the page stops polling; visible again, it polls at once.
	b.setVisibility("hidden")
	time.Sleep(100 * time.Millisecond) // a request on its way is seen
	hiddenAt := b.statusRequests()
	time.Sleep(3500 * time.Millisecond) // longer than the 3 s interval
	if n := b.statusRequests(); n != hiddenAt {
		t.Fatalf("the hidden page fetched status.json %d times", n-hiddenAt)
	}
	shown := b.statusRequests()
	b.setVisibility("visible")
	natstest.CheckFor(t, 2*time.Second, 20*time.Millisecond, func() error {
		if b.statusRequests() == shown {
			return fmt.Errorf("no status.json request since the page became visible")
		}
		return nil
	})

	for _, width := range []int64{360, 1280} {
		b.do(chromedp.EmulateViewport(width, 800))
		scrollWidth := run(b, chromedp.Evaluate[int64](`document.documentElement.scrollWidth`))
		if scrollWidth > width {
			t.Errorf("at %d px the page is %d px wide", width, scrollWidth)
		}
		b.screenshot(fmt.Sprintf("status-%d.png", width))
	}
	b.checkClean()

	// Once holdfast stops answering, the verdict says so instead of
	// keeping the last one. A stopped holdfast's page went on showing a
	// green "OK" at the top (and in the tab's title), with only the small
	// "updated" line saying "cannot reach holdfast" (found 2026-12-05).
	p.stop()
	b.waitText("#verdict", "unreachable")
	if reasons := b.text("#reasons"); !strings.Contains(reasons, "holdfast does not answer") {
		t.Fatalf("the page's reasons say %q once holdfast stopped", reasons)
	}
	if title := run(b, chromedp.Evaluate[string](`document.title`)); strings.Contains(title, "ok") {
		t.Fatalf("the page's title is %q once holdfast stopped", title)
	}
}

// requireChromium returns the path of chromium; without it the test
// skips, or fails when HOLDFAST_REQUIRE_BROWSER is set (CI).
func requireChromium(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("HOLDFAST_REQUIRE_BROWSER") != "" {
			t.Fatalf("chromium is not installed and HOLDFAST_REQUIRE_BROWSER is set: %v", err)
		}
		t.Skip("chromium is not installed (apt-get install chromium); set HOLDFAST_REQUIRE_BROWSER=1 to fail instead of skipping")
	}
	return path
}

// browser is a headless Chromium tab that records console errors,
// exceptions, dialogs and status.json requests.
type browser struct {
	t   *testing.T
	ctx context.Context

	mu       sync.Mutex
	problems []string
	dialogs  []string
	requests int
}

func openBrowser(t *testing.T, chromium string) *browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium), chromedp.NoSandbox,
		chromedp.WindowSize(1280, 800), chromedp.UserDataDir(t.TempDir()))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	b := &browser{t: t, ctx: ctx}
	err := chromedp.Listen(ctx, func(ev any) {
		b.mu.Lock()
		defer b.mu.Unlock()
		switch ev := ev.(type) {
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.ConsoleAPICalledTypeError || ev.Type == runtime.ConsoleAPICalledTypeAssert {
				b.problems = append(b.problems, fmt.Sprintf("console.%s: %s", ev.Type, consoleArgs(ev.Args)))
			}
		case *runtime.EventExceptionThrown:
			d := ev.ExceptionDetails
			text := d.Text
			if d.Exception != nil {
				text += " " + d.Exception.Description
			}
			b.problems = append(b.problems, fmt.Sprintf("exception at %s:%d: %s", d.URL, d.LineNumber+1, text))
		case *cdplog.EventEntryAdded:
			if ev.Entry.Level == cdplog.EntryLevelError {
				b.problems = append(b.problems, fmt.Sprintf("log (%s): %s %s", ev.Entry.Source, ev.Entry.Text, ev.Entry.URL))
			}
		case *page.EventJavascriptDialogOpening:
			b.dialogs = append(b.dialogs, string(ev.Type)+": "+ev.Message)
			// Dismissed, or the page stays blocked on it.
			go func() {
				_, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: false})
			}()
		case *network.EventRequestWillBeSent:
			if strings.HasSuffix(ev.Request.URL, "/status.json") {
				b.requests++
			}
		}
	})
	if err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return b
}

func consoleArgs(args []*runtime.RemoteObject) string {
	var parts []string
	for _, a := range args {
		if a.Value != nil {
			parts = append(parts, string(a.Value))
		} else {
			parts = append(parts, a.Description)
		}
	}
	return strings.Join(parts, " ")
}

// run runs action in b's tab with a deadline and returns its value,
// failing the test on an error.
func run[T any](b *browser, action chromedp.Action[T]) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 15*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, action)
	if err != nil {
		b.t.Fatalf("chromium: %v; seen so far: %q %q", err, b.problemList(), b.dialogList())
	}
	return v
}

// do runs actions that return nothing, in order.
func (b *browser) do(actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	run(b, chromedp.Steps(actions...))
}

// setVisibility makes the page see itself hidden or visible, as when its
// tab goes to the background and comes back.
func (b *browser) setVisibility(state string) {
	b.t.Helper()
	run(b, chromedp.Evaluate[bool](`Object.defineProperty(document, "visibilityState", {value: "`+state+`", configurable: true});
		document.dispatchEvent(new Event("visibilitychange"))`))
}

// waitText waits up to 10 s for the element sel to hold text want (digit
// grouping left out).
// text is the text of the element sel finds, "" while there is none or
// it is not shown.
func (b *browser) text(sel string) string {
	b.t.Helper()
	js := fmt.Sprintf(`(() => { const e = document.querySelector(%q); return e && e.offsetParent !== null ? e.textContent : ""; })()`, sel)
	return run(b, chromedp.Evaluate[string](js))
}

func (b *browser) waitText(sel, want string) {
	b.t.Helper()
	var got string
	deadline := time.Now().Add(10 * time.Second)
	// Read in one evaluation: the page replaces its nodes at each poll, and
	// a node found by one CDP call could be gone by the next ("No node
	// with given id found").
	for {
		got = b.text(sel)
		if strings.ReplaceAll(got, ",", "") == want {
			return
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("%s shows %q, want %q", sel, got, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (b *browser) statusRequests() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.requests
}

func (b *browser) problemList() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.problems...)
}

func (b *browser) dialogList() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.dialogs...)
}

// checkClean fails the test if the page logged an error, threw or opened
// a dialog.
func (b *browser) checkClean() {
	b.t.Helper()
	if p := b.problemList(); len(p) > 0 {
		b.t.Errorf("the page logged errors: %q", p)
	}
	if d := b.dialogList(); len(d) > 0 {
		b.t.Errorf("the page opened dialogs: %q", d)
	}
}

// statusJSON reads the daemon's /status.json.
func statusJSON(t *testing.T, base string) *daemon.ClientStatus {
	t.Helper()
	resp, err := http.Get(base + "/status.json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /status.json: %s", resp.Status)
	}
	var st daemon.ClientStatus
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatalf("GET /status.json: %v", err)
	}
	return &st
}

// checkDocumentedExample reads /status.json as docs/status-page.md's
// example does: "version" is 1 and each consumer has the keys the jq
// filter picks.
func checkDocumentedExample(t *testing.T, base string) {
	t.Helper()
	doc, err := os.ReadFile("../../docs/status-page.md")
	if err != nil {
		t.Fatal(err)
	}
	const example = `jq '.consumers[] | {name, pending, dead_letters}'`
	if !strings.Contains(string(doc), example) || !strings.Contains(string(doc), "`\"version\": 1`") {
		t.Fatalf("docs/status-page.md no longer has the example %s or says \"version\": 1; update this test", example)
	}
	resp, err := http.Get(base + "/status.json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var raw struct {
		Version   json.RawMessage              `json:"version"`
		Consumers []map[string]json.RawMessage `json:"consumers"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&raw); err != nil {
		t.Fatal(err)
	}
	if string(raw.Version) != "1" || len(raw.Consumers) == 0 {
		t.Fatalf("status.json: version %s, %d consumers", raw.Version, len(raw.Consumers))
	}
	for _, c := range raw.Consumers {
		for _, key := range []string{"name", "pending", "dead_letters"} {
			if _, ok := c[key]; !ok {
				t.Fatalf("status.json: a consumer has no %q: %v", key, c)
			}
		}
	}
}

func statusConsumer(st *daemon.ClientStatus, name string) *daemon.ConsumerStatus {
	for i := range st.Consumers {
		if st.Consumers[i].Name == name {
			return &st.Consumers[i]
		}
	}
	return nil
}

func streamMessages(st *daemon.ClientStatus, name string) uint64 {
	for _, s := range st.Streams {
		if s.Name == name {
			return s.Messages
		}
	}
	return 0
}

// screenshot writes the whole page as PNG to name in the directory
// HOLDFAST_SCREENSHOTS names (make screenshots), if it is set.
func (b *browser) screenshot(name string) {
	b.t.Helper()
	dir := os.Getenv("HOLDFAST_SCREENSHOTS")
	if dir == "" {
		return
	}
	png := run(b, chromedp.FullScreenshot(100))
	if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
		b.t.Fatal(err)
	}
}
