package daemon

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
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
	for path, def := range perTableDefaults {
		if !strings.Contains(b.String(), "| `"+path+"` | "+def+" |") {
			t.Errorf("%s is not a key of the default file: its default in perTableDefaults is not shown", path)
		}
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

// TestTroubleshootingTextsExist: every heading of docs/troubleshooting.md
// quotes a text that holdfast's code still writes, so that the page is
// found by the words a user sees.
func TestTroubleshootingTextsExist(t *testing.T) {
	page, err := os.ReadFile("../docs/troubleshooting.md")
	if err != nil {
		t.Fatal(err)
	}
	var code strings.Builder
	err = filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != ".." || d.Name() == "docs") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
			b, err := os.ReadFile(path)
			code.Write(b)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(page), "\n") {
		text, ok := strings.CutPrefix(line, "### `")
		if !ok {
			continue
		}
		text = strings.TrimSuffix(text, "`")
		n++
		if !strings.Contains(code.String(), text) {
			t.Errorf("docs/troubleshooting.md quotes %q, which no code writes any more: update the heading to the text it writes now", text)
		}
	}
	if n < 10 {
		t.Errorf("only %d quoted texts found in docs/troubleshooting.md", n)
	}
}

// TestDocLinksResolve: every relative link of the README, docs/,
// examples/ and bench/results/ names a file or directory that exists.
func TestDocLinksResolve(t *testing.T) {
	var pages []string
	for _, pattern := range []string{"../README.md", "../CHANGELOG.md", "../docs/*.md", "../examples/*/README.md", "../bench/results/*.md"} {
		m, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		pages = append(pages, m...)
	}
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	n := 0
	for _, page := range pages {
		text, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(text), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "#") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			target, _, _ = strings.Cut(target, "#")
			n++
			if _, err := os.Stat(filepath.Join(filepath.Dir(page), target)); err != nil {
				t.Errorf("%s links to %s, which does not exist", strings.TrimPrefix(page, "../"), m[1])
			}
		}
	}
	if n < 50 {
		t.Errorf("only %d relative links found", n)
	}
}
