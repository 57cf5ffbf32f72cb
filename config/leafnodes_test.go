package config

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

const edgeNode = `
[server]
name = "edge1"

[[leafnodes.remotes]]
url = "nats-leaf://127.0.0.1:7422"

[streams.ORDERS]
subjects = ["orders.*"]

[consumers.FORWARD]
stream = "ORDERS"
handler = "forward"
workers = 1
`

const hubNode = `
[server]
name = "hub"

[jetstream]
domain = "hub"

[leafnodes]
listen = "127.0.0.1:7422"

[streams.EDGE]
subjects = ["edge.>"]
duplicate_window = "10m"
`

// TestLeafNodeDefaults: an edge's domain defaults to server.name, forward
// settings and unreachable_after to their defaults; a hub is valid with
// a loopback listener and no auth.
func TestLeafNodeDefaults(t *testing.T) {
	cfg := mustParse(t, edgeNode)
	if err := cfg.validateFile(); err != nil {
		t.Fatal(err)
	}
	if cfg.JetStream.Domain != "edge1" {
		t.Errorf("domain = %q, want the server name edge1", cfg.JetStream.Domain)
	}
	f := cfg.Consumers["FORWARD"].Forward
	if f.Subject != DefaultForwardSubject || f.Domain != "hub" || f.Timeout.Duration != DefaultForwardTimeout {
		t.Errorf("forward defaults = %+v", f)
	}
	if got := cfg.LeafNodes.UnreachableAfter.Duration; got != DefaultUnreachableAfter {
		t.Errorf("unreachable_after = %s, want %s", got, DefaultUnreachableAfter)
	}
	if got := ForwardPublishSubject(f.Subject, cfg.Server.Name); got != "edge.edge1.>" {
		t.Errorf("publish subject = %q", got)
	}
	if !cfg.LeafNodes.Edge() || cfg.LeafNodes.Hub() {
		t.Error("edge config is not an edge")
	}

	hub := mustParse(t, hubNode)
	if err := hub.validateFile(); err != nil {
		t.Fatal(err)
	}
	if !hub.LeafNodes.Hub() || hub.LeafNodes.Edge() || hub.JetStream.Domain != "hub" {
		t.Errorf("hub config: %+v domain %q", hub.LeafNodes, hub.JetStream.Domain)
	}

	// Inline remotes, as SPEC writes them, and a domain of its own.
	cfg = mustParse(t, `
[server]
name = "edge-02"
[jetstream]
domain = "site2"
[leafnodes]
remotes = [{ url = "tls://hub.example:7422", credentials = "/etc/holdfast/leaf.creds", ca_file = "/etc/ca.pem" }]
unreachable_after = "1m"
`)
	if err := cfg.validateFile(); err != nil {
		t.Fatal(err)
	}
	cmds := mustParse(t, edgeNode+`
[streams.CMDS]
mirror = { name = "COMMANDS", domain = "hub" }
`)
	if err := cmds.validateFile(); err != nil {
		t.Fatalf("a mirror without subjects: %v", err)
	}
	if m := cmds.Streams["CMDS"].Mirror; m == nil || m.Name != "COMMANDS" || SourceAPIPrefix(m.Domain) != "$JS.hub.API" {
		t.Errorf("mirror = %+v", m)
	}
	if cfg.JetStream.Domain != "site2" || !cfg.LeafNodes.Remotes[0].TLSEnabled() || cfg.LeafNodes.UnreachableAfter.Duration != time.Minute {
		t.Errorf("inline remote: %+v", cfg.LeafNodes)
	}
}

