package embedded

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync/atomic"

	"github.com/nats-io/nats-server/v2/server"
	"golang.org/x/crypto/bcrypt"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/embedded/store"
	"github.com/holdfast-io/holdfast/internal/subjects"
)

// internalIdentity is the credential of holdfast's own in-process
// connection. It is generated at every start, lives only in memory, and is
// never logged or written.
type internalIdentity struct {
	user     string
	password string
}

func newInternalIdentity() (internalIdentity, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return internalIdentity{}, fmt.Errorf("cannot generate the internal identity: %w", err)
	}
	return internalIdentity{user: config.InternalUser, password: base64.RawURLEncoding.EncodeToString(b)}, nil
}

// String keeps the password out of any accidental %v.
func (id internalIdentity) String() string { return id.user }

// InternalPermissions are what the in-process connection needs, and no
// more: the JetStream API (bootstrap, fetching, dead-letter reading), acks,
// dead letters (dlq.>), replies to its own requests (_INBOX.>), the
// JetStream advisories (max deliveries and terminations for the workers and
// the monitor, stream and consumer changes for the store-state recorder),
// the status subject it answers (replies go to the asker's inbox
// through the response permission), and group commit: the publishes on the
// streams' subjects, answered by PubAcks through the response permission,
// and its batches under subjects.GroupCommitPrefix.
func InternalPermissions() *server.Permissions {
	return &server.Permissions{
		Publish: &server.SubjectPermission{
			Allow: []string{"$JS.API.>", "$JS.ACK.>", subjects.DeadLetterPrefix + ">", subjects.GroupCommitPrefix + ">", subjects.BarrierPrefix + ">",
				// the status page's replays
				subjects.Replay("*")},
		},
		// ">" for group commit: the ingest answers the publishes on the
		// subjects of streams with group_commit, which a reload may
		// change; this identity may read every stream through the API anyway.
		Subscribe: &server.SubjectPermission{
			Allow: []string{">"},
		},
		// The server remembers the reply subject of every message this
		// identity receives until it answers, or until Expires: group
		// commit receives each client publish and leaves the answer of
		// those it passes on with the client's reply to the stream, so
		// without Expires the server would keep an entry per such
		// publish for good. Group commit answers within 30 s of sending
		// a batch.
		Response: &server.ResponsePermission{MaxMsgs: 1, Expires: InternalReplyExpiry},
	}
}

// InternalReplyExpiry is how long the internal identity may answer a
// request it received (the server's default for allow_responses).
const InternalReplyExpiry = server.DEFAULT_ALLOW_RESPONSE_EXPIRATION

// AnonymousUser is the identity of clients that connect without
// credentials when no [auth] is configured (the server's no_auth_user).
const AnonymousUser = "anonymous"

// SystemUser is the user, without a password, that may log in to the
// server's system account (`nats --user system server info`) when no
// [auth] is configured and the client port is on loopback only. With
// [auth], users marked system = true do instead.
const SystemUser = "system"

// serverCreated tells the authenticator that needs it which server it
// serves.
func serverCreated(opts *server.Options, ns *server.Server) {
	if a, ok := opts.CustomClientAuthentication.(*localAuth); ok {
		a.ns.Store(ns)
	}
}

// systemAccount returns the server's system account, added to opts.
func systemAccount(opts *server.Options) *server.Account {
	for _, a := range opts.Accounts {
		if a.Name == server.DEFAULT_SYSTEM_ACCOUNT {
			return a
		}
	}
	sys := server.NewAccount(server.DEFAULT_SYSTEM_ACCOUNT)
	opts.Accounts = append(opts.Accounts, sys)
	opts.SystemAccount = server.DEFAULT_SYSTEM_ACCOUNT
	return sys
}

// Subjects only holdfast's own identity may use, whatever the config:
// nobody else may publish JetStream advisories (a forged max-deliveries
// advisory would have a message dead-lettered), publish past group
// commit into a stream's prefixed subjects or onto the MQTT gate's
// barrier subjects (a message there would be stored), put a message
// among the dead letters (a flood of them could fill a dead-letter stream
// that then refuses the real ones), or subscribe to holdfast's internal
// subjects (a rogue responder could answer `holdfast status`).
// Requests to $HOLDFAST.STATUS.<server> and $HOLDFAST.RELOAD.<server>
// (both only read) stay allowed to everyone.
var (
	reservedPublish   = []string{"$JS.EVENT.>", subjects.GroupCommitPrefix + ">", subjects.BarrierPrefix + ">", subjects.DeadLetterPrefix + ">", subjects.RetiredPrefix + ">"}
	reservedSubscribe = []string{subjects.Internal + ">"}
)

