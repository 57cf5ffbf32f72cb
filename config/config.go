// Package config reads and validates holdfast's TOML configuration.
//
// The flow is DefaultConfig → Parse (from any io.Reader) → Validate. Parse
// fails on a syntax error, a wrongly typed value or an unknown key; Validate
// collects every semantic problem at once, each naming its key path.
package config

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// DefaultPath is where holdfast looks for its config file when neither
// --config nor HOLDFAST_CONFIG names one.
const DefaultPath = "/etc/holdfast/holdfast.toml"

// DefaultStoreDir is the store directory used when the config does not set
// one: relative to the working directory, so `holdfast run` works anywhere.
const DefaultStoreDir = "holdfast-data"

// Config is the whole holdfast configuration.
type Config struct {
	Server    ServerConfig               `toml:"server"`
	JetStream JetStreamConfig            `toml:"jetstream"`
	Run       RunConfig                  `toml:"run"`
	Streams   map[string]*StreamConfig   `toml:"-"`
	Consumers map[string]*ConsumerConfig `toml:"-"`
	HTTP      HTTPConfig                 `toml:"http"`
	Log       LogConfig                  `toml:"log"`
	Auth      AuthConfig                 `toml:"auth"`
	TLS       TLSConfig                  `toml:"tls"`
	Cluster   ClusterConfig              `toml:"cluster"`
	LeafNodes LeafNodesConfig            `toml:"leafnodes"`
	MQTT      MQTTConfig                 `toml:"mqtt"`
	WebSocket WebSocketConfig            `toml:"websocket"`

	// serverNameSet: the file sets server.name (required with [cluster]
	// or [leafnodes]); clusterTable, leafNodesTable: the file has the table.
	serverNameSet, clusterTable, leafNodesTable bool
}

// ServerConfig is the [server] table: the embedded NATS server's identity
// and client listener.
type ServerConfig struct {
	Name string `toml:"name"`
	Host string `toml:"host"`
	// Port is the client port, 1-65535. A program that embeds holdfast may
	// set -1 for a free port; Load refuses it in a config file.
	Port       int  `toml:"port"`
	MaxPayload Size `toml:"max_payload"`
	// AllowAnonymous lets a non-loopback host run without [auth]: anyone
	// who can reach the port may publish, read and delete streams.
	AllowAnonymous bool `toml:"allow_anonymous"`
	// MaxConnections limits client connections (the in-process one counts).
	MaxConnections int `toml:"max_connections"`
	// MaxSubscriptions limits subscriptions per client connection; 0 is
	// unlimited.
	MaxSubscriptions int `toml:"max_subscriptions"`
}

// JetStreamConfig is the [jetstream] table: the persistent store.
type JetStreamConfig struct {
	StoreDir       string `toml:"store_dir"`
	MaxMemoryStore Size   `toml:"max_memory_store"`
	MaxFileStore   Size   `toml:"max_file_store"`
	Sync           string `toml:"sync"`
	// CommitWindow, with Sync "always", has holdfast flush the streams'
	// files at most once per window and answer each publish after the
	// flush that holds it (embedded/store.Syncer); 0 leaves the flush of
	// each write to the server.
	CommitWindow      Duration `toml:"commit_window"`
	AllowTmpfs        bool     `toml:"allow_tmpfs"`
	EncryptionKeyFile string   `toml:"encryption_key_file"`
	// EncryptionCipher is "chacha" (ChaCha20-Poly1305) or "aes" (AES-GCM).
	EncryptionCipher string `toml:"encryption_cipher"`
	// EncryptionOldKeyFile holds the previous key during a key rotation.
	EncryptionOldKeyFile string `toml:"encryption_old_key_file"`
	Domain               string `toml:"domain"`
	OnDataLoss           string `toml:"on_data_loss"`
}

// RunConfig is the [run] table: daemon behaviour.
type RunConfig struct {
	ShutdownTimeout Duration `toml:"shutdown_timeout"`
}

