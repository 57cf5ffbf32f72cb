package config

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"
	"golang.org/x/crypto/bcrypt"

	"github.com/holdfast-io/holdfast/internal/testcert"
)

// testHash is a bcrypt hash (cost 4, to keep tests fast) of "s3cret-password".
var testHash = func() string {
	h, err := bcrypt.GenerateFromPassword([]byte("s3cret-password"), bcrypt.MinCost)
	if err != nil {
		panic(err)
	}
	return string(h)
}()

func testNkey(t testing.TB) string {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

// Every unsafe or contradictory security setting is refused with a
// message that names the key and says how to fix it.
func TestUnsafeConfigsRefused(t *testing.T) {
	tests := []struct {
		name string
		toml string
		want []string
	}{
		{"any interface without auth", "[server]\nhost = \"0.0.0.0\"",
			[]string{`server.host = "0.0.0.0"`, "needs authentication", "[auth]", "allow_anonymous = true", "127.0.0.1"}},
		{"ipv6 any without auth", "[server]\nhost = \"::\"", []string{`server.host = "::"`, "needs authentication"}},
		{"an interface address without auth", "[server]\nhost = \"192.0.2.10\"", []string{`server.host = "192.0.2.10"`, "[auth]"}},
		{"monitoring on every interface without auth", "[http]\nlisten = \"0.0.0.0:8222\"",
			[]string{`http.listen = "0.0.0.0:8222"`, "needs authentication", "allow_anonymous"}},
		{"monitoring with an empty host", "[http]\nlisten = \":8222\"", []string{`http.listen = ":8222"`, "needs authentication"}},
		{"an empty [auth] opens nothing", "[server]\nhost = \"0.0.0.0\"\n[auth]", []string{`server.host = "0.0.0.0"`}},
		{"plain-text password", "[server]\nhost = \"0.0.0.0\"\n[auth.users.app]\npassword = \"hunter2\"",
			[]string{"auth.users.app.password", "not a bcrypt hash", "holdfast passwd"}},
		{"user without credential", "[auth.users.app]\npublish_allow = [\"orders.>\"]", []string{"auth.users.app", "exactly one of password"}},
		{"user with two credentials", "[auth.users.app]\npassword = \"" + testHash + "\"\nnkey = \"" + testNkey(t) + "\"",
			[]string{"auth.users.app", "exactly one of"}},
		{"bad nkey", "[auth.users.app]\nnkey = \"SUAEXAMPLE\"", []string{`auth.users.app.nkey = "SUAEXAMPLE"`, "public user nkey"}},
		{"reserved user", "[auth.users.holdfast-internal]\npassword = \"" + testHash + "\"", []string{"auth.users.holdfast-internal", "reserved"}},
		{"user starting with $", "[auth.users.\"$sys\"]\npassword = \"" + testHash + "\"", []string{"auth.users.$sys", "not start with $"}},
		{"bad permission subject", "[auth.users.app]\npassword = \"" + testHash + "\"\npublish_allow = [\"orders..x\"]",
			[]string{`auth.users.app.publish_allow = "orders..x"`, "not a valid NATS subject"}},
		{"short token", "[auth]\ntoken = \"abc\"", []string{"auth.token", "too short", "openssl rand"}},
		{"token and token_file", "[auth]\ntoken = \"0123456789abcdef0123\"\ntoken_file = \"/etc/holdfast/token\"", []string{"auth.token", "not both"}},
		{"token and users", "[auth]\ntoken = \"0123456789abcdef0123\"\n[auth.users.app]\npassword = \"" + testHash + "\"",
			[]string{"auth: a token and [auth.users.*] cannot be combined", "give the token's clients a user"}},
		{"cert without key", "[tls]\ncert_file = \"/etc/holdfast/cert.pem\"", []string{"tls.key_file", "private key"}},
		{"key without cert", "[tls]\nkey_file = \"/etc/holdfast/key.pem\"", []string{"tls.cert_file"}},
		{"verify without ca", "[tls]\ncert_file = \"c\"\nkey_file = \"k\"\nverify = true", []string{"tls.verify = true", "needs ca_file"}},
		{"ca without cert", "[tls]\nca_file = \"ca.pem\"", []string{"tls:", "need cert_file and key_file"}},
		{"tls 1.1", "[tls]\ncert_file = \"c\"\nkey_file = \"k\"\nmin_version = \"1.1\"", []string{`tls.min_version = "1.1"`, `"1.2" or "1.3"`}},
		{"old key alone", "[jetstream]\nencryption_old_key_file = \"/k\"", []string{"jetstream.encryption_old_key_file", "set that too"}},
		{"old key is the key", "[jetstream]\nencryption_key_file = \"/k\"\nencryption_old_key_file = \"/k\"", []string{"jetstream.encryption_old_key_file", "same file"}},
		{"cipher", "[jetstream]\nencryption_cipher = \"rot13\"", []string{`jetstream.encryption_cipher = "rot13"`, "chacha, aes"}},
		{"max_connections 0", "[server]\nmax_connections = 0", []string{"server.max_connections = 0", "at least 1"}},
		{"max_subscriptions negative", "[server]\nmax_subscriptions = -1", []string{"server.max_subscriptions = -1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := mustParse(t, tt.toml+"\n")
			wantProblems(t, cfg.Validate(), tt.want...)
		})
	}
}

func TestAuthTablesParse(t *testing.T) {
	nk := testNkey(t)
	cfg := mustParse(t, `
[server]
host = "0.0.0.0"
[auth.users.app]
password = "`+testHash+`"
publish_allow = ["orders.>"]
subscribe_allow = ["_INBOX.>"]
[auth.users.svc]
nkey = "`+nk+`"
publish_deny = ["$JS.API.STREAM.DELETE.>"]
subscribe_deny = ["secret.>"]
subscribe_allow = ["jobs.* workers"]
allow_responses = true
[auth.users.file]
password_file = "/etc/holdfast/file.hash"
[http]
listen = "0.0.0.0:8222"
`)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	want := map[string]*UserConfig{
		"app":  {Password: testHash, PublishAllow: []string{"orders.>"}, SubscribeAllow: []string{"_INBOX.>"}},
		"svc":  {Nkey: nk, PublishDeny: []string{"$JS.API.STREAM.DELETE.>"}, SubscribeDeny: []string{"secret.>"}, SubscribeAllow: []string{"jobs.* workers"}, AllowResponses: true},
		"file": {PasswordFile: "/etc/holdfast/file.hash"},
	}
	if !reflect.DeepEqual(cfg.Auth.Users, want) {
		t.Errorf("users = %+v, want %+v", cfg.Auth.Users, want)
	}
	if !cfg.Auth.Enabled() || cfg.Auth.TokenMode() {
		t.Errorf("Enabled %v TokenMode %v", cfg.Auth.Enabled(), cfg.Auth.TokenMode())
	}
	if w := cfg.SecurityWarnings(""); len(w) != 1 || !strings.Contains(w[0], "without [tls]") {
		t.Errorf("warnings = %q, want one about clear text without TLS", w)
	}
	wantParseError(t, "[auth.users.app]\npasword = \"x\"\n", "auth.users.app.pasword: unknown key")
	wantParseError(t, "[auth]\ntokenfile = \"x\"\n", "auth.tokenfile: unknown key")
	wantParseError(t, "[tls]\ncert = \"x\"\n", "tls.cert: unknown key")
}

func TestAllowAnonymousAcceptedWithWarning(t *testing.T) {
	cfg := mustParse(t, "[server]\nhost = \"0.0.0.0\"\nallow_anonymous = true\n[http]\nlisten = \"0.0.0.0:8222\"\n")
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	w := cfg.SecurityWarnings("")
	if len(w) != 2 || !strings.Contains(w[0], "SECURITY") || !strings.Contains(w[0], "anyone who can reach port 4222") ||
		!strings.Contains(w[1], "http.listen") {
		t.Errorf("warnings = %q", w)
	}
	// On loopback allow_anonymous changes nothing and says nothing.
	cfg = mustParse(t, "[server]\nallow_anonymous = true\n")
	if w := cfg.SecurityWarnings(""); len(w) != 0 {
		t.Errorf("loopback warnings = %q", w)
	}
	if w := DefaultConfig().SecurityWarnings(""); len(w) != 0 {
		t.Errorf("default warnings = %q", w)
	}
}

func writeModeFile(t *testing.T, dir, name, content string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil { // not subject to the umask
		t.Fatal(err)
	}
	return p
}

func TestLoadSecrets(t *testing.T) {
	dir := t.TempDir()
	tok := writeModeFile(t, dir, "token", "0123456789abcdef0123456789\n", 0o600)
	hash := writeModeFile(t, dir, "app.hash", testHash+"\n", 0o400)
	key := writeModeFile(t, dir, "key", strings.Repeat("k", 48)+"\n", 0o600)
	certs, err := testcert.Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(certs.ServerKey, 0o640); err != nil { // its group may read a TLS key
		t.Fatal(err)
	}

	cfg := DefaultConfig()
	cfg.Auth.Users = map[string]*UserConfig{"app": {PasswordFile: hash}, "inline": {Password: testHash}}
	cfg.JetStream.EncryptionKeyFile = key
	cfg.TLS = TLSConfig{CertFile: certs.ServerCert, KeyFile: certs.ServerKey, CAFile: certs.CA}
	sec, err := cfg.LoadSecrets()
	if err != nil {
		t.Fatal(err)
	}
	if sec.Passwords["app"] != testHash || sec.Passwords["inline"] != testHash || sec.EncryptionKey != strings.Repeat("k", 48) {
		t.Errorf("secrets not read: %+v", sec)
	}

	tcfg := DefaultConfig()
	tcfg.Auth.TokenFile = tok
	if sec, err := tcfg.LoadSecrets(); err != nil || sec.Token != "0123456789abcdef0123456789" {
		t.Errorf("token: %+v, %v", sec, err)
	}

	bad := []struct {
		name  string
		setup func(c *Config)
		want  []string
	}{
		{"token file readable by others", func(c *Config) { c.Auth.TokenFile = writeModeFile(t, dir, "t2", "0123456789abcdef0123", 0o604) },
			[]string{"auth.token_file", "mode 0604", "refusing", "chmod 600"}},
		{"key file readable by group", func(c *Config) {
			c.JetStream.EncryptionKeyFile = writeModeFile(t, dir, "k2", strings.Repeat("k", 40), 0o640)
		},
			[]string{"jetstream.encryption_key_file", "mode 0640", "its group or others"}},
		{"short key", func(c *Config) { c.JetStream.EncryptionKeyFile = writeModeFile(t, dir, "k3", "short", 0o600) },
			[]string{"jetstream.encryption_key_file", "too short"}},
		{"missing key", func(c *Config) { c.JetStream.EncryptionKeyFile = filepath.Join(dir, "nope") },
			[]string{"jetstream.encryption_key_file", "no such file"}},
		{"password file readable by others", func(c *Config) {
			c.Auth.Users = map[string]*UserConfig{"a": {PasswordFile: writeModeFile(t, dir, "h2", testHash, 0o644)}}
		}, []string{"auth.users.a.password_file", "mode 0644"}},
		{"password file with plain text", func(c *Config) {
			c.Auth.Users = map[string]*UserConfig{"a": {PasswordFile: writeModeFile(t, dir, "h3", "hunter2", 0o600)}}
		}, []string{"auth.users.a.password_file", "not hold a bcrypt hash", "holdfast passwd"}},
		{"tls key readable by others", func(c *Config) {
			k := writeModeFile(t, dir, "tk2", "x", 0o644)
			c.TLS = TLSConfig{CertFile: k, KeyFile: k}
		}, []string{"tls.key_file", "mode 0644", "others"}},
		{"short token file", func(c *Config) { c.Auth.TokenFile = writeModeFile(t, dir, "t3", "abc", 0o600) }, []string{"auth.token_file", "too short"}},
		{"directory as key", func(c *Config) { c.JetStream.EncryptionKeyFile = dir }, []string{"not a regular file"}},
		{"empty old key", func(c *Config) {
			c.JetStream.EncryptionKeyFile = writeModeFile(t, dir, "k4", strings.Repeat("k", 40), 0o600)
			c.JetStream.EncryptionOldKeyFile = writeModeFile(t, dir, "k5", "\r\n", 0o600)
		}, []string{"jetstream.encryption_old_key_file", "the file is empty"}},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			tt.setup(c)
			_, err := c.LoadSecrets()
			wantProblems(t, err, tt.want...)
			if !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("%v does not unwrap to ErrInvalidConfig", err)
			}
		})
	}
}