// reservedQueues are the subscribe deny entries, on every subject, for
// the queue groups holdfast's own subscriptions share across nodes: the
// workers' max-deliveries advisories (a client in that group takes a
// share of them, and those messages are never dead-lettered), and group
// commit's of each stream of cfg (whether group_commit is on now or not:
// a reload may switch it on; a client in it takes its share of the
// publishes away from holdfast's ingest, never stored, and could answer
// them with a PubAck). A stream a reload adds is not among them until
// the next start.
func reservedQueues(cfg *config.Config) []string {
	out := []string{"> " + subjects.MaxDeliveriesQueue}
	for _, name := range cfg.StreamNames() {
		out = append(out, "> "+subjects.GroupCommitQueue(name))
	}
	return out
}

// userQueues are the queue groups denied to the [auth] users: all of
// reservedQueues, but only the max-deliveries one on a hub whose edges
// log in as these users (no leafnodes.user), where group commit's would stop the hub's own queue
// subscriptions from reaching the edges (the server sends a leafnode its
// user's subscribe denies, and the edge then refuses the hub's interest
// in that group: edges could not forward to a hub stream with
// group_commit). Those users may join group commit's queue group there:
// give the edges leafnodes.user, or keep the users off the streams'
// subjects.
func userQueues(cfg *config.Config) []string {
	if cfg.LeafNodes.Hub() && cfg.LeafNodes.User == "" {
		return []string{"> " + subjects.MaxDeliveriesQueue}
	}
	return reservedQueues(cfg)
}

// withReserved returns p with the reserved subjects, and the queue groups
// in queues (reservedQueues), denied (p may be nil, meaning everything
// else is allowed).
func withReserved(p *server.Permissions, queues []string) *server.Permissions {
	out := &server.Permissions{}
	if p != nil {
		c := *p
		out = &c
	}
	pub := &server.SubjectPermission{}
	if out.Publish != nil {
		*pub = *out.Publish
	}
	pub.Deny = append(slices.Clone(pub.Deny), reservedPublish...)
	out.Publish = pub
	sub := &server.SubjectPermission{}
	if out.Subscribe != nil {
		*sub = *out.Subscribe
	}
	sub.Deny = append(append(slices.Clone(sub.Deny), reservedSubscribe...), queues...)
	out.Subscribe = sub
	return out
}

// userPermissions maps a [auth.users.NAME] table onto the server's
// permissions, with the reserved subjects denied.
func userPermissions(u *config.UserConfig, queues []string) *server.Permissions {
	if len(u.PublishAllow)+len(u.PublishDeny)+len(u.SubscribeAllow)+len(u.SubscribeDeny) == 0 && !u.AllowResponses {
		return withReserved(nil, queues)
	}
	p := &server.Permissions{}
	if len(u.PublishAllow)+len(u.PublishDeny) > 0 {
		p.Publish = &server.SubjectPermission{Allow: u.PublishAllow, Deny: u.PublishDeny}
	}
	if len(u.SubscribeAllow)+len(u.SubscribeDeny) > 0 {
		p.Subscribe = &server.SubjectPermission{Allow: u.SubscribeAllow, Deny: u.SubscribeDeny}
	}
	if u.AllowResponses {
		p.Response = &server.ResponsePermission{MaxMsgs: 1}
	}
	return withReserved(p, queues)
}

