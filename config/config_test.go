package config

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/internal/natstest"
)

// mustParse parses text and fails the test on a parse error.
func mustParse(t *testing.T, text string) *Config {
	t.Helper()
	cfg, err := Parse(strings.NewReader(text), "test.toml")
	if err != nil {
		t.Fatalf("Parse:\n%s\nerror: %v", text, err)
	}
	return cfg
}

// wantProblems checks that err is a *ValidationError that unwraps to
// ErrInvalidConfig and that each fragment occurs in one of its problems.
func wantProblems(t *testing.T, err error, fragments ...string) *ValidationError {
	t.Helper()
	if err == nil {
		t.Fatalf("Validate returned nil, want problems containing %q", fragments)
	}
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("error %v (%T) is not a *ValidationError", err, err)
	}
	if !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("errors.Is(%v, ErrInvalidConfig) = false", err)
	}
	for _, f := range fragments {
		found := false
		for _, p := range ve.Problems {
			if strings.Contains(p.String(), f) {
				found = true
			}
		}
		if !found {
			t.Errorf("no problem contains %q; got:\n%v", f, err)
		}
		if !strings.Contains(err.Error(), f) {
			t.Errorf("error text does not contain %q:\n%v", f, err)
		}
	}
	return ve
}

// wantParseError checks that parsing text fails with a *ParseError whose
// text contains every fragment.
func wantParseError(t *testing.T, text string, fragments ...string) error {
	t.Helper()
	cfg, err := Parse(strings.NewReader(text), "test.toml")
	if err == nil {
		t.Fatalf("Parse accepted:\n%s\ngot %+v", text, cfg)
	}
	if cfg != nil {
		t.Errorf("Parse returned a config along with error %v", err)
	}
	var pe *ParseError
	if !errors.As(err, &pe) {
		t.Fatalf("error %v (%T) is not a *ParseError", err, err)
	}
	if !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("errors.Is(%v, ErrInvalidConfig) = false", err)
	}
	if !strings.HasPrefix(err.Error(), "test.toml: ") {
		t.Errorf("error %q does not start with the source name", err)
	}
	for _, f := range fragments {
		if !strings.Contains(err.Error(), f) {
			t.Errorf("error does not contain %q:\n%v", f, err)
		}
	}
	return err
}

const (
	streamS   = "[streams.S]\nsubjects = [\"s.*\"]\n"
	consumerC = streamS + "[consumers.C]\nstream = \"S\"\n"
)

func TestDefaults(t *testing.T) {
	cfg := mustParse(t, "")
	if !reflect.DeepEqual(cfg, builtinDefaults()) {
		t.Fatalf("empty file parsed to\n%+v\nwant DefaultConfig(), its consumer implied\n%+v", cfg, builtinDefaults())
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("DefaultConfig does not validate: %v", err)
	}
	// A file with only comments and unrelated tables is the same.
	cfg = mustParse(t, "# nothing here\n\n[log]\nlevel = \"info\"\n")
	if !reflect.DeepEqual(cfg, builtinDefaults()) {
		t.Fatalf("file without streams or consumers parsed to %+v, want DefaultConfig(), its consumer implied", cfg)
	}

	// The seed's stream and consumer, exactly.
	if got := cfg.StreamNames(); !reflect.DeepEqual(got, []string{"ORDERS"}) {
		t.Fatalf("streams = %v, want [ORDERS]", got)
	}
	s := cfg.Streams["ORDERS"]
	if !reflect.DeepEqual(s.Subjects, []string{"orders.*"}) || s.Retention != "limits" || s.MaxMsgs != 1_000_000 ||
		s.MaxAge.Duration != 72*time.Hour || s.Storage != "file" || s.Discard != "old" || s.MaxBytes.Bytes != -1 ||
		s.Replicas != 1 || s.AllowMemory {
		t.Errorf("stream ORDERS = %+v", s)
	}
	if got := cfg.ConsumerNames(); !reflect.DeepEqual(got, []string{"WORKER1"}) {
		t.Fatalf("consumers = %v, want [WORKER1]", got)
	}
	c := cfg.Consumers["WORKER1"]
	if c.Stream != "ORDERS" || c.AckWait.Duration != 30*time.Second || c.MaxDeliver != 5 || c.FilterSubject != "" ||
		c.Handler != "log" || c.DeadLetter != "ORDERS_DLQ" {
		t.Errorf("consumer WORKER1 = %+v", c)
	}

	// The safe-by-default settings.
	if cfg.Server.Host != "127.0.0.1" || cfg.Server.Port != 4222 || cfg.HTTP.Listen != "127.0.0.1:8222" {
		t.Errorf("listeners: server %s:%d, http %q", cfg.Server.Host, cfg.Server.Port, cfg.HTTP.Listen)
	}
	if cfg.JetStream.StoreDir != DefaultStoreDir || !cfg.JetStream.SyncAlways() || cfg.JetStream.AllowTmpfs {
		t.Errorf("jetstream = %+v", cfg.JetStream)
	}
	if cfg.Server.Name == "" {
		t.Error("server.name defaults to empty, want the host name")
	}
	if got := cfg.DeadLetterStreams(); !reflect.DeepEqual(got, map[string][]string{"ORDERS_DLQ": {"WORKER1"}}) {
		t.Errorf("DeadLetterStreams() = %v", got)
	}
}

// DefaultConfig returns a fresh value each time: callers may modify it.
func TestDefaultConfigIsFresh(t *testing.T) {
	a := DefaultConfig()
	a.Streams["ORDERS"].Subjects[0] = "changed"
	a.Consumers["WORKER1"].Backoff[0] = Dur(time.Hour)
	b := DefaultConfig()
	if b.Streams["ORDERS"].Subjects[0] != "orders.*" || b.Consumers["WORKER1"].Backoff[0].Duration != time.Second {
		t.Fatal("DefaultConfig shares state between calls")
	}
}

// Defaults go per kind: [streams.*] tables in a file replace the built-in
// ORDERS, [consumers.*] tables WORKER1; a file without consumer tables
// keeps WORKER1 only while it keeps a stream named ORDERS.
func TestStreamsInFileReplaceDefaults(t *testing.T) {
	t.Run("only a stream", func(t *testing.T) {
		cfg := mustParse(t, "[streams.X]\nsubjects = [\"x.>\"]\n")
		if got := cfg.StreamNames(); !reflect.DeepEqual(got, []string{"X"}) {
			t.Errorf("streams = %v, want [X]: ORDERS is dropped", got)
		}
		if len(cfg.Consumers) != 0 {
			t.Errorf("consumers = %v, want none: WORKER1 is dropped with ORDERS", cfg.ConsumerNames())
		}
		// Every key the table omits starts from DefaultStream.
		want := DefaultStream([]string{"x.>"})
		if !reflect.DeepEqual(cfg.Streams["X"], want) {
			t.Errorf("stream X = %+v, want %+v", cfg.Streams["X"], want)
		}
		if err := cfg.Validate(); err != nil {
			t.Errorf("a stream without consumers: %v", err)
		}
	})
	t.Run("only ORDERS changed", func(t *testing.T) {
		// Changing the default stream keeps its default consumer.
		cfg := mustParse(t, "[streams.ORDERS]\nsubjects = [\"orders.*\"]\nmax_age = \"24h\"\n")
		if got := cfg.ConsumerNames(); !reflect.DeepEqual(got, []string{"WORKER1"}) {
			t.Errorf("consumers = %v, want [WORKER1]", got)
		}
		if err := cfg.Validate(); err != nil {
			t.Error(err)
		}
	})
	t.Run("only a consumer", func(t *testing.T) {
		// A consumer alone replaces WORKER1 and keeps the default ORDERS
		// (it failed with "no stream configured" before).
		cfg := mustParse(t, "[consumers.C]\nstream = \"ORDERS\"\nhandler = \"log\"\n")
		if got := cfg.StreamNames(); !reflect.DeepEqual(got, []string{"ORDERS"}) {
			t.Errorf("streams = %v, want the default [ORDERS]", got)
		}
		if got := cfg.ConsumerNames(); !reflect.DeepEqual(got, []string{"C"}) {
			t.Errorf("consumers = %v, want [C]: WORKER1 is replaced", got)
		}
		want := DefaultConsumer("ORDERS")
		if !reflect.DeepEqual(cfg.Consumers["C"], want) {
			t.Errorf("consumer C = %+v, want %+v", cfg.Consumers["C"], want)
		}
		if err := cfg.Validate(); err != nil {
			t.Error(err)
		}
	})
	t.Run("a consumer of a stream not there", func(t *testing.T) {
		cfg := mustParse(t, "[consumers.C]\nstream = \"PAYMENTS\"\n")
		wantProblems(t, cfg.Validate(), `consumers.C.stream = "PAYMENTS": no such stream: configured streams are ORDERS`)
	})
	t.Run("several", func(t *testing.T) {
		cfg := mustParse(t, `
[streams.A]
subjects = ["a.*"]
[streams.B]
subjects = ["b.*", "bb.>"]
[consumers.A1]
stream = "A"
[consumers.A2]
stream = "A"
filter_subject = "a.x"
dead_letter = "A_DLQ"
[consumers.B1]
stream = "B"
`)
		if got := cfg.StreamNames(); !reflect.DeepEqual(got, []string{"A", "B"}) {
			t.Errorf("streams = %v", got)
		}
		if got := cfg.ConsumerNames(); !reflect.DeepEqual(got, []string{"A1", "A2", "B1"}) {
			t.Errorf("consumers = %v", got)
		}
		// dead_letter defaults to the consumer's own stream + _DLQ.
		if got := cfg.Consumers["B1"].DeadLetter; got != "B_DLQ" {
			t.Errorf("B1 dead_letter = %q, want B_DLQ", got)
		}
		want := map[string][]string{"A_DLQ": {"A1", "A2"}, "B_DLQ": {"B1"}}
		if got := cfg.DeadLetterStreams(); !reflect.DeepEqual(got, want) {
			t.Errorf("DeadLetterStreams() = %v, want %v", got, want)
		}
		if err := cfg.Validate(); err != nil {
			t.Error(err)
		}
	})
	t.Run("other tables keep the defaults", func(t *testing.T) {
		cfg := mustParse(t, "[server]\nport = 4333\n[jetstream]\nstore_dir = \"/srv/js\"\n")
		if got := cfg.StreamNames(); !reflect.DeepEqual(got, []string{"ORDERS"}) {
			t.Errorf("streams = %v, want [ORDERS]", got)
		}
		if got := cfg.ConsumerNames(); !reflect.DeepEqual(got, []string{"WORKER1"}) {
			t.Errorf("consumers = %v, want [WORKER1]", got)
		}
		if cfg.Server.Port != 4333 || cfg.JetStream.StoreDir != "/srv/js" || cfg.Server.Host != "127.0.0.1" {
			t.Errorf("server %+v jetstream %+v", cfg.Server, cfg.JetStream)
		}
	})
}

