package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sys/unix"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/embedded/mqtt"
	"github.com/holdfast-io/holdfast/ingest"
	"github.com/holdfast-io/holdfast/internal/subjects"
	"github.com/holdfast-io/holdfast/pipeline/forward"
	"github.com/holdfast-io/holdfast/pipeline/monitor"
)

// StatusReply is the daemon's answer on subjects.Status.
type StatusReply struct {
	Version    string    `json:"version"`
	NATSServer string    `json:"nats_server"`
	ServerName string    `json:"server_name"`
	PID        int       `json:"pid"`
	Started    time.Time `json:"started"`
	StoreDir   string    `json:"store_dir"`
	// DiskFree and DiskSize are the store's file system's, in bytes (0
	// when unknown).
	DiskFree int64  `json:"disk_free,omitempty"`
	DiskSize int64  `json:"disk_size,omitempty"`
	Sync     string `json:"sync"`
	// CommitWindow is jetstream.commit_window when on ("40ms"), or "".
	CommitWindow string          `json:"commit_window,omitempty"`
	Domain       string          `json:"domain,omitempty"`
	HTTPListen   string          `json:"http_listen,omitempty"`
	FailOnLoss   bool            `json:"fail_on_loss"`
	Health       monitor.Health  `json:"health"`
	Report       *monitor.Report `json:"report"`
	Cluster      *ClusterStatus  `json:"cluster,omitempty"`
	// PeerNames are the names of the cluster's nodes by Raft peer ID, as
	// this node has seen them: the server names a peer it has not heard
	// from since it started only by its ID.
	PeerNames map[string]string   `json:"peer_names,omitempty"`
	Leafnodes *forward.EdgeStatus `json:"leafnodes,omitempty"`
	// GroupCommit holds the counters of each stream with group commit.
	GroupCommit map[string]ingest.Stats `json:"group_commit,omitempty"`
	// MQTT is the devices' listener ([mqtt]).
	MQTT *mqtt.Stats `json:"mqtt,omitempty"`
	// History is each consumer's recent samples, by "STREAM/CONSUMER".
	History map[string][]monitor.Sample `json:"history,omitempty"`
}

