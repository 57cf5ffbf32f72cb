package embedded

import (
	"fmt"
	"path/filepath"

	"github.com/holdfast-io/holdfast/embedded/store"
)

// noteLoadFailure records a stream or consumer the server says it could
// not load, in the words of the server's log.
func (l *serverLogger) noteLoadFailure(format string, v []any) {
	var name string
	switch format {
	case "  Error recreating stream %q: %v":
		name, _ = v[0].(string)
	case "  Error reading metafile %q: %v", "  Error reading Stream metafile checksum %q: %v":
		if p, ok := v[0].(string); ok {
			name = filepath.Base(filepath.Dir(p))
		}
	case "    Error adding consumer '%s > %s > %s': %v":
		name = fmt.Sprintf("%v > %v", v[1], v[2])
	default:
		return
	}
	if name == "" || len(v) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.loadFailures == nil {
		l.loadFailures = map[string]store.StreamLoadFailure{}
	}
	l.loadFailures[name] = store.StreamLoadFailure{Name: name, Err: fmt.Sprint(v[len(v)-1])}
}

// LoadFailures returns what noteLoadFailure recorded.
func (l *serverLogger) LoadFailures() map[string]store.StreamLoadFailure {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]store.StreamLoadFailure, len(l.loadFailures))
	for k, f := range l.loadFailures {
		out[k] = f
	}
	return out
}