// TestValidValues sets each key to accepted values and reads them back.
func TestValidValues(t *testing.T) {
	tests := []struct {
		name string
		toml string
		got  func(*Config) any
		want any
	}{
		{"server.name", "[server]\nname = \"edge-01\"", func(c *Config) any { return c.Server.Name }, "edge-01"},
		{"server.host ipv4", "[server]\nhost = \"127.0.0.1\"", func(c *Config) any { return c.Server.Host }, "127.0.0.1"},
		{"server.host other loopback", "[server]\nhost = \"127.0.0.5\"", func(c *Config) any { return c.Server.Host }, "127.0.0.5"},
		{"server.host ipv6", "[server]\nhost = \"::1\"", func(c *Config) any { return c.Server.Host }, "::1"},
		{"server.host localhost", "[server]\nhost = \"localhost\"", func(c *Config) any { return c.Server.Host }, "localhost"},
		{"server.port", "[server]\nport = 4333", func(c *Config) any { return c.Server.Port }, 4333},
		// Programs that embed holdfast may pick a free port; Load refuses it (TestLoad).
		{"server.port -1", "[server]\nport = -1", func(c *Config) any { return c.Server.Port }, -1},
		{"server.port max", "[server]\nport = 65535", func(c *Config) any { return c.Server.Port }, 65535},
		{"server.max_payload string", "[server]\nmax_payload = \"8MB\"", func(c *Config) any { return c.Server.MaxPayload.Bytes }, int64(8 << 20)},
		{"server.max_payload int", "[server]\nmax_payload = 1024", func(c *Config) any { return c.Server.MaxPayload.Bytes }, int64(1024)},
		{"server.max_payload max", "[server]\nmax_payload = \"64MiB\"", func(c *Config) any { return c.Server.MaxPayload.Bytes }, int64(64 << 20)},
		{"server.max_payload 1", "[server]\nmax_payload = 1", func(c *Config) any { return c.Server.MaxPayload.Bytes }, int64(1)},

		{"jetstream.store_dir absolute", "[jetstream]\nstore_dir = \"/var/lib/holdfast/jetstream\"", func(c *Config) any { return c.JetStream.StoreDir }, "/var/lib/holdfast/jetstream"},
		{"jetstream.store_dir relative", "[jetstream]\nstore_dir = \"data\"", func(c *Config) any { return c.JetStream.StoreDir }, "data"},
		{"jetstream.max_memory_store", "[jetstream]\nmax_memory_store = \"2GB\"", func(c *Config) any { return c.JetStream.MaxMemoryStore.Bytes }, int64(2 << 30)},
		{"jetstream.max_memory_store int", "[jetstream]\nmax_memory_store = 1048576", func(c *Config) any { return c.JetStream.MaxMemoryStore.Bytes }, int64(1 << 20)},
		{"jetstream.max_file_store", "[jetstream]\nmax_file_store = \"500GiB\"", func(c *Config) any { return c.JetStream.MaxFileStore.Bytes }, int64(500 << 30)},
		{"jetstream.max_file_store int", "[jetstream]\nmax_file_store = 4096", func(c *Config) any { return c.JetStream.MaxFileStore.Bytes }, int64(4096)},
		{"jetstream.sync shortest interval", "[jetstream]\nsync = \"10ms\"", func(c *Config) any { return c.JetStream.SyncInterval() }, MinSyncInterval},
		{"jetstream.sync always", "[jetstream]\nsync = \"always\"", func(c *Config) any { return c.JetStream.SyncAlways() }, true},
		{"jetstream.sync interval", "[jetstream]\nsync = \"2m\"", func(c *Config) any {
			return []any{c.JetStream.SyncAlways(), c.JetStream.SyncInterval()}
		}, []any{false, 2 * time.Minute}},
		{"jetstream.allow_tmpfs", "[jetstream]\nallow_tmpfs = true", func(c *Config) any { return c.JetStream.AllowTmpfs }, true},
		{"jetstream.encryption_key_file empty", "[jetstream]\nencryption_key_file = \"\"", func(c *Config) any { return c.JetStream.EncryptionKeyFile }, ""},
		{"jetstream.domain", "[jetstream]\ndomain = \"hub\"", func(c *Config) any { return c.JetStream.Domain }, "hub"},
		{"jetstream.on_data_loss refuse", "[jetstream]\non_data_loss = \"refuse\"", func(c *Config) any { return c.JetStream.OnDataLoss }, "refuse"},
		{"jetstream.on_data_loss warn", "[jetstream]\non_data_loss = \"warn\"", func(c *Config) any { return c.JetStream.OnDataLoss }, "warn"},

		{"run.shutdown_timeout", "[run]\nshutdown_timeout = \"1m\"", func(c *Config) any { return c.Run.ShutdownTimeout.Duration }, time.Minute},

		{"streams.subjects", "[streams.S]\nsubjects = [\"s.*\", \"t.>\", \"u\"]", func(c *Config) any { return c.Streams["S"].Subjects }, []string{"s.*", "t.>", "u"}},
		{"streams.retention interest", streamS + "retention = \"interest\"", func(c *Config) any { return c.Streams["S"].Retention }, "interest"},
		{"streams.retention workqueue", streamS + "retention = \"workqueue\"", func(c *Config) any { return c.Streams["S"].Retention }, "workqueue"},
		{"consumers.filter_subject on a mirror", "[streams.SRC]\nsubjects = [\"src.*\"]\n[streams.M]\nmirror = { name = \"SRC\" }\n[consumers.C]\nstream = \"M\"\nfilter_subject = \"src.a\"", func(c *Config) any { return c.Consumers["C"].FilterSubject }, "src.a"},
		{"consumers.filter_subject on a remote mirror", "[streams.M]\nmirror = { name = \"SRC\", domain = \"hub\" }\n[consumers.C]\nstream = \"M\"\nfilter_subject = \"src.a\"\n[[leafnodes.remotes]]\nurl = \"nats-leaf://127.0.0.1:7422\"", func(c *Config) any { return c.Consumers["C"].FilterSubject }, "src.a"},
		{"consumers workqueue disjoint filters", streamS + "retention = \"workqueue\"\n[consumers.A]\nstream = \"S\"\nfilter_subject = \"s.a\"\n[consumers.B]\nstream = \"S\"\nfilter_subject = \"s.b\"", func(c *Config) any { return c.Consumers["B"].FilterSubject }, "s.b"},
		{"streams.retention limits", streamS + "retention = \"limits\"", func(c *Config) any { return c.Streams["S"].Retention }, "limits"},
		{"streams.discard new", streamS + "discard = \"new\"", func(c *Config) any { return c.Streams["S"].Discard }, "new"},
		{"streams.discard old", streamS + "discard = \"old\"", func(c *Config) any { return c.Streams["S"].Discard }, "old"},
		{"streams.max_msgs", streamS + "max_msgs = 5", func(c *Config) any { return c.Streams["S"].MaxMsgs }, int64(5)},
		{"streams.max_msgs unlimited", streamS + "max_msgs = -1", func(c *Config) any { return c.Streams["S"].MaxMsgs }, int64(-1)},
		{"streams.max_bytes", streamS + "max_bytes = \"1GB\"", func(c *Config) any { return c.Streams["S"].MaxBytes.Bytes }, int64(1 << 30)},
		{"streams.max_bytes int", streamS + "max_bytes = 4096", func(c *Config) any { return c.Streams["S"].MaxBytes.Bytes }, int64(4096)},
		{"streams.max_bytes unlimited", streamS + "max_bytes = -1", func(c *Config) any { return c.Streams["S"].MaxBytes.Bytes }, int64(-1)},
		{"streams.max_age", streamS + "max_age = \"24h\"", func(c *Config) any { return c.Streams["S"].MaxAge.Duration }, 24 * time.Hour},
		{"streams.max_age forever", streamS + "max_age = \"0s\"", func(c *Config) any { return c.Streams["S"].MaxAge.Duration }, time.Duration(0)},
		{"streams.storage file", streamS + "storage = \"file\"", func(c *Config) any { return c.Streams["S"].Storage }, "file"},
		{"streams.storage memory allowed", streamS + "storage = \"memory\"\nallow_memory = true", func(c *Config) any {
			return []any{c.Streams["S"].Storage, c.Streams["S"].AllowMemory}
		}, []any{"memory", true}},
		{"streams.allow_memory with file", streamS + "allow_memory = true", func(c *Config) any { return c.Streams["S"].AllowMemory }, true},
		{"streams.replicas", streamS + "replicas = 1", func(c *Config) any { return c.Streams["S"].Replicas }, 1},
		{"streams.duplicate_window", streamS + "duplicate_window = \"1m\"", func(c *Config) any { return c.Streams["S"].DuplicateWindow.Duration }, time.Minute},
		{"streams.duplicate_window 0", streamS + "duplicate_window = \"0s\"", func(c *Config) any { return c.Streams["S"].DuplicateWindow.Duration }, time.Duration(0)},
		{"streams.group_commit", streamS + "group_commit = true", func(c *Config) any { return c.Streams["S"].GroupCommit }, true},
		{"streams.duplicate_window = max_age", streamS + "max_age = \"1h\"\nduplicate_window = \"1h\"", func(c *Config) any { return c.Streams["S"].DuplicateWindow.Duration }, time.Hour},
		{"streams.duplicate_window with max_age forever", streamS + "max_age = \"0s\"\nduplicate_window = \"1000h\"", func(c *Config) any { return c.Streams["S"].DuplicateWindow.Duration }, 1000 * time.Hour},

		{"consumers.stream", consumerC, func(c *Config) any { return c.Consumers["C"].Stream }, "S"},
		{"consumers.filter_subject", consumerC + "filter_subject = \"s.x\"", func(c *Config) any { return c.Consumers["C"].FilterSubject }, "s.x"},
		{"consumers.filter_subject wildcard", consumerC + "filter_subject = \"s.*\"", func(c *Config) any { return c.Consumers["C"].FilterSubject }, "s.*"},
		{"consumers.ack_wait", consumerC + "ack_wait = \"1m\"", func(c *Config) any { return c.Consumers["C"].AckWait.Duration }, time.Minute},
		{"consumers.max_deliver", consumerC + "max_deliver = 10", func(c *Config) any { return c.Consumers["C"].MaxDeliver }, 10},
		{"consumers.max_deliver 1", consumerC + "max_deliver = 1", func(c *Config) any { return c.Consumers["C"].MaxDeliver }, 1},
		{"consumers.ack_wait shortest", consumerC + "ack_wait = \"1s\"", func(c *Config) any { return c.Consumers["C"].AckWait.Duration }, MinAckWait},
		{"consumers.backoff shortest", consumerC + "backoff = [\"10ms\"]", func(c *Config) any { return c.Consumers["C"].Backoff }, []Duration{Dur(MinBackoff)}},
		{"consumers.timeouts shortest", consumerC + "exec = { timeout = \"100ms\" }\nhttp = { timeout = \"100ms\" }", func(c *Config) any {
			return []time.Duration{c.Consumers["C"].Exec.Timeout.Duration, c.Consumers["C"].HTTP.Timeout.Duration}
		}, []time.Duration{MinHandlerTimeout, MinHandlerTimeout}},
		{"streams.subjects near the reply subjects", "[streams.S]\nsubjects = [\"_INBOXES.>\", \"inbox.>\", \"R.>\"]", func(c *Config) any { return c.Streams["S"].Subjects }, []string{"_INBOXES.>", "inbox.>", "R.>"}},
		{"consumers.backoff", consumerC + "backoff = [\"1s\", \"2m\"]", func(c *Config) any { return c.Consumers["C"].Backoff }, []Duration{Dur(time.Second), Dur(2 * time.Minute)}},
		{"consumers.backoff empty", consumerC + "backoff = []", func(c *Config) any { return len(c.Consumers["C"].Backoff) }, 0},
		{"consumers.max_ack_pending", consumerC + "max_ack_pending = 50", func(c *Config) any { return c.Consumers["C"].MaxAckPending }, 50},
		{"consumers.workers", consumerC + "workers = 16", func(c *Config) any { return c.Consumers["C"].Workers }, 16},
		{"consumers.workers 0", consumerC + "workers = 0", func(c *Config) any { return c.Consumers["C"].Workers }, 0},
		{"consumers.prefetch default", consumerC, func(c *Config) any { return c.Consumers["C"].Prefetch }, 256},
		{"consumers.prefetch 0", consumerC + "prefetch = 0", func(c *Config) any { return c.Consumers["C"].Prefetch }, 0},
		{"consumers.prefetch max", consumerC + "prefetch = 10000", func(c *Config) any { return c.Consumers["C"].Prefetch }, 10000},
		{"consumers.workers = max_ack_pending", consumerC + "workers = 8\nmax_ack_pending = 8", func(c *Config) any { return c.Consumers["C"].Workers }, 8},
		{"consumers.handler log", consumerC + "handler = \"log\"", func(c *Config) any { return c.Consumers["C"].Handler }, "log"},
		{"consumers.handler exec", consumerC + "handler = \"exec\"\n[consumers.C.exec]\ncommand = [\"/usr/local/bin/process-order\", \"--strict\"]\ntimeout = \"5s\"",
			func(c *Config) any {
				return []any{c.Consumers["C"].Handler, c.Consumers["C"].Exec.Command, c.Consumers["C"].Exec.Timeout.Duration}
			},
			[]any{"exec", []string{"/usr/local/bin/process-order", "--strict"}, 5 * time.Second}},
		{"consumers.handler http", consumerC + "handler = \"http\"\n[consumers.C.http]\nurl = \"http://127.0.0.1:8080/orders\"\ntimeout = \"3s\"",
			func(c *Config) any {
				return []any{c.Consumers["C"].Handler, c.Consumers["C"].HTTP.URL, c.Consumers["C"].HTTP.Timeout.Duration}
			},
			[]any{"http", "http://127.0.0.1:8080/orders", 3 * time.Second}},
		{"consumers.http https", consumerC + "handler = \"http\"\nhttp = { url = \"https://example.com/x\" }", func(c *Config) any { return c.Consumers["C"].HTTP.URL }, "https://example.com/x"},
		{"consumers.exec timeout while handler is log", consumerC + "[consumers.C.exec]\ntimeout = \"5s\"", func(c *Config) any { return c.Consumers["C"].Exec.Timeout.Duration }, 5 * time.Second},
		{"consumers.dead_letter", consumerC + "dead_letter = \"FAILED\"", func(c *Config) any { return c.Consumers["C"].DeadLetter }, "FAILED"},
		{"consumers.dead_letter disabled", consumerC + "dead_letter = \"\"", func(c *Config) any {
			return []any{c.Consumers["C"].DeadLetter, len(c.DeadLetterStreams())}
		}, []any{"", 0}},

		{"http.listen", "[http]\nlisten = \"127.0.0.1:9000\"", func(c *Config) any { return c.HTTP.Listen }, "127.0.0.1:9000"},
		{"http.listen ipv6", "[http]\nlisten = \"[::1]:9000\"", func(c *Config) any { return c.HTTP.Listen }, "[::1]:9000"},
		{"http.listen localhost port 0", "[http]\nlisten = \"localhost:0\"", func(c *Config) any { return c.HTTP.Listen }, "localhost:0"},
		{"http.listen disabled", "[http]\nlisten = \"\"", func(c *Config) any { return c.HTTP.Listen }, ""},
		{"http.fail_on_loss", "[http]\nfail_on_loss = false", func(c *Config) any { return c.HTTP.FailOnLoss }, false},
		{"http.stall_timeout", "[http]\nstall_timeout = \"90s\"", func(c *Config) any { return c.HTTP.StallTimeout.Duration }, 90 * time.Second},

		{"log.level debug", "[log]\nlevel = \"debug\"", func(c *Config) any { return c.Log.Level }, "debug"},
		{"log.level warn", "[log]\nlevel = \"warn\"", func(c *Config) any { return c.Log.Level }, "warn"},
		{"log.level error", "[log]\nlevel = \"error\"", func(c *Config) any { return c.Log.Level }, "error"},
		{"log.format json", "[log]\nformat = \"json\"", func(c *Config) any { return c.Log.Format }, "json"},
		{"log.format text", "[log]\nformat = \"text\"", func(c *Config) any { return c.Log.Format }, "text"},

		{"dotted keys", "server.port = 5000\nlog.level = \"debug\"", func(c *Config) any { return []any{c.Server.Port, c.Log.Level} }, []any{5000, "debug"}},
		{"inline stream table", "streams = { S = { subjects = [\"s.*\"] } }", func(c *Config) any { return c.StreamNames() }, []string{"S"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := mustParse(t, tt.toml+"\n")
			if err := cfg.Validate(); err != nil {
				t.Fatalf("%s\nValidate: %v", tt.toml, err)
			}
			if got := tt.got(cfg); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("%s\ngot %#v, want %#v", tt.toml, got, tt.want)
			}
		})
	}
}

