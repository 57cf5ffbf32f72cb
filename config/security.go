package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
	"golang.org/x/crypto/bcrypt"
)

// InternalUser is the name of the identity holdfast's own in-process
// connection (bootstrap, workers, dead letters, status) authenticates as
// when [auth] is configured. It cannot be configured as a user.
const InternalUser = "holdfast-internal"

// MinTokenLength is the shortest plain-text token [auth] accepts.
const MinTokenLength = 16

// MinEncryptionKeyLength is the shortest encryption key accepted, in
// characters after trimming surrounding white space.
const MinEncryptionKeyLength = 32

// AuthConfig is the [auth] table: who may connect to the client port.
// Either a single token or named users, not both.
type AuthConfig struct {
	// Token is a shared secret (or its bcrypt hash) every client sends.
	Token string `toml:"token"`
	// TokenFile names a file holding the token, so that the config file
	// holds no secret.
	TokenFile string `toml:"token_file"`
	// Users are the [auth.users.NAME] tables.
	Users map[string]*UserConfig `toml:"users"`
}

// UserConfig is one [auth.users.NAME] table: exactly one of Password,
// PasswordFile or Nkey, and the user's permissions. An empty allow list
// allows everything; a deny list wins over the allow list.
type UserConfig struct {
	// Password is a bcrypt hash, as printed by `holdfast passwd`.
	Password string `toml:"password"`
	// PasswordFile names a file holding the bcrypt hash.
	PasswordFile string `toml:"password_file"`
	// Nkey is the user's public nkey (starts with U); the client proves
	// it holds the seed.
	Nkey           string   `toml:"nkey"`
	PublishAllow   []string `toml:"publish_allow"`
	PublishDeny    []string `toml:"publish_deny"`
	SubscribeAllow []string `toml:"subscribe_allow"`
	SubscribeDeny  []string `toml:"subscribe_deny"`
	// AllowResponses lets the user publish one reply to the reply subject
	// of each request it received, whatever PublishAllow says (services).
	AllowResponses bool `toml:"allow_responses"`
	// System puts the user in the server's system account: for `nats
	// server info|list|report`, not for messages (the system account
	// sees none of the streams).
	System bool `toml:"system"`
	// Admin lets the user replay and purge dead letters from the status
	// page (logged in with its password on the monitoring listener).
	Admin bool `toml:"admin"`
}

// TLSConfig is the [tls] table for the client port.
type TLSConfig struct {
	CertFile string `toml:"cert_file"`
	KeyFile  string `toml:"key_file"`
	// CAFile holds the CA certificates client certificates are checked
	// against; clients (and holdfast's CLI) use it to check the server.
	CAFile string `toml:"ca_file"`
	// Verify requires every client to present a certificate signed by CAFile.
	Verify bool `toml:"verify"`
	// MinVersion is "1.2" or "1.3".
	MinVersion string `toml:"min_version"`
}

// Enabled reports whether [auth] configures any credential.
func (a *AuthConfig) Enabled() bool {
	return a.Token != "" || a.TokenFile != "" || len(a.Users) > 0
}

// TokenMode reports whether [auth] uses a single token.
func (a *AuthConfig) TokenMode() bool { return a.Token != "" || a.TokenFile != "" }

// UserNames returns the configured user names, sorted.
func (a *AuthConfig) UserNames() []string { return slices.Sorted(maps.Keys(a.Users)) }

// Enabled reports whether [tls] turns TLS on for the client port.
func (t *TLSConfig) Enabled() bool { return t.CertFile != "" || t.KeyFile != "" }

// IsBcrypt reports whether s looks like a bcrypt hash.
func IsBcrypt(s string) bool {
	if !strings.HasPrefix(s, "$2a$") && !strings.HasPrefix(s, "$2b$") && !strings.HasPrefix(s, "$2y$") {
		return false
	}
	_, err := bcrypt.Cost([]byte(s))
	return err == nil
}

