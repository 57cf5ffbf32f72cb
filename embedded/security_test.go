package embedded

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"golang.org/x/crypto/bcrypt"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/embedded/bootstrap"
	"github.com/holdfast-io/holdfast/embedded/store"
	"github.com/holdfast-io/holdfast/internal/configtest"
	"github.com/holdfast-io/holdfast/internal/natstest"
	"github.com/holdfast-io/holdfast/internal/subjects"
	"github.com/holdfast-io/holdfast/internal/testcert"
)

func bcryptHash(t *testing.T, password string) string {
	t.Helper()
	h, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	return string(h)
}

// captureIdentity makes s's internal password visible to the test (never
// to the logs); call it before s is opened.
func captureIdentity(s *Server) func() []string {
	var mu sync.Mutex
	var seen []string
	s.seeIdentity = func(password string) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, password)
	}
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), seen...)
	}
}

// asyncErrors collects a client's asynchronous errors (permission
// violations arrive this way).
type asyncErrors struct {
	mu   sync.Mutex
	errs []error
}

func (a *asyncErrors) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.errs = append(a.errs, err)
}

func (a *asyncErrors) has(fragment string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, e := range a.errs {
		if strings.Contains(e.Error(), fragment) {
			return nil
		}
	}
	return fmt.Errorf("no async error contains %q (got %v)", fragment, a.errs)
}

func applyConfig(t *testing.T, s *Server, cfg *config.Config) {
	t.Helper()
	log, _ := natstest.Logger(t)
	if err := bootstrap.Apply(natstest.Context(t), s.JetStream(), cfg, log); err != nil {
		t.Fatalf("bootstrap over the internal connection: %v", err)
	}
}

// The internal connection must be able to do all a worker does: fetch,
// ack, dead-letter, follow advisories, answer status requests.
// pub publishes the test message (the internal connection may not
// publish to the streams' subjects when [auth] is configured).
func checkInternalConnection(t *testing.T, s *Server, pub jetstream.JetStream) {
	t.Helper()
	if pub == nil {
		pub = s.JetStream()
	}
	ctx := natstest.Context(t)
	js := s.JetStream()
	nc := s.Conn()
	adv, err := nc.SubscribeSync("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.ORDERS.WORKER1")
	if err != nil {
		t.Fatal(err)
	}
	status, err := nc.Subscribe("$HOLDFAST.STATUS", func(m *nats.Msg) { _ = m.Respond([]byte("ok")) })
	if err != nil {
		t.Fatal(err)
	}
	defer status.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := nc.LastError(); err != nil {
		t.Fatalf("internal connection: %v", err)
	}
	_ = adv.Unsubscribe()
	if _, err := pub.Publish(ctx, "orders.internal", []byte("x")); err != nil {
		t.Fatalf("publish: %v", err)
	}
	cons, err := js.Consumer(ctx, "ORDERS", "WORKER1")
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(10, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for m := range batch.Messages() {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatalf("ack: %v", err)
		}
		n++
	}
	if n == 0 {
		t.Fatalf("internal fetch got nothing: %v", batch.Error())
	}
	dl := nats.NewMsg(subjects.DeadLetterPrefix + "WORKER1.orders.internal")
	dl.Data = []byte("dead")
	if _, err := js.PublishMsg(ctx, dl); err != nil {
		t.Fatalf("dead letter: %v", err)
	}
	if err := nc.LastError(); err != nil {
		t.Fatalf("internal connection: %v", err)
	}
}