// TestLeafNodeRefusals: each refusal names its key path.
func TestLeafNodeRefusals(t *testing.T) {
	for _, tc := range []struct {
		name, toml, key, reason string
	}{
		{"empty table", "[leafnodes]\n", "leafnodes", "empty table"},
		{"no server.name", strings.Replace(edgeNode, "name = \"edge1\"\n", "", 1), "server.name", "must be set in the file"},
		{"remote without url", strings.Replace(edgeNode, `url = "nats-leaf://127.0.0.1:7422"`, `user = "leaf"`, 1), "leafnodes.remotes[0].url", "required"},
		{"remote scheme", strings.Replace(edgeNode, "nats-leaf://", "http://", 1), "leafnodes.remotes[0].url", "nats-leaf://"},
		{"remote port 0", strings.Replace(edgeNode, "127.0.0.1:7422", "127.0.0.1:0", 1), "leafnodes.remotes[0].url", "port 0 is not 1-65535"},
		{"remote port too large", strings.Replace(edgeNode, "127.0.0.1:7422", "hub.example:74220", 1), "leafnodes.remotes[0].url", "port 74220 is not 1-65535"},
		{"remote with credentials in the url", strings.Replace(edgeNode, "nats-leaf://", "nats-leaf://u:secret@", 1), "leafnodes.remotes[0].url", "must not hold credentials"},
		{"remote with two auth ways", strings.Replace(edgeNode, "\n\n[streams", "\ntoken_file = \"/t\"\ncredentials = \"/c\"\n\n[streams", 1), "leafnodes.remotes[0]", "one way to authenticate"},
		{"remote user without password", strings.Replace(edgeNode, "\n\n[streams", "\nuser = \"leaf\"\n\n[streams", 1), "leafnodes.remotes[0].user", "go together"},
		{"hub beyond loopback without auth", strings.Replace(hubNode, "127.0.0.1:7422", "0.0.0.0:7422", 1), "leafnodes.listen", "need leafnodes.user"},
		{"hub on the client port", strings.Replace(hubNode, "127.0.0.1:7422", "127.0.0.1:4222", 1), "leafnodes.listen", "client port"},
		{"hub listen not host:port", strings.Replace(hubNode, "127.0.0.1:7422", "7422", 1), "leafnodes.listen", "host:port"},
		{"hub user without password file", strings.Replace(hubNode, "listen = \"127.0.0.1:7422\"", "listen = \"127.0.0.1:7422\"\nuser = \"leaf\"", 1), "leafnodes.user", "go together"},
		{"hub user named like a client user", strings.Replace(hubNode, "listen = \"127.0.0.1:7422\"", "listen = \"127.0.0.1:7422\"\nuser = \"ops\"\npassword_file = \"/p\"", 1) + "\n[auth.users.ops]\npassword = \"$2a$11$abcdefghijklmnopqrstuu3Q2hZ0l4pU1S2O8Z1xYl5mQz6w0e9V2\"\n", "leafnodes.user", "name of a client user"},
		{"hub verify without ca", strings.Replace(hubNode, "listen = \"127.0.0.1:7422\"", "listen = \"127.0.0.1:7422\"\ncert_file = \"/c\"\nkey_file = \"/k\"\nverify = true", 1), "leafnodes.verify", "ca_file"},
		{"unreachable_after too short", strings.Replace(edgeNode, "[[leafnodes.remotes]]", "[leafnodes]\nunreachable_after = \"10ms\"\n[[leafnodes.remotes]]", 1), "leafnodes.unreachable_after", "at least 1s"},
		{"forward without remotes", hubNode + "\n[consumers.F]\nstream = \"EDGE\"\nhandler = \"forward\"\n[consumers.F.forward]\ndomain = \"central\"\nsubject = \"up.{subject}\"\n", "consumers.F.forward", "[[leafnodes.remotes]]"},
		{"forward to own domain", edgeNode + "[consumers.FORWARD.forward]\ndomain = \"edge1\"\n", "consumers.FORWARD.forward.domain", "own jetstream.domain"},
		{"forward loops into a local stream", edgeNode + "[consumers.FORWARD.forward]\nsubject = \"orders.{subject}\"\n", "consumers.FORWARD.forward.subject", "a loop"},
		{"forward subject with {subject} inside", edgeNode + "[consumers.FORWARD.forward]\nsubject = \"edge.{subject}.x\"\n", "consumers.FORWARD.forward.subject", "last token"},
		{"forward subject with a wildcard", edgeNode + "[consumers.FORWARD.forward]\nsubject = \"edge.*.{subject}\"\n", "consumers.FORWARD.forward.subject", "not a valid subject template"},
		{"forward subject unknown placeholder", edgeNode + "[consumers.FORWARD.forward]\nsubject = \"edge.{host}.{subject}\"\n", "consumers.FORWARD.forward.subject", "unknown placeholder"},
		{"forward to the dead letters", edgeNode + "[consumers.FORWARD.forward]\nsubject = \"dlq.{subject}\"\n", "consumers.FORWARD.forward.subject", "reserved"},
		{"forward timeout", edgeNode + "[consumers.FORWARD.forward]\ntimeout = \"1ms\"\n", "consumers.FORWARD.forward.timeout", "at least"},
		{"mirror with subjects", hubNode + "[streams.EDGE.mirror]\nname = \"OTHER\"\n", "streams.EDGE.subjects", "a mirror has no subjects"},
		{"mirror and sources", edgeNode + "[streams.CMDS]\nmirror = { name = \"A\", domain = \"hub\" }\nsources = [{ name = \"B\" }]\n", "streams.CMDS.mirror", "not both"},
		{"source without a name", edgeNode + "[streams.CMDS]\nsubjects = [\"cmd.local\"]\nsources = [{ domain = \"hub\" }]\n", "streams.CMDS.sources[0].name", "must name the stream"},
		{"source is the stream itself", edgeNode + "[streams.CMDS]\nsubjects = [\"cmd.local\"]\nsources = [{ name = \"CMDS\" }]\n", "streams.CMDS.sources[0].name", "this stream itself"},
		{"source filter", edgeNode + "[streams.CMDS]\nsubjects = [\"cmd.local\"]\nsources = [{ name = \"C\", domain = \"hub\", filter_subject = \"a..b\" }]\n", "streams.CMDS.sources[0].filter_subject", "not a valid"},
		{"remote at own listener", strings.Replace(edgeNode, "[[leafnodes.remotes]]", "[leafnodes]\nlisten = \"127.0.0.1:7422\"\n[[leafnodes.remotes]]", 1), "leafnodes.remotes[0].url", "this node's own leafnode listener"},
		{"remote at own listener by name", strings.Replace(strings.Replace(edgeNode, "127.0.0.1:7422", "localhost:7422", 1), "[[leafnodes.remotes]]", "[leafnodes]\nlisten = \"127.0.0.1:7422\"\n[[leafnodes.remotes]]", 1), "leafnodes.remotes[0].url", "this node's own leafnode listener"},
		{"remote at own wildcard listener", strings.Replace(edgeNode, "[[leafnodes.remotes]]", "[leafnodes]\nlisten = \"0.0.0.0:7422\"\nuser = \"leaf\"\npassword_file = \"/p\"\n[[leafnodes.remotes]]", 1), "leafnodes.remotes[0].url", "this node's own leafnode listener"},
		{"server name with a dot", strings.Replace(edgeNode, `name = "edge1"`, `name = "edge.1"`, 1) + "[jetstream]\ndomain = \"e1\"\n", "server.name", "no '.'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantFileProblem(t, tc.toml, tc.key, tc.reason)
		})
	}
	wantParseError(t, "[leafnodes]\nfoo = \"bar\"\n", "leafnodes.foo", "unknown key")
}