func (c *Config) validateSecurity(v *validator) {
	a := c.Auth
	if a.Token != "" && a.TokenFile != "" {
		v.add("auth.token", "", "set token or token_file, not both")
	}
	if a.Token != "" && !IsBcrypt(a.Token) && len(a.Token) < MinTokenLength {
		v.add("auth.token", "", "too short (%d characters, at least %d): generate one with `openssl rand -hex 24`", len(a.Token), MinTokenLength)
	}
	if a.TokenMode() && len(a.Users) > 0 {
		v.add("auth", "", "a token and [auth.users.*] cannot be combined (the NATS server authenticates either one shared token or named users): give the token's clients a user instead, and remove the token")
	}
	for _, name := range a.UserNames() {
		u := a.Users[name]
		key := "auth.users." + name
		if u == nil {
			continue
		}
		switch {
		case name == InternalUser:
			v.add(key, "", "%s is reserved for holdfast's own in-process connection: pick another name", InternalUser)
		case name == "" || strings.ContainsAny(name, " \t\r\n") || strings.HasPrefix(name, "$"):
			v.add(key, "", "user name must be non-empty, without spaces, and not start with $")
		}
		n := 0
		for _, set := range []string{u.Password, u.PasswordFile, u.Nkey} {
			if set != "" {
				n++
			}
		}
		if n != 1 {
			v.add(key, "", "needs exactly one of password (a bcrypt hash from `holdfast passwd`), password_file or nkey")
		}
		if u.Password != "" && !IsBcrypt(u.Password) {
			v.add(key+".password", "", "is not a bcrypt hash: plain-text passwords are refused; run `holdfast passwd` and paste the hash it prints (or put it in password_file)")
		}
		if u.Admin && u.Nkey != "" {
			v.add(key+".admin", "true", "needs a password (password_file or password): the status page logs users in with one, an nkey cannot")
		}
		if u.Nkey != "" && !nkeys.IsValidPublicUserKey(u.Nkey) {
			v.add(key+".nkey", q(u.Nkey), "not a public user nkey (56 characters starting with U): create one with `nk -gen user -pubout`")
		}
		for _, l := range []struct {
			name string
			subj []string
		}{{"publish_allow", u.PublishAllow}, {"publish_deny", u.PublishDeny}, {"subscribe_allow", u.SubscribeAllow}, {"subscribe_deny", u.SubscribeDeny}} {
			for _, s := range l.subj {
				if !validPermissionSubject(s) {
					v.add(key+"."+l.name, q(s), "not a valid NATS subject (wildcards * and > are allowed; a queue group follows a space in subscribe lists)")
				}
			}
		}
	}

	t := c.TLS
	if t.CertFile != "" && t.KeyFile == "" {
		v.add("tls.key_file", `""`, "tls.cert_file needs its private key in tls.key_file")
	}
	if t.KeyFile != "" && t.CertFile == "" {
		v.add("tls.cert_file", `""`, "tls.key_file needs its certificate in tls.cert_file")
	}
	if !t.Enabled() && (t.CAFile != "" || t.Verify) {
		v.add("tls", "", "ca_file and verify need cert_file and key_file: without them the client port is not TLS")
	}
	if t.Verify && t.CAFile == "" {
		v.add("tls.verify", "true", "needs ca_file: the CA that signs the client certificates")
	}
	if t.MinVersion != "" && t.MinVersion != "1.2" && t.MinVersion != "1.3" {
		v.add("tls.min_version", q(t.MinVersion), "must be \"1.2\" or \"1.3\"")
	}

	js := c.JetStream
	v.oneOf("jetstream.encryption_cipher", js.EncryptionCipher, "chacha", "aes")
	if js.EncryptionOldKeyFile != "" && js.EncryptionKeyFile == "" {
		v.add("jetstream.encryption_old_key_file", q(js.EncryptionOldKeyFile), "only used while rotating to a new encryption_key_file: set that too")
	}
	if js.EncryptionKeyFile != "" && js.EncryptionKeyFile == js.EncryptionOldKeyFile {
		v.add("jetstream.encryption_old_key_file", q(js.EncryptionOldKeyFile), "is the same file as encryption_key_file")
	}

	s := c.Server
	if s.MaxConnections < 1 {
		v.add("server.max_connections", strconv.Itoa(s.MaxConnections), "must be at least 1 (holdfast's own in-process connection counts)")
	}
	if s.MaxSubscriptions < 0 {
		v.add("server.max_subscriptions", strconv.Itoa(s.MaxSubscriptions), "must be 0 (unlimited) or positive")
	}
}

