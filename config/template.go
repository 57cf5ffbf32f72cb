package config

import (
	_ "embed"
	"io"
	"text/template"
)

//go:embed holdfast.toml.tmpl
var defaultFileText string

var defaultFile = template.Must(template.New("holdfast.toml").Parse(defaultFileText))

// WriteDefault writes the fully commented default config file to w, with
// the store under storeDir. Parsed back, it is DefaultConfig() with that
// store dir.
func WriteDefault(w io.Writer, storeDir string) error {
	return defaultFile.Execute(w, struct{ StoreDir string }{storeDir})
}
