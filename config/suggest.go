package config

import (
	"reflect"
	"slices"
	"strings"
)

// validKeys lists the keys a config file may set in the table at path
// (nil at the top level), read from the toml tags of the types a table
// decodes into; nil when path names no table.
func validKeys(path []string) []string {
	t := reflect.TypeFor[Config]()
	for i := 0; i < len(path); i++ {
		if t = indirect(t); t.Kind() == reflect.Map {
			t = t.Elem() // path[i] is a name: [streams.NAME]
			continue
		}
		if t.Kind() != reflect.Struct {
			return nil
		}
		switch {
		case t == reflect.TypeFor[Config]() && path[i] == "streams":
			t = reflect.TypeFor[map[string]*StreamConfig]()
		case t == reflect.TypeFor[Config]() && path[i] == "consumers":
			t = reflect.TypeFor[map[string]*ConsumerConfig]()
		default:
			f, ok := fieldByKey(t, path[i])
			if !ok {
				return nil
			}
			t = f.Type
		}
	}
	if t = indirect(t); t.Kind() != reflect.Struct {
		return nil
	}
	keys := tomlKeys(t)
	if t == reflect.TypeFor[Config]() {
		keys = append(keys, "streams", "consumers")
	}
	return keys
}

func indirect(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}

// tomlKey is the key a struct field decodes from ("" for none).
func tomlKey(f reflect.StructField) string {
	if !f.IsExported() {
		return ""
	}
	name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
	switch name {
	case "-":
		return ""
	case "":
		return f.Name
	}
	return name
}

func fieldByKey(t reflect.Type, key string) (reflect.StructField, bool) {
	for _, f := range reflect.VisibleFields(t) {
		if !f.Anonymous && tomlKey(f) == key {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

func tomlKeys(t reflect.Type) []string {
	var out []string
	for _, f := range reflect.VisibleFields(t) {
		if k := tomlKey(f); k != "" && !f.Anonymous {
			out = append(out, k)
		}
	}
	return out
}

// suggestKey returns the key path meant by the unknown key path k: the
// first of its parts that its table does not know replaced by the valid
// key closest to it, when that is a likely misspelling (at most two
// edits, fewer than half its length); "" when none is.
func suggestKey(k []string) string {
	for i, part := range k {
		keys := validKeys(k[:i])
		if keys == nil {
			continue // a name ([streams.NAME]) or inside an unknown table
		}
		if slices.Contains(keys, part) {
			continue
		}
		best, bestDist := "", 3
		for _, valid := range keys {
			if d := editDistance(part, valid); d < bestDist && 2*d < len(part) {
				best, bestDist = valid, d
			}
		}
		if best == "" {
			return ""
		}
		return strings.Join(slices.Concat(k[:i], []string{best}, k[i+1:]), ".")
	}
	return ""
}

// enclosingKey returns the key path meant by the unknown key path k when
// its last part is a key of a table that encloses its own (known) table:
// consumers.C.dead_letter for consumers.C.exec.dead_letter, a key
// written below the [consumers.C.exec] header; "" otherwise.
func enclosingKey(k []string) string {
	last := len(k) - 1
	if last < 2 || validKeys(k[:last]) == nil {
		return ""
	}
	for j := last - 1; j > 0; j-- {
		if slices.Contains(validKeys(k[:j]), k[last]) {
			return strings.Join(append(slices.Clone(k[:j]), k[last]), ".")
		}
	}
	return ""
}

// editDistance is the Levenshtein distance between a and b (bytes).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