// validPermissionSubject accepts a subject with wildcards, and in
// subscribe lists an optional queue group after a space.
func validPermissionSubject(s string) bool {
	subj, queue, hasQueue := strings.Cut(s, " ")
	if hasQueue && (queue == "" || strings.ContainsAny(queue, " \t")) {
		return false
	}
	return server.IsValidSubject(subj)
}

// anonymousReason is why a non-loopback listener is refused.
const anonymousReason = "needs authentication: add an [auth] table (users or a token), " +
	"or set server.allow_anonymous = true to let anyone who can reach it in, or listen on 127.0.0.1"

// Secrets are the credentials and keys the config refers to, read from
// their files. They never appear in logs.
type Secrets struct {
	// Token is the [auth] token, plain or bcrypt.
	Token string
	// Passwords maps a user name to its bcrypt hash.
	Passwords map[string]string
	// EncryptionKey and OldEncryptionKey are the store keys ("" when unset).
	EncryptionKey    string
	OldEncryptionKey string
	// ClusterPassword is the routes' plain password ("" without route auth).
	ClusterPassword string
	// LeafPassword is what edges present to this hub ([leafnodes]
	// password_file: plain or bcrypt); RemoteSecrets, by remote, the
	// password or token this edge presents ("" when none).
	LeafPassword  string
	RemoteSecrets []string
}

