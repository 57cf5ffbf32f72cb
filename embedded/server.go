// Package embedded owns holdfast's NATS server: its options, logger,
// security, cluster routes and leafnodes, start-up with readiness and
// verification, and shutdown. The store directory (validated and locked
// before the server touches it) is embedded/store's; the Server drives it
// during its lifecycle.
package embedded

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/embedded/store"
	"github.com/holdfast-io/holdfast/internal/subjects"
)

// DefaultReadyTimeout bounds how long Open waits for the server to be
// ready, which includes recovering every stream from disk.
const DefaultReadyTimeout = 10 * time.Minute

// Server is holdfast's embedded NATS server with JetStream on a validated,
// locked store directory.
type Server struct {
	cfg  *config.Config
	log  *slog.Logger
	base *slog.Logger

	// ReadyTimeout bounds start-up; DefaultReadyTimeout when zero.
	ReadyTimeout time.Duration
	// OnStatus, when set, is told what start-up is doing (for sd_notify STATUS=).
	OnStatus func(string)
	// seeIdentity, set only by this package's tests, is given the
	// internal password, which nothing else ever sees.
	seeIdentity func(password string)
	// tweakOptions, set only by this package's tests, changes the server's
	// options last: to reach failures of the server that holdfast's own
	// checks would refuse before it starts.
	tweakOptions func(*server.Options)
	// atStep, set only by this package's tests, is told each step of a
	// start once it is done ("ready": the server is; "converted": the
	// copies of the streams it converted are removed): to see the store
	// as a kill at that moment leaves it, or to use the server then.
	atStep func(step string)
	// AcceptDataLoss makes Open go on after a data loss even with
	// jetstream.on_data_loss = "refuse" (for a --accept-data-loss flag).
	AcceptDataLoss bool
	// StateInterval is how often the stream positions are recorded for
	// the start-up data-loss check; DefaultStateInterval when zero.
	StateInterval time.Duration

	mu       sync.Mutex
	store    *store.DirCheck
	lock     *store.Lock
	ns       *server.Server
	nc       *nats.Conn
	js       jetstream.JetStream
	ncClosed chan struct{}
	id       internalIdentity // for Connect
	started  chan struct{}    // closed when ns.Start returned
	closed   bool

	identity *store.Identity // what the store was at Open, for CheckStore
	lost     atomic.Bool     // WatchStore found the store lost

	leaf  *leafLinks    // the remotes' link states, nil without remotes
	nsLog *serverLogger // the server's logger: what it noticed

	losses []store.DataLoss
	// rescued: streams the server deleted at this start, by name, with
	// where their files were put (holdfast-orphans).
	rescued map[string]string
	// guardLeft is the recovery links directory not removed yet (too
	// many open files then): the recorder goroutine retries.
	guardLeft  string
	stopRecord context.CancelFunc
	recordDone chan struct{}
	// syncer flushes the store with jetstream.commit_window (see Flush).
	syncer   *store.Syncer
	recordMu sync.Mutex        // serializes writes of the state file
	recorded *store.StoreState // what the state file holds, as last read or written (recordMu)
	// activity is the last StoreActivity fingerprint, read at activityAt.
	activityMu sync.Mutex
	activity   uint64
	activityAt time.Time
	// connDown holds, per in-process connection (*nats.Conn) that lost
	// its link and has not got it back, when it lost it.
	connDown sync.Map
	// connErrs limits the in-process connections' error lines (see
	// repeatBurst).
	connErrs repeatLimit
}

// New returns a Server for cfg, which must have passed Validate.
func New(cfg *config.Config, log *slog.Logger) *Server {
	if log == nil {
		log = slog.Default()
	}
	return &Server{cfg: cfg, base: log, log: log.With("component", "embedded")}
}

