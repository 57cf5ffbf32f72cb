package config

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// tomlBlock is a fenced TOML block of a Markdown page.
var tomlBlock = regexp.MustCompile("(?s)```toml\n(.*?)```")

// TestDocExamplesValid: every TOML block of the README, docs/ and
// examples/ parses and validates as a whole config file (a fragment
// reads as a file holding only it, on the built-in defaults), so that a
// newcomer who copies one gets no error but the files it names (password
// and key files, TLS certificates, an exec command), which only
// `holdfast check` on the host can find.
func TestDocExamplesValid(t *testing.T) {
	var pages []string
	for _, pattern := range []string{"../README.md", "../docs/*.md", "../examples/*/README.md"} {
		m, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		pages = append(pages, m...)
	}
	blocks := 0
	for _, page := range pages {
		text, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range tomlBlock.FindAllSubmatchIndex(text, -1) {
			blocks++
			line := 1 + strings.Count(string(text[:m[0]]), "\n")
			block := string(text[m[2]:m[3]])
			cfg, err := Parse(strings.NewReader(block), page)
			if err == nil {
				err = cfg.Validate()
			}
			if err != nil {
				t.Errorf("%s:%d: the TOML example does not validate:\n%v\n%s", page, line, err, block)
			}
		}
	}
	if blocks < 10 {
		t.Fatalf("only %d TOML blocks found in %d pages: is the pattern still right?", blocks, len(pages))
	}
}