func TestConfigFileWithSecretReadableByOthers(t *testing.T) {
	dir := t.TempDir()
	text := "[auth.users.app]\npassword = \"" + testHash + "\"\n"
	open := writeModeFile(t, dir, "open.toml", text, 0o644)
	closed := writeModeFile(t, dir, "closed.toml", text, 0o640)
	cfg := mustParse(t, text)
	if w := cfg.SecurityWarnings(open); len(w) != 1 || !strings.Contains(w[0], "holds a secret") || !strings.Contains(w[0], "chmod o=") {
		t.Errorf("warnings for a world-readable file = %q", w)
	}
	if w := cfg.SecurityWarnings(closed); len(w) != 0 {
		t.Errorf("warnings for a closed file = %q", w)
	}
	// Secrets in files: the config itself may be world-readable.
	cfg = mustParse(t, "[auth]\ntoken_file = \"/etc/holdfast/token\"\n")
	if w := cfg.SecurityWarnings(open); len(w) != 0 {
		t.Errorf("warnings for a config naming a token file = %q", w)
	}
}

func TestDefaultFileMentionsSecurityKeys(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteDefault(&buf, DefaultStoreDir); err != nil {
		t.Fatal(err)
	}
	text := buf.String()
	for _, v := range []any{AuthConfig{}, UserConfig{}, TLSConfig{}} {
		typ := reflect.TypeOf(v)
		for i := range typ.NumField() {
			tag := typ.Field(i).Tag.Get("toml")
			if tag == "users" {
				tag = "[auth.users."
			} else {
				tag += " = "
			}
			if !strings.Contains(text, tag) {
				t.Errorf("%s.%s (%s) is not in the default file", typ.Name(), typ.Field(i).Name, tag)
			}
		}
	}
	for _, k := range []string{"allow_anonymous = false", "max_connections = 1024", "encryption_key_file = \"\"", "encryption_old_key_file"} {
		if !strings.Contains(text, k) {
			t.Errorf("default file lacks %q", k)
		}
	}
}