// Options builds the nats-server options for cfg with the store at
// storeDir. Signals are left to holdfast.
func Options(cfg *config.Config, storeDir string) *server.Options {
	js := cfg.JetStream
	opts := &server.Options{
		ServerName:             cfg.Server.Name,
		Host:                   cfg.Server.Host,
		Port:                   cfg.Server.Port,
		MaxPayload:             int32(cfg.Server.MaxPayload.Bytes + subjects.DeadLetterHeadroom),
		JetStream:              true,
		StoreDir:               storeDir,
		JetStreamMaxMemory:     js.MaxMemoryStore.Bytes,
		JetStreamMaxStore:      js.MaxFileStore.Bytes,
		JetStreamDomain:        js.Domain,
		SyncAlways:             js.SyncAlways(),
		NoSigs:                 true,
		DisableJetStreamBanner: true,
		Debug:                  cfg.Log.Level == "debug",
		MaxConn:                cfg.Server.MaxConnections,
		MaxSubs:                cfg.Server.MaxSubscriptions,
	}
	if !opts.SyncAlways {
		opts.SyncInterval = js.SyncInterval()
	}
	if cfg.CommitWindowOn() {
		// The server writes each message to its block before it answers;
		// holdfast flushes (store.Syncer) and answers the publishers.
		opts.SyncAlways, opts.SyncInterval = false, commitWindowBackstop
	}
	if cl := cfg.Cluster; cl.Enabled() {
		host, port, _ := cl.ListenHostPort() // Validate checked it
		opts.Cluster.Name = cl.Name
		opts.Cluster.Host = host
		opts.Cluster.Port = port
		opts.Cluster.NoAdvertise = cl.NoAdvertise
		opts.Cluster.Advertise = cl.Advertise
		opts.Routes = server.RoutesFromStr(strings.Join(cl.Routes, ","))
	}
	leafListenOptions(opts, cfg.LeafNodes)
	if m := cfg.MQTT; m.Enabled() {
		// The server's own MQTT listener, for holdfast's gate only
		// (embedded/mqtt): devices connect to mqtt.listen.
		opts.MQTT.Host = "127.0.0.1"
		opts.MQTT.Port = -1
		opts.MQTT.AckWait = m.AckWait.Duration
		opts.MQTT.MaxAckPending = uint16(m.MaxAckPending)
	}
	if w := cfg.WebSocket; w.Enabled() {
		host, port, _ := w.HostPort() // Validate checked it
		if port == 0 {
			port = -1
		}
		opts.Websocket.Host = host
		opts.Websocket.Port = port
		opts.Websocket.NoTLS = w.NoTLS
		opts.Websocket.AllowedOrigins = websocketOrigins(w.AllowedOrigins)
	}
	return opts
}

// noWebOrigin is an origin no web page has (.invalid is reserved, RFC
// 2606): nats-server accepts every origin when its list is empty, so an
// empty websocket.allowed_origins becomes this list of one, and every
// browser's connection is refused. Clients that are not browsers send no
// Origin header, which the server accepts whatever the list.
const noWebOrigin = "https://no-web-page-may-connect.invalid"

// websocketOrigins is nats-server's AllowedOrigins for
// websocket.allowed_origins: without it a page of any web site, open in a
// browser on a host that reaches the listener, could connect with that
// host's rights (and without [auth], purge every stream).
func websocketOrigins(allowed []string) []string {
	switch {
	case len(allowed) == 0:
		return []string{noWebOrigin}
	case len(allowed) == 1 && allowed[0] == config.AnyOrigin:
		return nil
	}
	return slices.Clone(allowed)
}

// PrepareStore validates and locks the store dir, the first step of Open.
// A caller may take it before anything else (the daemon, before its HTTP
// listener), so that a second instance on the same store is refused by
// the lock, which names the process holding it, rather than by whatever
// else the two share (a port). Close releases the lock.
func (s *Server) PrepareStore() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.prepareStoreLocked()
}

