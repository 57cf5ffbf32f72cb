package config

import "fmt"

// Bounds on a config file, checked before it reaches the TOML decoder:
// the decoder's time and memory grow much faster than the depth of a key
// or of a value (a 100 KB file with a 50,000-part table name took seconds
// and gigabytes), and a config file is read by `holdfast check` and `run`
// as root or as the service user alike.
const (
	// MaxFileSize is the largest config file accepted; the fully commented
	// default is under 10 KB.
	MaxFileSize = 1 << 20
	// MaxKeyParts is the most dot-separated parts a key or table name may
	// have; holdfast's deepest key, consumers.NAME.exec.command, has four.
	MaxKeyParts = 32
	// MaxNesting is the deepest arrays and inline tables may be nested in
	// each other.
	MaxNesting = 32
	// maxUnknownKeys is how many unknown keys a parse error names.
	maxUnknownKeys = 20
)

// checkShape refuses a config file that is larger than MaxFileSize, has a
// key or table name of more than MaxKeyParts parts, or nests values deeper
// than MaxNesting, before it is decoded. It reads TOML's lexical shape
// only (strings, comments, brackets, braces, dots, '=' and ','): anything
// it lets through is for the decoder to accept or refuse.
func checkShape(data []byte) error {
	if len(data) > MaxFileSize {
		return fmt.Errorf("larger than %d KiB: a holdfast config is a few KB (`holdfast config` prints a complete one)", MaxFileSize>>10)
	}
	const (
		lineStart = iota // at the start of a line, outside any value
		header           // inside a [table] or [[array]] header
		key              // in a key, before its '='
		value            // in a value
	)
	var (
		state = lineStart
		line  = 1
		parts = 1    // parts of the key or table name being read
		stack []byte // open '[' and '{' of values
		quote []byte // closing delimiter of the string being read, or nil
		multi bool   // the string is a multi-line one
	)
	tooDeep := func() error {
		return fmt.Errorf("line %d: a key or table name with more than %d dot-separated parts (holdfast's longest is like consumers.WORKER1.exec.command)", line, MaxKeyParts)
	}
	for i := 0; i < len(data); i++ {
		c := data[i]
		if c == '\n' {
			line++
		}
		if quote != nil {
			switch {
			case c == '\\' && quote[0] == '"':
				i++ // an escaped character, perhaps a quote
				if i < len(data) && data[i] == '\n' {
					line++
				}
			case c == '\n' && !multi:
				quote = nil // an unterminated string: the decoder says so
				state = lineStart
			case c == quote[0] && (!multi || hasPrefix(data[i:], quote)):
				if multi {
					i += len(quote) - 1
				}
				quote = nil
			}
			continue
		}
		switch c {
		case '#':
			for i+1 < len(data) && data[i+1] != '\n' {
				i++
			}
		case '"', '\'':
			q := data[i : i+1]
			multi = hasPrefix(data[i:], []byte{c, c, c})
			if multi {
				q = data[i : i+3]
				i += 2
			}
			quote = q
			if state == lineStart {
				state, parts = key, 1
			}
		case '\n':
			if len(stack) == 0 {
				state = lineStart
			}
		case ' ', '\t', '\r':
		case '.':
			if state == header || state == key {
				if parts++; parts > MaxKeyParts {
					return tooDeep()
				}
			}
		case '=':
			if state == key {
				state = value
			}
		case '[':
			switch state {
			case lineStart:
				state, parts = header, 1
			case header:
			default:
				if stack = append(stack, '['); len(stack) > MaxNesting {
					return fmt.Errorf("line %d: arrays and inline tables nested more than %d deep", line, MaxNesting)
				}
			}
		case '{':
			if stack = append(stack, '{'); len(stack) > MaxNesting {
				return fmt.Errorf("line %d: arrays and inline tables nested more than %d deep", line, MaxNesting)
			}
			state, parts = key, 1
		case ',':
			if n := len(stack); n > 0 && stack[n-1] == '{' {
				state, parts = key, 1
			}
		case ']', '}':
			if state == header {
				continue
			}
			if n := len(stack); n > 0 {
				stack = stack[:n-1]
			}
			state = value
		default:
			if state == lineStart {
				state, parts = key, 1
			}
		}
	}
	return nil
}

func hasPrefix(b, prefix []byte) bool {
	return len(b) >= len(prefix) && string(b[:len(prefix)]) == string(prefix)
}