// TestLeafNodeSecretFiles: the hub's and the remotes' secret files are
// read with the same checks as the others, and refused by key path.
func TestLeafNodeSecretFiles(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "leaf.password")
	if err := os.WriteFile(good, []byte("s3cret-leaf-password\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	open := filepath.Join(dir, "open.password")
	if err := os.WriteFile(open, []byte("s3cret\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := mustParse(t, strings.Replace(hubNode, "listen = \"127.0.0.1:7422\"", "listen = \"127.0.0.1:7422\"\nuser = \"leaf\"\npassword_file = \""+good+"\"", 1)+`
[[leafnodes.remotes]]
url = "nats-leaf://127.0.0.1:7423"
user = "up"
password_file = "`+good+`"
`)
	sec, err := cfg.LoadSecrets()
	if err != nil {
		t.Fatal(err)
	}
	if sec.LeafPassword != "s3cret-leaf-password" || sec.RemoteSecrets[0] != "s3cret-leaf-password" {
		t.Errorf("secrets not read: %q %q", sec.LeafPassword, sec.RemoteSecrets)
	}

	cfg = mustParse(t, edgeNode)
	cfg.LeafNodes.Remotes[0].TokenFile = open
	cfg.LeafNodes.Remotes[0].Credentials = filepath.Join(dir, "missing.creds")
	cfg.LeafNodes.Remotes[0].CAFile = filepath.Join(dir, "missing-ca.pem")
	_, err = cfg.LoadSecrets()
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("LoadSecrets: %v, want a ValidationError", err)
	}
	for _, key := range []string{"leafnodes.remotes[0].token_file", "leafnodes.remotes[0].credentials", "leafnodes.remotes[0].ca_file"} {
		found := false
		for _, p := range ve.Problems {
			found = found || p.Key == key
		}
		if !found {
			t.Errorf("no problem for %s in\n%v", key, err)
		}
	}

	// An empty password file, and TLS files that are not there.
	empty := filepath.Join(dir, "empty.password")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg = mustParse(t, hubNode)
	cfg.LeafNodes.User, cfg.LeafNodes.PasswordFile = "leaf", empty
	cfg.LeafNodes.CertFile = filepath.Join(dir, "missing-hub.pem")
	cfg.LeafNodes.Remotes = []RemoteConfig{{URL: "nats-leaf://127.0.0.1:7423", TokenFile: empty, CertFile: filepath.Join(dir, "missing-edge.pem")}}
	_, err = cfg.LoadSecrets()
	if !errors.As(err, &ve) {
		t.Fatalf("LoadSecrets: %v, want a ValidationError", err)
	}
	for key, reason := range map[string]string{
		"leafnodes.password_file":         "the file is empty",
		"leafnodes.cert_file":             "no such file",
		"leafnodes.remotes[0].token_file": "the file is empty",
		"leafnodes.remotes[0].cert_file":  "no such file",
	} {
		if !slices.ContainsFunc(ve.Problems, func(p Problem) bool { return p.Key == key && strings.Contains(p.Reason, reason) }) {
			t.Errorf("no problem %q for %s in\n%v", reason, key, err)
		}
	}
}