func (s *Server) prepareStoreLocked() error {
	if s.lock != nil {
		return nil
	}
	js := s.cfg.JetStream
	dir, err := store.CheckDir(js.StoreDir, js.AllowTmpfs, js.MaxFileStore.Bytes)
	if err != nil {
		return err
	}
	for _, w := range dir.Warnings {
		s.log.Warn(w)
	}
	if s.lock, err = store.LockDir(dir.Path); err != nil {
		return err
	}
	s.store = dir
	if s.cfg.CommitWindowOn() {
		s.syncer = store.NewSyncer(dir.Path, s.cfg.JetStream.CommitWindow.Duration)
	}
	s.log.Info("store dir ready", "path", s.store.Path, "fs", s.store.FSType, "created", s.store.Created,
		"free", store.HumanBytes(s.store.Free), "max_file_store", store.HumanBytes(js.MaxFileStore.Bytes),
		"max_memory_store", store.HumanBytes(js.MaxMemoryStore.Bytes), "sync", js.Sync, "commit_window", js.CommitWindow.Duration)
	if !js.SyncAlways() {
		s.log.Warn("jetstream.sync is an interval: acknowledged messages written since the last sync are lost on power failure", "sync", js.Sync)
	}
	return nil
}

// Flush returns once what the server stored before the call is on disk,
// when holdfast flushes the store itself (jetstream.commit_window): in one
// flush shared by the callers of a window. Without a commit window the
// server flushed each write before it answered, and Flush does nothing.
func (s *Server) Flush() error {
	if s.syncer == nil {
		return nil
	}
	return s.syncer.Sync()
}

// step tells the tests' atStep that step is done.
func (s *Server) step(step string) {
	if s.atStep != nil {
		s.atStep(step)
	}
}

// commitWindowBackstop is the server's own sync interval with a commit
// window: what holdfast's flushes do not cover (the consumers' state) is
// flushed at least this often.
const commitWindowBackstop = 2 * time.Minute