// TestInvalidValues sets each key to values Validate refuses; the problem
// names the key path and the bad value.
func TestInvalidValues(t *testing.T) {
	tests := []struct {
		name string
		toml string
		want string // "key = value" as it appears in the problem, or more
	}{
		{"server.name empty", "[server]\nname = \"\"", `server.name = ""`},
		{"server.name space", "[server]\nname = \"edge 01\"", `server.name = "edge 01"`},
		{"server.host unspecified", "[server]\nhost = \"0.0.0.0\"", `server.host = "0.0.0.0": listening on a non-loopback address needs authentication: add an [auth] table`},
		{"server.host ipv6 unspecified", "[server]\nhost = \"::\"", `server.host = "::": listening on a non-loopback address`},
		{"server.host public", "[server]\nhost = \"192.0.2.10\"", `server.host = "192.0.2.10": listening on a non-loopback`},
		{"server.host name", "[server]\nhost = \"example.com\"", `server.host = "example.com": must be an IP address`},
		{"server.host empty", "[server]\nhost = \"\"", `server.host = "": must be an IP address`},
		{"server.port high", "[server]\nport = 70000", "server.port = 70000: must be 1-65535"},
		{"server.port negative", "[server]\nport = -2", "server.port = -2: must be 1-65535"},
		{"server.port 0", "[server]\nport = 0", "server.port = 0: must be 1-65535"},
		{"server.max_payload 0", "[server]\nmax_payload = 0", "server.max_payload = 0: must be between 1 byte and 64MiB"},
		{"server.max_payload unlimited", "[server]\nmax_payload = \"-1\"", "server.max_payload = -1: must be between"},
		{"server.max_payload too big", "[server]\nmax_payload = \"65MiB\"", "server.max_payload = 65MiB: must be between 1 byte and 64MiB"},
		{"server.max_payload unit", "[server]\nmax_payload = \"1XB\"", `server.max_payload = "1XB": unknown size unit`},

		{"jetstream.store_dir empty", "[jetstream]\nstore_dir = \"\"", `jetstream.store_dir = "": must be set`},
		{"jetstream.max_memory_store unlimited", "[jetstream]\nmax_memory_store = \"-1\"", "jetstream.max_memory_store = -1: must be a positive size"},
		{"jetstream.max_memory_store 0", "[jetstream]\nmax_memory_store = 0", "jetstream.max_memory_store = 0: must be a positive size"},
		{"jetstream.max_memory_store garbage", "[jetstream]\nmax_memory_store = \"lots\"", `jetstream.max_memory_store = "lots": unknown size unit`},
		{"jetstream.max_file_store unlimited", "[jetstream]\nmax_file_store = -1", "jetstream.max_file_store = -1: must be a positive size"},
		{"jetstream.max_file_store 0", "[jetstream]\nmax_file_store = \"0GB\"", "jetstream.max_file_store = 0: must be a positive size"},
		{"jetstream.max_file_store negative", "[jetstream]\nmax_file_store = \"-10GB\"", `jetstream.max_file_store = "-10GB": negative size`},
		{"jetstream.sync word", "[jetstream]\nsync = \"sometimes\"", `jetstream.sync = "sometimes": must be "always"`},
		{"jetstream.sync zero", "[jetstream]\nsync = \"0s\"", `jetstream.sync = "0s": must be "always"`},
		{"jetstream.sync negative", "[jetstream]\nsync = \"-1m\"", `jetstream.sync = "-1m"`},
		{"jetstream.sync empty", "[jetstream]\nsync = \"\"", `jetstream.sync = ""`},
		// 1ns panicked inside nats-server at start; anything that short fsyncs without pause.
		{"jetstream.sync 1ns", "[jetstream]\nsync = \"1ns\"", `jetstream.sync = "1ns": an interval must be at least 10ms`},
		{"jetstream.sync 9ms", "[jetstream]\nsync = \"9ms\"", `jetstream.sync = "9ms": an interval must be at least 10ms`},
		{"jetstream.domain dot", "[jetstream]\ndomain = \"a.b\"", `jetstream.domain = "a.b"`},
		{"jetstream.domain space", "[jetstream]\ndomain = \"a b\"", `jetstream.domain = "a b"`},
		{"jetstream.on_data_loss", "[jetstream]\non_data_loss = \"ignore\"", `jetstream.on_data_loss = "ignore": must be one of warn, refuse`},

		{"run.shutdown_timeout 0", "[run]\nshutdown_timeout = \"0s\"", "run.shutdown_timeout = 0s: must be positive"},
		{"run.shutdown_timeout negative", "[run]\nshutdown_timeout = \"-1s\"", "run.shutdown_timeout = -1s: must be positive"},
		{"run.shutdown_timeout garbage", "[run]\nshutdown_timeout = \"abc\"", `run.shutdown_timeout = "abc": not a duration`},
		{"run.shutdown_timeout int", "[run]\nshutdown_timeout = 20", `run.shutdown_timeout = "20": a duration must be a string`},

		{"streams name", "[streams.\"a.b\"]\nsubjects = [\"s\"]", "streams.a.b: stream name must not contain"},
		{"streams name space", "[streams.\"a b\"]\nsubjects = [\"s\"]", "streams.a b: stream name must not contain"},
		{"streams.subjects empty", "[streams.S]\nsubjects = []", "streams.S.subjects = []: at least one subject"},
		{"streams.subjects missing", "[streams.S]\nmax_msgs = 5", "streams.S.subjects = []: at least one subject"},
		{"streams.subjects invalid", "[streams.S]\nsubjects = [\"a..b\"]", `streams.S.subjects = "a..b": not a valid NATS subject`},
		{"streams.subjects space", "[streams.S]\nsubjects = [\"a b\"]", `streams.S.subjects = "a b": not a valid NATS subject`},
		{"streams.subjects all", "[streams.S]\nsubjects = [\">\"]", `streams.S.subjects = ">": reserved`},
		{"streams.subjects $JS", "[streams.S]\nsubjects = [\"$JS.API.>\"]", `streams.S.subjects = "$JS.API.>": reserved`},
		{"streams.subjects $SYS", "[streams.S]\nsubjects = [\"$SYS.x\"]", `streams.S.subjects = "$SYS.x": reserved`},
		{"streams.subjects $KV", "[streams.S]\nsubjects = [\"$KV.b.>\"]", `streams.S.subjects = "$KV.b.>": reserved`},
		{"streams.subjects $O", "[streams.S]\nsubjects = [\"$O.>\"]", `streams.S.subjects = "$O.>": reserved`},
		{"streams.subjects $HOLDFAST", "[streams.S]\nsubjects = [\"$HOLDFAST.>\"]", `streams.S.subjects = "$HOLDFAST.>": reserved`},
		{"streams.subjects wildcard first token", "[streams.S]\nsubjects = [\"*.created\"]", `streams.S.subjects = "*.created": reserved`},
		// A stream on the reply subjects stored its own PubAcks: a loop that filled the disk.
		{"streams.subjects _INBOX.>", "[streams.S]\nsubjects = [\"_INBOX.>\"]", `streams.S.subjects = "_INBOX.>": overlaps _INBOX.>, where the replies to requests go`},
		{"streams.subjects _INBOX.*", "[streams.S]\nsubjects = [\"_INBOX.*\"]", `streams.S.subjects = "_INBOX.*": overlaps _INBOX.>`},
		{"streams.subjects one inbox", "[streams.S]\nsubjects = [\"_INBOX.abc.1\"]", `streams.S.subjects = "_INBOX.abc.1": overlaps _INBOX.>`},
		{"streams.subjects _R_", "[streams.S]\nsubjects = [\"_R_.>\"]", `streams.S.subjects = "_R_.>": overlaps _R_.>`},
		{"streams.subjects _GR_", "[streams.S]\nsubjects = [\"_GR_.x.*\"]", `streams.S.subjects = "_GR_.x.*": overlaps _GR_.>`},
		{"streams.subjects dlq", "[streams.S]\nsubjects = [\"dlq.WORKER1.>\"]", `streams.S.subjects = "dlq.WORKER1.>": reserved`},
		{"streams.subjects duplicate", "[streams.S]\nsubjects = [\"a\", \"a\"]", `streams.S.subjects = "a": overlaps "a" of stream S`},
		{"streams.subjects self overlap", "[streams.S]\nsubjects = [\"a.*\", \"a.b\"]", `streams.S.subjects = "a.b": overlaps "a.*" of stream S`},
		{"streams.retention", streamS + "retention = \"forever\"", `streams.S.retention = "forever": must be one of limits, interest, workqueue`},
		{"streams.discard", streamS + "discard = \"oldest\"", `streams.S.discard = "oldest": must be one of old, new`},
		{"streams.max_msgs 0", streamS + "max_msgs = 0", "streams.S.max_msgs = 0: must be positive, or -1"},
		{"streams.max_msgs -2", streamS + "max_msgs = -2", "streams.S.max_msgs = -2: must be positive, or -1"},
		{"streams.max_bytes 0", streamS + "max_bytes = 0", "streams.S.max_bytes = 0: must be positive"},
		{"streams.max_bytes unit", streamS + "max_bytes = \"5 bytes\"", `streams.S.max_bytes = "5 bytes": unknown size unit`},
		{"streams.max_age negative", streamS + "max_age = \"-1h\"", "streams.S.max_age = -1h0m0s: must not be negative"},
		{"streams.max_age garbage", streamS + "max_age = \"3d\"", `streams.S.max_age = "3d": not a duration`},
		{"streams.storage", streamS + "storage = \"disk\"", `streams.S.storage = "disk": must be one of file, memory`},
		{"streams.storage memory", streamS + "storage = \"memory\"", `streams.S.storage = "memory": memory storage loses every message at restart: set allow_memory = true`},
		{"streams.storage memory not allowed", streamS + "storage = \"memory\"\nallow_memory = false", `streams.S.storage = "memory": memory storage`},
		{"streams.replicas 3", streamS + "replicas = 3", "streams.S.replicas = 3: must be 1"},
		{"streams.replicas 0", streamS + "replicas = 0", "streams.S.replicas = 0: must be 1"},
		{"streams.duplicate_window negative", streamS + "duplicate_window = \"-1s\"", "streams.S.duplicate_window = -1s: must not be negative"},
		{"streams.duplicate_window garbage", streamS + "duplicate_window = \"x\"", `streams.S.duplicate_window = "x": not a duration`},
		{"streams.duplicate_window beyond max_age", streamS + "max_age = \"1h\"\nduplicate_window = \"2h\"", "streams.S.duplicate_window = 2h0m0s: must not be longer than max_age (1h0m0s)"},

		{"consumers name", streamS + "[consumers.\"c.1\"]\nstream = \"S\"", "consumers.c.1: consumer name must not contain"},
		{"consumers.stream empty", streamS + "[consumers.C]\nstream = \"\"", `consumers.C.stream = "": must name the stream`},
		{"consumers.stream missing", streamS + "[consumers.C]\nack_wait = \"1s\"", `consumers.C.stream = "": must name the stream`},
		{"consumers.stream unknown", streamS + "[consumers.C]\nstream = \"NOPE\"", `consumers.C.stream = "NOPE": no such stream: configured streams are S`},
		{"consumers.filter_subject invalid", consumerC + "filter_subject = \"s..x\"", `consumers.C.filter_subject = "s..x": not a valid NATS subject`},
		{"consumers.filter_subject outside stream", consumerC + "filter_subject = \"other.x\"", `consumers.C.filter_subject = "other.x": matches none of stream S's subjects`},
		{"consumers.ack_wait 0", consumerC + "ack_wait = \"0s\"", "consumers.C.ack_wait = 0s: must be at least 1s"},
		{"consumers.ack_wait negative", consumerC + "ack_wait = \"-5s\"", "consumers.C.ack_wait = -5s: must be at least 1s"},
		{"consumers.ack_wait 1ns", consumerC + "ack_wait = \"1ns\"", "consumers.C.ack_wait = 1ns: must be at least 1s"},
		{"consumers.ack_wait 999ms", consumerC + "ack_wait = \"999ms\"", "consumers.C.ack_wait = 999ms: must be at least 1s"},
		{"consumers.ack_wait garbage", consumerC + "ack_wait = \"soon\"", `consumers.C.ack_wait = "soon": not a duration`},
		{"consumers.ack_wait int", consumerC + "ack_wait = 30", `consumers.C.ack_wait = "30": a duration must be a string`},
		{"consumers.max_deliver 0", consumerC + "max_deliver = 0", "consumers.C.max_deliver = 0: must be at least 1"},
		{"consumers.max_deliver -1", consumerC + "max_deliver = -1", "consumers.C.max_deliver = -1: must be at least 1: holdfast never retries forever"},
		{"consumers.backoff 0", consumerC + "backoff = [\"1s\", \"0s\"]", "consumers.C.backoff[1] = 0s: must be at least 10ms"},
		{"consumers.backoff 1ns", consumerC + "backoff = [\"1ns\"]", "consumers.C.backoff[0] = 1ns: must be at least 10ms"},
		{"consumers.backoff garbage", consumerC + "backoff = [\"x\"]", `consumers.C.backoff[0] = "x": not a duration`},
		{"consumers.backoff int", consumerC + "backoff = [5]", `consumers.C.backoff[0] = "5": a duration must be a string`},
		{"consumers.max_ack_pending 0", consumerC + "max_ack_pending = 0\nworkers = 0", "consumers.C.max_ack_pending = 0: must be at least 1"},
		{"consumers.workers negative", consumerC + "workers = -1", "consumers.C.workers = -1: must be between 0"},
		{"consumers.workers too many", consumerC + "workers = 1025\nmax_ack_pending = 2000", "consumers.C.workers = 1025: must be between 0 (no in-process workers) and 1024"},
		{"consumers.workers > max_ack_pending", consumerC + "workers = 8\nmax_ack_pending = 4", "consumers.C.workers = 8: more than max_ack_pending (4)"},
		{"consumers.prefetch negative", consumerC + "prefetch = -1", "consumers.C.prefetch = -1: must be between 0 (pull one message per free worker) and 10000"},
		{"consumers.prefetch too many", consumerC + "prefetch = 10001", "consumers.C.prefetch = 10001: must be between 0"},
		{"http.allowed_hosts with port", "[http]\nallowed_hosts = [\"edge-01.example.net:8222\"]", `http.allowed_hosts[0] = "edge-01.example.net:8222": must be a host name as clients write it, without scheme or port`},
		{"http.allowed_hosts URL", "[http]\nallowed_hosts = [\"https://edge-01\"]", `http.allowed_hosts[0] = "https://edge-01": must be a host name`},
		{"consumers.handler", consumerC + "handler = \"shell\"", `consumers.C.handler = "shell": must be one of log, exec, http`},
		{"consumers.exec command, no handler", consumerC + "[consumers.C.exec]\ncommand = [\"/bin/false\"]", `consumers.C.exec.command = ["/bin/false"]: set, but handler = "log": the exec handler would never run and log would take (and acknowledge) every message; set handler = "exec", or remove exec.command`},
		{"consumers.http url, exec handler", consumerC + "handler = \"exec\"\n[consumers.C.exec]\ncommand = [\"/bin/true\"]\n[consumers.C.http]\nurl = \"http://127.0.0.1:1/\"", `consumers.C.http.url = "http://127.0.0.1:1/": set, but handler = "exec"`},
		{"consumers.forward domain, no handler", consumerC + "[consumers.C.forward]\ndomain = \"central\"", `consumers.C.forward.domain = "central": set, but handler = "log"`},
		{"consumers.handler empty", consumerC + "handler = \"\"", `consumers.C.handler = "": must be one of`},
		{"consumers.exec without command", consumerC + "handler = \"exec\"", `consumers.C.exec.command = []: handler = "exec" needs a command`},
		{"consumers.exec empty command", consumerC + "handler = \"exec\"\n[consumers.C.exec]\ncommand = []", `consumers.C.exec.command = []: handler = "exec" needs a command`},
		{"consumers.exec empty program", consumerC + "handler = \"exec\"\n[consumers.C.exec]\ncommand = [\"\", \"x\"]", `consumers.C.exec.command = []: handler = "exec" needs a command`},
		{"consumers.exec relative command", consumerC + "handler = \"exec\"\n[consumers.C.exec]\ncommand = [\"process-order\"]", `consumers.C.exec.command = "process-order": must be an absolute path`},
		{"consumers.exec NUL in an argument", consumerC + "handler = \"exec\"\n[consumers.C.exec]\ncommand = [\"/bin/p\", \"a\\u0000b\"]", `consumers.C.exec.command[1] = "a\x00b": contains a NUL byte`},
		{"consumers.exec dot-relative command", consumerC + "handler = \"exec\"\n[consumers.C.exec]\ncommand = [\"./bin/p\"]", `consumers.C.exec.command = "./bin/p": must be an absolute path`},
		{"consumers.exec.timeout 0", consumerC + "[consumers.C.exec]\ntimeout = \"0s\"", "consumers.C.exec.timeout = 0s: must be at least 100ms"},
		{"consumers.exec.timeout 1ms", consumerC + "[consumers.C.exec]\ntimeout = \"1ms\"", "consumers.C.exec.timeout = 1ms: must be at least 100ms"},
		{"consumers.exec.timeout garbage", consumerC + "[consumers.C.exec]\ntimeout = \"long\"", `consumers.C.exec.timeout = "long": not a duration`},
		{"consumers.http without url", consumerC + "handler = \"http\"", `consumers.C.http.url = "": handler = "http" needs a url`},
		{"consumers.http bad scheme", consumerC + "handler = \"http\"\n[consumers.C.http]\nurl = \"ftp://127.0.0.1/x\"", `consumers.C.http.url = "ftp://127.0.0.1/x": must be an http:// or https:// URL`},
		// check passed these; run refused the first two or retried and dead-lettered every message.
		{"consumers.http no host", consumerC + "handler = \"http\"\n[consumers.C.http]\nurl = \"http:///x\"", `consumers.C.http.url = "http:///x": has no host, such as http://127.0.0.1:8080/orders`},
		{"consumers.http bad url", consumerC + "handler = \"http\"\n[consumers.C.http]\nurl = \"http://127.0.0.1/%zz\"", `consumers.C.http.url = "http://127.0.0.1/%zz": is not a valid URL: invalid URL escape "%zz"`},
		{"consumers.http port too big", consumerC + "handler = \"http\"\n[consumers.C.http]\nurl = \"http://127.0.0.1:99999/x\"", `consumers.C.http.url = "http://127.0.0.1:99999/x": port 99999 is not between 1 and 65535`},
		{"consumers.http port 0", consumerC + "handler = \"http\"\n[consumers.C.http]\nurl = \"http://127.0.0.1:0/x\"", `consumers.C.http.url = "http://127.0.0.1:0/x": port 0 is not between 1 and 65535`},
		{"consumers.http password not shown", consumerC + "handler = \"http\"\n[consumers.C.http]\nurl = \"http://u:hunter2@127.0.0.1:70000/x\"", `consumers.C.http.url = "http://u:xxxxx@127.0.0.1:70000/x": port 70000`},
		{"consumers.http.timeout 0", consumerC + "[consumers.C.http]\ntimeout = \"0s\"", "consumers.C.http.timeout = 0s: must be at least 100ms"},
		{"consumers.http.timeout negative", consumerC + "[consumers.C.http]\ntimeout = \"-3s\"", "consumers.C.http.timeout = -3s: must be at least 100ms"},
		{"consumers.dead_letter configured stream", consumerC + "dead_letter = \"S\"", `consumers.C.dead_letter = "S": is a configured stream: dead-letter streams are created by holdfast, pick another name such as "S_DLQ"`},
		{"consumers.dead_letter configured stream named like the default", consumerC + "dead_letter = \"S_DLQ\"\n[streams.S_DLQ]\nsubjects = [\"x.*\"]", `consumers.C.dead_letter = "S_DLQ": is a configured stream: dead-letter streams are created by holdfast, pick another name such as "S_DLQ_DEAD"`},
		// The server refuses these consumers; holdfast run stopped at start-up after check had passed.
		{"consumers workqueue two unfiltered", "[streams.S]\nsubjects = [\"s.*\"]\nretention = \"workqueue\"\n[consumers.A]\nstream = \"S\"\n[consumers.B]\nstream = \"S\"\nfilter_subject = \"s.b\"", `consumers.B.filter_subject = "s.b": stream S has retention "workqueue", where a message goes to one consumer only: consumers A and B each need a filter_subject`},
		{"consumers workqueue overlapping filters", "[streams.S]\nsubjects = [\"s.*\"]\nretention = \"workqueue\"\n[consumers.A]\nstream = \"S\"\nfilter_subject = \"s.*\"\n[consumers.B]\nstream = \"S\"\nfilter_subject = \"s.b\"", `consumers.B.filter_subject = "s.b": overlaps "s.*" of consumer A on stream S`},
		// The server refuses these streams; holdfast run stopped at start-up after check had passed.
		{"streams.max_age below the server's minimum", streamS + "max_age = \"10ms\"\nduplicate_window = \"10ms\"", `streams.S.max_age = 10ms: must be at least 100ms`},
		{"streams.duplicate_window below the server's minimum", streamS + "duplicate_window = \"50ms\"", `streams.S.duplicate_window = 50ms: must be at least 100ms`},
		{"streams.max_bytes together above max_file_store", "[jetstream]\nmax_file_store = \"1GiB\"\n" + streamS + "max_bytes = \"600MiB\"\n[streams.T]\nsubjects = [\"t.*\"]\nmax_bytes = \"600MiB\"", `jetstream.max_file_store = 1GiB: is less than the max_bytes of its streams together (S 600MiB + T 600MiB)`},
		{"streams.max_bytes all of max_file_store", "[jetstream]\nmax_file_store = \"1GiB\"\n" + streamS + "max_bytes = \"1GiB\"\n[consumers.C]\nstream = \"S\"", `jetstream.max_file_store = 1GiB: is all set aside for the max_bytes of S 1GiB, and the server refuses a stream without max_bytes (S_DLQ)`},
		{"streams.max_bytes above max_memory_store", "[jetstream]\nmax_memory_store = \"64MiB\"\n" + streamS + "storage = \"memory\"\nallow_memory = true\nmax_bytes = \"128MiB\"", `jetstream.max_memory_store = 64MiB: is less than the max_bytes of its streams together (S 128MiB)`},
		{"consumers.dead_letter too long", "[streams." + strings.Repeat("S", 252) + "]\nsubjects = [\"s.*\"]\n[consumers.C]\nstream = \"" + strings.Repeat("S", 252) + "\"", `_DLQ": stream name is 256 bytes long: the server takes at most 255`},
		// A consumer on a mirror or a stream with sources filters on the origin's subjects.
		{"consumers.filter_subject outside a mirror's origin", "[streams.SRC]\nsubjects = [\"src.*\"]\n[streams.M]\nmirror = { name = \"SRC\" }\n[consumers.C]\nstream = \"M\"\nfilter_subject = \"x.a\"", `consumers.C.filter_subject = "x.a": matches none of stream M's subjects [src.*]`},
		{"consumers.dead_letter invalid", consumerC + "dead_letter = \"a.b\"", `consumers.C.dead_letter = "a.b": stream name must not contain`},

		{"http.listen non-loopback", "[http]\nlisten = \"0.0.0.0:8222\"", `http.listen = "0.0.0.0:8222": monitoring on a non-loopback address`},
		{"http.listen all interfaces", "[http]\nlisten = \":8222\"", `http.listen = ":8222": monitoring on a non-loopback address`},
		{"http.listen no port", "[http]\nlisten = \"127.0.0.1\"", `http.listen = "127.0.0.1": must be host:port`},
		{"http.listen port range", "[http]\nlisten = \"127.0.0.1:99999\"", `http.listen = "127.0.0.1:99999": port must be 0-65535`},
		{"http.listen port name", "[http]\nlisten = \"127.0.0.1:http\"", `http.listen = "127.0.0.1:http": port must be 0-65535`},

		{"http.stall_timeout 0", "[http]\nstall_timeout = \"0s\"", "http.stall_timeout = 0s: must be positive"},
		{"http.stall_timeout garbage", "[http]\nstall_timeout = \"5\"", `http.stall_timeout = "5": not a duration`},
		{"http.stall_timeout int", "[http]\nstall_timeout = 300", `http.stall_timeout = "300": a duration must be a string`},

		{"log.level", "[log]\nlevel = \"trace\"", `log.level = "trace": must be one of debug, info, warn, error`},
		{"log.level case", "[log]\nlevel = \"INFO\"", `log.level = "INFO": must be one of`},
		{"log.format", "[log]\nformat = \"xml\"", `log.format = "xml": must be one of text, json`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := mustParse(t, tt.toml+"\n")
			wantProblems(t, cfg.Validate(), tt.want)
		})
	}
}

