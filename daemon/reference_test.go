package daemon

import (
	"os"
	"strings"
	"testing"
)

// TestConfigReferenceUpToDate: docs/configuration-reference.md is what
// `holdfast config --reference` writes now: `make docs` writes it again.
func TestConfigReferenceUpToDate(t *testing.T) {
	var b strings.Builder
	if err := WriteConfigReference(&b); err != nil {
		t.Fatal(err)
	}
	file, err := os.ReadFile("../docs/configuration-reference.md")
	if err != nil {
		t.Fatal(err)
	}
	if string(file) != b.String() {
		t.Fatal("docs/configuration-reference.md differs from `holdfast config --reference`: run `make docs`")
	}
}

// TestRestartOnly: the keys the reference says only a restart applies,
// as restartOnlyChanges compares them, and a few that a reload applies.
func TestRestartOnly(t *testing.T) {
	for key, want := range map[string]bool{
		"server.port": true, "jetstream.sync": true, "leafnodes.remotes[].url": true, "log.format": true,
		"consumers.NAME.stream": true, "log.level": false, "run.shutdown_timeout": false,
		"streams.NAME.max_age": false, "consumers.NAME.workers": false, "consumers.NAME.forward.timeout": false,
	} {
		if got := RestartOnly(key); got != want {
			t.Errorf("RestartOnly(%s) = %v, want %v", key, got, want)
		}
	}
}