// StreamConfig is one [streams.NAME] table.
type StreamConfig struct {
	Subjects        []string `toml:"subjects"`
	Retention       string   `toml:"retention"`
	Discard         string   `toml:"discard"`
	MaxMsgs         int64    `toml:"max_msgs"`
	MaxBytes        Size     `toml:"max_bytes"`
	MaxAge          Duration `toml:"max_age"`
	Storage         string   `toml:"storage"`
	AllowMemory     bool     `toml:"allow_memory"`
	Replicas        int      `toml:"replicas"`
	DuplicateWindow Duration `toml:"duplicate_window"`
	// Sources and Mirror pull other streams' messages into this one, on
	// the server (see SourceConfig); a mirror has no subjects of its own.
	Sources []SourceConfig `toml:"sources"`
	Mirror  *SourceConfig  `toml:"mirror"`
	// GroupCommit has holdfast answer the stream's publishes and store
	// them in atomic batches: one flush for many messages (see
	// internal/subjects.GroupCommit and docs/group-commit.md).
	GroupCommit bool `toml:"group_commit"`

	// groupCommitImplied: GroupCommit was set by jetstream.commit_window,
	// not by the file.
	groupCommitImplied bool
}

// ConsumerConfig is one [consumers.NAME] table: a durable pull consumer
// and the in-process workers that process its messages.
type ConsumerConfig struct {
	Stream        string     `toml:"stream"`
	FilterSubject string     `toml:"filter_subject"`
	AckWait       Duration   `toml:"ack_wait"`
	MaxDeliver    int        `toml:"max_deliver"`
	Backoff       []Duration `toml:"backoff"`
	MaxAckPending int        `toml:"max_ack_pending"`
	Workers       int        `toml:"workers"`
	// Prefetch is how many messages the workers pull ahead of the
	// handlers, each kept alive from its receipt (at most
	// max_ack_pending - workers are used); quick handlers get up to
	// 100 ms of their work ahead, up to max_ack_pending - workers.
	Prefetch   int               `toml:"prefetch"`
	Handler    string            `toml:"handler"`
	DeadLetter string            `toml:"dead_letter"`
	Exec       ExecConfig        `toml:"exec"`
	HTTP       HTTPHandlerConfig `toml:"http"`
	Forward    ForwardConfig     `toml:"forward"`
	// Implied is set on the built-in default consumer when no
	// [consumers.NAME] table configures it (see Parse): its handler is the
	// built-in one, not one the operator chose.
	Implied bool `toml:"-" json:"-"`
}

// ExecConfig is a consumer's [consumers.NAME.exec] table.
type ExecConfig struct {
	Command []string `toml:"command"`
	Timeout Duration `toml:"timeout"`
}

// HTTPHandlerConfig is a consumer's [consumers.NAME.http] table.
type HTTPHandlerConfig struct {
	URL     string   `toml:"url"`
	Timeout Duration `toml:"timeout"`
}

// HTTPConfig is the [http] table: metrics and health endpoints.
type HTTPConfig struct {
	Listen string `toml:"listen"`
	// FailOnLoss makes /healthz answer 503 once messages were removed by
	// retention before a consumer acknowledged them; otherwise such a loss
	// is reported as "degraded" with 200.
	FailOnLoss bool `toml:"fail_on_loss"`
	// StallTimeout is how long a consumer with work to do may go without
	// any delivery or acknowledgement before it counts as stalled.
	StallTimeout Duration `toml:"stall_timeout"`
	// AllowedHosts are host names, besides the loopback ones and this
	// host's name, that a loopback listener answers requests for (a
	// reverse proxy that passes on its own Host).
	AllowedHosts []string `toml:"allowed_hosts"`
}

// LogConfig is the [log] table.
type LogConfig struct {
	Level  string `toml:"level"`
	Format string `toml:"format"`
}

// Names of the default stream and consumer, as in the JetStream setup
// holdfast replaces.
const (
	DefaultStreamName   = "ORDERS"
	DefaultConsumerName = "WORKER1"
)

