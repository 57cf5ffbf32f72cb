package statuspage

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func get(t *testing.T, h http.Handler, path, etag string) *http.Response {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	if etag != "" {
		req.Header.Set("If-None-Match", etag)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Result()
}

// The page and its script are served with their types, the security
// headers and an entity tag that answers 304 when unchanged.
func TestHandlerServesPageAndScript(t *testing.T) {
	h := Handler()
	for path, want := range map[string]string{"/": "text/html; charset=utf-8", ScriptPath: "text/javascript; charset=utf-8"} {
		resp := get(t, h, path, "")
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != want || len(body) == 0 {
			t.Fatalf("GET %s: %s, %q, %d bytes; want 200, %q", path, resp.Status, resp.Header.Get("Content-Type"), len(body), want)
		}
		csp := resp.Header.Get("Content-Security-Policy")
		if !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-eval") || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Fatalf("GET %s: headers %v", path, resp.Header)
		}
		if again := get(t, h, path, resp.Header.Get("ETag")); again.StatusCode != http.StatusNotModified {
			t.Fatalf("GET %s with its ETag: %s, want 304", path, again.Status)
		}
	}
}

// An edge host is often offline: the page loads nothing from elsewhere,
// and has no inline script for the policy to refuse.
func TestPageLoadsNothingFromElsewhere(t *testing.T) {
	for _, name := range []string{"index.html", "status.js"} {
		data, err := assets.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		// The SVG namespace is a name that is never fetched.
		data = bytes.ReplaceAll(data, []byte(`"http://www.w3.org/2000/svg"`), nil)
		if m := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}[/"']`).Find(data); m != nil {
			t.Errorf("%s refers to another origin: %s", name, m)
		}
	}
	page, _ := assets.ReadFile("index.html")
	for _, m := range regexp.MustCompile(`(?is)<script([^>]*)>(.*?)</script>`).FindAllSubmatch(page, -1) {
		if len(strings.TrimSpace(string(m[2]))) > 0 || !strings.Contains(string(m[1]), `src="status.js"`) {
			t.Errorf("index.html has a script other than status.js: %s", m[0])
		}
	}
	if regexp.MustCompile(`(?i)<[^>]+\son[a-z]+=`).Match(page) {
		t.Error("index.html has an inline event handler")
	}
}

// Strings from the server reach the page as text only.
func TestScriptInsertsNoMarkup(t *testing.T) {
	js, _ := assets.ReadFile("status.js")
	for _, sink := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"} {
		if strings.Contains(string(js), sink) {
			t.Errorf("status.js uses %s", sink)
		}
	}
}
