package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/internal/natstest"
)

// TestStatusPageAdmin: on a listener beyond loopback with [auth], reading
// needs a user's password (but /healthz does not); dead letters are
// listed with their reason and an escaped payload, one opens whole; an
// admin replays one from the page in Chromium, and a replay is refused
// without login, for a user who is not an admin, without the CSRF token,
// and from another origin.
func TestStatusPageAdmin(t *testing.T) {
	t.Parallel()
	chromium := requireChromium(t)
	etc := t.TempDir()
	hashPassword(t, filepath.Join(etc, "ops.hash"), "ops-password-1")
	hashPassword(t, filepath.Join(etc, "viewer.hash"), "viewer-password-2")
	fixed := filepath.Join(t.TempDir(), "fixed")
	parser := e2eScript(t, fmt.Sprintf("cat >/dev/null\n[ -e %q ] && exit 0\necho 'cannot parse: %s' >&2\nexit 65\n", fixed, xssReason))
	port := natstest.FreePort(t)
	httpPort := natstest.FreePort(t)
	cfg := e2eWriteConfig(t, fmt.Sprintf(`[server]
name = "page-admin"
host = "127.0.0.1"
port = %d

[jetstream]
store_dir = %q
max_file_store = "1GB"

[http]
listen = "0.0.0.0:%d"

[auth.users.ops]
password_file = %q
admin = true

[auth.users.viewer]
password_file = %q

[streams.ORDERS]
subjects = ["orders.*"]

[consumers.PARSER]
stream = "ORDERS"
workers = 1
handler = "exec"
max_deliver = 1

[consumers.PARSER.exec]
command = [%q]
timeout = "10s"
`, port, filepath.Join(t.TempDir(), "store"), httpPort, filepath.Join(etc, "ops.hash"), filepath.Join(etc, "viewer.hash"), parser))
	p := startHoldfast(t, cfg)
	p.waitReady()
	nc, err := nats.Connect(fmt.Sprintf("nats://127.0.0.1:%d", port), nats.UserInfo("ops", "ops-password-1"), nats.MaxReconnects(0))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if _, err := js.Publish(natstest.Context(t), "orders.bad", []byte(xssReason)); err != nil {
		t.Fatal(err)
	}
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	type answer struct {
		code int
		body string
	}
	call := func(method, path, user, password string, header map[string]string, body string) answer {
		t.Helper()
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if user != "" {
			req.SetBasicAuth(user, password)
		}
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return answer{resp.StatusCode, string(b)}
	}

	// Reading: credentials needed, but not for the probes.
	if a := call("GET", "/status.json", "", "", nil, ""); a.code != http.StatusUnauthorized {
		t.Fatalf("status.json without credentials: %d %s", a.code, a.body)
	}
	for _, path := range []string{"/metrics", "/nats/connz", "/deadletters.json", "/"} {
		if a := call("GET", path, "viewer", "wrong", nil, ""); a.code != http.StatusUnauthorized {
			t.Fatalf("%s with a wrong password: %d", path, a.code)
		}
	}
	if a := call("GET", "/healthz", "", "", nil, ""); a.code == http.StatusUnauthorized {
		t.Fatal("/healthz asks for credentials: load balancers and systemd probe it")
	}
	var list struct {
		DeadLetters []struct {
			Stream, Reason, Preview string
			Seq                     uint64
		} `json:"dead_letters"`
	}
	natstest.CheckFor(t, 20*time.Second, 100*time.Millisecond, func() error {
		a := call("GET", "/deadletters.json", "viewer", "viewer-password-2", nil, "")
		if a.code != http.StatusOK {
			return fmt.Errorf("deadletters.json: %d %s", a.code, a.body)
		}
		if err := json.Unmarshal([]byte(a.body), &list); err != nil {
			return err
		}
		if len(list.DeadLetters) != 1 {
			return fmt.Errorf("%d dead letters listed", len(list.DeadLetters))
		}
		return nil
	})
	dl := list.DeadLetters[0]
	if dl.Preview != xssReason || !strings.Contains(dl.Reason, xssReason) {
		t.Fatalf("listed %+v", dl)
	}

	// Acting: refused unless an admin with the CSRF token, same origin.
	replay := fmt.Sprintf(`{"stream":%q,"seq":%d}`, dl.Stream, dl.Seq)
	asJSON := map[string]string{"Content-Type": "application/json"}
	if a := call("POST", "/api/deadletters/replay", "", "", asJSON, replay); a.code != http.StatusUnauthorized {
		t.Fatalf("replay without login: %d %s", a.code, a.body)
	}
	if a := call("POST", "/api/deadletters/replay", "viewer", "viewer-password-2", asJSON, replay); a.code != http.StatusForbidden {
		t.Fatalf("replay as a user who is not an admin: %d %s", a.code, a.body)
	}
	if a := call("POST", "/api/deadletters/replay", "ops", "ops-password-1", asJSON, replay); a.code != http.StatusForbidden || !strings.Contains(a.body, "CSRF") {
		t.Fatalf("replay without the CSRF token: %d %s", a.code, a.body)
	}
	var who struct{ CSRF string }
	_ = json.Unmarshal([]byte(call("GET", "/api/whoami", "ops", "ops-password-1", nil, "").body), &who)
	if who.CSRF == "" {
		t.Fatal("whoami gave the admin no CSRF token")
	}
	foreign := map[string]string{"Content-Type": "application/json", "X-Holdfast-CSRF": who.CSRF, "Origin": "http://evil.example"}
	if a := call("POST", "/api/deadletters/replay", "ops", "ops-password-1", foreign, replay); a.code != http.StatusForbidden {
		t.Fatalf("replay from another origin: %d %s", a.code, a.body)
	}
	// Requests that do not say which dead letters: refused, saying what
	// is missing; a replay that fails counts none.
	own := map[string]string{"Content-Type": "application/json", "X-Holdfast-CSRF": who.CSRF}
	for _, tc := range []struct{ path, body, want string }{
		{"/api/deadletters/replay", `{}`, `which dead letter: give \"stream\"`},
		{"/api/deadletters/replay", fmt.Sprintf(`{"stream":%q,"seq":%d,"all":true}`, dl.Stream, dl.Seq), "not both"},
		{"/api/deadletters/replay", replay + `{"x":1}`, "something follows it"},
		{"/api/deadletters/purge", fmt.Sprintf(`{"stream":%q,"seq":%d}`, dl.Stream, dl.Seq), `purge takes \"consumer\" and \"upto\"`},
	} {
		if a := call("POST", tc.path, "ops", "ops-password-1", own, tc.body); a.code != http.StatusBadRequest || !strings.Contains(a.body, tc.want) {
			t.Errorf("%s %s: %d %s, want 400 with %s", tc.path, tc.body, a.code, a.body, tc.want)
		}
	}
	if a := call("POST", "/api/deadletters/replay", "ops", "ops-password-1", own, fmt.Sprintf(`{"stream":%q,"seq":999}`, dl.Stream)); a.code != http.StatusConflict || !strings.Contains(a.body, `"replayed": 0`) {
		t.Errorf("replay of a dead letter that is not there: %d %s, want 409 with replayed 0", a.code, a.body)
	}

	// The page, as the admin: the dead letter with its payload as text,
	// its detail, then a replay that now succeeds.
	b := openBrowser(t, chromium)
	auth := "Basic " + base64.StdEncoding.EncodeToString([]byte("ops:ops-password-1"))
	b.do(chromedp.Navigate("about:blank"))
	if _, err := chromedp.Call(b.ctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(b.ctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: network.Headers{"Authorization": auth}}); err != nil {
		t.Fatal(err)
	}
	b.do(chromedp.Navigate(base + "/"))
	card := fmt.Sprintf(`[data-deadletter="%s/%d"]`, dl.Stream, dl.Seq)
	b.waitText(card+` [data-field="preview"]`, xssReason)
	b.waitText(`#login .tag`, "ops (admin)")
	b.click(card + ` [data-action="details"]`)
	b.waitText(`#dlq-detail [data-field="payload"]`, xssReason)
	if images := run(b, chromedp.Evaluate[int](`document.querySelectorAll("img").length`)); images != 0 {
		t.Fatalf("the payload %q became %d <img> on the page", xssReason, images)
	}
	if err := os.WriteFile(fixed, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	b.click(card + ` [data-action="replay"]`)
	b.waitText(`[data-consumer="ORDERS/PARSER"] [data-field="dead_letters"]`, "0 in ORDERS_DLQ")
	if !strings.Contains(b.text("#dlq-actions"), "done") {
		t.Fatalf("the page says %q after the replay", b.text("#dlq-actions"))
	}
	if !strings.Contains(p.stderr.String(), `msg="status page action" component=http user=ops path=/api/deadletters/replay`) {
		t.Fatal("the replay is not in the log with who did it")
	}
	b.checkClean()
}

// click clicks the element sel finds, in one evaluation (the page
// replaces its nodes as it polls).
func (b *browser) click(sel string) {
	b.t.Helper()
	js := fmt.Sprintf(`(() => { const e = document.querySelector(%q); if (!e) return false; e.click(); return true; })()`, sel)
	if !run(b, chromedp.Evaluate[bool](js)) {
		b.t.Fatalf("nothing to click at %s", sel)
	}
}