// serveStatus answers subjects.Status on the daemon's in-process connection
// with a fresh check.
func serveStatus(d *Daemon) (*nats.Subscription, error) {
	subject := subjects.Status(d.cfg.Server.Name)
	sub, err := d.srv.Conn().Subscribe(subject, func(m *nats.Msg) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		data, err := json.Marshal(d.statusReply(ctx))
		if err != nil {
			d.log.Error("cannot encode status", "err", err)
			return
		}
		if err := m.Respond(data); err != nil {
			d.log.Warn("cannot answer status request", "err", err)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("cannot serve %s: %w", subject, err)
	}
	return sub, nil
}

// statusReply is the daemon's StatusReply after a fresh check.
func (d *Daemon) statusReply(ctx context.Context) *StatusReply {
	cfg := d.running.Load() // its server, jetstream and http sections never change at reload
	reply := &StatusReply{
		Version:      d.version,
		NATSServer:   server.VERSION,
		ServerName:   cfg.Server.Name,
		PID:          os.Getpid(),
		Started:      d.started,
		StoreDir:     d.srv.StoreDir(),
		Sync:         cfg.JetStream.Sync,
		CommitWindow: commitWindow(cfg),
		Domain:       cfg.JetStream.Domain,
		HTTPListen:   d.http.Addr(),
		FailOnLoss:   cfg.HTTP.FailOnLoss,
		Report:       d.monitor.CheckNow(ctx),
		Cluster:      d.peers.clusterView(d.srv.NATS()),
		PeerNames:    d.peers.names.all(),
		Leafnodes:    d.edge.Status(ctx),
	}
	reply.Health = d.monitor.Health()
	var fs unix.Statfs_t
	if err := unix.Statfs(reply.StoreDir, &fs); err == nil {
		reply.DiskFree, reply.DiskSize = int64(fs.Bavail)*fs.Bsize, int64(fs.Blocks)*fs.Bsize
	}
	reply.GroupCommit = d.groupCommitStats()
	if reply.Report != nil {
		reply.History = map[string][]monitor.Sample{}
		for _, c := range reply.Report.Consumers {
			reply.History[c.Stream+"/"+c.Name] = d.monitor.History(c.Stream, c.Name)
		}
	}
	if d.mqtt != nil {
		st := d.mqtt.Stats()
		st.Sessions, st.InFlight = mqtt.Sessions(ctx, d.srv.JetStream())
		reply.MQTT = &st
	}
	return reply
}

// clientStatus is the ClientStatus that `holdfast status --json` prints,
// collected in the daemon itself over its in-process connection: the
// status page's /status.json.
func (d *Daemon) clientStatus(ctx context.Context) *ClientStatus {
	ctx, cancel := context.WithTimeout(ctx, collectTimeout)
	defer cancel()
	st := &ClientStatus{URL: d.srv.NATS().ClientURL()}
	reply := d.statusReply(ctx)
	st.useReply(reply)
	st.collect(ctx, d.running.Load(), d.srv.JetStream(), reply)
	return st
}

// StatusVersion is ClientStatus.Version: it changes when a field of
// ClientStatus changes meaning or goes away, not when one is added.
const StatusVersion = 1

// ClientStatus is a running holdfast as a client sees it: JetStream, the
// streams and the consumers read over a NATS connection, merged with the
// StatusReply of the daemon it is connected to. `holdfast status --json`
// prints it.
type ClientStatus struct {
	// Version is the version of this document's layout, StatusVersion.
	Version int `json:"version"`
	// Healthy is true when the daemon answered and reports "ok"; the
	// exit code is 0 then, else 1.
	Healthy bool `json:"healthy"`
	// Error says why nothing could be read (holdfast unreachable); the
	// other fields are empty then.
	Error     string              `json:"error,omitempty"`
	URL       string              `json:"url"`
	Daemon    *DaemonInfo         `json:"daemon"`
	Health    *monitor.Health     `json:"health"`
	Problems  []string            `json:"problems,omitempty"`
	JetStream JetStreamStatus     `json:"jetstream"`
	Cluster   *ClusterStatus      `json:"cluster,omitempty"`
	Streams   []StreamStatus      `json:"streams"`
	Consumers []ConsumerStatus    `json:"consumers"`
	Leafnodes *forward.EdgeStatus `json:"leafnodes,omitempty"`
	MQTT      *mqtt.Stats         `json:"mqtt,omitempty"`

	// clustered: the node is one of a cluster, where a stream or consumer
	// that does not answer is most often one without a reachable leader.
	clustered bool
}

// DaemonInfo is what the daemon says about itself in its StatusReply.
type DaemonInfo struct {
	Version    string    `json:"version"`
	NATSServer string    `json:"nats_server"`
	ServerName string    `json:"server_name"`
	PID        int       `json:"pid"`
	Started    time.Time `json:"started"`
	HTTPListen string    `json:"http_listen,omitempty"`
	FailOnLoss bool      `json:"fail_on_loss"`
}

// JetStreamStatus is the JetStream account of the client, with the store
// settings the daemon reports.
type JetStreamStatus struct {
	Enabled  bool   `json:"enabled"`
	Error    string `json:"error,omitempty"`
	StoreDir string `json:"store_dir,omitempty"`
	DiskFree int64  `json:"disk_free,omitempty"`
	DiskSize int64  `json:"disk_size,omitempty"`
	Sync     string `json:"sync,omitempty"`
	// CommitWindow is jetstream.commit_window when on, or "".
	CommitWindow string       `json:"commit_window,omitempty"`
	Domain       string       `json:"domain,omitempty"`
	File         StorageUsage `json:"file"`
	Memory       StorageUsage `json:"memory"`
	Streams      int          `json:"streams"`
	Consumers    int          `json:"consumers"`
}

// StorageUsage is the use of one JetStream storage type, in bytes.
type StorageUsage struct {
	Used     uint64 `json:"used"`
	Reserved uint64 `json:"reserved"`
	// Limit is -1 when unknown or unlimited.
	Limit int64 `json:"limit"`
}

// StreamStatus is one stream as a client reads it, with how close it is to
// its limits and its group commit.
type StreamStatus struct {
	monitor.StreamStatus
	// Unknown: the stream could not be read (no answer in time, its
	// replicas offline, JetStream unavailable), so whether it exists is
	// not known; Exists is false and Error says why.
	Unknown       bool    `json:"unknown,omitempty"`
	DeadLetter    bool    `json:"dead_letter"`
	MaxAgeSeconds float64 `json:"max_age_seconds"`
	// Ratios to each limit that is set: messages, bytes, and the age of
	// the first message.
	LimitRatio map[string]float64 `json:"limit_ratio,omitempty"`
	// GroupCommit is "on" when the stream stores through group commit
	// (its subjects behind the prefix), with the daemon's counters.
	GroupCommit      string        `json:"group_commit"`
	GroupCommitStats *ingest.Stats `json:"group_commit_stats,omitempty"`
}

// ConsumerStatus is one consumer as a client reads it, with what only the
// daemon knows: losses to retention, stalls and workers.
type ConsumerStatus struct {
	Name          string `json:"name"`
	Stream        string `json:"stream"`
	Exists        bool   `json:"exists"`
	Unknown       bool   `json:"unknown,omitempty"` // as StreamStatus.Unknown
	Error         string `json:"error,omitempty"`
	FilterSubject string `json:"filter_subject,omitempty"`
	// Handler is the kind of handler its workers run (from the daemon).
	Handler       string `json:"handler,omitempty"`
	Pending       uint64 `json:"pending"`
	AckPending    uint64 `json:"ack_pending"`
	Redelivered   uint64 `json:"redelivered"`
	MaxAckPending int    `json:"max_ack_pending"`
	DeliveredSeq  uint64 `json:"delivered_stream_seq"`
	AckFloorSeq   uint64 `json:"ack_floor_stream_seq"`
	// DeadLetters is the number of its dead letters stored in
	// DeadLetterStream now; null without a dead-letter stream.
	DeadLetterStream string  `json:"dead_letter_stream,omitempty"`
	DeadLetters      *uint64 `json:"dead_letters"`
	// LostToRetention and the fields below come from the daemon; null
	// when it did not answer.
	LostToRetention *uint64               `json:"lost_to_retention"`
	LastLoss        *monitor.LossEvent    `json:"last_loss,omitempty"`
	Stalled         bool                  `json:"stalled"`
	BacklogRatio    map[string]float64    `json:"backlog_ratio,omitempty"`
	Warnings        []string              `json:"warnings,omitempty"`
	Workers         *monitor.WorkerStatus `json:"workers"`
	// History is the last 15 minutes of its backlog and acknowledgements,
	// a sample every 10 s (from the daemon; the status page's chart).
	History []monitor.Sample `json:"history,omitempty"`
	// Leader and Replicas are the consumer's Raft group in a cluster.
	Leader   string                  `json:"leader,omitempty"`
	Replicas []monitor.ReplicaStatus `json:"replicas,omitempty"`
}

// collectTimeout bounds all of CollectStatus; readTimeout each of its
// JetStream API requests, so that one stream that does not answer (its
// leader down) leaves time to read the others.
const (
	collectTimeout = 30 * time.Second
	readTimeout    = 5 * time.Second
)

// CollectStatus reads JetStream over nc and js as any client would and
// merges what the daemon nc is connected to reports. cfg is the local
// config: it names the server and HTTP listener to ask, and the streams
// and consumers to read when the daemon does not answer.
func CollectStatus(ctx context.Context, cfg *config.Config, nc *nats.Conn, js jetstream.JetStream) *ClientStatus {
	ctx, cancel := context.WithTimeout(ctx, collectTimeout)
	defer cancel()
	st := &ClientStatus{URL: nc.ConnectedUrlRedacted()}
	reply := st.requestReply(ctx, cfg, nc)
	st.collect(ctx, cfg, js, reply)
	return st
}

// collect reads JetStream, the streams and the consumers over js into st,
// merged with the daemon's reply (nil when it did not answer).
func (st *ClientStatus) collect(ctx context.Context, cfg *config.Config, js jetstream.JetStream, reply *StatusReply) {
	st.Version = StatusVersion
	st.clustered = cfg.Cluster.Enabled() || st.Cluster != nil
	st.readAccount(ctx, js, reply)

	streams, consumers := watchedNames(cfg, reply)
	deadLetterStreams := map[string]bool{}
	for _, c := range consumers {
		if c.deadLetter != "" {
			deadLetterStreams[c.deadLetter] = true
		}
	}
	for _, name := range streams {
		st.Streams = append(st.Streams, st.readStream(ctx, js, reply, name, deadLetterStreams[name]))
	}
	if reply != nil {
		watched := maps.Clone(deadLetterStreams)
		for _, name := range streams {
			watched[name] = true
		}
		st.readLeftOut(ctx, js, watched)
	}
	daemonConsumers := map[string]monitor.ConsumerStatus{}
	if reply != nil && reply.Report != nil {
		for _, c := range reply.Report.Consumers {
			daemonConsumers[c.Stream+"/"+c.Name] = c
		}
	}
	for _, ref := range consumers {
		co := st.readConsumer(ctx, js, ref)
		if dc, ok := daemonConsumers[ref.stream+"/"+ref.name]; ok {
			lost := dc.LostToRetention
			co.LostToRetention = &lost
			co.LastLoss = dc.LastLoss
			co.Stalled = dc.Stalled
			co.BacklogRatio = dc.BacklogRatio
			co.Warnings = dc.Warnings
			co.Handler = dc.Handler
			ws := dc.Workers
			co.Workers = &ws
			if reply.History != nil {
				co.History = reply.History[ref.stream+"/"+ref.name]
			}
		}
		st.Consumers = append(st.Consumers, co)
	}
	if reply != nil {
		st.nameReplicas(reply.PeerNames)
	}

	st.Healthy = reply != nil && reply.Health.Status == monitor.HealthOK && len(st.Problems) == 0
}

// nameReplicas names the replicas of the streams and consumers that the
// server knows only by their peer ID (knownPeerName).
func (st *ClientStatus) nameReplicas(names map[string]string) {
	rename := func(rs []monitor.ReplicaStatus) {
		for i := range rs {
			rs[i].Name = knownPeerName(names, rs[i].Peer, rs[i].Name)
		}
	}
	for i := range st.Streams {
		rename(st.Streams[i].Replicas)
	}
	for i := range st.Consumers {
		rename(st.Consumers[i].Replicas)
	}
}

// requestReply asks the daemon nc is connected to for its StatusReply and
// copies what it says about itself into st. Without an answer it returns
// nil, and st says why, with the daemon's /healthz when it can be read.
func (st *ClientStatus) requestReply(ctx context.Context, cfg *config.Config, nc *nats.Conn) *StatusReply {
	var reply *StatusReply
	// The server this client is connected to answers, not another node of
	// a cluster or a leafnode network.
	name := nc.ConnectedServerName()
	if name == "" {
		name = cfg.Server.Name
	}
	subject := subjects.Status(name)
	msg, err := nc.RequestWithContext(ctx, subject, nil)
	if err == nil {
		reply = &StatusReply{}
		if err = json.Unmarshal(msg.Data, reply); err != nil {
			reply = nil
		}
	}
	if reply == nil {
		// A daemon still starting (a cluster node waiting for its quorum,
		// a store being recovered) does not answer yet; its /healthz
		// says what it waits for.
		if h := localHealthz(ctx, cfg.HTTP.Listen); h != nil {
			st.Health = h
			st.Problems = append(st.Problems, "/healthz on "+cfg.HTTP.Listen+": "+h.Reason)
		}
		st.Problems = append(st.Problems, fmt.Sprintf("the holdfast daemon does not answer on %s (%v): losses to retention, workers and health are unknown", subject, err))
		return nil
	}
	st.useReply(reply)
	return reply
}

// useReply copies what the daemon says about itself into st.
func (st *ClientStatus) useReply(reply *StatusReply) {
	st.Daemon = &DaemonInfo{Version: reply.Version, NATSServer: reply.NATSServer, ServerName: reply.ServerName,
		PID: reply.PID, Started: reply.Started, HTTPListen: reply.HTTPListen, FailOnLoss: reply.FailOnLoss}
	h := reply.Health
	st.Health = &h
	st.JetStream.StoreDir = reply.StoreDir
	st.JetStream.DiskFree, st.JetStream.DiskSize = reply.DiskFree, reply.DiskSize
	st.JetStream.Sync = reply.Sync
	st.JetStream.CommitWindow = reply.CommitWindow
	st.JetStream.Domain = reply.Domain
	st.Cluster = reply.Cluster
	st.Leafnodes = reply.Leafnodes
	st.MQTT = reply.MQTT
}

// readAccount reads the client's JetStream account into st.JetStream,
// with the server's storage limits from reply when the account has none.
func (st *ClientStatus) readAccount(ctx context.Context, js jetstream.JetStream, reply *StatusReply) {
	st.JetStream.File.Limit, st.JetStream.Memory.Limit = -1, -1
	rctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	if ai, err := js.AccountInfo(rctx); err != nil {
		st.JetStream.Error = err.Error()
		st.Problems = append(st.Problems, "JetStream: "+err.Error())
	} else {
		st.JetStream.Enabled = true
		st.JetStream.File = StorageUsage{Used: ai.Store, Reserved: ai.ReservedStore, Limit: ai.Limits.MaxStore}
		st.JetStream.Memory = StorageUsage{Used: ai.Memory, Reserved: ai.ReservedMemory, Limit: ai.Limits.MaxMemory}
		st.JetStream.Streams, st.JetStream.Consumers = ai.Streams, ai.Consumers
	}
	if reply != nil && reply.Report != nil {
		// The account is unlimited on a single server; the server's own
		// limits are the ones that matter.
		if l := reply.Report.JetStream.FileLimit; l > 0 && st.JetStream.File.Limit <= 0 {
			st.JetStream.File.Limit = l
		}
		if l := reply.Report.JetStream.MemoryLimit; l > 0 && st.JetStream.Memory.Limit <= 0 {
			st.JetStream.Memory.Limit = l
		}
	}
}

// consumerRef names a consumer to read and its dead-letter stream.
type consumerRef struct{ stream, name, deadLetter string }

// watchedNames lists the streams and consumers to read: those the daemon
// watches, else those of the local config.
func watchedNames(cfg *config.Config, reply *StatusReply) ([]string, []consumerRef) {
	var streams []string
	var consumers []consumerRef
	if reply != nil && reply.Report != nil {
		for _, s := range reply.Report.Streams {
			streams = append(streams, s.Name)
		}
		for _, c := range reply.Report.Consumers {
			consumers = append(consumers, consumerRef{c.Stream, c.Name, c.DeadLetter})
		}
		return streams, consumers
	}
	streams = cfg.AllStreamNames()
	for _, name := range cfg.ConsumerNames() {
		cc := cfg.Consumers[name]
		consumers = append(consumers, consumerRef{cc.Stream, name, cc.DeadLetter})
	}
	return streams, consumers
}

// readStream reads stream name, adding to st.Problems what is wrong with
// it: missing, or its subjects at odds with the daemon's group commit.
func (st *ClientStatus) readStream(ctx context.Context, js jetstream.JetStream, reply *StatusReply, name string, deadLetter bool) StreamStatus {
	so := StreamStatus{StreamStatus: monitor.StreamStatus{Name: name, MaxMsgs: -1, MaxBytes: -1}, DeadLetter: deadLetter}
	rctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	s, err := js.Stream(rctx, name)
	if err != nil {
		so.Error, so.Unknown = st.readError(ctx, err, "stream does not exist")
		st.Problems = append(st.Problems, fmt.Sprintf("stream %s: %s", name, so.Error))
		return so
	}
	si := s.CachedInfo()
	monitor.FillStream(&so.StreamStatus, si)
	so.MaxAgeSeconds = si.Config.MaxAge.Seconds()
	so.GroupCommit = "off"
	if t := si.Config.SubjectTransform; t != nil && subjects.IsGroupCommit(t.Source) {
		so.GroupCommit = "on"
	}
	if gc, ok := replyGroupCommit(reply, name); ok {
		so.GroupCommitStats = &gc
		if so.GroupCommit == "off" {
			// The stream takes the configured subjects itself, and
			// group commit takes them too.
			st.Problems = append(st.Problems, fmt.Sprintf("stream %s: holdfast runs group commit for it but the stream does not have its prefixed subjects (edited by hand?): "+
				"each publish is taken by both and may be stored twice; reload holdfast (systemctl reload holdfast) to set them back", name))
		}
	} else if so.GroupCommit == "on" && reply != nil {
		st.Problems = append(st.Problems, noGroupCommitProblem(&si.Config, "set group_commit = true for it and reload, or reload to set its subjects back"))
	}
	so.LimitRatio = limitRatios(si, time.Now())
	return so
}

// noGroupCommitProblem says that stream cfg listens on group commit's
// prefixed subjects only, while holdfast runs no group commit for it:
// nothing answers its configured subjects.
func noGroupCommitProblem(cfg *jetstream.StreamConfig, fix string) string {
	configured := subjects.ConfiguredSubjects(cfg.Name, cfg.Subjects)
	return fmt.Sprintf("stream %s: has group commit's prefixed subjects but holdfast runs no group commit for it: "+
		"every publish to %s gets \"no responders\"; %s", cfg.Name, strings.Join(configured, ", "), fix)
}

// readLeftOut adds a problem for each stream on the server that holdfast
// does not watch (left out of the config at a reload, or made by hand)
// but that has group commit's prefixed subjects: it stays there, and no
// publish to its configured subjects is answered.
//
// With jetstream.commit_window, any such stream on file storage is named:
// the server flushes nothing itself, and only the configured streams'
// publishes are answered after holdfast's flush.
func (st *ClientStatus) readLeftOut(ctx context.Context, js jetstream.JetStream, watched map[string]bool) {
	ctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	list := js.ListStreams(ctx)
	for si := range list.Info() {
		if watched[si.Config.Name] {
			continue
		}
		if t := si.Config.SubjectTransform; t != nil && subjects.IsGroupCommit(t.Source) {
			st.Problems = append(st.Problems, noGroupCommitProblem(&si.Config,
				fmt.Sprintf("configure it again with group_commit = true and reload, or give it back its subjects (nats stream edit %s --subjects ...)", si.Config.Name)))
		} else if st.JetStream.CommitWindow != "" && si.Config.Storage == jetstream.FileStorage {
			st.Problems = append(st.Problems, fmt.Sprintf("stream %s is not in holdfast's config: with jetstream.commit_window the server flushes nothing itself, "+
				"and only the configured streams' publishes are answered after holdfast's flush, so a PubAck of %s may come before its message is on disk "+
				"(a power cut within %s of it can lose it): add [streams.%s] to the config and reload, or delete the stream", si.Config.Name, si.Config.Name, st.JetStream.CommitWindow, si.Config.Name))
		}
	}
	if err := list.Err(); err != nil {
		st.Problems = append(st.Problems, fmt.Sprintf("cannot list the server's streams to look for those holdfast does not watch: %v", err))
	}
}

// limitRatios is how close a stream is to each limit it has, or nil when
// it has none.
func limitRatios(si *jetstream.StreamInfo, now time.Time) map[string]float64 {
	ratios := map[string]float64{}
	if si.Config.MaxMsgs > 0 {
		ratios["max_msgs"] = float64(si.State.Msgs) / float64(si.Config.MaxMsgs)
	}
	if si.Config.MaxBytes > 0 {
		ratios["max_bytes"] = float64(si.State.Bytes) / float64(si.Config.MaxBytes)
	}
	if si.Config.MaxAge > 0 && si.State.Msgs > 0 {
		ratios["max_age"] = float64(now.Sub(si.State.FirstTime)) / float64(si.Config.MaxAge)
	}
	if len(ratios) == 0 {
		return nil
	}
	return ratios
}

// readConsumer reads consumer ref and counts its dead letters, adding to
// st.Problems what could not be read.
func (st *ClientStatus) readConsumer(ctx context.Context, js jetstream.JetStream, ref consumerRef) ConsumerStatus {
	co := ConsumerStatus{Name: ref.name, Stream: ref.stream, DeadLetterStream: ref.deadLetter}
	rctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	if c, err := js.Consumer(rctx, ref.stream, ref.name); err != nil {
		co.Error, co.Unknown = st.readError(ctx, err, "consumer does not exist")
		st.Problems = append(st.Problems, fmt.Sprintf("consumer %s on stream %s: %s", ref.name, ref.stream, co.Error))
	} else {
		ci := c.CachedInfo()
		co.Exists = true
		co.FilterSubject = ci.Config.FilterSubject
		co.Pending = ci.NumPending
		co.AckPending = uint64(max(ci.NumAckPending, 0))
		co.Redelivered = uint64(max(ci.NumRedelivered, 0))
		co.MaxAckPending = ci.Config.MaxAckPending
		co.DeliveredSeq = ci.Delivered.Stream
		co.AckFloorSeq = ci.AckFloor.Stream
		if cl := ci.Cluster; cl != nil && len(cl.Replicas) > 0 {
			co.Leader = cl.Leader
			for _, r := range cl.Replicas {
				co.Replicas = append(co.Replicas, monitor.ReplicaStatus{Name: r.Name, Peer: r.Peer, Current: r.Current, Offline: r.Offline, Lag: r.Lag})
			}
		}
	}
	// Not counted in a dead-letter stream already found missing or
	// unknown: its problem is listed once, without another wait.
	if ref.deadLetter != "" && st.streamRead(ref.deadLetter) {
		if n, err := countDeadLetters(ctx, js, ref.deadLetter, ref.name); err == nil {
			co.DeadLetters = &n
		} else {
			st.Problems = append(st.Problems, fmt.Sprintf("dead letters of %s in %s: %v", ref.name, ref.deadLetter, err))
		}
	}
	return co
}

// streamRead reports whether stream name was read: false when it is
// among st.Streams, missing or unknown.
func (st *ClientStatus) streamRead(name string) bool {
	for _, s := range st.Streams {
		if s.Name == name {
			return s.Exists
		}
	}
	return true
}

// readError says why a stream or consumer could not be read: missing
// when err says it does not exist; else unknown is true, and the text
// says what answered instead (nothing in time, an error) and, in a
// cluster, where to look. ctx is CollectStatus's own.
func (st *ClientStatus) readError(ctx context.Context, err error, missing string) (text string, unknown bool) {
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrConsumerNotFound):
		return missing, false
	case ctx.Err() != nil:
		text = fmt.Sprintf("not read: status gave up after %s (other requests took the time)", collectTimeout)
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout):
		text = fmt.Sprintf("no answer within %s", readTimeout)
	default:
		text = err.Error()
	}
	if st.clustered {
		text += " (in a cluster: no leader for it is reachable from this node; check `holdfast status` on the other nodes)"
	}
	return text, true
}