// TestWrongTypes: a value of the wrong TOML type is a parse error that
// names the key and the line.
func TestWrongTypes(t *testing.T) {
	tests := []struct {
		name string
		toml string
		want []string
	}{
		{"server.port string", "[server]\nport = \"4222\"", []string{"line 2", "server.port", "string"}},
		{"server.name int", "[server]\nname = 5", []string{"line 2", "server.name"}},
		{"server.host array", "\n[server]\nhost = [\"127.0.0.1\"]", []string{"line 3", "server.host"}},
		{"jetstream.allow_tmpfs string", "[jetstream]\nallow_tmpfs = \"yes\"", []string{"line 2", "jetstream.allow_tmpfs"}},
		{"jetstream.sync bool", "[jetstream]\nsync = true", []string{"line 2", "jetstream.sync"}},
		{"log.level int", "[log]\nlevel = 3", []string{"line 2", "log.level"}},
		{"http.listen int", "[http]\nlisten = 8222", []string{"line 2", "http.listen"}},
		{"http.fail_on_loss string", "[http]\nfail_on_loss = \"yes\"", []string{"line 2", "http.fail_on_loss"}},
		{"server not a table", "server = 5", []string{"line 1", "server"}},
		{"streams.subjects string", "[streams.S]\nsubjects = \"s.*\"", []string{"line 2", "streams.S.subjects"}},
		{"streams.max_msgs string", streamS + "max_msgs = \"1000\"", []string{"line 3", "streams.S.max_msgs"}},
		{"streams.allow_memory string", streamS + "allow_memory = \"true\"", []string{"line 3", "streams.S.allow_memory"}},
		{"streams.replicas float", streamS + "replicas = 1.0", []string{"line 3", "streams.S.replicas"}},
		{"stream not a table", "[streams]\nS = 5", []string{"line 2", "streams.S"}},
		{"consumers.stream int", streamS + "[consumers.C]\nstream = 5", []string{"line 4", "consumers.C.stream"}},
		{"consumers.max_deliver string", consumerC + "max_deliver = \"5\"", []string{"line 5", "consumers.C.max_deliver"}},
		{"consumers.workers bool", consumerC + "workers = true", []string{"line 5", "consumers.C.workers"}},
		{"consumers.backoff string", consumerC + "backoff = \"1s\"", []string{"line 5", "consumers.C.backoff"}},
		{"consumers.exec not a table", consumerC + "exec = 5", []string{"line 5", "consumers.C.exec"}},
		{"consumers.exec.command string", consumerC + "[consumers.C.exec]\ncommand = \"/bin/true\"", []string{"line 6", "consumers.C.exec.command"}},
		{"consumers.http.url int", consumerC + "[consumers.C.http]\nurl = 80", []string{"line 6", "consumers.C.http.url"}},
		{"integer overflow", "[server]\nport = 99999999999999999999", []string{"line 2", "server.port", "99999999999999999999"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantParseError(t, tt.toml+"\n", tt.want...)
		})
	}
}

