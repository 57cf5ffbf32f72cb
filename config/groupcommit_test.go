package config

import (
	"errors"
	"strings"
	"testing"
)

// TestGroupCommitRefusals: group_commit on a stream without subjects of
// its own (a mirror, or only sources) is refused by its key path: nothing
// would publish to it for holdfast to answer.
func TestGroupCommitRefusals(t *testing.T) {
	const a = "[streams.A]\nsubjects = [\"a.*\"]\n"
	for _, tc := range []struct {
		name, toml, key, reason string
	}{
		{"mirror", a + "[streams.M]\nmirror = { name = \"A\" }\ngroup_commit = true\n", "streams.M.group_commit", "a mirror"},
		{"sources only", a + "[streams.S]\nsources = [{ name = \"A\" }]\ngroup_commit = true\n", "streams.S.group_commit", "no subjects"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantFileProblem(t, tc.toml, tc.key, tc.reason)
		})
	}
	// Sources beside subjects of its own: the clients' publishes are batched.
	cfg := mustParse(t, a+"[streams.S]\nsubjects = [\"s.*\"]\nsources = [{ name = \"A\" }]\ngroup_commit = true\n")
	if err := cfg.validateFile(); err != nil {
		t.Fatalf("group commit with subjects and sources: %v", err)
	}
}

// jetstream.commit_window turns group commit on for the streams clients
// publish to, and is refused where a publish could be answered before
// holdfast's flush.
func TestCommitWindow(t *testing.T) {
	cfg, err := Parse(strings.NewReader("[jetstream]\ncommit_window = \"40ms\"\n"), "test")
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if !cfg.CommitWindowOn() || !cfg.Streams[DefaultStreamName].GroupCommit {
		t.Fatalf("commit_window 40ms: on %v, ORDERS group_commit %v", cfg.CommitWindowOn(), cfg.Streams[DefaultStreamName].GroupCommit)
	}
	for _, tc := range []struct{ name, toml, want string }{
		{"negative", "[jetstream]\ncommit_window = \"-1ms\"", `jetstream.commit_window = -1ms: must be "0s"`},
		{"too long", "[jetstream]\ncommit_window = \"2s\"", "at most 1s"},
		{"sync interval", "[jetstream]\nsync = \"2m\"\ncommit_window = \"40ms\"", `needs jetstream.sync = "always"`},
		{"group_commit false", "[jetstream]\ncommit_window = \"40ms\"\n[streams.ORDERS]\nsubjects = [\"orders.*\"]\ngroup_commit = false", "streams.ORDERS.group_commit = false: with jetstream.commit_window = 40ms"},
		{"hub", "[server]\nname = \"hub\"\n[jetstream]\ncommit_window = \"40ms\"\ndomain = \"hub\"\n[leafnodes]\nlisten = \"127.0.0.1:7422\"", "not supported on a hub"},
		{"mqtt", "[server]\nname = \"e1\"\n[jetstream]\ncommit_window = \"40ms\"\n[mqtt]\nlisten = \"127.0.0.1:1883\"", "not supported with [mqtt]"},
		{"cluster", "[server]\nname = \"n1\"\n[jetstream]\ncommit_window = \"40ms\"\n[cluster]\nname = \"c\"\nlisten = \"127.0.0.1:6222\"\nroutes = [\"nats-route://127.0.0.1:6223\"]", "not supported with [cluster]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse(strings.NewReader(tc.toml), "test")
			if err == nil {
				err = cfg.Validate()
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// With [cluster], jetstream.commit_window is one error of its own: the
// group commit it implies on every stream is not a second one, under a
// key the file does not have. A group_commit = true the file has is.
func TestCommitWindowWithClusterNamesWhatTheFileSays(t *testing.T) {
	const cluster = "[server]\nname = \"n1\"\n[cluster]\nname = \"c\"\nlisten = \"127.0.0.1:6222\"\nroutes = [\"nats-route://127.0.0.1:6223\", \"nats-route://127.0.0.1:6224\"]\n[jetstream]\ncommit_window = \"40ms\"\n"
	for _, tc := range []struct {
		name, toml string
		want       []string
	}{
		{"defaults", cluster, []string{"jetstream.commit_window = 40ms: not supported with [cluster]"}},
		{"one stream says group_commit", cluster + "[streams.ORDERS]\nsubjects = [\"orders.*\"]\ngroup_commit = true\n[streams.EVENTS]\nsubjects = [\"events.*\"]\n",
			[]string{"streams.ORDERS.group_commit = true: not supported with [cluster]", "jetstream.commit_window = 40ms: not supported with [cluster]"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse(strings.NewReader(tc.toml), "test")
			if err != nil {
				t.Fatal(err)
			}
			var ve *ValidationError
			if err := cfg.Validate(); !errors.As(err, &ve) {
				t.Fatalf("got %v, want a ValidationError", err)
			}
			var got []string
			for _, p := range ve.Problems {
				got = append(got, p.String())
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %d problem(s), want %d:\n  %s", len(got), len(tc.want), strings.Join(got, "\n  "))
			}
			for i, want := range tc.want {
				if !strings.HasPrefix(got[i], want) {
					t.Errorf("problem %d: %q, want it to start with %q", i+1, got[i], want)
				}
			}
		})
	}
}