// TestForwardWorkersDefault: a forward consumer runs one worker unless
// its table sets workers (it sends in order: the hub's position); the
// other consumers keep the general default.
func TestForwardWorkersDefault(t *testing.T) {
	cfg := mustParse(t, strings.Replace(edgeNode, "workers = 1\n", "", 1)+"\n[consumers.LOG]\nstream = \"ORDERS\"\nhandler = \"log\"\n")
	if got := cfg.Consumers["FORWARD"].Workers; got != 1 {
		t.Errorf("forward workers = %d, want 1", got)
	}
	if got := cfg.Consumers["LOG"].Workers; got != DefaultConfig().Consumers[DefaultConsumerName].Workers {
		t.Errorf("log workers = %d, want the general default", got)
	}
	cfg = mustParse(t, strings.Replace(edgeNode, "workers = 1\n", "workers = 0\n", 1))
	if got := cfg.Consumers["FORWARD"].Workers; got != 0 {
		t.Errorf("forward workers = %d, want 0 as set", got)
	}
}

// TestRemoteURLs: a remote lists one hub address in url or several in
// urls (SPEC's inline form); its name for logs, status and metrics is
// its URLs without credentials, joined by ",", and its TLS choice is
// read from any of them.
func TestRemoteURLs(t *testing.T) {
	cfg := mustParse(t, `
[server]
name = "edge-01"
[leafnodes]
remotes = [{ urls = ["nats-leaf://hub-1:7422", "nats-leaf://hub-2:7422"], credentials = "/etc/holdfast/leaf.creds" }]
`)
	if err := cfg.validateFile(); err != nil {
		t.Fatal(err)
	}
	r := cfg.LeafNodes.Remotes[0]
	if got := r.HubURLs(); !slices.Equal(got, []string{"nats-leaf://hub-1:7422", "nats-leaf://hub-2:7422"}) {
		t.Errorf("HubURLs = %q", got)
	}
	if got := r.Redacted(); got != "nats-leaf://hub-1:7422,nats-leaf://hub-2:7422" {
		t.Errorf("Redacted = %q", got)
	}
	if got := r.URLKey(0, 1); got != "leafnodes.remotes[0].urls[1]" {
		t.Errorf("URLKey = %q", got)
	}
	if r.TLSEnabled() {
		t.Error("plain URLs use TLS")
	}

	one := mustParse(t, edgeNode).LeafNodes.Remotes[0]
	if got := one.HubURLs(); !slices.Equal(got, []string{"nats-leaf://127.0.0.1:7422"}) {
		t.Errorf("HubURLs of url = %q", got)
	}
	if one.Redacted() != "nats-leaf://127.0.0.1:7422" || one.URLKey(0, 0) != "leafnodes.remotes[0].url" {
		t.Errorf("url: Redacted %q, URLKey %q", one.Redacted(), one.URLKey(0, 0))
	}

	tls := RemoteConfig{URLs: []string{"tls://hub-1:7422", "tls://u:secret@hub-2:7422"}}
	if !tls.TLSEnabled() || tls.Redacted() != "tls://hub-1:7422,tls://hub-2:7422" {
		t.Errorf("tls:// URLs: TLS %v, Redacted %q", tls.TLSEnabled(), tls.Redacted())
	}

	// Two remotes, one with a URL list, one with one URL; a one-element list.
	cfg = mustParse(t, strings.Replace(edgeNode, `url = "nats-leaf://127.0.0.1:7422"`,
		`urls = ["nats-leaf://10.0.0.1:7422", "nats-leaf://10.0.0.2:7422", "nats-leaf://hub-3.example:7422"]`, 1)+`
[[leafnodes.remotes]]
url = "nats-leaf://other-hub:7422"
[[leafnodes.remotes]]
urls = ["tls://third-hub:7422"]
`)
	if err := cfg.validateFile(); err != nil {
		t.Fatal(err)
	}
}

