package config

import (
	_ "embed"
	"fmt"
	"io"
	"strings"
	"text/template"
	"unicode/utf8"
)

//go:embed holdfast.toml.tmpl
var defaultFileText string

var defaultFile = template.Must(template.New("holdfast.toml").Funcs(template.FuncMap{"tomlString": tomlString}).Parse(defaultFileText))

// WriteDefault writes the fully commented default config file to w, with
// the store under storeDir. Parsed back, it is DefaultConfig() with that
// store dir.
func WriteDefault(w io.Writer, storeDir string) error {
	if !utf8.ValidString(storeDir) {
		return fmt.Errorf("store dir %q is not valid UTF-8, which a TOML file cannot hold", storeDir)
	}
	return defaultFile.Execute(w, struct{ StoreDir string }{storeDir})
}

// tomlString quotes s as a TOML basic string.
func tomlString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20 && r != '\t' || r == 0x7f:
			fmt.Fprintf(&b, `\u%04X`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}
