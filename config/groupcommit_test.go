package config

import "testing"

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