// configureSecurity applies [auth], [tls] and the encryption key to opts.
// The in-process connection always authenticates as id. Without [auth],
// clients that present no credentials are AnonymousUser (the server's
// no_auth_user): allowed everything but the reserved subjects.
func configureSecurity(opts *server.Options, cfg *config.Config, sec *config.Secrets, id internalIdentity) error {
	if err := defineAuthorization(opts); err != nil {
		return err
	}
	internal := &server.User{Username: id.user, Password: id.password, Permissions: InternalPermissions()}
	leafPermissions(internal.Permissions, cfg)
	if a := cfg.Auth; !a.Enabled() {
		// Without [auth] every local client may do everything but the
		// reserved subjects; holdfast's own identity keeps no limits
		// either (Go code built around the packages publishes on it).
		// The system account's monitoring (server info, list, reports)
		// is for local operators: never offered without auth on a port
		// beyond loopback (allow_anonymous).
		opts.CustomClientAuthentication = &localAuth{
			internal: id,
			system:   config.IsLoopback(cfg.Server.Host),
			queues:   reservedQueues(cfg),
		}
	} else {
		if a.TokenMode() {
			// The server cannot mix a token with users, and the internal
			// identity is a user: authenticate both here instead.
			opts.CustomClientAuthentication = &tokenAuth{token: sec.Token, internal: internal, queues: reservedQueues(cfg)}
		} else {
			opts.Users = []*server.User{internal}
			for _, name := range a.UserNames() {
				u := a.Users[name]
				perms := userPermissions(u, userQueues(cfg))
				var account *server.Account
				if u.System {
					account = systemAccount(opts)
				}
				if u.Nkey != "" {
					opts.Nkeys = append(opts.Nkeys, &server.NkeyUser{Nkey: u.Nkey, Permissions: perms, Account: account})
					continue
				}
				hash, ok := sec.Passwords[name]
				if !ok || !config.IsBcrypt(hash) {
					return fmt.Errorf("auth.users.%s: no bcrypt password hash", name)
				}
				opts.Users = append(opts.Users, &server.User{Username: name, Password: hash, Permissions: perms, Account: account})
			}
		}
	}

	if t := cfg.TLS; t.Enabled() {
		minVersion := uint16(tls.VersionTLS12)
		if t.MinVersion == "1.3" {
			minVersion = tls.VersionTLS13
		}
		tc, err := server.GenTLSConfig(&server.TLSConfigOpts{
			CertFile: t.CertFile, KeyFile: t.KeyFile, CaFile: t.CAFile,
			Verify: t.Verify, MinVersion: minVersion,
		})
		if err != nil {
			return fmt.Errorf("tls: %w", err)
		}
		opts.TLS = true
		opts.TLSConfig = tc
		opts.TLSVerify = t.Verify
		opts.TLSCaCert = t.CAFile
		opts.TLSCert = t.CertFile
		opts.TLSKey = t.KeyFile
		opts.TLSTimeout = tlsHandshakeTimeout
	}

	if w := cfg.WebSocket; w.Enabled() && !w.NoTLS {
		tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: w.CertFile, KeyFile: w.KeyFile, MinVersion: tls.VersionTLS12})
		if err != nil {
			return fmt.Errorf("websocket TLS: %w", err)
		}
		opts.Websocket.TLSConfig = tc
	}

	if err := configureRoutes(opts, cfg.Cluster, sec); err != nil {
		return err
	}
	if err := configureLeafNodes(opts, cfg, sec); err != nil {
		return err
	}

	if sec.EncryptionKey != "" {
		opts.JetStreamKey = sec.EncryptionKey
		opts.JetStreamOldKey = sec.OldEncryptionKey
		opts.JetStreamCipher = server.ChaCha
		if cfg.JetStream.EncryptionCipher == "aes" {
			opts.JetStreamCipher = server.AES
		}
	}
	return nil
}

// defineAuthorization tells the server that holdfast decides who may
// connect. A server whose options hold a system account and no account
// but $G, and came from no authorization block, adds a password-less user
// for $G and makes it the no-auth user: with [auth.users.X] system = true
// every client without credentials would get in. The flag that turns this
// off is set only by parsing an authorization block.
func defineAuthorization(opts *server.Options) error {
	if err := opts.ProcessConfigString("authorization {}"); err != nil {
		return fmt.Errorf("cannot configure the server's authorization: %w", err)
	}
	return nil
}

// userNames lists the users and nkeys opts lets in, and its no-auth user.
func userNames(opts *server.Options) (names []string, noAuth string) {
	for _, u := range opts.Users {
		names = append(names, u.Username)
	}
	for _, n := range opts.Nkeys {
		names = append(names, n.Nkey)
	}
	return names, opts.NoAuthUser
}

// checkEffectiveUsers refuses a server that lets in anyone holdfast did
// not configure: configured is userNames(opts) before server.NewServer,
// which may add users of its own to opts.
func checkEffectiveUsers(opts *server.Options, configured []string) error {
	names, noAuth := userNames(opts)
	for _, n := range names {
		if !slices.Contains(configured, n) {
			return fmt.Errorf("the NATS server (v%s) added a user %q that holdfast did not configure: refusing to start, as it may let clients in without credentials; report this with the server version", server.VERSION, n)
		}
	}
	if noAuth != "" {
		return fmt.Errorf("the NATS server (v%s) lets clients without credentials in as %q: refusing to start; report this with the server version", server.VERSION, noAuth)
	}
	return nil
}