// FuzzAuthConfig feeds arbitrary [auth]/[tls] sections to Parse and
// Validate: no panic, only config errors, and a validated config never
// combines a token with users, never holds a plain-text password, and
// never listens beyond loopback without auth or allow_anonymous.
func FuzzAuthConfig(f *testing.F) {
	nk := testNkey(f)
	for _, seed := range []string{
		"[auth]\ntoken = \"0123456789abcdef0123\"\n",
		"[auth]\ntoken_file = \"/etc/holdfast/token\"\n",
		"[auth.users.app]\npassword = \"" + testHash + "\"\npublish_allow = [\"orders.>\"]\nsubscribe_allow = [\"_INBOX.>\"]\n",
		"[auth.users.app]\nnkey = \"" + nk + "\"\npublish_deny = [\"a.*\"]\nallow_responses = true\n",
		"[auth.users.a]\npassword = \"plain\"\n[auth.users.b]\npassword_file = \"/x\"\n",
		"[server]\nhost = \"0.0.0.0\"\n[auth]\ntoken = \"x\"\n[auth.users.a]\nnkey = \"U\"\n",
		"[auth.users.\"holdfast-internal\"]\npassword = \"$2a$04$\"\n",
		"[auth.users.x]\nsubscribe_allow = [\"q.* group\", \"a..b\", \"\"]\n",
		"[tls]\ncert_file = \"c\"\nkey_file = \"k\"\nca_file = \"a\"\nverify = true\nmin_version = \"1.3\"\n",
		"[auth]\nusers = 5\n",
		"[auth]\nusers = { a = { password = 1 } }\n",
		"[auth.users]\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse(bytes.NewReader(data), "fuzz.toml")
		if err != nil {
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("Parse error %v is not a config error", err)
			}
			return
		}
		if err := cfg.Validate(); err != nil {
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("Validate error %v is not a config error", err)
			}
			return
		}
		if cfg.Auth.TokenMode() && len(cfg.Auth.Users) > 0 {
			t.Error("token combined with users")
		}
		for name, u := range cfg.Auth.Users {
			if name == InternalUser {
				t.Error("the internal user is configurable")
			}
			if u == nil {
				continue
			}
			if u.Password != "" && !IsBcrypt(u.Password) {
				t.Errorf("user %s has a plain-text password", name)
			}
		}
		if !IsLoopback(cfg.Server.Host) && !cfg.Auth.Enabled() && !cfg.Server.AllowAnonymous {
			t.Errorf("host %q without auth", cfg.Server.Host)
		}
		if cfg.TLS.Verify && cfg.TLS.CAFile == "" {
			t.Error("verify without a CA")
		}
		_ = cfg.SecurityWarnings("")
	})
}