func TestUnknownKeys(t *testing.T) {
	tests := []struct {
		name string
		toml string
		want []string // fragments: the key path and its line
	}{
		{"top level", "# comment\nbogus = 1\n", []string{"line 2: bogus: unknown key"}},
		{"top-level table", "[log]\nlevel = \"info\"\n\n[metrics]\nlisten = \"x\"\n", []string{"line 4: metrics: unknown key", "line 5: metrics.listen: unknown key"}},
		{"in server", "[server]\nhost = \"127.0.0.1\"\nlisten = \"x\"\n", []string{"line 3: server.listen: unknown key"}},
		{"misspelt jetstream key", "[jetstream]\n\nstoredir = \"/x\"\n", []string{"line 3: jetstream.storedir: unknown key"}},
		{"in run", "[run]\nshutdown = \"5s\"\n", []string{"line 2: run.shutdown: unknown key"}},
		{"in a stream", "[streams.ORDERS]\nsubjects = [\"orders.*\"]\nmax_age = \"1h\"\nmaxage = \"2h\"\n", []string{"line 4: streams.ORDERS.maxage: unknown key"}},
		{"in a consumer", consumerC + "ackwait = \"1s\"\n", []string{"line 5: consumers.C.ackwait: unknown key"}},
		{"in consumers.X.exec", consumerC + "[consumers.C.exec]\ncommand = [\"/bin/true\"]\nargs = [\"x\"]\n", []string{"line 7: consumers.C.exec.args: unknown key"}},
		{"in consumers.X.http", consumerC + "[consumers.C.http]\nmethod = \"PUT\"\n", []string{"line 6: consumers.C.http.method: unknown key"}},
		{"in http", "[http]\nport = 1\n", []string{"line 2: http.port: unknown key"}},
		{"in log", "[log]\nlevel = \"info\"\ncolor = true\n", []string{"line 3: log.color: unknown key"}},
		{"dotted key", "\nserver.bogus = 1\n", []string{"line 2: server.bogus: unknown key"}},
		{"quoted table name", "[streams.\"S\"]\nsubjects = [\"s.*\"]\nfoo = 1\n", []string{"line 3: streams.S.foo: unknown key"}},
		{"several at once", "a = 1\n[server]\nb = 2\n[streams.S]\nsubjects = [\"s\"]\nc = 3\n", []string{
			"line 1: a: unknown key", "line 3: server.b: unknown key", "line 6: streams.S.c: unknown key"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := wantParseError(t, tt.toml, tt.want...)
			if !strings.Contains(err.Error(), "`holdfast config` prints every valid key") {
				t.Errorf("error does not say where to find valid keys: %v", err)
			}
		})
	}
}

