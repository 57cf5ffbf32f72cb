package daemon

import (
	"fmt"
	"io"
	"strings"

	"github.com/holdfast-io/holdfast/config"
)

// WriteConfigReference writes the reference of every config key as
// Markdown: one row per key of the default file (config.Keys), with its
// default, whether a reload or only a restart applies a change of it, and
// what the file says of it. docs/configuration-reference.md is this
// output; a test fails when they differ.
func WriteConfigReference(w io.Writer) error {
	var b strings.Builder
	b.WriteString(`# Configuration reference

Every key of ` + "`holdfast.toml`" + `, in the order of the commented default file
that ` + "`holdfast config`" + ` prints, which is where this page comes from: it is
written by ` + "`holdfast config --reference`" + ` (` + "`make docs`" + `), and a test fails when
it is out of date. NAME is a name you choose (` + "`[streams.ORDERS]`" + `); ` + "`[]`" + ` is
one entry of an array of tables (` + "`[[leafnodes.remotes]]`" + `). A key shown as
"unset" has no default: the example is what a value looks like.

**Applies**: "reload" — ` + "`holdfast reload`" + `, ` + "`systemctl reload holdfast`" + ` or SIGHUP
applies a change of it while running (a stream change the server cannot
make, such as another ` + "`storage`" + `, is refused and logged, and the rest keeps
running); "restart" — a reload that changes it is refused whole, names
it, and ` + "`/healthz`" + ` warns until a restart (see [reload](reload.md)).

| key | default | applies | what it does |
| --- | --- | --- | --- |
`)
	for _, k := range config.Keys() {
		def := "`" + k.Default + "`"
		if d, ok := perTableDefaults[k.Path]; ok {
			def = d
		} else if k.Default == "" {
			def = "unset"
			if k.Example != "" {
				def = "unset (e.g. `" + k.Example + "`)"
			}
		}
		applies := "reload"
		if RestartOnly(k.Path) {
			applies = "restart"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", k.Path, cell(def), applies, cell(k.Doc))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// perTableDefaults are the defaults of keys whose value in the default
// file is the built-in WORKER1's, not what another table starts from.
var perTableDefaults = map[string]string{
	"consumers.NAME.stream":      "required (the built-in `" + config.DefaultConsumerName + "`: `\"" + config.DefaultStreamName + "\"`)",
	"consumers.NAME.dead_letter": "the stream's name with `_DLQ` (`\"" + config.DefaultStreamName + "_DLQ\"`)",
}

// cell makes s fit in a Markdown table cell.
func cell(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}