// localAuth authenticates clients when no [auth] is configured: the
// in-process connection as its internal identity (no limits: Go code
// built around the packages publishes on it), SystemUser with no password
// into the system account (natscli sends `--user system` as a token), and
// a client without credentials as AnonymousUser, allowed everything but
// the reserved subjects. Any other credentials are refused, as the
// server's users and no_auth_user did before.
type localAuth struct {
	internal internalIdentity
	system   bool
	ns       atomic.Pointer[server.Server] // set once the server exists
	// leaf, with leafnodes.user on a hub, is what every leafnode
	// connection must present (checkLeaf).
	leaf *server.User
	// queues are reservedQueues, denied to the anonymous user.
	queues []string
}

// Check implements server.Authentication.
func (a *localAuth) Check(c server.ClientAuthentication) bool {
	if ok, decided := checkLeaf(a.leaf, c); decided {
		return ok
	}
	o := c.GetOpts()
	if o == nil || o.Nkey != "" || o.JWT != "" || o.Sig != "" {
		return false
	}
	switch {
	case o.Username == a.internal.user && o.Token == "" &&
		subtle.ConstantTimeCompare([]byte(o.Password), []byte(a.internal.password)) == 1:
		c.RegisterUser(&server.User{Username: a.internal.user})
	case a.system && o.Password == "" && (o.Username == SystemUser && o.Token == "" || o.Username == "" && o.Token == SystemUser):
		ns := a.ns.Load()
		if ns == nil || ns.SystemAccount() == nil {
			return false
		}
		c.RegisterUser(&server.User{Username: SystemUser, Account: ns.SystemAccount()})
	case o.Username == "" && o.Password == "" && o.Token == "":
		c.RegisterUser(&server.User{Username: AnonymousUser, Permissions: withReserved(nil, clientQueues(c, a.queues))})
	default:
		return false
	}
	return true
}

// tokenAuth authenticates clients against the [auth] token, and the
// in-process connection against its internal identity.
type tokenAuth struct {
	token    string
	internal *server.User
	leaf     *server.User // as localAuth's
	queues   []string     // reservedQueues, denied to the token's clients
}

// Check implements server.Authentication.
func (a *tokenAuth) Check(c server.ClientAuthentication) bool {
	if ok, decided := checkLeaf(a.leaf, c); decided {
		return ok
	}
	o := c.GetOpts()
	if o == nil {
		return false
	}
	if o.Username != "" || o.Nkey != "" || o.JWT != "" {
		if o.Username == a.internal.Username && o.Nkey == "" && o.JWT == "" &&
			subtle.ConstantTimeCompare([]byte(o.Password), []byte(a.internal.Password)) == 1 {
			c.RegisterUser(&server.User{Username: a.internal.Username, Permissions: a.internal.Permissions})
			return true
		}
		return false
	}
	if o.Token == "" || !matchToken(a.token, o.Token) {
		return false
	}
	c.RegisterUser(&server.User{Username: "token", Permissions: withReserved(nil, clientQueues(c, a.queues))})
	return true
}

// clientQueues are the queue groups to deny connection c: queues, but
// none for a leafnode connection. The server sends a leafnode its
// subscribe denies and the other side applies them to the interest it
// receives: a hub's own group-commit queue subscription would no longer
// reach its edges. (For a leafnode the server checks no queue group on
// the subscriptions it forwards anyway.)
func clientQueues(c server.ClientAuthentication, queues []string) []string {
	if c.Kind() == server.LEAF {
		return nil
	}
	return queues
}

// checkLeaf decides a leafnode connection when leaf (leafnodes.user, its
// password plain or a bcrypt hash) is set: it must present exactly that
// user, and gets its permissions. It decides nothing else: other
// connections, and leafnodes when leaf is nil, are the caller's.
func checkLeaf(leaf *server.User, c server.ClientAuthentication) (ok, decided bool) {
	if leaf == nil || c.Kind() != server.LEAF {
		return false, false
	}
	o := c.GetOpts()
	if o == nil || o.Username != leaf.Username || o.Nkey != "" || o.JWT != "" || o.Token != "" || !matchToken(leaf.Password, o.Password) {
		return false, true
	}
	c.RegisterUser(&server.User{Username: leaf.Username, Permissions: leaf.Permissions})
	return true, true
}

// matchToken compares a presented token with the configured one, which
// may be a bcrypt hash.
func matchToken(configured, presented string) bool {
	if strings.HasPrefix(configured, "$2") {
		return bcrypt.CompareHashAndPassword([]byte(configured), []byte(presented)) == nil
	}
	return subtle.ConstantTimeCompare([]byte(configured), []byte(presented)) == 1
}