// LoadSecrets reads every secret file the config names. A file readable by
// group or others (or, for the TLS key, by others) is refused, as is a file
// whose content is not what the key expects. Problems come back as a
// *ValidationError naming the key.
func (c *Config) LoadSecrets() (*Secrets, error) {
	v := &validator{}
	sec := &Secrets{Token: c.Auth.Token, Passwords: map[string]string{}}
	if f := c.Auth.TokenFile; f != "" {
		if tok, ok := readSecret(v, "auth.token_file", f, true); ok {
			switch {
			case tok == "":
				v.add("auth.token_file", q(f), "the file is empty")
			case !IsBcrypt(tok) && len(tok) < MinTokenLength:
				v.add("auth.token_file", q(f), "the token is too short (%d characters, at least %d): generate one with `openssl rand -hex 24`", len(tok), MinTokenLength)
			}
			sec.Token = tok
		}
	}
	for _, name := range c.Auth.UserNames() {
		u := c.Auth.Users[name]
		if u == nil {
			continue
		}
		if u.Password != "" {
			sec.Passwords[name] = u.Password
		}
		if u.PasswordFile == "" {
			continue
		}
		key := "auth.users." + name + ".password_file"
		if hash, ok := readSecret(v, key, u.PasswordFile, true); ok {
			if !IsBcrypt(hash) {
				v.add(key, q(u.PasswordFile), "the file does not hold a bcrypt hash: write the output of `holdfast passwd` into it")
				continue
			}
			sec.Passwords[name] = hash
		}
	}
	js := c.JetStream
	if js.EncryptionKeyFile != "" {
		if k, ok := readSecret(v, "jetstream.encryption_key_file", js.EncryptionKeyFile, true); ok {
			if len(k) < MinEncryptionKeyLength {
				v.add("jetstream.encryption_key_file", q(js.EncryptionKeyFile), "the key is too short (%d characters, at least %d): generate one with `openssl rand -base64 48`", len(k), MinEncryptionKeyLength)
			}
			sec.EncryptionKey = k
		}
	}
	if js.EncryptionOldKeyFile != "" {
		if k, ok := readSecret(v, "jetstream.encryption_old_key_file", js.EncryptionOldKeyFile, true); ok {
			if k == "" {
				// An empty old key would be no old key: the rotation would
				// not happen, and the start fail on the store's key files.
				v.add("jetstream.encryption_old_key_file", q(js.EncryptionOldKeyFile), "the file is empty: it must hold the key the store was written with")
			}
			sec.OldEncryptionKey = k
		}
	}
	if c.TLS.KeyFile != "" {
		checkSecretFile(v, "tls.key_file", c.TLS.KeyFile, false)
	}
	checkExists(v, "tls.cert_file", c.TLS.CertFile)
	checkExists(v, "tls.ca_file", c.TLS.CAFile)
	checkTLSFiles(v, "tls.", c.TLS.CertFile, c.TLS.KeyFile, c.TLS.CAFile)
	if f := c.Cluster.PasswordFile; f != "" {
		sec.ClusterPassword = readPassword(v, "cluster.password_file", f)
	}
	if c.Cluster.KeyFile != "" {
		checkSecretFile(v, "cluster.key_file", c.Cluster.KeyFile, false)
	}
	checkExists(v, "cluster.cert_file", c.Cluster.CertFile)
	checkExists(v, "cluster.ca_file", c.Cluster.CAFile)
	checkTLSFiles(v, "cluster.", c.Cluster.CertFile, c.Cluster.KeyFile, c.Cluster.CAFile)
	// The devices' and browsers' listeners, checked as the others: a
	// certificate that does not load is refused by check, not found by
	// run after the server started.
	for _, t := range []struct{ prefix, cert, key, ca string }{
		{"mqtt.", c.MQTT.CertFile, c.MQTT.KeyFile, c.MQTT.CAFile},
		{"websocket.", c.WebSocket.CertFile, c.WebSocket.KeyFile, ""},
	} {
		if t.key != "" {
			checkSecretFile(v, t.prefix+"key_file", t.key, false)
		}
		checkExists(v, t.prefix+"cert_file", t.cert)
		checkExists(v, t.prefix+"ca_file", t.ca)
		checkTLSFiles(v, t.prefix, t.cert, t.key, t.ca)
	}
	c.loadLeafSecrets(v, sec)
	if len(v.problems) > 0 {
		return nil, &ValidationError{Problems: v.problems}
	}
	return sec, nil
}

// readSecret checks a secret file's permissions and returns its content
// with surrounding white space trimmed.
func readSecret(v *validator, key, path string, ownerOnly bool) (string, bool) {
	if !checkSecretFile(v, key, path, ownerOnly) {
		return "", false
	}
	b, err := os.ReadFile(path)
	if err != nil {
		v.add(key, q(path), "cannot read: %v", unwrapPathError(err))
		return "", false
	}
	return strings.TrimSpace(string(b)), true
}

// readPassword reads a password or token file, which must not be empty.
func readPassword(v *validator, key, path string) string {
	s, ok := readSecret(v, key, path, true)
	if ok && s == "" {
		v.add(key, q(path), "the file is empty")
	}
	return s
}

// checkExists reports a file the config names (a certificate, a CA) that
// is not there; "" names none.
func checkExists(v *validator, key, path string) {
	if path == "" {
		return
	}
	if _, err := os.Stat(path); err != nil {
		v.add(key, q(path), "%v", unwrapPathError(err))
	}
}

