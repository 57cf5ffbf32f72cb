// Package statuspage is the status page the monitoring listener serves
// at /: one HTML file and one script, built into the binary, that poll
// /status.json (the document `holdfast status --json` prints) while the
// tab is visible. The page runs nothing on the server between requests.
package statuspage

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"net/http"
	"time"
)

// ScriptPath is where the page's script is served.
const ScriptPath = "/status.js"

//go:embed index.html status.js
var assets embed.FS

// contentSecurityPolicy lets the page load its own script and the JSON
// and nothing else: no inline script, no other origin. Strings from
// messages and handlers are inserted as text; this policy is a second
// wall should one ever be inserted as markup.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; connect-src 'self'; " +
	"img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// asset is one embedded file with its type and entity tag.
type asset struct {
	body        []byte
	contentType string
	etag        string
}

func load(name, contentType string) asset {
	body, err := assets.ReadFile(name)
	if err != nil {
		panic("statuspage: " + name + " is not embedded: " + err.Error())
	}
	sum := sha256.Sum256(body)
	return asset{body: body, contentType: contentType, etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
}

// Handler serves the page at / and its script at ScriptPath; the caller
// routes only those two paths to it.
func Handler() http.Handler {
	page := load("index.html", "text/html; charset=utf-8")
	script := load("status.js", "text/javascript; charset=utf-8")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a := page
		if r.URL.Path == ScriptPath {
			a = script
		}
		h := w.Header()
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		// Revalidated at each load, so that an upgraded binary's page
		// is never mixed with the old script.
		h.Set("Cache-Control", "no-cache")
		h.Set("ETag", a.etag)
		h.Set("Content-Type", a.contentType)
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(a.body))
	})
}
