package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
)

// deepTableName is the 100 KB file that took 9.7 s and 2.6 GB of memory
// to be rejected: a table name of 50,000 parts.
func deepTableName() string { return "[" + strings.Repeat("a.", 50_000) + "a]\n" }

// TestParseRefusesHostileShapes: files whose decoding costs grow faster
// than their size are refused before they reach the TOML decoder, with an
// error that says what is wrong and where.
func TestParseRefusesHostileShapes(t *testing.T) {
	deep := 50_000
	tests := []struct {
		name, text, want string
	}{
		{"deep table name", deepTableName(), "line 1: a key or table name with more than 32 dot-separated parts"},
		{"deep array-of-tables name", "[[" + strings.Repeat("a.", deep) + "a]]\n", "line 1: a key or table name with more than 32"},
		{"deep dotted key", "[server]\n" + strings.Repeat("a.", deep) + "a = 1\n", "line 2: a key or table name with more than 32"},
		{"deep digit key", strings.Repeat("1.", deep) + "1 = 1\n", "line 1: a key or table name with more than 32"},
		{"deep key in an inline table", "x = { " + strings.Repeat("a . ", deep) + "a = 1 }\n", "line 1: a key or table name with more than 32"},
		{"deep quoted parts", "[" + strings.Repeat(`"a".`, deep) + "a]\n", "line 1: a key or table name with more than 32"},
		{"nested arrays", "x = " + strings.Repeat("[", deep) + strings.Repeat("]", deep) + "\n", "line 1: arrays and inline tables nested more than 32 deep"},
		{"nested inline tables", "x = " + strings.Repeat("{a=", deep) + "1" + strings.Repeat("}", deep) + "\n", "line 1: arrays and inline tables nested more than 32 deep"},
		{"nested across lines", "x = [\n" + strings.Repeat("[\n", deep), "arrays and inline tables nested more than 32 deep"},
		{"too large", "# " + strings.Repeat("x", MaxFileSize) + "\n", "larger than 1024 KiB"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Parse(strings.NewReader(tt.text), "hostile.toml")
			if err == nil {
				t.Fatalf("Parse accepted it: %+v", cfg)
			}
			var pe *ParseError
			if !errors.As(err, &pe) || !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("error %v (%T) is not a *ParseError for ErrInvalidConfig", err, err)
			}
			if !strings.HasPrefix(err.Error(), "hostile.toml: ") || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q does not name the file and say %q", err, tt.want)
			}
			if len(err.Error()) > 1024 {
				t.Errorf("the error is %d bytes long", len(err.Error()))
			}
		})
	}
}

// endless is a reader that never ends, like /dev/zero.
type endless struct{}

func (endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = '#'
	}
	return len(p), nil
}

func TestParseReadsAtMostMaxFileSize(t *testing.T) {
	r := &countingReader{r: endless{}}
	_, err := Parse(r, "/dev/zero")
	if err == nil || !strings.Contains(err.Error(), "larger than 1024 KiB") {
		t.Fatalf("Parse of an endless file = %v, want a size error", err)
	}
	if r.n > MaxFileSize+1 {
		t.Errorf("Parse read %d bytes of an endless file, want at most %d", r.n, MaxFileSize+1)
	}
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// TestParseAcceptsOrdinaryShapes: what looks like depth but is not (dots in
// strings, comments, numbers and quoted keys; brackets in strings) passes
// the shape check, and so does the commented default file.
func TestParseAcceptsOrdinaryShapes(t *testing.T) {
	var def bytes.Buffer
	if err := WriteDefault(&def, "/var/lib/holdfast/jetstream"); err != nil {
		t.Fatal(err)
	}
	many := strings.Repeat("1.5, ", 1000)
	for _, text := range []string{
		def.String(),
		"x = \"" + strings.Repeat("a.", 1000) + "\"\n",
		"x = '" + strings.Repeat("[{", 1000) + "'\n",
		"x = \"\"\"\n" + strings.Repeat("a.[{\n", 1000) + "\"\"\"\n",
		"x = '''\n" + strings.Repeat("a.[{'\n", 1000) + "'''\n",
		"x = \"\\\"" + strings.Repeat("a.", 1000) + "\"\n",
		"# " + strings.Repeat("a.[{", 1000) + "\n",
		"x = [" + many + "]\n",
		"x = 1979-05-27T07:32:00.999999Z\n",
		`"` + strings.Repeat("a.", 1000) + `" = 1` + "\n",
		"[a]\nx = [\n  [1, 2],\n  [3, 4],\n]\ny = { a.b.c = 1, d = { e = [1.5] } }\n",
		"[" + strings.Repeat("a.", MaxKeyParts-1) + "a]\n",
		"x = " + strings.Repeat("[", MaxNesting) + strings.Repeat("]", MaxNesting) + "\n",
	} {
		if err := checkShape([]byte(text)); err != nil {
			t.Errorf("checkShape(%.60q...) = %v", text, err)
		}
	}
}

// TestParseNamesABoundedNumberOfUnknownKeys: a file of unknown keys used to
// be scanned once per key to find its line, which took minutes at 1 MB.
func TestParseNamesABoundedNumberOfUnknownKeys(t *testing.T) {
	var b strings.Builder
	for i := 0; i < 1000; i++ {
		fmt.Fprintf(&b, "k%d = 1\n", i)
	}
	_, err := Parse(strings.NewReader(b.String()), "unknown.toml")
	if err == nil {
		t.Fatal("Parse accepted unknown keys")
	}
	msg := err.Error()
	if n := strings.Count(msg, "unknown key;"); n != maxUnknownKeys {
		t.Errorf("the error names %d unknown keys, want %d", n, maxUnknownKeys)
	}
	if !strings.Contains(msg, "line 1: k0: unknown key") || !strings.Contains(msg, fmt.Sprintf("... and %d more unknown keys", 1000-maxUnknownKeys)) {
		t.Errorf("error does not name the first key and count the rest:\n%s", msg)
	}
}