func TestAuthUsersPermissions(t *testing.T) {
	t.Parallel()
	cfg := configtest.Default(t)
	hashFile := filepath.Join(t.TempDir(), "reader.hash")
	if err := os.WriteFile(hashFile, []byte(bcryptHash(t, "reader-password")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	cfg.Auth.Users = map[string]*config.UserConfig{
		"app":    {Password: bcryptHash(t, "app-password"), PublishAllow: []string{"orders.>"}, SubscribeAllow: []string{"_INBOX.>"}},
		"reader": {PasswordFile: hashFile, PublishAllow: []string{"$JS.API.STREAM.INFO.>", "$JS.API.STREAM.MSG.GET.>"}, SubscribeAllow: []string{"_INBOX.>"}},
		"nk":     {Nkey: pub},
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	log, logs := natstest.Logger(t)
	s := New(cfg, log)
	passwords := captureIdentity(s)
	openServer(t, s)
	applyConfig(t, s, cfg)
	url := s.NATS().ClientURL()
	ctx := natstest.Context(t)

	t.Run("anonymous refused", func(t *testing.T) {
		if nc, err := nats.Connect(url, nats.MaxReconnects(0)); err == nil {
			nc.Close()
			t.Fatal("an unauthenticated client connected")
		} else if !strings.Contains(strings.ToLower(err.Error()), "authorization") {
			t.Errorf("error %v, want an authorization violation", err)
		}
	})
	t.Run("wrong password refused", func(t *testing.T) {
		if nc, err := nats.Connect(url, nats.UserInfo("app", "nope"), nats.MaxReconnects(0)); err == nil {
			nc.Close()
			t.Fatal("a wrong password connected")
		}
	})
	t.Run("the internal user is not reachable from outside without its password", func(t *testing.T) {
		if nc, err := nats.Connect(url, nats.UserInfo(config.InternalUser, ""), nats.MaxReconnects(0)); err == nil {
			nc.Close()
			t.Fatal("connected as the internal user with an empty password")
		}
	})

	t.Run("app limited to orders.>", func(t *testing.T) {
		errs := &asyncErrors{}
		nc, err := nats.Connect(url, nats.UserInfo("app", "app-password"), nats.ErrorHandler(errs.handler))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		ack, err := js.Publish(ctx, "orders.created", []byte("allowed"))
		if err != nil {
			t.Fatalf("publish to orders.created: %v", err)
		}
		if ack.Stream != "ORDERS" {
			t.Errorf("stored in %s", ack.Stream)
		}
		if err := nc.Publish("payments.created", []byte("denied")); err != nil {
			t.Fatal(err)
		}
		_ = nc.Flush()
		natstest.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
			return errs.has(`Permissions Violation for Publish to "payments.created"`)
		})
		short, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if _, err := js.Stream(short, "ORDERS"); err == nil {
			t.Error("app read the stream's info through the JetStream API")
		}
		req := fmt.Sprintf(`{"seq":%d}`, ack.Sequence)
		if m, err := nc.Request("$JS.API.STREAM.MSG.GET.ORDERS", []byte(req), 2*time.Second); err == nil {
			t.Errorf("app read a message through the JetStream API: %s", m.Data)
		}
		natstest.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
			return errs.has(`Permissions Violation for Publish to "$JS.API.STREAM.MSG.GET.ORDERS"`)
		})
		if _, err := nc.SubscribeSync("orders.>"); err != nil {
			t.Fatal(err)
		}
		_ = nc.Flush()
		natstest.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
			return errs.has(`Permissions Violation for Subscription to "orders.>"`)
		})
	})

	t.Run("reader may read the stream", func(t *testing.T) {
		nc, err := nats.Connect(url, nats.UserInfo("reader", "reader-password"))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		st, err := js.Stream(ctx, "ORDERS")
		if err != nil {
			t.Fatalf("stream info: %v", err)
		}
		m, err := st.GetMsg(ctx, st.CachedInfo().State.FirstSeq)
		if err != nil {
			t.Fatalf("get message: %v", err)
		}
		if string(m.Data) != "allowed" {
			t.Errorf("read %q", m.Data)
		}
	})

	t.Run("nkey user", func(t *testing.T) {
		nc, err := nats.Connect(url, nats.Nkey(pub, func(nonce []byte) ([]byte, error) {
			kp, err := nkeys.FromSeed(seed)
			if err != nil {
				return nil, err
			}
			return kp.Sign(nonce)
		}))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		if _, err := js.Stream(ctx, "ORDERS"); err != nil {
			t.Errorf("an unrestricted nkey user cannot read: %v", err)
		}
		// The internal connection answers requests (holdfast status).
		sub, err := s.Conn().Subscribe("$HOLDFAST.STATUS", func(m *nats.Msg) { _ = m.Respond([]byte("status")) })
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		_ = s.Conn().Flush()
		if m, err := nc.Request("$HOLDFAST.STATUS", nil, 5*time.Second); err != nil || string(m.Data) != "status" {
			t.Errorf("status request over the internal identity: %v, %v", m, err)
		}
	})

	t.Run("internal connection keeps working", func(t *testing.T) {
		nc, err := nats.Connect(url, nats.UserInfo("app", "app-password"))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		checkInternalConnection(t, s, js)
	})
	t.Run("internal connection may not publish to the streams", func(t *testing.T) {
		short, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if _, err := s.JetStream().Publish(short, "orders.internal", []byte("x")); err == nil {
			t.Error("the internal identity published to orders.internal")
		}
	})

	t.Run("internal password never logged or stored", func(t *testing.T) {
		pw := passwords()
		if len(pw) == 0 || len(pw[len(pw)-1]) < 40 {
			t.Fatalf("no internal password captured: %q", pw)
		}
		secret := pw[len(pw)-1]
		if strings.Contains(logs.String(), secret) {
			t.Error("the internal password is in the log")
		}
		if !strings.Contains(logs.String(), "NATS server ready") {
			t.Error("no log captured")
		}
		if f := grepTree(t, s.StoreDir(), []byte(secret)); f != "" {
			t.Errorf("the internal password is in %s", f)
		}
	})
}