// A wrongly typed [streams] or [consumers] value must not be ignored in
// favour of the defaults.
func TestStreamsAndConsumersMustBeTables(t *testing.T) {
	for _, text := range []string{
		"streams = 5\n",
		"streams = []\n",
		"streams = \"ORDERS\"\n",
		"consumers = 5\n",
		"consumers = \"WORKER1\"\n",
		"consumers = [\"WORKER1\"]\n",
		"[[streams]]\nsubjects = [\"a\"]\n",
	} {
		t.Run(text, func(t *testing.T) {
			key := strings.TrimLeft(strings.Fields(text)[0], "[")
			key = strings.TrimRight(key, "]")
			wantParseError(t, text, "line 1", key)
		})
	}
}

func TestSyntaxErrorCarriesLine(t *testing.T) {
	tests := []struct {
		name string
		toml string
		line string
	}{
		{"double equals", "[server]\nport = = 1\n", "line 2"},
		// The parser notices the missing ']' at the newline, and counts it
		// on the next line.
		{"unclosed header", "[log]\nlevel = \"info\"\n[server\nport = 1\n", "line 4"},
		{"unterminated string", "\n\n\n[log]\nlevel = \"info\n", "line 5"},
		{"bare value", "[jetstream]\nstore_dir = /var/lib\n", "line 2"},
		{"duplicate key", "[server]\nport = 1\nport = 2\n", "line 3"},
		{"duplicate table", "[server]\n[log]\n[server]\n", "line 3"},
		{"invalid escape", "[jetstream]\nstore_dir = \"C:\\data\"\n", "line 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantParseError(t, tt.toml, tt.line)
		})
	}
}

func TestValidationCollectsEveryProblem(t *testing.T) {
	cfg := mustParse(t, `
[server]
host = "0.0.0.0"
[streams.S]
subjects = ["s.*"]
max_age = "forever"
[consumers.C]
stream = "S"
max_deliver = 0
`)
	err := cfg.Validate()
	ve := wantProblems(t, err,
		`server.host = "0.0.0.0"`,
		`streams.S.max_age = "forever"`,
		"consumers.C.max_deliver = 0")
	if len(ve.Problems) != 3 {
		t.Errorf("got %d problems, want 3:\n%v", len(ve.Problems), err)
	}
	if !strings.HasPrefix(err.Error(), "config: 3 problem(s):\n  ") {
		t.Errorf("error text %q does not start with the count", err)
	}
	if n := strings.Count(err.Error(), "\n  "); n != 3 {
		t.Errorf("error lists %d lines, want 3:\n%v", n, err)
	}
	// Validate is a pure function of the config.
	if again := cfg.Validate(); again.Error() != err.Error() {
		t.Errorf("second Validate differs:\n%v\n%v", again, err)
	}
}