// countDeadLetters counts a consumer's dead letters (subjects
// dlq.<CONSUMER>.>) stored in a dead-letter stream.
func countDeadLetters(ctx context.Context, js jetstream.JetStream, stream, consumer string) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, err
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(subjects.DeadLetters(consumer)))
	if err != nil {
		return 0, err
	}
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	return n, nil
}

// replyGroupCommit returns the daemon's group commit counters of stream
// name.
func replyGroupCommit(r *StatusReply, name string) (ingest.Stats, bool) {
	if r == nil {
		return ingest.Stats{}, false
	}
	st, ok := r.GroupCommit[name]
	return st, ok
}

// localHealthz reads the /healthz of the holdfast listening on listen (the
// config's http.listen; on this host when it names no address), or nil.
func localHealthz(ctx context.Context, listen string) *monitor.Health {
	host, port, err := net.SplitHostPort(listen)
	if listen == "" || err != nil {
		return nil
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(host, port)+"/healthz", nil)
	if err != nil {
		return nil
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var h monitor.Health
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&h); err != nil || h.Status == "" {
		return nil
	}
	return &h
}

// commitWindow is cfg's jetstream.commit_window as status shows it: "" when
// off.
func commitWindow(cfg *config.Config) string {
	if !cfg.CommitWindowOn() {
		return ""
	}
	return cfg.JetStream.CommitWindow.Duration.String()
}