// DefaultConfig returns the built-in configuration: what `holdfast run`
// uses with no file, and what `holdfast config` prints.
func DefaultConfig() *Config {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "holdfast"
	}
	return &Config{
		Server: ServerConfig{
			Name:       host,
			Host:       "127.0.0.1",
			Port:       4222,
			MaxPayload: Bytes(1 << 20),
			// An edge host serves a handful of publishers and the CLI.
			MaxConnections:   1024,
			MaxSubscriptions: 10_000,
		},
		JetStream: JetStreamConfig{
			StoreDir:         DefaultStoreDir,
			MaxMemoryStore:   Bytes(1 << 30),
			MaxFileStore:     Bytes(10 << 30),
			Sync:             "always",
			OnDataLoss:       "warn",
			EncryptionCipher: "chacha",
		},
		Run:       RunConfig{ShutdownTimeout: Dur(20 * time.Second)},
		Streams:   map[string]*StreamConfig{DefaultStreamName: DefaultStream([]string{"orders.*"})},
		Consumers: map[string]*ConsumerConfig{DefaultConsumerName: DefaultConsumer(DefaultStreamName)},
		HTTP:      HTTPConfig{Listen: "127.0.0.1:8222", FailOnLoss: true, StallTimeout: Dur(5 * time.Minute)},
		Log:       LogConfig{Level: "info", Format: "text"},
		TLS:       TLSConfig{MinVersion: "1.2"},
		LeafNodes: LeafNodesConfig{UnreachableAfter: Dur(DefaultUnreachableAfter), EdgeSubjects: slices.Clone(DefaultEdgeSubjects)},
		MQTT:      MQTTConfig{AckWait: Dur(DefaultMQTTAckWait), MaxAckPending: DefaultMQTTMaxAckPending},
	}
}

// DefaultStream returns the settings a [streams.NAME] table starts from.
func DefaultStream(subjects []string) *StreamConfig {
	return &StreamConfig{
		Subjects:        subjects,
		Retention:       "limits",
		Discard:         "old",
		MaxMsgs:         1_000_000,
		MaxBytes:        Bytes(-1),
		MaxAge:          Dur(72 * time.Hour),
		Storage:         "file",
		Replicas:        1,
		DuplicateWindow: Dur(2 * time.Minute),
	}
}

// builtinDefaults is the config of no file at all: DefaultConfig, its
// consumer implied.
func builtinDefaults() *Config {
	cfg := DefaultConfig()
	markImplied(cfg)
	return cfg
}

// markImplied marks cfg's consumers as the built-in ones no table
// configures (ConsumerConfig.Implied).
func markImplied(cfg *Config) {
	for _, cc := range cfg.Consumers {
		cc.Implied = true
	}
}

// DefaultHandler is a consumer's handler when its table names none.
const DefaultHandler = "log"

// DefaultConsumer returns the settings a [consumers.NAME] table starts from.
func DefaultConsumer(stream string) *ConsumerConfig {
	return &ConsumerConfig{
		Stream:        stream,
		AckWait:       Dur(30 * time.Second),
		MaxDeliver:    5,
		Backoff:       []Duration{Dur(time.Second), Dur(5 * time.Second), Dur(30 * time.Second)},
		MaxAckPending: 1000,
		Workers:       4,
		Prefetch:      256,
		Handler:       DefaultHandler,
		DeadLetter:    stream + "_DLQ",
		Exec:          ExecConfig{Timeout: Dur(25 * time.Second)},
		HTTP:          HTTPHandlerConfig{Timeout: Dur(10 * time.Second)},
		Forward:       forwardDefaults(),
	}
}

// ErrInvalidConfig is the sentinel every config error unwraps to, so
// callers can tell a config problem (exit code 2) from a runtime failure.
var ErrInvalidConfig = errors.New("invalid config")

// Problem is one thing wrong with a config: the key path, the offending
// value as written, and what is wrong with it.
type Problem struct {
	Key    string
	Value  string
	Reason string
}

func (p Problem) String() string {
	if p.Value != "" {
		return fmt.Sprintf("%s = %s: %s", p.Key, p.Value, p.Reason)
	}
	return fmt.Sprintf("%s: %s", p.Key, p.Reason)
}

// ValidationError lists every problem found in a config.
type ValidationError struct {
	Source   string // file name, or "" for built-in defaults
	Problems []Problem
}

func (e *ValidationError) Error() string {
	var b strings.Builder
	src := e.Source
	if src == "" {
		src = "config"
	}
	fmt.Fprintf(&b, "%s: %d problem(s):", src, len(e.Problems))
	for _, p := range e.Problems {
		b.WriteString("\n  ")
		b.WriteString(p.String())
	}
	return b.String()
}