func TestOverlappingSubjects(t *testing.T) {
	tests := []struct {
		name   string
		a, b   string // subjects of streams A and B
		ok     bool
		wantIn string
	}{
		{"wildcard vs full wildcard", `"orders.*"`, `"orders.>"`, false, `streams.B.subjects = "orders.>": overlaps "orders.*" of stream A`},
		{"literal vs wildcard", `"a.b"`, `"a.*"`, false, `streams.B.subjects = "a.*": overlaps "a.b" of stream A`},
		{"same literal", `"a.b"`, `"a.b"`, false, `streams.B.subjects = "a.b": overlaps "a.b" of stream A`},
		{"inner wildcard", `"orders.*.created"`, `"orders.>"`, false, `streams.B.subjects = "orders.>": overlaps "orders.*.created" of stream A`},
		{"second subject", `"x", "a.>"`, `"y", "a.b.c"`, false, `streams.B.subjects = "a.b.c": overlaps "a.>" of stream A`},
		{"different tokens", `"orders.*"`, `"invoices.*"`, true, ""},
		{"different depth", `"a.*"`, `"a.b.c"`, true, ""},
		{"literal and longer", `"a"`, `"a.b"`, true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := mustParse(t, "[streams.A]\nsubjects = ["+tt.a+"]\n[streams.B]\nsubjects = ["+tt.b+"]\n")
			err := cfg.Validate()
			if tt.ok {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			ve := wantProblems(t, err, tt.wantIn)
			if len(ve.Problems) != 1 {
				t.Errorf("want exactly one problem, got:\n%v", err)
			}
		})
	}
}

// A stream's subjects must not overlap what the server or holdfast's own
// dead-letter streams use, even through wildcards: the server would refuse
// the stream at start-up although `holdfast check` said the file was fine.
// Each verdict is checked against a real JetStream server too.
func TestSubjectsOverlappingReservedSpace(t *testing.T) {
	tests := []struct {
		subject string
		ok      bool
		strict  bool // refused by holdfast though the server would take it
	}{
		{"*.>", false, false},           // $JS.API.> and dlq.WORKER1.>
		{"*.*", false, false},           // $JS.API
		{"*.WORKER1.>", false, false},   // dlq.WORKER1.>
		{"*.*.*", false, false},         // $JS.API.INFO, dlq.WORKER1.x
		{"*.created", false, false},     // $JS.created
		{"*.OTHER.>", false, false},     // $JS.OTHER.x
		{"$JS.EVENT.x", false, true},    // $ is reserved as a whole, even the server's exception
		{"$SYS.x", false, false},        // the system account's API
		{"dlq.WORKER1.x", false, false}, // dlq. prefix
		{"orders.>", true, false},       // a literal first token
		{"events.*.>", true, false},     // a literal first token
		{"*", true, false},              // one token: no API subject has one
		{"dlq", true, false},            // the bare word is not a dead-letter subject
	}
	// A server with no listener, reached in process.
	ns := natstest.RunServer(t, func(o *server.Options) { o.DontListen = true })
	js := natstest.JetStream(t, natstest.Connect(t, ns))
	ctx := natstest.Context(t)
	dlq := jetstream.StreamConfig{Name: "ORDERS_DLQ", Subjects: []string{"dlq.WORKER1.>"}}
	if _, err := js.CreateStream(ctx, dlq); err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.subject, func(t *testing.T) {
			cfg := mustParse(t, "[streams.ORDERS]\nsubjects = [\""+tt.subject+"\"]\n[consumers.WORKER1]\nstream = \"ORDERS\"\n")
			err := cfg.Validate()
			if tt.ok {
				if err != nil {
					t.Fatal(err)
				}
			} else {
				wantProblems(t, err, `streams.ORDERS.subjects = "`+tt.subject+`": reserved`)
			}
			_, serr := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{tt.subject}})
			if serr == nil {
				if err := js.DeleteStream(ctx, "ORDERS"); err != nil {
					t.Fatal(err)
				}
			}
			if (serr == nil) != (tt.ok || tt.strict) {
				t.Errorf("Validate says ok=%v, the server says %v", tt.ok, serr)
			}
		})
	}
}

func TestMemoryStorage(t *testing.T) {
	cfg := mustParse(t, streamS+"storage = \"memory\"\n")
	wantProblems(t, cfg.Validate(), `streams.S.storage = "memory"`, "allow_memory = true")
	cfg = mustParse(t, streamS+"storage = \"memory\"\nallow_memory = true\n")
	if err := cfg.Validate(); err != nil {
		t.Fatalf("memory storage with allow_memory = true: %v", err)
	}
	// allow_memory is per stream: it does not carry over to another.
	cfg = mustParse(t, streamS+"storage = \"memory\"\nallow_memory = true\n[streams.T]\nsubjects = [\"t\"]\nstorage = \"memory\"\n")
	ve := wantProblems(t, cfg.Validate(), `streams.T.storage = "memory"`)
	if len(ve.Problems) != 1 {
		t.Errorf("want only stream T refused, got:\n%v", ve)
	}
}

func TestNoStreams(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Streams = nil
	cfg.Consumers = nil
	wantProblems(t, cfg.Validate(), "streams: no stream configured")
}

func TestErrorsUnwrapToSentinel(t *testing.T) {
	_, perr := Parse(strings.NewReader("bogus = 1\n"), "a.toml")
	verr := mustParse(t, "[log]\nlevel = \"loud\"\n").Validate()
	for _, err := range []error{perr, verr} {
		if !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("errors.Is(%v, ErrInvalidConfig) = false", err)
		}
	}
	var pe *ParseError
	if !errors.As(perr, &pe) || pe.Source != "a.toml" {
		t.Errorf("parse error %#v", perr)
	}
	var ve *ValidationError
	if !errors.As(verr, &ve) {
		t.Errorf("validation error %#v", verr)
	}
	// An error from Parse about the TOML syntax also keeps the
	// underlying error reachable.
	_, serr := Parse(strings.NewReader("x = = 1"), "")
	if !errors.Is(serr, ErrInvalidConfig) || !strings.HasPrefix(serr.Error(), "config: ") {
		t.Errorf("syntax error %v", serr)
	}
	if errors.Unwrap(serr) != nil {
		t.Errorf("ParseError unwraps to several errors, errors.Unwrap should be nil")
	}
	if !errors.Is(&ParseError{Err: os.ErrClosed}, os.ErrClosed) {
		t.Error("ParseError does not unwrap to its cause")
	}
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, os.ErrDeadlineExceeded }

func TestParseReadError(t *testing.T) {
	_, err := Parse(failingReader{}, "slow.toml")
	if !errors.Is(err, os.ErrDeadlineExceeded) || !strings.Contains(err.Error(), "slow.toml") {
		t.Fatalf("Parse(failing reader) = %v", err)
	}
}

func TestWriteDefaultRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteDefault(&buf, DefaultStoreDir); err != nil {
		t.Fatal(err)
	}
	text := buf.String()
	cfg := mustParse(t, text)
	if err := cfg.Validate(); err != nil {
		t.Fatalf("the default file does not validate: %v", err)
	}
	if !reflect.DeepEqual(cfg, DefaultConfig()) {
		t.Fatalf("the default file parses to\n%+v\nwant DefaultConfig()\n%+v", cfg, DefaultConfig())
	}
	for _, want := range []string{"[server]", "[jetstream]", "[run]", "[streams.ORDERS]", "[consumers.WORKER1]",
		"[consumers.WORKER1.exec]", "[consumers.WORKER1.http]", "[http]", "[log]"} {
		if !strings.Contains(text, "\n"+want) {
			t.Errorf("the default file has no %s table", want)
		}
	}

	for _, dir := range []string{
		"/var/lib/holdfast/jetstream",
		"relative/dir",
		"/srv/with space/js",
		`/srv/quote"d`,
		`C:\holdfast\data`,
		"/srv/ünïcode/日本",
		"/srv/tab\there",
	} {
		t.Run(dir, func(t *testing.T) {
			var buf bytes.Buffer
			if err := WriteDefault(&buf, dir); err != nil {
				t.Fatal(err)
			}
			cfg := mustParse(t, buf.String())
			want := DefaultConfig()
			want.JetStream.StoreDir = dir
			if !reflect.DeepEqual(cfg, want) {
				t.Errorf("store dir %q: parsed %+v, want %+v", dir, cfg.JetStream, want.JetStream)
			}
			if err := cfg.Validate(); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestWriteDefaultRefusesInvalidUTF8(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteDefault(&buf, "/srv/\xff"); err == nil {
		t.Fatalf("WriteDefault wrote a store dir that is not UTF-8:\n%s", buf.String())
	}
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, os.ErrClosed }

func TestWriteDefaultWriteError(t *testing.T) {
	if err := WriteDefault(failingWriter{}, DefaultStoreDir); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("WriteDefault to a failing writer = %v, want its error", err)
	}
}

// Every key of the structs appears in the commented default file, so that
// `holdfast config` documents them all.
func TestDefaultFileMentionsEveryKey(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteDefault(&buf, DefaultStoreDir); err != nil {
		t.Fatal(err)
	}
	text := buf.String()
	for _, v := range []any{ServerConfig{}, JetStreamConfig{}, RunConfig{}, StreamConfig{}, ConsumerConfig{}, ExecConfig{}, HTTPHandlerConfig{}, HTTPConfig{}, LogConfig{},
		LeafNodesConfig{}, RemoteConfig{}, ForwardConfig{}, SourceConfig{}} {
		typ := reflect.TypeOf(v)
		for i := range typ.NumField() {
			tag := typ.Field(i).Tag.Get("toml")
			if tag == "" || tag == "-" {
				continue
			}
			if !strings.Contains(text, tag+" = ") && !strings.Contains(text, "."+tag+"]") {
				t.Errorf("%s.%s (%s) is not in the default file", typ.Name(), typ.Field(i).Name, tag)
			}
		}
	}
}

func TestLoad(t *testing.T) {
	t.Run("no path and no default file", func(t *testing.T) {
		if _, err := os.Stat(DefaultPath); err == nil {
			t.Skipf("%s exists on this machine", DefaultPath)
		}
		cfg, source, err := Load("")
		if err != nil {
			t.Fatal(err)
		}
		if source != "" {
			t.Errorf("source = %q, want \"\" for built-in defaults", source)
		}
		if !reflect.DeepEqual(cfg, builtinDefaults()) {
			t.Errorf("Load(\"\") = %+v, want DefaultConfig(), its consumer implied", cfg)
		}
	})
	t.Run("missing explicit path", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "nope.toml")
		cfg, source, err := Load(path)
		if err == nil {
			t.Fatalf("Load(%s) = %+v, want an error", path, cfg)
		}
		if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), path) {
			t.Errorf("error %v does not name %s as missing", err, path)
		}
		if source != path {
			t.Errorf("source = %q, want %q", source, path)
		}
	})
	t.Run("a directory", func(t *testing.T) {
		dir := t.TempDir()
		if _, _, err := Load(dir); err == nil {
			t.Fatalf("Load(%s) of a directory succeeded", dir)
		}
	})
	t.Run("valid file", func(t *testing.T) {
		path := writeFile(t, "[server]\nport = 4999\n")
		cfg, source, err := Load(path)
		if err != nil {
			t.Fatal(err)
		}
		if source != path || cfg.Server.Port != 4999 {
			t.Errorf("Load = port %d, source %q", cfg.Server.Port, source)
		}
	})
	t.Run("invalid value", func(t *testing.T) {
		path := writeFile(t, "[log]\nlevel = \"loud\"\n")
		_, _, err := Load(path)
		wantProblems(t, err, `log.level = "loud"`)
		if !strings.HasPrefix(err.Error(), path+": 1 problem(s)") {
			t.Errorf("error %q does not start with the file name", err)
		}
	})
	// port = -1 ran on a random port that `holdfast status` and clients
	// could not find.
	t.Run("random port", func(t *testing.T) {
		path := writeFile(t, "[server]\nport = -1\n")
		_, _, err := Load(path)
		wantProblems(t, err, "server.port = -1: must be 1-65535")
	})
	t.Run("syntax error", func(t *testing.T) {
		path := writeFile(t, "[log]\nlevel = \n")
		_, _, err := Load(path)
		var pe *ParseError
		if !errors.As(err, &pe) || !errors.Is(err, ErrInvalidConfig) {
			t.Fatalf("Load = %v, want a *ParseError", err)
		}
		if !strings.HasPrefix(err.Error(), path+": line 2") {
			t.Errorf("error %q does not start with file and line", err)
		}
	})
}

