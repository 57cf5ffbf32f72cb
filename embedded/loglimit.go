package embedded

import (
	"sync"
	"time"
)

// repeatBurst lines of one kind are logged per repeatWindow; the rest are
// counted, and the next line of that kind logged says how many were held
// back. A client can make the server (or holdfast's own connections) log
// a line per message it sends — a publish its user may not make, a reply
// subject it reuses under group commit — and at tens of thousands a
// second that buries every other line and fills the disk under the log.
const (
	repeatBurst  = 10
	repeatWindow = 10 * time.Second
	// repeatKinds bounds the kinds remembered (a key holds a connection's
	// name or address): past it, those whose window ended are forgotten.
	repeatKinds = 1024
)

// repeatLimit limits the lines logged per kind (see repeatBurst).
type repeatLimit struct {
	mu    sync.Mutex
	kinds map[string]*repeatSeen
}

type repeatSeen struct {
	start  time.Time // of the current window
	logged int       // lines logged in it
	held   int       // lines held back since the last logged one
}

// allow reports whether a line of kind may be logged at now, and how
// many of its kind were held back before it (to be said with it).
func (r *repeatLimit) allow(kind string, now time.Time) (ok bool, held int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.kinds == nil {
		r.kinds = map[string]*repeatSeen{}
	}
	s := r.kinds[kind]
	if s == nil {
		if len(r.kinds) >= repeatKinds {
			r.forget(now)
		}
		s = &repeatSeen{start: now}
		r.kinds[kind] = s
	}
	if now.Sub(s.start) >= repeatWindow {
		s.start, s.logged = now, 0
	}
	if s.logged >= repeatBurst {
		s.held++
		return false, 0
	}
	s.logged++
	held, s.held = s.held, 0
	return true, held
}

// forget drops the kinds whose window ended and that hold nothing back;
// when none has, all of them. The caller holds r.mu.
func (r *repeatLimit) forget(now time.Time) {
	for k, s := range r.kinds {
		if now.Sub(s.start) >= repeatWindow && s.held == 0 {
			delete(r.kinds, k)
		}
	}
	if len(r.kinds) >= repeatKinds {
		clear(r.kinds)
	}
}
