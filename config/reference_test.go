package config

import (
	"reflect"
	"slices"
	"strings"
	"testing"
)

// TestKeysCoverEveryKey: every key the config file may hold (read from
// the Config type's toml tags) is in the default file, set or shown
// commented out, so the reference generated from it (Keys) documents
// it; and every key the file shows exists.
func TestKeysCoverEveryKey(t *testing.T) {
	documented := map[string]bool{}
	for _, k := range Keys() {
		documented[k.Path] = true
	}
	var real []string
	walkKeys(reflect.TypeFor[Config](), "", &real)
	// Streams and consumers are decoded table by table (Parse).
	walkKeys(reflect.TypeFor[StreamConfig](), "streams.NAME.", &real)
	walkKeys(reflect.TypeFor[ConsumerConfig](), "consumers.NAME.", &real)
	for _, path := range real {
		if !documented[path] && !documentedAbove(path, documented) {
			t.Errorf("key %s is not in the default file (config/holdfast.toml.tmpl): add it, set or commented out, with what it does", path)
		}
	}
	for path := range documented {
		if !slices.ContainsFunc(real, func(r string) bool {
			return r == path || strings.HasPrefix(r, path+".") || strings.HasPrefix(r, path+"[].")
		}) {
			t.Errorf("the default file shows %s, which is no key", path)
		}
	}
}

// documentedAbove reports whether a key inside an inline table or array
// of them (streams.NAME.sources[].name, streams.NAME.mirror.name) is
// documented by the key that holds it.
func documentedAbove(path string, documented map[string]bool) bool {
	for i := len(path) - 1; i > 0; i-- {
		if path[i] == '.' && documented[strings.TrimSuffix(path[:i], "[]")] {
			return true
		}
	}
	return false
}

// walkKeys appends the key paths of the toml-tagged fields of t under
// prefix: NAME for a map's keys, [] for a slice of tables; a field whose
// type reads its own text (Duration, Size) is one key.
func walkKeys(t reflect.Type, prefix string, out *[]string) {
	textual := reflect.TypeFor[interface{ UnmarshalTOML(any) error }]()
	for i := range t.NumField() {
		f := t.Field(i)
		name := strings.Split(f.Tag.Get("toml"), ",")[0]
		if name == "" || name == "-" {
			continue
		}
		path := prefix + name
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		switch {
		case reflect.PointerTo(ft).Implements(textual) || ft.Kind() != reflect.Struct && ft.Kind() != reflect.Map && ft.Kind() != reflect.Slice:
			*out = append(*out, path)
		case ft.Kind() == reflect.Struct:
			walkKeys(ft, path+".", out)
		case ft.Kind() == reflect.Map:
			elem := ft.Elem()
			for elem.Kind() == reflect.Pointer {
				elem = elem.Elem()
			}
			if elem.Kind() == reflect.Struct {
				walkKeys(elem, path+".NAME.", out)
			} else {
				*out = append(*out, path)
			}
		case ft.Kind() == reflect.Slice:
			elem := ft.Elem()
			if elem.Kind() == reflect.Struct && !reflect.PointerTo(elem).Implements(textual) {
				walkKeys(elem, path+"[].", out)
			} else {
				*out = append(*out, path)
			}
		}
	}
}