func writeFile(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "holdfast.toml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestIsLoopback(t *testing.T) {
	for host, want := range map[string]bool{
		"127.0.0.1": true, "127.1.2.3": true, "::1": true, "localhost": true,
		"0.0.0.0": false, "::": false, "10.0.0.1": false, "": false, "example.com": false, "LOCALHOST": false,
	} {
		if got := IsLoopback(host); got != want {
			t.Errorf("IsLoopback(%q) = %v, want %v", host, got, want)
		}
	}
}

func TestAllStreamNames(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Streams["AUDIT"] = DefaultStream([]string{"audit.>"})
	cc := DefaultConsumer("AUDIT")
	cc.DeadLetter = "AUDIT_DLQ"
	cfg.Consumers["AUDITOR"] = cc
	got := cfg.AllStreamNames()
	want := []string{"AUDIT", "ORDERS", "AUDIT_DLQ", "ORDERS_DLQ"}
	if !slices.Equal(got, want) {
		t.Errorf("AllStreamNames() = %q, want %q", got, want)
	}
}

// TestLoadRefusesFileWithoutKeys: an existing file that sets no key
// (empty, or only comments) is an ErrNoKeys naming the file and what to
// do, for Load (run, check) and LoadForReload alike, whatever holdfast
// runs on. Load used to take it for the built-in defaults, so `holdfast
// check` passed a file that a reload refused, and a start on it gave
// WORKER1 the log handler.
func TestLoadRefusesFileWithoutKeys(t *testing.T) {
	running := mustParse(t, "[log]\nlevel = \"debug\"\n")
	defaults := DefaultConfig()
	if err := defaults.validateFile(); err != nil {
		t.Fatal(err)
	}
	for _, text := range []string{"", "\n  \n", "# all commented out\n# [server]\n"} {
		path := filepath.Join(t.TempDir(), "holdfast.toml")
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		wantErr := func(what string, err error) {
			t.Helper()
			if !errors.Is(err, ErrNoKeys) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "holdfast config") {
				t.Errorf("%s(%q) = %v, want ErrNoKeys naming the file and `holdfast config`", what, text, err)
			}
		}
		_, _, err := Load(path)
		wantErr("Load", err)
		_, _, err = LoadForReload(path, running)
		wantErr("LoadForReload on another config", err)
		_, _, err = LoadForReload(path, defaults)
		wantErr("LoadForReload on the defaults", err)
	}
	path := filepath.Join(t.TempDir(), "holdfast.toml")
	if err := os.WriteFile(path, []byte("[log]\nlevel = \"debug\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if cfg, _, err := LoadForReload(path, running); err != nil || cfg.Log.Level != "debug" {
		t.Errorf("LoadForReload of a file with a key = %v, %v", cfg, err)
	}
	if cfg, _, err := Load(path); err != nil || cfg.Log.Level != "debug" {
		t.Errorf("Load of a file with a key = %v, %v", cfg, err)
	}
}

// TestStreamMaxMsgSize: a hub's stream that takes edge_subjects takes
// ForwardHeadroom more than max_payload (the origin headers an edge adds
// to a message of its largest size); other streams, and every stream of a
// node that is no hub, take max_payload.
func TestStreamMaxMsgSize(t *testing.T) {
	tests := []struct {
		name, text string
		want       int64
	}{
		{"hub stream on edge.>", "[leafnodes]\nlisten = \"127.0.0.1:7422\"\n[streams.S]\nsubjects = [\"edge.>\"]\n", 1<<20 + ForwardHeadroom},
		{"hub stream on a part", "[leafnodes]\nlisten = \"127.0.0.1:7422\"\n[streams.S]\nsubjects = [\"edge.site1.>\"]\n", 1<<20 + ForwardHeadroom},
		{"hub stream elsewhere", "[leafnodes]\nlisten = \"127.0.0.1:7422\"\n[streams.S]\nsubjects = [\"orders.*\"]\n", 1 << 20},
		{"hub without edge_subjects", "[leafnodes]\nlisten = \"127.0.0.1:7422\"\nedge_subjects = []\n[streams.S]\nsubjects = [\"edge.>\"]\n", 1 << 20},
		{"no hub", "[streams.S]\nsubjects = [\"edge.>\"]\n", 1 << 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := mustParse(t, tt.text).StreamMaxMsgSize("S"); got != tt.want {
				t.Errorf("StreamMaxMsgSize = %d, want %d", got, tt.want)
			}
		})
	}
}

// TestWrongTypeReportsOnlyItself: a wrongly typed value in a stream or
// consumer table stops that table's decoding; the valid keys after it
// are not unknown keys (they were reported as such, a different set from
// one run to the next).
func TestWrongTypeReportsOnlyItself(t *testing.T) {
	tests := []struct {
		name string
		toml string
		want string
	}{
		{"consumer workers as a string", "[streams.S]\nsubjects = [\"s.*\"]\n[consumers.C]\nstream = \"S\"\nworkers = \"3\"\nmax_deliver = 5\nbackoff = [\"1s\"]\nhandler = \"exec\"\n[consumers.C.exec]\ncommand = [\"/bin/true\"]\n", "consumers.C"},
		{"stream max_msgs as a string", "[streams.S]\nmax_msgs = \"10\"\nsubjects = [\"s.*\"]\nmax_age = \"1h\"\nreplicas = 1\n", "streams.S"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for range 20 { // the decoder walks tables in map order
				err := wantParseError(t, tt.toml, tt.want)
				if strings.Contains(err.Error(), "unknown key") || strings.Count(err.Error(), "\n") > 0 {
					t.Fatalf("want the type error alone, got:\n%v", err)
				}
			}
		})
	}
}

// TestUnknownKeySuggestsValidOne: an unknown key close to a valid key of
// its table names it; one close to none names none.
func TestUnknownKeySuggestsValidOne(t *testing.T) {
	tests := []struct {
		name string
		toml string
		want string // "" for no suggestion
	}{
		{"consumer", consumerC + "max_delivers = 5\n", "consumers.C.max_delivers: unknown key (did you mean consumers.C.max_deliver?)"},
		{"consumer exec", consumerC + "[consumers.C.exec]\ncomand = [\"/bin/true\"]\n", "consumers.C.exec.comand: unknown key (did you mean consumers.C.exec.command?)"},
		{"stream", "[streams.S]\nsubjects = [\"s.*\"]\nmaxage = \"1h\"\n", "streams.S.maxage: unknown key (did you mean streams.S.max_age?)"},
		{"jetstream", "[jetstream]\nstoredir = \"/x\"\n", "jetstream.storedir: unknown key (did you mean jetstream.store_dir?)"},
		{"auth user", "[auth.users.app]\npasword = \"x\"\n", "auth.users.app.pasword: unknown key (did you mean auth.users.app.password?)"},
		{"top-level table", "[steams.S]\nsubjects = [\"s.*\"]\n", "steams.S.subjects: unknown key (did you mean streams.S.subjects?)"},
		{"nothing close", "[server]\nlisten = \"x\"\n", ""},
		{"below a sub-table", consumerC + "[consumers.C.exec]\ncommand = [\"/bin/true\"]\ndead_letter = \"X\"\n",
			"consumers.C.exec.dead_letter: unknown key (did you mean consumers.C.dead_letter? a key below the [consumers.C.exec] header belongs to that table: move it above the header)"},
		{"below a table", "[streams.S]\nsubjects = [\"s.*\"]\n[http]\nlisten = \"\"\nmax_age = \"1h\"\n", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := wantParseError(t, tt.toml, "unknown key")
			switch {
			case tt.want == "" && strings.Contains(err.Error(), "did you mean"):
				t.Fatalf("want no suggestion, got %v", err)
			case tt.want != "" && !strings.Contains(err.Error(), tt.want):
				t.Fatalf("want %q in %v", tt.want, err)
			}
		})
	}
}