// grepTree returns the first file under dir that contains needle.
func grepTree(t *testing.T, dir string, needle []byte) string {
	t.Helper()
	found := ""
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || found != "" {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if bytes.Contains(b, needle) {
			found = p
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

func TestAuthToken(t *testing.T) {
	t.Parallel()
	cfg := configtest.Default(t)
	tokenFile := clientTokenFile(t)
	cfg.Auth.TokenFile = tokenFile
	s := runServer(t, cfg)
	applyConfig(t, s, cfg)
	url := s.NATS().ClientURL()
	for name, opt := range map[string]nats.Option{
		"no token":    nats.Name("anonymous"),
		"wrong token": nats.Token("0123456789abcdef-wrong"),
		"a user":      nats.UserInfo("app", "0123456789abcdef-token"),
		"internal":    nats.UserInfo(config.InternalUser, "0123456789abcdef-token"),
	} {
		if nc, err := nats.Connect(url, opt, nats.MaxReconnects(0)); err == nil {
			nc.Close()
			t.Errorf("%s: connected", name)
		}
	}
	nc, err := nats.Connect(url, nats.Token("0123456789abcdef-token"))
	if err != nil {
		t.Fatalf("token: %v", err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if _, err := js.Publish(natstest.Context(t), "orders.token", []byte("x")); err != nil {
		t.Fatalf("publish with the token: %v", err)
	}
	checkInternalConnection(t, s, js)

	// A bcrypt-hashed token in the config works too.
	if !matchToken(bcryptHash(t, "0123456789abcdef-token"), "0123456789abcdef-token") || matchToken(bcryptHash(t, "a"), "b") {
		t.Error("bcrypt token comparison")
	}
}

func TestSecretFileReadableByOthersRefusesStart(t *testing.T) {
	t.Parallel()
	cfg := configtest.Default(t)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("0123456789abcdef-token"), 0o644); err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(tokenFile, 0o644)
	cfg.Auth.TokenFile = tokenFile
	log, _ := natstest.Logger(t)
	err := openWithin(t, New(cfg, log), 20*time.Second)
	if err == nil || !strings.Contains(err.Error(), "auth.token_file") || !strings.Contains(err.Error(), "mode 0644") {
		t.Fatalf("Open = %v, want a refusal naming auth.token_file and its mode", err)
	}
}

func TestTLS(t *testing.T) {
	t.Parallel()
	certs, err := testcert.Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Run("server certificate", func(t *testing.T) {
		t.Parallel()
		cfg := configtest.Default(t)
		cfg.TLS = config.TLSConfig{CertFile: certs.ServerCert, KeyFile: certs.ServerKey, MinVersion: "1.2"}
		s := runServer(t, cfg)
		applyConfig(t, s, cfg)
		url := s.NATS().ClientURL()
		if nc, err := nats.Connect(url, nats.MaxReconnects(0)); err == nil {
			nc.Close()
			t.Error("a client without the CA connected")
		} else if !strings.Contains(err.Error(), "certificate") {
			t.Errorf("error %v, want a certificate error", err)
		}
		if nc, err := nats.Connect(url, nats.RootCAs(certs.OtherCA), nats.MaxReconnects(0)); err == nil {
			nc.Close()
			t.Error("a client trusting another CA connected")
		}
		nc, err := nats.Connect(url, nats.RootCAs(certs.CA))
		if err != nil {
			t.Fatalf("a client with the CA: %v", err)
		}
		defer nc.Close()
		if !nc.TLSRequired() {
			t.Error("connection not TLS")
		}
		js, _ := jetstream.New(nc)
		if _, err := js.Publish(natstest.Context(t), "orders.tls", []byte("x")); err != nil {
			t.Fatal(err)
		}
		checkInternalConnection(t, s, nil)
	})
	t.Run("verify client certificates", func(t *testing.T) {
		t.Parallel()
		cfg := configtest.Default(t)
		cfg.TLS = config.TLSConfig{CertFile: certs.ServerCert, KeyFile: certs.ServerKey, CAFile: certs.CA, Verify: true, MinVersion: "1.3"}
		s := runServer(t, cfg)
		applyConfig(t, s, cfg)
		url := s.NATS().ClientURL()
		if nc, err := nats.Connect(url, nats.RootCAs(certs.CA), nats.MaxReconnects(0)); err == nil {
			nc.Close()
			t.Error("a client without a certificate connected")
		}
		nc, err := nats.Connect(url, nats.RootCAs(certs.CA), nats.ClientCert(certs.ClientCert, certs.ClientKey))
		if err != nil {
			t.Fatalf("a client with a certificate: %v", err)
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		if _, err := js.Publish(natstest.Context(t), "orders.mtls", []byte("x")); err != nil {
			t.Fatal(err)
		}
		checkInternalConnection(t, s, nil)
	})
}

// treeDigest hashes every file's path and content under dir.
func treeDigest(t *testing.T, dir string) string {
	t.Helper()
	var lines []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() == store.LockFileName {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		lines = append(lines, fmt.Sprintf("%s %x", strings.TrimPrefix(p, dir), sha256.Sum256(b)))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

func writeKey(t *testing.T, dir, name, key string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestEncryptionAtRest(t *testing.T) {
	t.Parallel()
	const canary = "PLAINTEXT-CANARY-4f1c2a"
	keys := t.TempDir()
	key := writeKey(t, keys, "key", strings.Repeat("0123456789", 5))
	cfg := configtest.Default(t)
	cfg.JetStream.EncryptionKeyFile = key

	open := func(cfg *config.Config) (*Server, error) {
		log, _ := natstest.Logger(t)
		s := New(cfg, log)
		s.ReadyTimeout = 30 * time.Second
		return s, openWithin(t, s, 30*time.Second)
	}
	s, err := open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	applyConfig(t, s, cfg)
	ctx := natstest.Context(t)
	for i := range 50 {
		if _, err := s.JetStream().Publish(ctx, "orders.secret", []byte(fmt.Sprintf("%s-%d", canary, i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if f := grepTree(t, cfg.JetStream.StoreDir, []byte(canary)); f != "" {
		t.Fatalf("payload found in clear text in %s", f)
	}
	before := treeDigest(t, cfg.JetStream.StoreDir)

	readBack := func(t *testing.T, cfg *config.Config) {
		t.Helper()
		s, err := open(cfg)
		if err != nil {
			t.Fatalf("restart: %v", err)
		}
		defer s.Close(context.Background())
		st, err := s.JetStream().Stream(ctx, "ORDERS")
		if err != nil {
			t.Fatal(err)
		}
		if n := st.CachedInfo().State.Msgs; n != 50 {
			t.Fatalf("%d messages after restart, want 50", n)
		}
		m, err := st.GetMsg(ctx, 50)
		if err != nil || string(m.Data) != canary+"-49" {
			t.Fatalf("message 50 = %v, %v", m, err)
		}
	}

	t.Run("same key reads", func(t *testing.T) { readBack(t, cfg) })
	before = treeDigest(t, cfg.JetStream.StoreDir)

	for name, change := range map[string]func(c *config.Config){
		"wrong key": func(c *config.Config) {
			c.JetStream.EncryptionKeyFile = writeKey(t, keys, "wrong", strings.Repeat("x", 40))
		},
		"missing key": func(c *config.Config) { c.JetStream.EncryptionKeyFile = "" },
	} {
		t.Run(name, func(t *testing.T) {
			bad := *cfg
			change(&bad)
			s, err := open(&bad)
			if err == nil {
				s.Close(context.Background())
				t.Fatal("started with a key that does not open the store")
			}
			if !errors.Is(err, store.ErrEncryptionKey) || !strings.Contains(err.Error(), "ORDERS") || !strings.Contains(err.Error(), "nothing was changed on disk") {
				t.Errorf("error %v does not say which stream and that the key is the problem", err)
			}
			if after := treeDigest(t, cfg.JetStream.StoreDir); after != before {
				t.Errorf("the store changed:\nbefore\n%s\nafter\n%s", before, after)
			}
		})
	}
	t.Run("right key after refusals", func(t *testing.T) { readBack(t, cfg) })

	t.Run("rotation with the old key", func(t *testing.T) {
		rotated := *cfg
		rotated.JetStream.EncryptionKeyFile = writeKey(t, keys, "new", strings.Repeat("n", 48))
		rotated.JetStream.EncryptionOldKeyFile = key
		readBack(t, &rotated)
		rotated.JetStream.EncryptionOldKeyFile = ""
		readBack(t, &rotated)
		if _, err := open(cfg); !errors.Is(err, store.ErrEncryptionKey) {
			t.Errorf("the old key still opens the store after rotation: %v", err)
		}
	})
}

func TestEncryptionControl(t *testing.T) {
	t.Parallel()
	// Without a key the payload is in the store in clear text: the grep
	// in TestEncryptionAtRest would find it.
	cfg := configtest.Default(t)
	s := runServer(t, cfg)
	applyConfig(t, s, cfg)
	if _, err := s.JetStream().Publish(natstest.Context(t), "orders.plain", []byte("PLAINTEXT-CONTROL-77")); err != nil {
		t.Fatal(err)
	}
	if f := grepTree(t, cfg.JetStream.StoreDir, []byte("PLAINTEXT-CONTROL-77")); f == "" {
		t.Fatal("the control payload is not in the store: the grep proves nothing")
	}
}

func TestOptionsLimits(t *testing.T) {
	cfg := configtest.Default(t)
	cfg.Server.MaxConnections = 7
	cfg.Server.MaxSubscriptions = 9
	opts := Options(cfg, t.TempDir())
	if opts.MaxConn != 7 || opts.MaxSubs != 9 {
		t.Errorf("MaxConn %d MaxSubs %d, want 7 and 9", opts.MaxConn, opts.MaxSubs)
	}
	def := Options(config.DefaultConfig(), t.TempDir())
	if def.MaxConn != 1024 || def.MaxSubs != 10_000 || def.Host != "127.0.0.1" || len(def.Users) != 0 || def.TLSConfig != nil {
		t.Errorf("default options: MaxConn %d MaxSubs %d Host %s", def.MaxConn, def.MaxSubs, def.Host)
	}
}

// A key added to an existing unencrypted store: the server encrypts the
// streams at that start, and they stay readable.
func TestEncryptionAddedToPlainStore(t *testing.T) {
	t.Parallel()
	cfg := configtest.Default(t)
	s := runServer(t, cfg)
	applyConfig(t, s, cfg)
	if _, err := s.JetStream().Publish(natstest.Context(t), "orders.before", []byte("PLAIN-BEFORE-KEY")); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	cfg.JetStream.EncryptionKeyFile = writeKey(t, t.TempDir(), "key", strings.Repeat("k", 40))
	s2 := runServer(t, cfg)
	st, err := s2.JetStream().Stream(natstest.Context(t), "ORDERS")
	if err != nil {
		t.Fatalf("the unencrypted stream is gone after adding a key: %v", err)
	}
	if n := st.CachedInfo().State.Msgs; n != 1 {
		t.Errorf("%d messages, want 1", n)
	}
	if _, err := s2.JetStream().Publish(natstest.Context(t), "orders.after", []byte("PLAIN-AFTER-KEY")); err != nil {
		t.Fatal(err)
	}
	if err := s2.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The server converts the existing stream when it starts with a key.
	for _, p := range []string{"PLAIN-BEFORE-KEY", "PLAIN-AFTER-KEY"} {
		if f := grepTree(t, cfg.JetStream.StoreDir, []byte(p)); f != "" {
			t.Errorf("%s in clear text in %s", p, f)
		}
	}
	s3 := runServer(t, cfg)
	if st, err := s3.JetStream().Stream(natstest.Context(t), "ORDERS"); err != nil || st.CachedInfo().State.Msgs != 2 {
		t.Errorf("after conversion: %v", err)
	}
}

// TestReservedSubjects: whatever the [auth] mode, clients other than
// holdfast's own identity can neither publish JetStream advisories (a
// forged MAX_DELIVERIES advisory made holdfast dead-letter a message that
// had succeeded) or dead letters (found 2026-12-04) nor subscribe to
// $HOLDFAST.> (a rogue responder answered `holdfast status`). Without [auth] anything else still works without
// credentials, as before.
func TestReservedSubjects(t *testing.T) {
	t.Parallel()
	tokenFile := clientTokenFile(t)
	for _, tc := range []struct {
		name  string
		setup func(*config.Config)
		opt   nats.Option
	}{
		{"no auth", func(*config.Config) {}, nats.Name("anonymous")},
		{"user without permissions", func(c *config.Config) {
			c.Auth.Users = map[string]*config.UserConfig{"ops": {Password: bcryptHash(t, "ops-password")}}
		}, nats.UserInfo("ops", "ops-password")},
		{"token", func(c *config.Config) { c.Auth.TokenFile = tokenFile }, nats.Token("0123456789abcdef-token")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := configtest.Default(t)
			tc.setup(cfg)
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			s := runServer(t, cfg)
			applyConfig(t, s, cfg)
			ctx := natstest.Context(t)

			// What holdfast itself listens to.
			adv, err := s.Conn().SubscribeSync("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.ORDERS.WORKER1")
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Conn().Flush(); err != nil {
				t.Fatal(err)
			}

			errs := make(chan error, 10)
			nc, err := nats.Connect(s.NATS().ClientURL(), tc.opt, nats.MaxReconnects(0),
				nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
			if err != nil {
				t.Fatalf("connect: %v", err)
			}
			defer nc.Close()
			js, _ := jetstream.New(nc)
			if _, err := js.Publish(ctx, "orders.created", []byte("x")); err != nil {
				t.Fatalf("ordinary publish refused: %v", err)
			}

			if err := nc.Publish("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.ORDERS.WORKER1", []byte(`{"stream_seq":1}`)); err != nil {
				t.Fatal(err)
			}
			_ = nc.Flush()
			if m, err := adv.NextMsg(time.Second); err == nil {
				t.Fatalf("a client forged an advisory: %s", m.Data)
			}
			// violation waits for the server's answer to what was just
			// sent: a permissions violation for it (kind: publish or
			// subscription).
			violation := func(what, kind string) {
				t.Helper()
				_ = nc.Flush()
				select {
				case err := <-errs:
					if !strings.Contains(strings.ToLower(err.Error()), "permissions violation for "+kind) {
						t.Fatalf("%s: %v, want a %s permissions violation", what, err, kind)
					}
				case <-time.After(5 * time.Second):
					t.Fatalf("no permissions violation for %s", what)
				}
			}
			violation("the forged advisory", "publish")

			// A forged dead letter: dlq ls would list it, and a flood
			// of them could fill the stream the real ones need.
			if err := nc.Publish("dlq.WORKER1.orders.created", []byte("forged")); err != nil {
				t.Fatal(err)
			}
			violation("the forged dead letter", "publish")

			if _, err := nc.Subscribe("$HOLDFAST.STATUS.holdfast-test", func(*nats.Msg) {}); err != nil {
				t.Fatal(err)
			}
			violation("a subscription to $HOLDFAST.>", "subscription")
		})
	}
}

// TestSystemAccount: the standard tools' server-wide requests (`nats server
// info|list|report`) need the system account. Without [auth] on loopback
// the passwordless user "system" gets in (natscli sends `--user system` as
// a token; both forms work); a port beyond loopback without auth never
// offers it; with [auth] a user marked system = true does. The system
// account sees no streams, and other users cannot ask.
func TestSystemAccount(t *testing.T) {
	t.Parallel()
	ping := func(t *testing.T, url string, opts ...nats.Option) error {
		t.Helper()
		nc, err := nats.Connect(url, append(opts, nats.MaxReconnects(0))...)
		if err != nil {
			return err
		}
		defer nc.Close()
		msg, err := nc.Request("$SYS.REQ.SERVER.PING.VARZ", nil, 5*time.Second)
		if err != nil {
			return err
		}
		if !strings.Contains(string(msg.Data), `"server_id"`) {
			return fmt.Errorf("VARZ answer without a server id: %.200s", msg.Data)
		}
		return nil
	}

	t.Run("no auth, loopback", func(t *testing.T) {
		s := runServer(t, configtest.Default(t))
		url := s.NATS().ClientURL()
		if err := ping(t, url, nats.UserInfo(SystemUser, "")); err != nil {
			t.Errorf("user system: %v", err)
		}
		if err := ping(t, url, nats.Token(SystemUser)); err != nil {
			t.Errorf("token system (natscli --user system): %v", err)
		}
		if err := ping(t, url); err == nil {
			t.Error("an anonymous client got a system-account answer")
		}
		if err := ping(t, url, nats.UserInfo(SystemUser, "guess")); err == nil {
			t.Error("user system with a password connected")
		}
		if err := ping(t, url, nats.UserInfo("someone", "x")); err == nil {
			t.Error("unknown credentials connected")
		}
	})
	t.Run("no auth beyond loopback", func(t *testing.T) {
		cfg := configtest.Default(t)
		cfg.Server.Host = "0.0.0.0"
		cfg.Server.AllowAnonymous = true
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		s := runServer(t, cfg)
		url := fmt.Sprintf("nats://127.0.0.1:%d", s.NATS().Addr().(*net.TCPAddr).Port)
		if err := ping(t, url, nats.UserInfo(SystemUser, "")); err == nil {
			t.Error("the passwordless system user is offered on a port beyond loopback")
		}
		if err := ping(t, url, nats.Token(SystemUser)); err == nil {
			t.Error("the system token is offered on a port beyond loopback")
		}
	})
	t.Run("auth user marked system", func(t *testing.T) {
		cfg := configtest.Default(t)
		cfg.Auth.Users = map[string]*config.UserConfig{
			"ops": {Password: bcryptHash(t, "ops-password"), System: true},
			"app": {Password: bcryptHash(t, "app-password")},
		}
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		s := runServer(t, cfg)
		url := s.NATS().ClientURL()
		if err := ping(t, url, nats.UserInfo("ops", "ops-password")); err != nil {
			t.Errorf("system user ops: %v", err)
		}
		if err := ping(t, url, nats.UserInfo("app", "app-password")); err == nil {
			t.Error("user app (not system) got a system-account answer")
		}
		if err := ping(t, url, nats.UserInfo(SystemUser, "")); err == nil {
			t.Error("the passwordless system user is offered with [auth]")
		}
	})
}

// TestInternalRepliesExpire: the server keeps the reply subject of each
// message the internal identity receives until it answers or the
// response permission expires. Group commit receives every publish and
// never answers those the stream answers itself (passed on with the
// client's reply): with no expiry the server kept an entry per such
// publish for good under [auth] (measured: the heap grew about 60 bytes
// per publish over 200,000, and stayed flat without [auth]).
func TestInternalRepliesExpire(t *testing.T) {
	r := InternalPermissions().Response
	if r == nil || r.Expires <= 0 {
		t.Fatalf("response permission %+v: replies the internal identity does not answer are kept for ever", r)
	}
	// Group commit answers a batch's clients up to 30 s after sending it.
	if r.Expires < time.Minute {
		t.Fatalf("response permission expires after %v: group commit's late answers would be refused", r.Expires)
	}
}

// TestAnonymousRefusedWithAuth: with [auth], a client without credentials
// is refused whatever else is configured: a system user, a host beyond
// loopback, a leafnode listener. The server's own no-auth user for a
// system account plus $G must never come back (TestAssumeSystemAccountAddsNoAuthUser).
func TestAnonymousRefusedWithAuth(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name             string
		host             string
		system, leafnode bool
		token            bool
	}{
		{name: "loopback, system user", host: "127.0.0.1", system: true},
		{name: "any host, system user", host: "0.0.0.0", system: true},
		{name: "any host, system user, leafnode listener", host: "0.0.0.0", system: true, leafnode: true},
		{name: "loopback, no system user", host: "127.0.0.1"},
		{name: "any host, token", host: "0.0.0.0", token: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := configtest.Default(t)
			cfg.Server.Host = tc.host
			if tc.token {
				cfg.Auth.Token = "a-long-shared-token-0123456789"
			} else {
				cfg.Auth.Users = map[string]*config.UserConfig{"app": {Password: bcryptHash(t, "app-password")}}
				if tc.system {
					cfg.Auth.Users["admin"] = &config.UserConfig{Password: bcryptHash(t, "admin-password"), System: true}
				}
			}
			if tc.leafnode {
				cfg.LeafNodes.Listen = fmt.Sprintf("127.0.0.1:%d", natstest.FreePort(t))
			}
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			s := runServer(t, cfg)
			url := fmt.Sprintf("nats://127.0.0.1:%d", s.NATS().Addr().(*net.TCPAddr).Port)
			nc, err := nats.Connect(url, nats.MaxReconnects(0))
			if err == nil {
				defer nc.Close()
				js, _ := jetstream.New(nc)
				_, serr := js.Stream(natstest.Context(t), "ORDERS")
				t.Fatalf("a client without credentials connected (stream info: %v)", serr)
			}
			if !strings.Contains(strings.ToLower(err.Error()), "authorization") {
				t.Errorf("error %v, want an authorization violation", err)
			}
		})
	}
}

// TestServerAddsNoUsers: the users the server lets in are exactly those
// holdfast configured, for every kind of node (with a cluster, whose
// start needs its peers, the options are checked as the server takes them).
func TestServerAddsNoUsers(t *testing.T) {
	t.Parallel()
	cfg := configtest.Default(t)
	cfg.Server.Host = "0.0.0.0"
	cfg.Auth.Users = map[string]*config.UserConfig{
		"app":   {Password: bcryptHash(t, "app-password")},
		"admin": {Password: bcryptHash(t, "admin-password"), System: true},
	}
	cfg.Cluster.Name = "c1"
	cfg.Cluster.Listen = fmt.Sprintf("127.0.0.1:%d", natstest.FreePort(t))
	cfg.Cluster.Routes = []string{"nats-route://" + cfg.Cluster.Listen}
	cfg.LeafNodes.Listen = fmt.Sprintf("127.0.0.1:%d", natstest.FreePort(t))
	for _, st := range cfg.Streams {
		st.Replicas = 1
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	sec, err := cfg.LoadSecrets()
	if err != nil {
		t.Fatal(err)
	}
	opts := Options(cfg, cfg.JetStream.StoreDir)
	id, _ := newInternalIdentity()
	if err := configureSecurity(opts, cfg, sec, id); err != nil {
		t.Fatal(err)
	}
	configured, _ := userNames(opts)
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	ns.Shutdown()
	if err := checkEffectiveUsers(opts, configured); err != nil {
		t.Fatal(err)
	}
	names, noAuth := userNames(opts)
	slices.Sort(names)
	if want := []string{"admin", "app", config.InternalUser}; !slices.Equal(names, want) || noAuth != "" {
		t.Errorf("users %v, no-auth user %q; want %v and none", names, noAuth, want)
	}

	// The guard itself: a user the server added is refused by name.
	opts.Users = append(opts.Users, &server.User{Username: "nats-added"})
	if err := checkEffectiveUsers(opts, configured); err == nil || !strings.Contains(err.Error(), `"nats-added"`) {
		t.Errorf("an added user: %v", err)
	}
}

// TestGroupCommitQueueReserved: only holdfast's own identity may join
// group commit's queue group on a stream's subjects. A client in it takes
// its share of the publishes away from the ingest (never stored), and
// with the right to answer requests it gets (allow_responses, or none
// needed without [auth]) it can answer them with a PubAck: the publisher
// is told its message is stored and it is not. Ordinary subscriptions,
// and queue subscriptions in other groups, still get every message.
func TestGroupCommitQueueReserved(t *testing.T) {
	t.Parallel()
	tokenFile := clientTokenFile(t)
	for _, tc := range []struct {
		name  string
		setup func(*config.Config)
		opt   nats.Option
		pub   nats.Option // a publisher's credentials
	}{
		{"no auth", func(*config.Config) {}, nats.Name("anonymous"), nats.Name("anonymous")},
		{"tap user", func(c *config.Config) {
			c.Auth.Users = map[string]*config.UserConfig{
				"tap": {
					Password: bcryptHash(t, "tap-password"), PublishAllow: []string{"reports.>"},
					SubscribeAllow: []string{"orders.>"}, AllowResponses: true,
				},
				"app": {Password: bcryptHash(t, "app-password"), PublishAllow: []string{"orders.>"}},
			}
		}, nats.UserInfo("tap", "tap-password"), nats.UserInfo("app", "app-password")},
		{"token", func(c *config.Config) { c.Auth.TokenFile = tokenFile }, nats.Token("0123456789abcdef-token"), nats.Token("0123456789abcdef-token")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := configtest.Default(t)
			tc.setup(cfg)
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			s := runServer(t, cfg)
			queue := subjects.GroupCommitQueue("ORDERS")

			errs := make(chan error, 10)
			nc, err := nats.Connect(s.NATS().ClientURL(), tc.opt, nats.MaxReconnects(0),
				nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
			if err != nil {
				t.Fatalf("connect: %v", err)
			}
			defer nc.Close()
			for _, subj := range []string{"orders.*", "orders.>", "orders.created"} {
				if _, err := nc.QueueSubscribe(subj, queue, func(*nats.Msg) {}); err != nil {
					t.Fatal(err)
				}
				_ = nc.Flush()
				select {
				case err := <-errs:
					if !strings.Contains(strings.ToLower(err.Error()), "permissions violation for subscription") {
						t.Fatalf("%s in %s: %v, want a subscription permissions violation", subj, queue, err)
					}
				case <-time.After(5 * time.Second):
					t.Fatalf("a client joined %s on %s", queue, subj)
				}
			}

			// What stays allowed gets every message.
			plain, err := nc.SubscribeSync("orders.*")
			if err != nil {
				t.Fatal(err)
			}
			other, err := nc.QueueSubscribeSync("orders.*", "workers")
			if err != nil {
				t.Fatal(err)
			}
			_ = nc.Flush()
			// The internal identity's own queue subscription still works.
			own, err := s.Conn().QueueSubscribeSync("orders.*", queue)
			if err != nil {
				t.Fatal(err)
			}
			_ = s.Conn().Flush()
			pub, err := nats.Connect(s.NATS().ClientURL(), tc.pub)
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close()
			for i := range 3 {
				if err := pub.Publish(fmt.Sprintf("orders.m%d", i), []byte("x")); err != nil {
					t.Fatal(err)
				}
			}
			_ = pub.Flush()
			for _, sub := range []*nats.Subscription{plain, other, own} {
				for i := range 3 {
					if _, err := sub.NextMsg(5 * time.Second); err != nil {
						t.Fatalf("%s %q: message %d: %v", sub.Subject, sub.Queue, i, err)
					}
				}
			}
			select {
			case err := <-errs:
				t.Fatalf("unexpected: %v", err)
			default:
			}
		})
	}
}

// TestMaxDeliveriesQueueReserved: only holdfast's own identity may join
// the queue group of the workers' max-deliveries advisory subscription.
// A client in it (a monitoring user allowed to watch $JS.EVENT.>) takes a
// share of the advisories: the message the server stopped delivering is
// then neither handled nor dead-lettered, and nothing reports it. Watching
// the advisories outside the group stays allowed.
func TestMaxDeliveriesQueueReserved(t *testing.T) {
	t.Parallel()
	const subj = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.ORDERS.WORKER1"
	for _, tc := range []struct {
		name  string
		setup func(*config.Config)
		opt   nats.Option
	}{
		{"no auth", func(*config.Config) {}, nats.Name("anonymous")},
		{"monitoring user", func(c *config.Config) {
			c.Auth.Users = map[string]*config.UserConfig{"mon": {
				Password: bcryptHash(t, "mon-password"), PublishAllow: []string{"none.>"},
				SubscribeAllow: []string{"$JS.EVENT.>"},
			}}
		}, nats.UserInfo("mon", "mon-password")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := configtest.Default(t)
			tc.setup(cfg)
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			s := runServer(t, cfg)
			errs := make(chan error, 10)
			nc, err := nats.Connect(s.NATS().ClientURL(), tc.opt, nats.MaxReconnects(0),
				nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
			if err != nil {
				t.Fatalf("connect: %v", err)
			}
			defer nc.Close()
			for _, sub := range []string{subj, "$JS.EVENT.>"} {
				if _, err := nc.QueueSubscribe(sub, subjects.MaxDeliveriesQueue, func(*nats.Msg) {}); err != nil {
					t.Fatal(err)
				}
				_ = nc.Flush()
				select {
				case err := <-errs:
					if !strings.Contains(strings.ToLower(err.Error()), "permissions violation for subscription") {
						t.Fatalf("%s: %v, want a subscription permissions violation", sub, err)
					}
				case <-time.After(5 * time.Second):
					t.Fatalf("a client joined %s on %s", subjects.MaxDeliveriesQueue, sub)
				}
			}
			if _, err := nc.SubscribeSync(subj); err != nil {
				t.Fatal(err)
			}
			_ = nc.Flush()
			select {
			case err := <-errs:
				t.Fatalf("watching the advisories: %v", err)
			case <-time.After(200 * time.Millisecond):
			}
		})
	}
}

// clientToken is the [auth] token clientTokenFile holds.
const clientToken = "0123456789abcdef-token"

// clientTokenFile writes clientToken to a token_file only its owner reads.
func clientTokenFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte(clientToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