// Unwrap makes errors.Is(err, ErrInvalidConfig) true.
func (e *ValidationError) Unwrap() error { return ErrInvalidConfig }

// ParseError is a syntax, type or unknown-key error in a config file.
type ParseError struct {
	Source string
	Err    error
}

func (e *ParseError) Error() string {
	src := e.Source
	if src == "" {
		src = "config"
	}
	return fmt.Sprintf("%s: %v", src, e.Err)
}

// Unwrap returns ErrInvalidConfig and the underlying error.
func (e *ParseError) Unwrap() []error { return []error{ErrInvalidConfig, e.Err} }

type fileLayout struct {
	Config
	Streams   map[string]toml.Primitive `toml:"streams"`
	Consumers map[string]toml.Primitive `toml:"consumers"`
}

// Parse reads TOML from r on top of DefaultConfig. source names the file in
// errors. Defaults go per kind: [streams.NAME] tables in the file replace
// the default ORDERS stream (none keeps it), [consumers.NAME] tables the
// default WORKER1 (none keeps it when the file keeps a stream named
// ORDERS, so that changing ORDERS or only the rest of the file does not
// drop the workers); each table starts from DefaultStream/DefaultConsumer.
// Parse does not validate values: call Validate.
func Parse(r io.Reader, source string) (*Config, error) {
	cfg, _, err := parse(r, source)
	return cfg, err
}

// parse is Parse, also returning whether the file sets any key.
func parse(r io.Reader, source string) (*Config, bool, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxFileSize+1))
	if err != nil {
		return nil, false, fmt.Errorf("cannot read %s: %w", source, err)
	}
	if err := checkShape(data); err != nil {
		return nil, false, &ParseError{Source: source, Err: err}
	}
	cfg := DefaultConfig()
	layout := fileLayout{Config: *cfg}
	md, err := toml.Decode(string(data), &layout)
	if err != nil {
		return nil, false, &ParseError{Source: source, Err: tomlError(err)}
	}
	var problems []string
	// failed are the [streams.NAME] and [consumers.NAME] tables whose
	// decoding stopped at a wrongly typed value: their later keys are left
	// undecoded, and are not unknown.
	failed := map[[2]string]bool{}
	// The decoder leaves a map alone when the TOML value is not a table,
	// so `streams = 5` would silently mean the default streams.
	for _, k := range []string{"streams", "consumers"} {
		if typ := md.Type(k); typ != "" && typ != "Hash" {
			problems = append(problems, fmt.Sprintf("line %d: %s: must be [%s.NAME] tables, not a TOML %s", keyLine(string(data), toml.Key{k}), k, k, typ))
		}
	}
	out := layout.Config
	if len(layout.Streams) > 0 {
		out.Streams = map[string]*StreamConfig{}
	}
	if _, keepsOrders := layout.Streams[DefaultStreamName]; len(layout.Consumers) > 0 || len(layout.Streams) > 0 && !keepsOrders {
		out.Consumers = map[string]*ConsumerConfig{}
	} else {
		markImplied(&out)
	}
	for _, name := range slices.Sorted(maps.Keys(layout.Streams)) {
		sc := DefaultStream(nil)
		if err := md.PrimitiveDecode(layout.Streams[name], sc); err != nil {
			problems = append(problems, fmt.Sprintf("streams.%s: %v", name, tomlError(err)))
			failed[[2]string{"streams", name}] = true
			continue
		}
		out.Streams[name] = sc
	}
	for _, name := range slices.Sorted(maps.Keys(layout.Consumers)) {
		prim := layout.Consumers[name]
		var probe struct {
			Stream string `toml:"stream"`
		}
		_ = md.PrimitiveDecode(prim, &probe)
		cc := DefaultConsumer(probe.Stream)
		if err := md.PrimitiveDecode(prim, cc); err != nil {
			problems = append(problems, fmt.Sprintf("consumers.%s: %v", name, tomlError(err)))
			failed[[2]string{"consumers", name}] = true
			continue
		}
		if cc.Handler == "forward" && !md.IsDefined("consumers", name, "workers") {
			// One worker sends in order: the hub's position then says
			// what it holds (docs/edge-and-hub.md).
			cc.Workers = 1
		}
		out.Consumers[name] = cc
	}
	out.serverNameSet = md.IsDefined("server", "name")
	out.clusterTable = md.IsDefined("cluster")
	out.leafNodesTable = md.IsDefined("leafnodes")
	out.applyLeafNodeDefaults()
	out.applyClusterDefaults(func(stream string) bool { return md.IsDefined("streams", stream, "replicas") })
	out.applyCommitWindow(func(stream string) bool { return md.IsDefined("streams", stream, "group_commit") })
	problems = append(problems, unknownKeys(string(data), md.Undecoded(), failed)...)
	if len(problems) > 0 {
		return nil, false, &ParseError{Source: source, Err: errors.New(strings.Join(problems, "\n  "))}
	}
	return &out, len(md.Keys()) > 0, nil
}

