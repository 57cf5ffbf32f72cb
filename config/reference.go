package config

import (
	"regexp"
	"strings"
)

// A Key is one key of the config file as the default file (`holdfast
// config`, WriteDefault) shows it: the reference of every key is read from
// that one commented file, so the two cannot say different things.
type Key struct {
	// Path is the key's path, with NAME for a table named by the user
	// (streams.NAME.max_age) and [] for an array of tables
	// (leafnodes.remotes[].url).
	Path string
	// Default is the value the default file gives it, as written there;
	// Example is the value of a key the file shows commented out (no
	// default of its own: unset unless written).
	Default, Example string
	// Doc is what the file says of it: the comment lines above it and the
	// comment after it.
	Doc string
}

// Keys returns every key of the default config file, in its order.
func Keys() []Key {
	var b strings.Builder
	_ = WriteDefault(&b, DefaultStoreDir)
	return parseKeys(b.String())
}

var (
	keyDefLine = regexp.MustCompile(`^(#\s?)?([a-z_]+) = (.*)$`)
	// tomlValue is one TOML value as the file writes them: prose that
	// happens to read "word = ..." is not a key.
	tomlValue  = regexp.MustCompile(`^("([^"\\]|\\.)*"|'[^']*'|\[.*\]|\{.*\}|-?[0-9][0-9_.]*|true|false)$`)
	headerLine = regexp.MustCompile(`^(#\s?)?(\[\[?)([A-Za-z0-9_.]+)\]\]?(.*)$`)
	// userNamed are the tables whose last part the user names.
	userNamed = regexp.MustCompile(`^(streams|consumers|auth\.users)\.[A-Za-z0-9_]+`)
)

// parseKeys reads the keys of a default config file's text.
func parseKeys(text string) []Key {
	var out []Key
	table := ""
	var prose []string // comment lines since the last key, header or blank line
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimRight(line, " ")
		if line == "" || line == "#" {
			prose = nil
			continue
		}
		if m := headerLine.FindStringSubmatch(line); m != nil {
			table = userNamed.ReplaceAllString(m[3], "$1.NAME")
			if m[2] == "[[" {
				table += "[]"
			}
			prose = nil
			continue
		}
		if m := keyDefLine.FindStringSubmatch(line); m != nil && tomlValue.MatchString(firstValue(m[3])) {
			value, comment := splitComment(m[3])
			k := Key{Path: m[2], Doc: strings.Join(append(prose, comment), " ")}
			if table != "" {
				k.Path = table + "." + m[2]
			}
			if m[1] == "" {
				k.Default = value
			} else {
				k.Example = value
			}
			k.Doc = strings.TrimSpace(k.Doc)
			out = append(out, k)
			prose = nil
			continue
		}
		text := strings.TrimSpace(strings.TrimPrefix(line, "#"))
		if strings.HasPrefix(line, "# ") && strings.HasPrefix(text, "#") && len(out) > 0 {
			// "#   # more": the comment after the last key goes on.
			last := &out[len(out)-1]
			last.Doc = strings.TrimSpace(last.Doc + " " + strings.TrimSpace(strings.TrimPrefix(text, "#")))
			continue
		}
		if strings.HasPrefix(line, "#") {
			prose = append(prose, text)
		}
	}
	return dedupe(out)
}

// dedupe keeps the first of keys with the same path (the file shows some
// twice, as examples of the same table).
func dedupe(keys []Key) []Key {
	seen := map[string]bool{}
	out := keys[:0]
	for _, k := range keys {
		if !seen[k.Path] {
			seen[k.Path] = true
			out = append(out, k)
		}
	}
	return out
}

// splitComment splits a key's value from the comment after it ("#"
// outside quotes and brackets).
func splitComment(s string) (value, comment string) {
	quote, depth := byte(0), 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0:
			if c == '\\' {
				i++
			} else if c == quote {
				quote = 0
			}
		case c == '"' || c == '\'':
			quote = c
		case c == '[' || c == '{':
			depth++
		case c == ']' || c == '}':
			depth--
		case c == '#' && depth == 0:
			return strings.TrimSpace(s[:i]), strings.TrimSpace(s[i+1:])
		}
	}
	return strings.TrimSpace(s), ""
}

// firstValue is the value of a key's line, without the comment after it.
func firstValue(s string) string {
	v, _ := splitComment(s)
	return v
}