// checkEncryptedStreams refuses to go on when a stream directory in the
// store holds an encrypted stream the server could not load: with a wrong
// or missing key the server skips such a stream with a warning, and the
// bootstrap would then create an empty stream in its place. Nothing on
// disk has been changed when it returns an error.
func (s *Server) checkEncryptedStreams(ctx context.Context) error {
	dir := filepath.Join(s.store.Path, server.JetStreamStoreDir, server.DEFAULT_GLOBAL_ACCOUNT, "streams")
	entries, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("cannot list the streams in %s: %w", dir, err)
	}
	loaded := map[string]bool{}
	names := s.js.StreamNames(ctx)
	for n := range names.Name() {
		loaded[n] = true
	}
	if err := names.Err(); err != nil {
		return fmt.Errorf("cannot list the loaded streams: %w", err)
	}
	keyFile := s.cfg.JetStream.EncryptionKeyFile
	var unreadable, damaged []string
	for _, e := range entries {
		if !e.IsDir() || loaded[e.Name()] {
			continue
		}
		fi, err := os.Stat(filepath.Join(dir, e.Name(), "meta.key"))
		if err != nil {
			continue // not encrypted: the data-loss check deals with it
		}
		if fi.Size() < store.MinKeyFileLength {
			damaged = append(damaged, filepath.Join(dir, e.Name(), "meta.key"))
			continue
		}
		unreadable = append(unreadable, e.Name())
	}
	if len(damaged) > 0 {
		sort.Strings(damaged)
		return fmt.Errorf("%w: the key file of stream(s) %s is damaged (too short to hold a key): no key can read those streams any more; "+
			"move their directories out of %s to start without them (the data-loss check then reports them), or put them back from a copy; nothing was changed on disk",
			store.ErrEncryptionKey, strings.Join(damaged, ", "), dir)
	}
	if len(unreadable) == 0 {
		return nil
	}
	sort.Strings(unreadable)
	list := strings.Join(unreadable, ", ")
	if keyFile == "" {
		return fmt.Errorf("%w: stream(s) %s in %s are encrypted, but jetstream.encryption_key_file is not set: "+
			"set it to the file holding the key the store was written with; nothing was changed on disk", store.ErrEncryptionKey, list, dir)
	}
	return fmt.Errorf("%w: stream(s) %s in %s cannot be decrypted with the key in %s: it is not the key the store was written with "+
		"(when rotating, put the previous key in jetstream.encryption_old_key_file); nothing was changed on disk", store.ErrEncryptionKey, list, dir, keyFile)
}

// configureRoutes applies the [cluster] route authentication and TLS:
// every node accepts routes that present cluster.user and the password,
// and presents them on the routes it makes.
func configureRoutes(opts *server.Options, cl config.ClusterConfig, sec *config.Secrets) error {
	if !cl.Enabled() {
		return nil
	}
	if cl.User != "" {
		opts.Cluster.Username = cl.User
		opts.Cluster.Password = sec.ClusterPassword
		for _, r := range opts.Routes {
			r.User = url.UserPassword(cl.User, sec.ClusterPassword)
		}
	}
	if cl.TLSEnabled() {
		tc, err := linkTLS("cluster", cl.CertFile, cl.KeyFile, cl.CAFile, cl.Verify)
		if err != nil {
			return err
		}
		opts.Cluster.TLSConfig = tc
		opts.Cluster.TLSTimeout = tlsHandshakeTimeout
	}
	return nil
}

// tlsHandshakeTimeout is the TLS handshake timeout, in seconds, of the
// client port, routes and leafnodes.
const tlsHandshakeTimeout = 2

// linkTLS builds the TLS config of a server-to-server link (routes, the
// leafnode listener, a leafnode remote): TLS 1.2 or later; ca verifies
// the certificate of the node this one dials, and with verify that of a
// node dialing in, which must present one. Errors name the table.
func linkTLS(table, cert, key, ca string, verify bool) (*tls.Config, error) {
	tc, err := server.GenTLSConfig(&server.TLSConfigOpts{
		CertFile: cert, KeyFile: key, CaFile: ca, Verify: verify, MinVersion: tls.VersionTLS12,
	})
	if err != nil {
		return nil, fmt.Errorf("%s TLS: %w", table, err)
	}
	// GenTLSConfig puts the CA only where a listener checks the other
	// side's certificate (ClientCAs); a node dialing out (routes it
	// solicits, leafnode remotes) checks the server's against RootCAs,
	// which would otherwise be the system's. nats-server's own config
	// parsing does the same for routes, gateways and remotes.
	tc.RootCAs = tc.ClientCAs
	return tc, nil
}