// Open validates and locks the store dir, starts the server, waits until
// it is ready, verifies JetStream runs on the file store in that directory,
// and connects in-process. If a step fails, the steps before it are undone.
func (s *Server) Open(ctx context.Context) (err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ns != nil {
		return errors.New("embedded server already open")
	}
	defer func() {
		if err != nil {
			s.closeLocked()
		}
	}()

	if err = s.prepareStoreLocked(); err != nil {
		return err
	}
	if err = s.checkStoreCluster(); err != nil {
		return err
	}

	opts := Options(s.cfg, s.store.Path)
	if limit, lowered := store.FileStoreLimit(s.store, opts.JetStreamMaxStore); lowered {
		s.log.Warn("jetstream.max_file_store lowered to what the disk can hold: publishes get an error when the store is full, and work again once messages are removed",
			"max_file_store", store.HumanBytes(opts.JetStreamMaxStore), "limit", store.HumanBytes(limit), "free", store.HumanBytes(s.store.Free))
		opts.JetStreamMaxStore = limit
	}
	secrets, err := s.cfg.LoadSecrets()
	if err != nil {
		return err
	}
	if err := checkRemoteAddresses(ctx, s.cfg.LeafNodes.Remotes); err != nil {
		return err
	}
	id, err := newInternalIdentity()
	if err != nil {
		return err
	}
	if s.seeIdentity != nil {
		s.seeIdentity(id.password)
	}
	s.id = id
	if err := configureSecurity(opts, s.cfg, secrets, id); err != nil {
		return err
	}
	// A message block or definition the server replaced or removed after
	// holdfast's last flush (jetstream.commit_window) is put back as
	// flushed.
	if restored, err := store.RestoreSyncGuard(s.store.Path); err != nil {
		return err
	} else if len(restored) > 0 {
		s.log.Warn("files the server had replaced or removed (a block compacted or emptied by deletes, a stream or consumer edited) since holdfast last flushed them are put back as flushed: "+
			"messages deleted, or an edit made, just before the stop may be undone",
			"files", strings.Join(restored, ","))
	}
	// First put back what an interrupted encrypting start left, then
	// re-seal the key files, then copy what the server is to encrypt.
	encrypting, err := s.protectClearStreams(secrets)
	if err != nil {
		return err
	}
	var guard *store.RecoveryGuard
	var rescued map[string]string
	if !s.cfg.Cluster.Enabled() {
		// A cluster node's streams load after it is ready, in the meta
		// group's hands.
		if guard, rescued, err = store.GuardStreams(s.store.Path, encrypting, s.log); err != nil {
			return err
		}
	}
	if s.tweakOptions != nil {
		s.tweakOptions(opts)
	}
	configured, _ := userNames(opts)
	ns, err := server.NewServer(opts)
	if err != nil {
		return fmt.Errorf("cannot configure NATS server: %w", err)
	}
	if err := checkEffectiveUsers(opts, configured); err != nil {
		ns.Shutdown()
		return err
	}
	serverCreated(opts, ns)
	logger := newServerLogger(s.base.With("component", "nats"))
	s.nsLog = logger
	ns.SetLoggerV2(logger, opts.Debug, false, false)
	s.ns = ns
	s.status("starting NATS server, recovering streams")
	started := make(chan struct{})
	s.started = started
	go func() { defer close(started); ns.Start() }()

	if err := s.waitReady(ctx, logger); err != nil {
		// A server that failed to start (its listener, under the same
		// open files limit) recovered the store first: what it deleted
		// is put back once Start returned. An interrupted start leaves
		// the links for the next one.
		if ctx.Err() == nil {
			select {
			case <-started:
				if _, gerr := guard.Finish(logger.LoadFailures(), s.log); gerr != nil {
					err = fmt.Errorf("%w; %w", err, gerr)
				}
			case <-time.After(5 * time.Second):
			}
		}
		return err
	}
	if err := guard.Ready(); err != nil {
		// The host is short of something (open files, space): the same
		// cause may have made the server fail on streams, which the
		// refusal of Finish names and puts back.
		if _, gerr := guard.Finish(logger.LoadFailures(), s.log); gerr != nil {
			return gerr
		}
		return err
	}
	s.step("ready")
	if err := s.finishEncrypting(encrypting, secrets.EncryptionKey); err != nil {
		return err
	}
	s.step("converted")
	if s.rescued, err = guard.Finish(logger.LoadFailures(), s.log); err != nil {
		return err
	}
	maps.Copy(s.rescued, rescued)
	s.guardLeft = guard.LeftDir()
	if err := s.verify(); err != nil {
		return err
	}
	if err := s.recordStoreIdentity(); err != nil {
		return err
	}
	s.ncClosed = make(chan struct{})
	closedCh := s.ncClosed
	connOpts := append(s.connOptions(ns, id, "holdfast-internal"), nats.DrainTimeout(10*time.Second),
		nats.ClosedHandler(func(*nats.Conn) { close(closedCh) }))
	s.nc, err = nats.Connect("", connOpts...)
	if err != nil {
		return fmt.Errorf("cannot connect in-process: %w", err)
	}
	s.js, err = jetstream.New(s.nc)
	if err != nil {
		return fmt.Errorf("cannot open JetStream API: %w", err)
	}
	if err := s.waitJetStream(ctx); err != nil {
		return err
	}
	// Before anything (the bootstrap) can create a vanished stream anew.
	if err := s.checkEncryptedStreams(ctx); err != nil {
		return err
	}
	if err := s.checkDataLoss(ctx); err != nil {
		return err
	}
	s.startRecorder()
	s.startLeafWatch()
	if l := s.cfg.LeafNodes; l.Hub() || l.Edge() {
		s.log.Info("leafnodes configured", leafSummary(s.cfg)...)
	}
	s.log.Info("NATS server ready", "name", opts.ServerName, "client_url", ns.ClientURL(), "version", server.VERSION)
	return nil
}