// unknownKeys describes the keys the decoder left undecoded, but for
// those of the tables in failed, with a likely meant key when there is
// one. keyLine reads the whole file: it names a bounded number.
func unknownKeys(data string, undecoded []toml.Key, failed map[[2]string]bool) []string {
	var unknown []toml.Key
	for _, k := range undecoded {
		if len(k) < 2 || !failed[[2]string{k[0], k[1]}] {
			unknown = append(unknown, k)
		}
	}
	var out []string
	for i, k := range unknown {
		if i == maxUnknownKeys {
			out = append(out, fmt.Sprintf("... and %d more unknown keys", len(unknown)-i))
			break
		}
		hint := ""
		if s := suggestKey(k); s != "" {
			hint = fmt.Sprintf(" (did you mean %s?)", s)
		} else if s := enclosingKey(k); s != "" {
			hint = fmt.Sprintf(" (did you mean %s? a key below the [%s] header belongs to that table: move it above the header)", s, strings.Join(k[:len(k)-1], "."))
		}
		out = append(out, fmt.Sprintf("line %d: %s: unknown key%s; `holdfast config` prints every valid key", keyLine(data, k), k.String(), hint))
	}
	return out
}

// keyLine finds the line that defines key, for error messages: a line
// "name = ..." under the table header for the key's parent, or the
// header itself. It returns 0 when it cannot tell.
func keyLine(data string, key toml.Key) int {
	want := strings.Join(key, ".")
	table := ""
	for i, line := range strings.Split(data, "\n") {
		t := strings.TrimSpace(line)
		if strings.HasPrefix(t, "[") {
			h := strings.Trim(strings.SplitN(t, "#", 2)[0], "[] \t")
			table = unquoteKey.Replace(h)
			if table == want {
				return i + 1
			}
			continue
		}
		eq := strings.IndexByte(t, '=')
		if eq <= 0 || strings.HasPrefix(t, "#") {
			continue
		}
		name := unquoteKey.Replace(t[:eq])
		full := name
		if table != "" {
			full = table + "." + name
		}
		if full == want || strings.HasPrefix(want, full+".") {
			return i + 1
		}
	}
	return 0
}

// unquoteKey turns a written key such as `streams."ORDERS" . max_age` into
// the dotted path toml.Key names it by.
var unquoteKey = strings.NewReplacer(" ", "", "\t", "", `"`, "", "'", "")

// tomlError shortens BurntSushi's errors to one line that keeps the line
// number and key.
func tomlError(err error) error {
	var pe toml.ParseError
	if errors.As(err, &pe) {
		msg := pe.Message
		if pe.LastKey != "" {
			return fmt.Errorf("line %d (key %s): %s", pe.Position.Line, pe.LastKey, msg)
		}
		return fmt.Errorf("line %d: %s", pe.Position.Line, msg)
	}
	return err
}

// Load reads and validates a config file. When path is "" it uses
// DefaultPath if that exists and the built-in defaults otherwise; the
// returned source says which ("" for defaults). A file that exists but
// sets no key (empty, or only comments and blank lines) is refused
// (ErrNoKeys), by run, check and a reload alike: it is a file emptied or
// caught while being written (`cat > FILE` truncates first), and run on
// the built-in defaults it gave every consumer the default log handler,
// which acknowledged the waiting messages without the configured handler
// seeing them.
func Load(path string) (cfg *Config, source string, err error) {
	return load(path, false)
}