// TestRemoteURLsDocExample: the hub cluster example of
// docs/edge-and-hub.md is valid, one remote with three URLs.
func TestRemoteURLsDocExample(t *testing.T) {
	doc, err := os.ReadFile("../docs/edge-and-hub.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "<!-- hub-cluster-urls-example -->\n```toml\n")
	if !ok {
		t.Fatal("docs/edge-and-hub.md has no hub-cluster-urls-example block")
	}
	example, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatal("the example block is not closed")
	}
	cfg := mustParse(t, "[server]\nname = \"edge-01\"\n"+example)
	if err := cfg.validateFile(); err != nil {
		t.Fatal(err)
	}
	if r := cfg.LeafNodes.Remotes; len(r) != 1 || len(r[0].HubURLs()) != 3 || r[0].Credentials == "" {
		t.Errorf("remotes = %+v, want one with three URLs and credentials", r)
	}
}

// TestRemoteURLsRefused: url and urls together or neither, an empty
// list, and each bad URL of a list are refused by key path, the URL's
// index included.
func TestRemoteURLsRefused(t *testing.T) {
	withURLs := func(urls string) string {
		return strings.Replace(edgeNode, `url = "nats-leaf://127.0.0.1:7422"`, "urls = "+urls, 1)
	}
	for _, tc := range []struct {
		name, toml, key, reason string
	}{
		{"url and urls", strings.Replace(edgeNode, `url = "nats-leaf://127.0.0.1:7422"`, `url = "nats-leaf://127.0.0.1:7422"`+"\nurls = [\"nats-leaf://127.0.0.2:7422\"]", 1),
			"leafnodes.remotes[0].urls", "set url or urls, not both"},
		{"neither", strings.Replace(edgeNode, `url = "nats-leaf://127.0.0.1:7422"`, `credentials = "/c"`, 1), "leafnodes.remotes[0].url", "required"},
		{"empty list", withURLs("[]"), "leafnodes.remotes[0].urls", "empty: list the hub's leafnode addresses"},
		{"empty string in the list", withURLs(`["nats-leaf://hub-1:7422", ""]`), "leafnodes.remotes[0].urls[1]", "empty"},
		{"scheme", withURLs(`["nats-leaf://hub-1:7422", "http://hub-2:7422"]`), "leafnodes.remotes[0].urls[1]", "must start with nats-leaf://"},
		{"no port", withURLs(`["nats-leaf://hub-1", "nats-leaf://hub-2:7422"]`), "leafnodes.remotes[0].urls[0]", "must name host and port"},
		{"port out of range", withURLs(`["nats-leaf://hub-1:7422", "nats-leaf://hub-2:74220"]`), "leafnodes.remotes[0].urls[1]", "port 74220 is not 1-65535"},
		{"credentials in a url", withURLs(`["nats-leaf://hub-1:7422", "nats-leaf://u:secret@hub-2:7422"]`), "leafnodes.remotes[0].urls[1]", "must not hold credentials"},
		{"not a url", withURLs(`["nats-leaf://hub-1:7422", "nats-leaf://hub 2:7422"]`), "leafnodes.remotes[0].urls[1]", "not a URL"},
		{"tls and plain mixed", withURLs(`["tls://hub-1:7422", "nats-leaf://hub-2:7422"]`), "leafnodes.remotes[0].urls[1]", "uses nats-leaf:// but leafnodes.remotes[0].urls[0] uses tls://"},
		{"two plain schemes mixed", withURLs(`["nats-leaf://hub-1:7422", "nats://hub-2:7422"]`), "leafnodes.remotes[0].urls[1]", "one scheme"},
		{"twice in one list", withURLs(`["nats-leaf://hub-1:7422", "nats-leaf://HUB-1:7422"]`), "leafnodes.remotes[0].urls[1]", "listed twice (also leafnodes.remotes[0].urls[0])"},
		{"twice across remotes", withURLs(`["nats-leaf://hub-1:7422", "nats-leaf://hub-2:7422"]`) + "\n[[leafnodes.remotes]]\nurl = \"nats-leaf://hub-2:7422\"\n",
			"leafnodes.remotes[1].url", "listed twice (also leafnodes.remotes[0].urls[1])"},
		{"own listener in the list", strings.Replace(withURLs(`["nats-leaf://hub-1:7422", "nats-leaf://localhost:7422"]`), "[[leafnodes.remotes]]", "[leafnodes]\nlisten = \"127.0.0.1:7422\"\n[[leafnodes.remotes]]", 1),
			"leafnodes.remotes[0].urls[1]", "this node's own leafnode listener"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantFileProblem(t, tc.toml, tc.key, tc.reason)
		})
	}
	// The error text shows the key path, the value (without a password)
	// and what to do.
	cfg := mustParse(t, withURLs(`["nats-leaf://hub-1:7422", "nats-leaf://u:secret@hub-2:7422"]`))
	err := cfg.validateFile()
	wantProblems(t, err, `leafnodes.remotes[0].urls[1] = "nats-leaf://hub-2:7422": must not hold credentials`)
	if strings.Contains(err.Error(), "secret") {
		t.Errorf("the error shows the password: %v", err)
	}
	cfg = mustParse(t, strings.Replace(withURLs(`["nats-leaf://u:secret@hub-1:7422", "nats-leaf://hub-2:7422"]`), "urls = ", "url = \"nats-leaf://hub-3:7422\"\nurls = ", 1))
	err = cfg.validateFile()
	wantProblems(t, err, `leafnodes.remotes[0].urls = ["nats-leaf://hub-1:7422", "nats-leaf://hub-2:7422"]: set url or urls, not both`)
	if strings.Contains(err.Error(), "secret") {
		t.Errorf("the error shows the password: %v", err)
	}
	wantParseError(t, withURLs(`"nats-leaf://hub-1:7422"`), "leafnodes.remotes")
}
