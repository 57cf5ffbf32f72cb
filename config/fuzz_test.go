package config

import (
	"bytes"
	"errors"
	"path"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/nats-io/nats-server/v2/server"
)

// FuzzParse feeds arbitrary bytes to Parse and Validate. Neither may panic;
// every error is a config error; and a config that validates keeps the
// invariants the rest of holdfast relies on. Under plain `go test` only
// the seeds run; `go test -fuzz=FuzzParse ./config/` explores.
func FuzzParse(f *testing.F) {
	var def bytes.Buffer
	if err := WriteDefault(&def, "/var/lib/holdfast/jetstream"); err != nil {
		f.Fatal(err)
	}
	for _, seed := range []string{
		def.String(),
		"",
		"[server]\nport = 4222\n",
		"[streams.A]\nsubjects = [\"a.*\"]\n[streams.B]\nsubjects = [\"a.>\"]\n",
		"[streams.S]\nsubjects = [\"s.*\"]\nmax_bytes = \"10XB\"\nmax_age = 5\n[consumers.C]\nstream = \"S\"\nmax_deliver = 0\nhandler = \"exec\"\n[consumers.C.exec]\ncommand = [\"rel\"]\n",
		"[consumers.C]\nstream = \"NOPE\"\nworkers = 9\nmax_ack_pending = 1\n",
		"[auth]\n[tls]\n",
		"bogus = 1\n[streams.\"a.b\"]\nx = 1\n",
		"[server\nport = = 1\n",
		"streams = 5\n",
		"[[streams]]\nsubjects = [\"x\"]\n",
		"streams = { S = { subjects = [\"*.>\"] } }\n",
		"[jetstream]\nsync = \"2m\"\nmax_file_store = 99999999999999999999\n",
		"[streams.S]\nsubjects = [\"s\"]\nstorage = \"memory\"\nallow_memory = true\n[consumers.C]\nstream = \"S\"\ndead_letter = \"S\"\n",
		"\x00\xff[",
		deepTableName(), // 100 KB that took seconds and gigabytes to refuse
		"x = " + strings.Repeat("[", 100) + strings.Repeat("]", 100) + "\n",
		"x = { " + strings.Repeat("a.", 40) + "a = 1 }\n",
		"[streams.S]\nsubjects = [\"_INBOX.>\"]\n[jetstream]\nsync = \"1ns\"\n[consumers.C]\nstream = \"S\"\nack_wait = \"1ns\"\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse(bytes.NewReader(data), "fuzz.toml")
		if err != nil {
			if cfg != nil {
				t.Errorf("Parse returned a config and an error: %v", err)
			}
			var pe *ParseError
			if !errors.As(err, &pe) || !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("Parse error %v (%T) is not a *ParseError for ErrInvalidConfig", err, err)
			}
			if !strings.HasPrefix(err.Error(), "fuzz.toml: ") {
				t.Errorf("Parse error %q does not name the source", err)
			}
			return
		}
		if cfg == nil {
			t.Fatal("Parse returned neither a config nor an error")
		}
		verr := cfg.Validate()
		if verr != nil {
			var ve *ValidationError
			if !errors.As(verr, &ve) || !errors.Is(verr, ErrInvalidConfig) {
				t.Fatalf("Validate error %v (%T) is not a *ValidationError for ErrInvalidConfig", verr, verr)
			}
			if len(ve.Problems) == 0 {
				t.Error("ValidationError without problems")
			}
			for _, p := range ve.Problems {
				if p.Key == "" || p.Reason == "" {
					t.Errorf("problem without a key or reason: %+v", p)
				}
			}
			if again := cfg.Validate(); again == nil || again.Error() != verr.Error() {
				t.Errorf("Validate is not deterministic:\n%v\n%v", verr, again)
			}
			return
		}
		checkInvariants(t, cfg)
	})
}