// ErrNoKeys is the sentinel for a config file that sets no key (empty, or
// only comments and blank lines), refused by Load and LoadForReload, and
// for a default config file that vanished while holdfast runs on another
// config (LoadForReload).
var ErrNoKeys = errors.New("the config file sets no key")

// errDefaultPathGone is ErrNoKeys for a default config file that vanished.
var errDefaultPathGone = fmt.Errorf("%w: the file is gone", ErrNoKeys)

// LoadForReload is Load for a reload of a holdfast running on running.
// A default path that no longer exists stands for the built-in defaults,
// as for Load — but when those differ from running, it is refused
// (ErrNoKeys), like a file that sets no key: a holdfast that runs on the
// defaults reloads them.
func LoadForReload(path string, running *Config) (cfg *Config, source string, err error) {
	cfg, source, err = load(path, true)
	if errors.Is(err, errDefaultPathGone) {
		def := builtinDefaults()
		if verr := def.validateFile(); verr == nil && reflect.DeepEqual(def, running) {
			return def, "", nil
		}
	}
	return cfg, source, err
}

func load(path string, needKeys bool) (cfg *Config, source string, err error) {
	explicit := path != ""
	if !explicit {
		path = DefaultPath
	}
	f, err := os.Open(path)
	if err != nil {
		if !explicit && errors.Is(err, os.ErrNotExist) {
			if needKeys {
				return nil, path, fmt.Errorf("%s: %w; "+
					"write it again and reload, or restart holdfast to run on the built-in defaults", path, errDefaultPathGone)
			}
			cfg := builtinDefaults()
			return cfg, "", cfg.validateFile()
		}
		return nil, path, fmt.Errorf("cannot open config: %w (pass --config or set HOLDFAST_CONFIG to a readable file)", err)
	}
	defer f.Close()
	cfg, keys, err := parse(f, path)
	if err != nil {
		return nil, path, err
	}
	if !keys {
		return nil, path, fmt.Errorf("%s: %w (it is empty or holds only comments: emptied, or caught while being written?); "+
			"holdfast does not take it for the built-in defaults: write the config into it (`holdfast config` prints every key with its default)%s",
			path, ErrNoKeys, noKeysDefaultsHint(explicit))
	}
	if verr := cfg.validateFile(); verr != nil {
		var ve *ValidationError
		if errors.As(verr, &ve) {
			ve.Source = path
		}
		return cfg, path, verr
	}
	return cfg, path, nil
}

// noKeysDefaultsHint says how to run on the built-in defaults on purpose.
func noKeysDefaultsHint(explicit bool) string {
	if explicit {
		return ", or drop --config and HOLDFAST_CONFIG and leave " + DefaultPath + " absent to run on the built-in defaults"
	}
	return ", or remove it to run on the built-in defaults"
}

// StreamNames returns the configured stream names, sorted.
func (c *Config) StreamNames() []string { return slices.Sorted(maps.Keys(c.Streams)) }

// AllStreamNames returns every stream holdfast makes: the configured
// ones, sorted, then the dead-letter streams, sorted.
func (c *Config) AllStreamNames() []string {
	return append(c.StreamNames(), slices.Sorted(maps.Keys(c.DeadLetterStreams()))...)
}

// TotalWorkers is the number of in-process workers of all consumers.
func (c *Config) TotalWorkers() int {
	n := 0
	for _, cc := range c.Consumers {
		n += cc.Workers
	}
	return n
}

// ConsumerNames returns the configured consumer names, sorted.
func (c *Config) ConsumerNames() []string { return slices.Sorted(maps.Keys(c.Consumers)) }

// SyncAlways reports whether the store fsyncs every write.
func (c *JetStreamConfig) SyncAlways() bool { return c.Sync == "always" }

// SyncInterval returns the fsync interval when Sync is not "always".
func (c *JetStreamConfig) SyncInterval() time.Duration {
	d, _ := time.ParseDuration(c.Sync)
	return d
}
