package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/holdfast-io/holdfast/internal/natstest"
	"github.com/holdfast-io/holdfast/internal/testcert"
)

// secureEdgeExample returns the example config of docs/security.md.
func secureEdgeExample(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile("../../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "<!-- secure-edge-example -->\n```toml\n")
	if !ok {
		t.Fatal("docs/security.md has no secure-edge-example block")
	}
	example, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatal("the example block is not closed")
	}
	return example
}

// hashPassword runs `holdfast passwd` with the password on stdin and
// writes the hash to a 0600 file.
func hashPassword(t *testing.T, path, password string) {
	t.Helper()
	res := runHoldfast(t, []byte(password+"\n"), "passwd", "--cost", "10")
	if res.code != 0 || !strings.HasPrefix(res.stdout, "$2a$10$") {
		t.Fatalf("holdfast passwd: exit %d, stdout %q, stderr %q", res.code, res.stdout, res.stderr)
	}
	if err := os.WriteFile(path, []byte(res.stdout), 0o600); err != nil {
		t.Fatal(err)
	}
}

func grepDir(t *testing.T, dir string, needle []byte) string {
	t.Helper()
	found := ""
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || found != "" {
			return err
		}
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, needle) {
			found = p
		}
		return nil
	})
	return found
}

// TestSecureEdgeExample runs the documented networked edge config (auth,
// TLS with client certificates, encryption at rest) end to end.
func TestSecureEdgeExample(t *testing.T) {
	t.Parallel()
	etc := t.TempDir()
	if err := os.Mkdir(filepath.Join(etc, "tls"), 0o755); err != nil {
		t.Fatal(err)
	}
	certs, err := testcert.Write(filepath.Join(etc, "tls"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(etc, "store.key"), []byte("kW3x9d7Jq2Zp8vN4mT6yR1sB5hL0cF3gA9eU7iO2wQ=\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	hashPassword(t, filepath.Join(etc, "app.hash"), "app-password-123")
	hashPassword(t, filepath.Join(etc, "ops.hash"), "ops-password-456")

	store := filepath.Join(t.TempDir(), "store")
	port := natstest.FreePort(t)
	text := secureEdgeExample(t)
	text = strings.ReplaceAll(text, "/etc/holdfast/tls/server.pem", certs.ServerCert)
	text = strings.ReplaceAll(text, "/etc/holdfast/tls/server-key.pem", certs.ServerKey)
	text = strings.ReplaceAll(text, "/etc/holdfast/tls/ca.pem", certs.CA)
	text = strings.ReplaceAll(text, "/etc/holdfast/", etc+"/")
	text = strings.ReplaceAll(text, `"/var/lib/holdfast"`, fmt.Sprintf("%q", store))
	text = strings.ReplaceAll(text, "port = 4222", fmt.Sprintf("port = %d", port))
	text = strings.ReplaceAll(text, `listen = "127.0.0.1:8222"`, `listen = "127.0.0.1:0"`)
	text += "\n[log]\nlevel = \"debug\"\n"
	cfgPath := filepath.Join(t.TempDir(), "holdfast.toml")
	if err := os.WriteFile(cfgPath, []byte(text), 0o644); err != nil { // holds no secret
		t.Fatal(err)
	}

	if res := runHoldfast(t, nil, "check", "--config", cfgPath); res.code != 0 || strings.Contains(res.stdout, "warning") {
		t.Fatalf("check: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	d := startHoldfast(t, cfgPath)
	d.waitReady()
	url := fmt.Sprintf("tls://127.0.0.1:%d", port)
	tlsOpts := []nats.Option{nats.RootCAs(certs.CA), nats.ClientCert(certs.ClientCert, certs.ClientKey), nats.MaxReconnects(0)}

	if nc, err := nats.Connect(url, tlsOpts...); err == nil {
		nc.Close()
		t.Fatal("an anonymous client connected")
	}
	if nc, err := nats.Connect(url, nats.RootCAs(certs.CA), nats.UserInfo("app", "app-password-123"), nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatal("a client without a certificate connected")
	}

	errs := make(chan error, 10)
	app, err := nats.Connect(url, append(tlsOpts, nats.UserInfo("app", "app-password-123"),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))...)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	appJS, _ := jetstream.New(app)
	ctx := natstest.Context(t)
	const canary = "EDGE-CANARY-PAYLOAD"
	for i := range 20 {
		if _, err := appJS.Publish(ctx, "orders.created", []byte(fmt.Sprintf("%s-%02d", canary, i))); err != nil {
			t.Fatalf("app publish: %v", err)
		}
	}
	_ = app.Publish("payments.created", []byte("x"))
	_ = app.Flush()
	select {
	case err := <-errs:
		if !strings.Contains(err.Error(), "Permissions Violation for Publish") {
			t.Errorf("unexpected async error %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("publishing outside orders.> was not refused")
	}

	ops, err := nats.Connect(url, append(tlsOpts, nats.UserInfo("ops", "ops-password-456"))...)
	if err != nil {
		t.Fatal(err)
	}
	defer ops.Close()
	opsJS, _ := jetstream.New(ops)
	// The in-process workers process everything the app stored.
	natstest.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		c, err := opsJS.Consumer(ctx, "ORDERS", "WORKER1")
		if err != nil {
			return err
		}
		if f := c.CachedInfo().AckFloor.Stream; f != 20 {
			return fmt.Errorf("ack floor %d, want 20", f)
		}
		return nil
	})

	env := []string{"HOLDFAST_PASSWORD=ops-password-456"}
	res := e2eRunBinary(t, holdfastBin, env, nil, "status", "--config", cfgPath, "--json", "--user", "ops",
		"--tls-cert", certs.ClientCert, "--tls-key", certs.ClientKey)
	if res.code != 0 {
		t.Fatalf("status over TLS: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	var status map[string]any
	if err := json.Unmarshal([]byte(res.stdout), &status); err != nil || !strings.Contains(res.stdout, "ORDERS") {
		t.Errorf("status output: %v\n%s", err, res.stdout)
	}
	// The documented operator user reads the dead letters too.
	res = e2eRunBinary(t, holdfastBin, env, nil, "dlq", "ls", "--config", cfgPath, "--user", "ops",
		"--tls-cert", certs.ClientCert, "--tls-key", certs.ClientKey)
	if res.code != 0 {
		t.Errorf("dlq ls as ops: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	res = e2eRunBinary(t, holdfastBin, env, nil, "status", "--config", cfgPath, "--user", "ops")
	if res.code != 1 || !strings.Contains(res.stderr, "--tls-cert") {
		t.Errorf("status without a client certificate: exit %d, want 1 with a hint\n%s", res.code, res.stderr)
	}
	res = e2eRunBinary(t, holdfastBin, nil, nil, "status", "--config", cfgPath, "--tls-cert", certs.ClientCert, "--tls-key", certs.ClientKey)
	if res.code != 1 || !strings.Contains(res.stderr, "requires credentials") {
		t.Errorf("status without credentials: exit %d, want 1 with a hint\n%s", res.code, res.stderr)
	}
	res = e2eRunBinary(t, holdfastBin, []string{"HOLDFAST_PASSWORD=app-password-123"}, nil, "pub", "--config", cfgPath, "--user", "app",
		"--tls-cert", certs.ClientCert, "--tls-key", certs.ClientKey, "orders.cli", canary+"-cli")
	if res.code != 0 || !strings.Contains(res.stdout, "stored in ORDERS as seq 21") {
		t.Errorf("pub as app: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}

	if code := d.signal(syscall.SIGTERM); code != 0 {
		t.Fatalf("exit %d after SIGTERM", code)
	}
	if f := grepDir(t, store, []byte(canary)); f != "" {
		t.Errorf("payload in clear text in %s", f)
	}
	if strings.Contains(d.stderr.String(), "ops-password") || strings.Contains(d.stderr.String(), "app-password") {
		t.Error("a password is in the log")
	}

	// Restart: the encrypted store reads back.
	d = startHoldfast(t, cfgPath)
	d.waitReady()
	ops2, err := nats.Connect(url, append(tlsOpts, nats.UserInfo("ops", "ops-password-456"))...)
	if err != nil {
		t.Fatal(err)
	}
	defer ops2.Close()
	js2, _ := jetstream.New(ops2)
	if st := natstest.StreamInfo(t, js2, "ORDERS").State; st.Msgs != 21 {
		t.Errorf("%d messages after restart, want 21", st.Msgs)
	}
	if code := d.signal(syscall.SIGTERM); code != 0 {
		t.Fatalf("exit %d after SIGTERM", code)
	}

	// The same store with the wrong key: refused, clearly, store intact.
	if err := os.WriteFile(filepath.Join(etc, "store.key"), []byte("a-different-key-of-enough-length-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d = startHoldfast(t, cfgPath)
	if code := d.wait(30 * time.Second); code != 1 {
		t.Fatalf("exit %d with the wrong key, want 1", code)
	}
	if out := d.stderr.String(); !strings.Contains(out, "do not open with the key in") || !strings.Contains(out, "nothing was changed on disk") {
		t.Errorf("no clear error with the wrong key:\n%s", out)
	}
}

func TestAnonymousNetworkListener(t *testing.T) {
	t.Parallel()
	store := filepath.Join(t.TempDir(), "store")
	port := natstest.FreePort(t)
	refused := strings.Replace(e2eConfigTOML(store, port, ""), `host = "127.0.0.1"`, `host = "0.0.0.0"`, 1)
	path := e2eWriteConfig(t, refused)
	for _, cmd := range []string{"check", "run"} {
		res := runHoldfast(t, nil, cmd, "--config", path)
		if res.code == 0 || !strings.Contains(res.stderr, `server.host = "0.0.0.0"`) || !strings.Contains(res.stderr, "allow_anonymous = true") {
			t.Errorf("%s with a network host and no auth: exit %d\n%s", cmd, res.code, res.stderr)
		}
	}
	allowed := strings.Replace(refused, "[jetstream]", "allow_anonymous = true\n[jetstream]", 1)
	d := startHoldfast(t, e2eWriteConfig(t, allowed))
	d.waitReady()
	if !strings.Contains(d.stderr.String(), "SECURITY: server.allow_anonymous = true") {
		t.Errorf("no warning with allow_anonymous:\n%s", d.stderr.String())
	}
	nc, err := nats.Connect(fmt.Sprintf("nats://127.0.0.1:%d", port))
	if err != nil {
		t.Fatalf("anonymous client: %v", err)
	}
	nc.Close()
	if code := d.signal(syscall.SIGTERM); code != 0 {
		t.Errorf("exit %d", code)
	}
}

func TestPasswdRefusesWeakInput(t *testing.T) {
	t.Parallel()
	for _, in := range []string{"", "short\n", strings.Repeat("x", 80) + "\n"} {
		if res := runHoldfast(t, []byte(in), "passwd"); res.code != 2 || res.stdout != "" {
			t.Errorf("passwd %q: exit %d stdout %q", in, res.code, res.stdout)
		}
	}
	if res := runHoldfast(t, []byte("long-enough-password\n"), "passwd", "--cost", "4"); res.code != 2 {
		t.Errorf("--cost 4: exit %d", res.code)
	}
}

// With a token_file the CLI finds the token itself; other clients need it.
func TestTokenFromConfigFile(t *testing.T) {
	t.Parallel()
	in := newE2EInstance(t)
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("e2e-token-0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	in.cfg = e2eWriteConfig(t, e2eConfigTOML(in.store, in.port, fmt.Sprintf("[auth]\ntoken_file = %q\n", token)))
	d := startHoldfast(t, in.cfg)
	d.waitReady()
	if nc, err := nats.Connect(in.url(), nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatal("connected without the token")
	}
	if res := runHoldfast(t, nil, "pub", "--config", in.cfg, "orders.token", "x"); res.code != 0 {
		t.Errorf("pub with the config's token_file: exit %d\n%s", res.code, res.stderr)
	}
	if res := runHoldfast(t, nil, "pub", "--config", in.cfg, "--token", "wrong-token-0123456789", "orders.token", "x"); res.code != 1 || !strings.Contains(res.stderr, "credentials") {
		t.Errorf("pub with a wrong --token: exit %d\n%s", res.code, res.stderr)
	}
	if res := runHoldfast(t, nil, "dlq", "ls", "--config", in.cfg); res.code != 0 {
		t.Errorf("dlq ls with the config's token_file: exit %d\n%s", res.code, res.stderr)
	}
	if code := d.signal(syscall.SIGTERM); code != 0 {
		t.Errorf("exit %d", code)
	}
}

// --creds takes an nkey seed file.
func TestCredsNkeySeed(t *testing.T) {
	t.Parallel()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	seedFile := filepath.Join(t.TempDir(), "ops.nk")
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	in := newE2EInstance(t)
	in.cfg = e2eWriteConfig(t, e2eConfigTOML(in.store, in.port, fmt.Sprintf("[auth.users.ops]\nnkey = %q\n", pub)))
	d := startHoldfast(t, in.cfg)
	d.waitReady()
	if res := runHoldfast(t, nil, "pub", "--config", in.cfg, "orders.nkey", "x"); res.code != 1 {
		t.Errorf("pub without credentials: exit %d", res.code)
	}
	if res := runHoldfast(t, nil, "pub", "--config", in.cfg, "--creds", seedFile, "orders.nkey", "x"); res.code != 0 {
		t.Errorf("pub --creds SEED: exit %d\n%s", res.code, res.stderr)
	}
	if code := d.signal(syscall.SIGTERM); code != 0 {
		t.Errorf("exit %d", code)
	}
}

// TestAnonymousNatsCLIRefusedWithSystemUser: the README's [auth] with a
// system user, on every address, with a leafnode listener: the nats CLI
// without credentials is refused (it cannot delete a stream or forge an
// advisory), while the configured users work.
func TestAnonymousNatsCLIRefusedWithSystemUser(t *testing.T) {
	t.Parallel()
	etc := t.TempDir()
	hashPassword(t, filepath.Join(etc, "app.hash"), "app-password-123")
	hashPassword(t, filepath.Join(etc, "admin.hash"), "admin-password-456")
	store := filepath.Join(t.TempDir(), "store")
	port := natstest.FreePort(t)
	text := strings.Replace(e2eConfigTOML(store, port, fmt.Sprintf(`dead_letter = "ORDERS_DLQ"

[leafnodes]
listen = "127.0.0.1:%d"

[auth.users.app]
password_file = %q

[auth.users.admin]
password_file = %q
system = true
`, natstest.FreePort(t), filepath.Join(etc, "app.hash"), filepath.Join(etc, "admin.hash"))), `host = "127.0.0.1"`, `host = "0.0.0.0"`, 1)
	cfgPath := e2eWriteConfig(t, text)
	if res := runHoldfast(t, nil, "check", "--config", cfgPath); res.code != 0 {
		t.Fatalf("check: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	d := startHoldfast(t, cfgPath)
	d.waitReady()
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	for _, args := range [][]string{
		{"stream", "ls"},
		{"stream", "rm", "ORDERS_DLQ", "-f"},
		{"pub", "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.ORDERS.WORKER1", "{}"},
	} {
		res := e2eRunBinary(t, natsBin, nil, nil, append([]string{"--server", url}, args...)...)
		if res.code == 0 || !strings.Contains(strings.ToLower(res.stdout+res.stderr), "authorization violation") {
			t.Errorf("nats %s without credentials: exit %d, want an authorization violation\n%s%s", strings.Join(args, " "), res.code, res.stdout, res.stderr)
		}
	}
	res := e2eRunBinary(t, natsBin, nil, nil, "--server", url, "--user", "admin", "--password", "admin-password-456", "server", "list")
	if res.code != 0 {
		t.Errorf("nats server list as the system user: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	res = e2eRunBinary(t, natsBin, nil, nil, "--server", url, "--user", "app", "--password", "app-password-123", "stream", "info", "ORDERS_DLQ")
	if res.code != 0 {
		t.Errorf("nats stream info as app: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	if code := d.signal(syscall.SIGTERM); code != 0 {
		t.Errorf("exit %d", code)
	}
}