// waitJetStream waits until the JetStream API answers. On one node that
// is at once; in a cluster it answers once the meta group has a leader,
// which needs a quorum of the nodes (all of them in a new cluster): until
// then it says every few seconds which of the other nodes it reaches (log
// and STATUS=, clusterWait), up to ReadyTimeout.
func (s *Server) waitJetStream(ctx context.Context) error {
	if !s.cfg.Cluster.Enabled() {
		if _, err := s.js.AccountInfo(ctx); err != nil {
			return fmt.Errorf("JetStream API does not answer: %w", err)
		}
		return nil
	}
	timeout := s.ReadyTimeout
	if timeout == 0 {
		timeout = DefaultReadyTimeout
	}
	start := time.Now()
	others := s.ClusterNodes() - 1
	var lastSaid time.Time
	for {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := s.js.AccountInfo(actx)
		cancel()
		if err == nil {
			// A server with this node's name is refused by this node
			// but joins through the others, which answer at once.
			if err := s.DuplicateName(10 * time.Second); err != nil {
				return err
			}
			s.log.Info("JetStream cluster ready", "cluster", s.cfg.Cluster.Name, "routes", s.ns.NumRoutes(),
				"meta_leader", s.ns.JetStreamIsLeader(), "waited", time.Since(start).Round(time.Millisecond))
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("start-up interrupted: %w", ctx.Err())
		}
		refusal := s.nsLog.RouteRefusal(10 * time.Second)
		if time.Since(start) > timeout {
			if refusal != "" {
				return fmt.Errorf("the JetStream cluster %s has no meta leader after %s (%s): routes are refused: %s", s.cfg.Cluster.Name, timeout, s.clusterWait(others, false), refusal)
			}
			return fmt.Errorf("the JetStream cluster %s has no meta leader after %s (%s): start the other nodes, "+
				"check cluster.routes and that each node reaches the others' cluster.listen: %w", s.cfg.Cluster.Name, timeout, s.clusterWait(others, true), err)
		}
		if time.Since(lastSaid) >= 5*time.Second {
			lastSaid = time.Now()
			msg := fmt.Sprintf("waiting for the JetStream cluster %s: %s", s.cfg.Cluster.Name, s.clusterWait(others, refusal == ""))
			if refusal != "" {
				msg += ": routes are refused: " + refusal
				s.log.Error(msg, "peers_known", len(s.ns.JetStreamClusterPeers()), "waited", time.Since(start).Round(time.Second))
			} else {
				s.log.Info(msg, "peers_known", len(s.ns.JetStreamClusterPeers()), "waited", time.Since(start).Round(time.Second))
			}
			s.status(msg)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("start-up interrupted: %w", ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// clusterWait says what a node waiting for its cluster's meta leader
// sees: which of the other nodes it has routes to and, with newHint while
// its meta group has never had a leader (a new cluster), that a new
// cluster needs every node it expects: nats-server elects the first meta
// leader only with the votes of all of them (empty logs never form a
// quorum). Without newHint (routes refused: the refusal is the cause) it
// leaves that out.
func (s *Server) clusterWait(others int, newHint bool) string {
	routed := map[string]bool{}
	if rz, err := s.ns.Routez(nil); err == nil {
		for _, r := range rz.Routes {
			if r.RemoteName != "" {
				routed[r.RemoteName] = true
			}
		}
	}
	msg := fmt.Sprintf("%d of the %d other node(s) connected", len(routed), others)
	if len(routed) > 0 {
		msg += " (" + strings.Join(slices.Sorted(maps.Keys(routed)), ", ") + ")"
	}
	msg += ", no meta leader yet"
	if size, fresh := s.metaNeverLed(); fresh && newHint {
		msg += fmt.Sprintf(": a new cluster elects its first meta leader only once all %d of its nodes are up: start every node (after that a majority keeps serving)", size)
	}
	return msg
}

// metaNeverLed returns the size of the meta group and whether it is a
// new one: its log empty and no leader seen.
func (s *Server) metaNeverLed() (size int, fresh bool) {
	const metaGroup = "_meta_"
	rz := s.ns.Raftz(&server.RaftzOptions{GroupFilter: metaGroup})
	if rz == nil {
		return 0, false
	}
	for _, groups := range *rz {
		if g, ok := groups[metaGroup]; ok {
			return g.Size, g.PIndex == 0 && !g.EverHadLeader
		}
	}
	return 0, false
}

func (s *Server) status(msg string) {
	if s.OnStatus != nil {
		s.OnStatus(msg)
	}
}

// waitReady polls readiness until the server accepts connections, reports
// a fatal error, or the context or the ready timeout ends.
func (s *Server) waitReady(ctx context.Context, logger *serverLogger) error {
	timeout := s.ReadyTimeout
	if timeout == 0 {
		timeout = DefaultReadyTimeout
	}
	deadline := time.Now().Add(timeout)
	for {
		select {
		case err := <-logger.fatal:
			return fmt.Errorf("NATS server failed to start: %w", err)
		case <-ctx.Done():
			return fmt.Errorf("start-up interrupted: %w", ctx.Err())
		default:
		}
		if s.ns.ReadyForConnections(100 * time.Millisecond) {
			// Start may report a late fatal error (after the listener
			// is up) just before returning; give it no chance to pass.
			select {
			case err := <-logger.fatal:
				return fmt.Errorf("NATS server failed to start: %w", err)
			default:
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("NATS server not ready after %s", timeout)
		}
	}
}

// verify refuses a server that would run without a persistent JetStream
// in the configured directory.
func (s *Server) verify() error {
	if !s.ns.JetStreamEnabled() {
		return errors.New("JetStream is not enabled after start-up: refusing to run without persistence")
	}
	jc := s.ns.JetStreamConfig()
	if jc == nil {
		return errors.New("JetStream reports no configuration: refusing to run")
	}
	want := filepath.Join(s.store.Path, server.JetStreamStoreDir)
	if filepath.Clean(jc.StoreDir) != want {
		return fmt.Errorf("JetStream stores in %s, not in the configured %s: refusing to run", jc.StoreDir, want)
	}
	if jc.MaxStore <= 0 {
		return fmt.Errorf("JetStream has no file storage (max store %d): refusing to run", jc.MaxStore)
	}
	if fi, err := os.Stat(want); err != nil || !fi.IsDir() {
		return fmt.Errorf("JetStream store %s does not exist after start-up: refusing to run", want)
	}
	return nil
}

// Connect opens another in-process connection with holdfast's internal
// identity, for a component whose traffic should not queue behind the
// shared connection (group commit's ingest). The caller closes it.
func (s *Server) Connect(name string) (*nats.Conn, error) {
	s.mu.Lock()
	ns, id := s.ns, s.id
	s.mu.Unlock()
	if ns == nil {
		return nil, errors.New("embedded server not open")
	}
	return nats.Connect("", s.connOptions(ns, id, name)...)
}

// connOptions are the options of every in-process connection: holdfast's
// internal identity, reconnecting forever, and a log line for what the
// client library reports only asynchronously — a subscription too slow
// for its messages (they are dropped), a permissions violation, the
// connection lost and back — which would otherwise pass unseen.
//
// A lost in-process connection reconnects like any other: the client
// asks the server for a new pipe (InProcessConn). The server refuses one
// while it is at server.max_connections, so a connection may stay
// reconnecting (see Reconnecting). One the server closes with an error
// (a protocol limit broken) does not reconnect: it is closed for good.
func (s *Server) connOptions(ns *server.Server, id internalIdentity, name string) []nats.Option {
	log := s.log.With("connection", name)
	return []nats.Option{nats.InProcessServer(ns), nats.Name(name), nats.UserInfo(id.user, id.password),
		nats.MaxReconnects(-1),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			// A permissions violation of this connection's is one a
			// client brought about (a reply subject reused under group
			// commit), once per message it sends: one kind, whatever the
			// subject.
			kind := err.Error()
			if errors.Is(err, nats.ErrPermissionViolation) {
				kind = nats.ErrPermissionViolation.Error()
			}
			attrs := []any{"err", err}
			if sub != nil {
				kind += " " + sub.Subject
				attrs = append(attrs, "subject", sub.Subject)
			}
			ok, held := s.connErrs.allow(name+" "+kind, time.Now())
			if !ok {
				return
			}
			if held > 0 {
				attrs = append(attrs, "similar_lines_held_back", held)
			}
			log.Warn("in-process connection error", attrs...)
		}),
		// The server drops a connection that falls behind its messages
		// (a slow consumer: group commit's, under a burst of large
		// publishes) and it comes back at once; what was in flight on it
		// is lost, and group commit's clients get no answer for it.
		nats.DisconnectErrHandler(func(c *nats.Conn, err error) {
			// nil: closed by holdfast (Close, shutdown).
			if c.IsClosed() {
				return
			}
			s.connDown.LoadOrStore(c, time.Now())
			if err != nil && ns.Running() {
				log.Warn("in-process connection lost: what was in flight on it is lost (group commit: those publishers get no answer); reconnecting", "err", err)
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) {
			s.connDown.Delete(c)
			log.Warn("in-process connection back")
		})}
}

// Reconnecting reports since when nc, an in-process connection of s, has
// been trying to get its link back, and false when it is not.
func (s *Server) Reconnecting(nc *nats.Conn) (since time.Time, ok bool) {
	if nc == nil || !nc.IsReconnecting() {
		return time.Time{}, false
	}
	if v, found := s.connDown.Load(nc); found {
		return v.(time.Time), true
	}
	return time.Now(), true
}

// Conn returns the in-process client connection.
func (s *Server) Conn() *nats.Conn { return s.nc }

// JetStream returns the JetStream API on the in-process connection.
func (s *Server) JetStream() jetstream.JetStream { return s.js }

// NATS returns the embedded server.
func (s *Server) NATS() *server.Server { return s.ns }

// StoreFSType names the file system the store is on ("ext4", ...).
func (s *Server) StoreFSType() string {
	if s.store == nil {
		return ""
	}
	return s.store.FSType
}

// StoreDir returns the absolute store directory.
func (s *Server) StoreDir() string {
	if s.store == nil {
		return ""
	}
	return s.store.Path
}

// Close drains the in-process connection, shuts the server down, waits for
// it and releases the store lock. It is idempotent.
func (s *Server) Close(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closeLocked()
}

func (s *Server) closeLocked() error {
	if s.closed {
		return nil
	}
	s.closed = true
	var errs []error
	if s.stopRecord != nil {
		s.stopRecord()
		<-s.recordDone
		// The last positions, for the next start's data-loss check —
		// unless the store was lost: its path may be another directory.
		if s.lost.Load() {
			s.log.Warn("stream positions not recorded at shutdown: the store directory was lost")
		} else if err := s.recordState(context.Background()); err != nil {
			s.log.Warn("cannot record stream positions at shutdown; the next start compares with the last periodic record", "err", err)
		}
	}
	s.leaf.stop()
	if s.nc != nil {
		if err := s.nc.Drain(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			errs = append(errs, fmt.Errorf("drain in-process connection: %w", err))
		}
		select {
		case <-s.ncClosed:
		case <-time.After(15 * time.Second):
			s.nc.Close()
		}
	}
	if s.ns != nil {
		// Start must have returned first: a Shutdown that overtakes it
		// leaves Start creating the store's directories afterwards.
		select {
		case <-s.started:
		case <-time.After(DefaultReadyTimeout):
		}
		s.ns.Shutdown()
		s.ns.WaitForShutdown()
		s.log.Info("NATS server stopped")
	}
	if s.lock != nil {
		if err := s.lock.Unlock(); err != nil {
			errs = append(errs, fmt.Errorf("unlock store dir: %w", err))
		}
	}
	return errors.Join(errs...)
}
