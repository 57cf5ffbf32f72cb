package main

import (
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The bash completion script completes commands and flags of the built
// binary: sourced into bash with COMP_WORDS set as bash sets them. Where
// bash-completion is not installed, _get_comp_words_by_ref is the plain
// version of it (the words as typed).
func TestBashCompletion(t *testing.T) {
	t.Parallel()
	script := runHoldfast(t, nil, "completion", "bash")
	if script.code != 0 {
		t.Fatalf("completion bash: exit %d: %s", script.code, script.stderr)
	}
	for _, tc := range []struct {
		words string
		want  []string
	}{
		{"holdfast dl", []string{"dlq"}},
		{"holdfast dlq re", []string{"replay"}},
		{"holdfast status --js", []string{"--json"}},
	} {
		words := strings.Fields(tc.words)
		sh := `
if [ -r /usr/share/bash-completion/bash_completion ]; then . /usr/share/bash-completion/bash_completion
else _get_comp_words_by_ref() { cur="${COMP_WORDS[COMP_CWORD]}"; words=("${COMP_WORDS[@]}"); cword=$COMP_CWORD; }; fi
eval "$SCRIPT"
COMP_WORDS=(` + strings.Join(words, " ") + `)
COMP_CWORD=` + strconv.Itoa(len(words)-1) + `
_holdfast_complete
printf '%s\n' "${COMPREPLY[@]}"`
		cmd := exec.Command("bash", "-c", sh)
		cmd.Env = append(e2eEnv(), "SCRIPT="+script.stdout, "PATH="+filepath.Dir(holdfastBin)+":/usr/bin:/bin")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%q: %v\n%s", tc.words, err, out)
		}
		got := strings.Fields(string(out))
		if strings.Join(got, " ") != strings.Join(tc.want, " ") {
			t.Errorf("completing %q: %q, want %q", tc.words, got, tc.want)
		}
	}
	for _, shell := range []string{"zsh", "fish"} {
		if res := runHoldfast(t, nil, "completion", shell); res.code != 0 || !strings.Contains(res.stdout, "holdfast") {
			t.Errorf("completion %s: exit %d\n%s%s", shell, res.code, res.stdout, res.stderr)
		}
	}
	if res := runHoldfast(t, nil, "completion", "tcsh"); res.code != 2 {
		t.Errorf("completion tcsh: exit %d, want 2 (usage)", res.code)
	}
}