// checkInvariants states what a validated config guarantees.
func checkInvariants(t *testing.T, cfg *Config) {
	t.Helper()
	if !IsLoopback(cfg.Server.Host) && !cfg.Auth.Enabled() && !cfg.Server.AllowAnonymous {
		t.Errorf("server.host %q is not loopback, yet neither [auth] nor allow_anonymous is set", cfg.Server.Host)
	}
	if cfg.HTTP.Listen != "" && !strings.Contains(cfg.HTTP.Listen, ":") {
		t.Errorf("http.listen %q has no port", cfg.HTTP.Listen)
	}
	if cfg.JetStream.StoreDir == "" {
		t.Error("empty store dir")
	}
	if cfg.JetStream.MaxFileStore.Bytes <= 0 || cfg.JetStream.MaxMemoryStore.Bytes <= 0 {
		t.Errorf("unlimited store: %+v", cfg.JetStream)
	}
	if !cfg.JetStream.SyncAlways() && cfg.JetStream.SyncInterval() < MinSyncInterval {
		t.Errorf("sync %q is neither always nor an interval", cfg.JetStream.Sync)
	}
	if cfg.Run.ShutdownTimeout.Duration <= 0 {
		t.Errorf("shutdown_timeout %v", cfg.Run.ShutdownTimeout)
	}
	if len(cfg.Streams) == 0 {
		t.Error("no streams")
	}
	type owned struct{ stream, subject string }
	var subjects []owned
	for _, name := range cfg.StreamNames() {
		s := cfg.Streams[name]
		if s == nil {
			t.Fatalf("stream %s is nil", name)
		}
		if s.Storage == "memory" && !s.AllowMemory {
			t.Errorf("stream %s: memory storage without allow_memory", name)
		}
		if s.Storage != "file" && s.Storage != "memory" {
			t.Errorf("stream %s: storage %q", name, s.Storage)
		}
		if s.Replicas != 1 || s.MaxMsgs == 0 || s.MaxBytes.Bytes == 0 || s.MaxAge.Duration < 0 {
			t.Errorf("stream %s: %+v", name, s)
		}
		if len(s.Subjects) == 0 {
			t.Errorf("stream %s has no subjects", name)
		}
		for _, subj := range s.Subjects {
			if !server.IsValidSubject(subj) || server.SubjectsCollide(subj, "$JS.>") || strings.HasPrefix(subj, "$") ||
				server.SubjectsCollide(subj, "_INBOX.>") {
				t.Errorf("stream %s: subject %q is invalid or reserved", name, subj)
			}
			for _, o := range subjects {
				if server.SubjectsCollide(o.subject, subj) {
					t.Errorf("stream %s subject %q overlaps stream %s subject %q", name, subj, o.stream, o.subject)
				}
			}
			subjects = append(subjects, owned{name, subj})
		}
	}
	// The dead-letter streams holdfast creates overlap no configured stream
	// and are not configured streams themselves.
	for dl, consumers := range cfg.DeadLetterStreams() {
		if cfg.Streams[dl] != nil {
			t.Errorf("dead-letter stream %s is a configured stream", dl)
		}
		for _, c := range consumers {
			dlSubject := "dlq." + c + ".>"
			if !server.IsValidSubject(dlSubject) {
				t.Errorf("dead-letter subject %q is invalid", dlSubject)
			}
			for _, o := range subjects {
				if server.SubjectsCollide(o.subject, dlSubject) {
					t.Errorf("dead-letter subject %q overlaps stream %s subject %q", dlSubject, o.stream, o.subject)
				}
			}
		}
	}
	for _, name := range cfg.ConsumerNames() {
		c := cfg.Consumers[name]
		if c == nil {
			t.Fatalf("consumer %s is nil", name)
		}
		if cfg.Streams[c.Stream] == nil {
			t.Errorf("consumer %s reads stream %q, which is not configured", name, c.Stream)
		}
		if c.MaxDeliver < 1 || c.AckWait.Duration < MinAckWait || c.MaxAckPending < 1 {
			t.Errorf("consumer %s: max_deliver %d, ack_wait %v, max_ack_pending %d", name, c.MaxDeliver, c.AckWait, c.MaxAckPending)
		}
		if c.Workers < 0 || c.Workers > c.MaxAckPending {
			t.Errorf("consumer %s: %d workers, max_ack_pending %d", name, c.Workers, c.MaxAckPending)
		}
		for i, b := range c.Backoff {
			if b.Duration < MinBackoff {
				t.Errorf("consumer %s: backoff[%d] = %v", name, i, b)
			}
		}
		switch c.Handler {
		case "exec":
			if len(c.Exec.Command) == 0 || !path.IsAbs(c.Exec.Command[0]) {
				t.Errorf("consumer %s: exec command %q", name, c.Exec.Command)
			}
		case "http":
			if !strings.HasPrefix(c.HTTP.URL, "http://") && !strings.HasPrefix(c.HTTP.URL, "https://") {
				t.Errorf("consumer %s: http url %q", name, c.HTTP.URL)
			}
		case "log", "go":
		default:
			t.Errorf("consumer %s: handler %q", name, c.Handler)
		}
		if c.FilterSubject != "" {
			in := false
			for _, s := range cfg.Streams[c.Stream].Subjects {
				in = in || server.SubjectsCollide(s, c.FilterSubject)
			}
			if !in {
				t.Errorf("consumer %s: filter %q outside stream %s", name, c.FilterSubject, c.Stream)
			}
		}
	}
}

// FuzzWriteDefault checks that any store dir survives the trip through the
// commented default file.
func FuzzWriteDefault(f *testing.F) {
	for _, dir := range []string{DefaultStoreDir, "/var/lib/holdfast/jetstream", `C:\data`, `a"b`, "tab\there", "nl\nx", "\x7f", "日本", "\xff"} {
		f.Add(dir)
	}
	f.Fuzz(func(t *testing.T, dir string) {
		var buf bytes.Buffer
		err := WriteDefault(&buf, dir)
		if !utf8.ValidString(dir) {
			if err == nil {
				t.Fatalf("WriteDefault(%q) accepted a store dir that is not UTF-8", dir)
			}
			return
		}
		if err != nil {
			t.Fatalf("WriteDefault(%q): %v", dir, err)
		}
		cfg, err := Parse(&buf, "default.toml")
		if err != nil {
			t.Fatalf("WriteDefault(%q) does not parse back: %v", dir, err)
		}
		want := DefaultConfig()
		want.JetStream.StoreDir = dir
		if !reflect.DeepEqual(cfg, want) {
			t.Fatalf("WriteDefault(%q) parses to store dir %q", dir, cfg.JetStream.StoreDir)
		}
	})
}

// FuzzParseSize: ParseSize never panics, and what it accepts is -1 or a
// non-negative byte count.
func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"10GB", "512MiB", "1 KiB", "4096", "-1", "-5", "", "10XB", "8388608TiB", "+_", "-1B"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseSize(s)
		if err != nil {
			if n != 0 {
				t.Errorf("ParseSize(%q) = %d with error %v", s, n, err)
			}
			return
		}
		if n < -1 {
			t.Errorf("ParseSize(%q) = %d", s, n)
		}
	})
}