// checkTLSFiles loads a certificate with its key, and a CA file, of the
// table whose keys start with prefix, as the server will, so that `holdfast
// check` refuses a certificate whose key is another's, or a file that is
// no PEM, which run would refuse at start ("tls: error parsing X509
// certificate/key pair", naming no key). Files that are missing or
// unreadable are reported by checkExists and checkSecretFile.
func checkTLSFiles(v *validator, prefix, cert, key, ca string) {
	if cert != "" && key != "" && readable(cert) && readable(key) {
		if _, err := tls.LoadX509KeyPair(cert, key); err != nil {
			v.add(prefix+"cert_file", q(cert), "does not load with %skey_file %s: %v (both must be PEM, the key the certificate's own)", prefix, q(key), err)
		}
	}
	if ca != "" && readable(ca) {
		data, err := os.ReadFile(ca)
		if err == nil && !x509.NewCertPool().AppendCertsFromPEM(data) {
			v.add(prefix+"ca_file", q(ca), "holds no PEM certificate")
		}
	}
}

// readable tells whether path is a regular file that can be opened.
func readable(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	fi, err := f.Stat()
	return err == nil && fi.Mode().IsRegular()
}

// checkSecretFile refuses a secret file that others (and, with ownerOnly,
// its group) may read or write, and one that is not a regular file.
func checkSecretFile(v *validator, key, path string, ownerOnly bool) bool {
	fi, err := os.Stat(path)
	if err != nil {
		v.add(key, q(path), "%v", unwrapPathError(err))
		return false
	}
	if !fi.Mode().IsRegular() {
		v.add(key, q(path), "not a regular file")
		return false
	}
	mask, who, fix := fs.FileMode(0o007), "others", "chmod o= "+path
	if ownerOnly {
		mask, who, fix = 0o077, "its group or others", "chmod 600 "+path+" (owned by the user holdfast runs as)"
	}
	if perm := fi.Mode().Perm(); perm&mask != 0 {
		v.add(key, q(path), "mode %04o lets %s read a secret: refusing to use it; fix with `%s`", perm, who, fix)
		return false
	}
	return true
}

func unwrapPathError(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// HoldsSecret reports whether the config text itself holds a credential
// (an inline token or password hash), as opposed to naming files.
func (c *Config) HoldsSecret() bool {
	if c.Auth.Token != "" {
		return true
	}
	for _, u := range c.Auth.Users {
		if u != nil && u.Password != "" {
			return true
		}
	}
	return false
}

// SecurityWarnings returns what an operator must hear at every start: a
// network listener without authentication, and a config file that holds a
// secret and is readable by others. source is the config file ("" for the
// built-in defaults).
func (c *Config) SecurityWarnings(source string) []string {
	var w []string
	if !c.Auth.Enabled() && c.Server.AllowAnonymous {
		if !IsLoopback(c.Server.Host) {
			w = append(w, fmt.Sprintf("SECURITY: server.allow_anonymous = true and server.host = %q: anyone who can reach port %d can publish, read and delete every stream; configure [auth] to stop this", c.Server.Host, c.Server.Port))
		}
		if host, _, err := splitListen(c.HTTP.Listen); err == nil && !IsLoopback(host) {
			w = append(w, fmt.Sprintf("SECURITY: http.listen = %q serves monitoring to the network without authentication (server.allow_anonymous = true)", c.HTTP.Listen))
		}
	}
	if c.Auth.Enabled() && !c.TLS.Enabled() && !IsLoopback(c.Server.Host) {
		w = append(w, fmt.Sprintf("server.host = %q without [tls]: passwords and tokens cross the network in clear text", c.Server.Host))
	}
	if m := c.MQTT; m.Enabled() && !m.TLSEnabled() {
		if host, _, err := m.HostPort(); err == nil && !IsLoopback(host) && c.Auth.Enabled() {
			w = append(w, fmt.Sprintf("mqtt.listen = %q without mqtt.cert_file: devices' passwords cross the network in clear text", m.Listen))
		}
	}
	if source != "" && c.HoldsSecret() {
		if fi, err := os.Stat(source); err == nil && fi.Mode().Perm()&0o004 != 0 {
			w = append(w, fmt.Sprintf("config file %s holds a secret ([auth] token or password hash) and is readable by every user (mode %04o): chmod o= %s, or move the secret to token_file/password_file", source, fi.Mode().Perm(), source))
		}
	}
	return w
}
