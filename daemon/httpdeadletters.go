package daemon

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// deadLetterRoutes adds the dead letters of the status page: two reads,
// who is logged in, and the admin's actions (POST, JSON body, CSRF
// token).
func (h *httpServer) deadLetterRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /deadletters.json", h.serving(func(w http.ResponseWriter, r *http.Request, d *Daemon) {
		limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
		if limit == 0 {
			limit = 20
		}
		list, err := d.deadLetters(r.Context(), r.URL.Query().Get("consumer"), limit)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"dead_letters": nonNil(list)})
	}))
	mux.HandleFunc("GET /deadletter.json", h.serving(func(w http.ResponseWriter, r *http.Request, d *Daemon) {
		seq, err := strconv.ParseUint(r.URL.Query().Get("seq"), 10, 64)
		if err != nil || seq == 0 {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "seq: a dead letter's sequence (1 or more)"})
			return
		}
		dl, err := d.deadLetter(r.Context(), r.URL.Query().Get("stream"), seq)
		if err != nil {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, dl)
	}))
	// whoami tells the page who its Basic credentials name; an admin
	// gets the CSRF token its actions must carry.
	mux.HandleFunc("GET /api/whoami", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		id := h.auth.identify(r)
		if id.busy {
			tooBusy(w)
			return
		}
		out := map[string]any{"user": id.name, "admin": id.admin}
		if id.admin {
			out["csrf"] = h.auth.csrfToken(id.name)
		}
		writeJSON(w, http.StatusOK, out)
	})
	// login asks the browser for credentials, then goes back to the page.
	mux.HandleFunc("GET /login", func(w http.ResponseWriter, r *http.Request) {
		if id := h.auth.identify(r); id.busy {
			tooBusy(w)
			return
		} else if id.name == "" {
			challenge(w, "log in with an [auth.users] name and password")
			return
		}
		http.Redirect(w, r, "/", http.StatusSeeOther)
	})
	mux.HandleFunc("POST /api/deadletters/replay", h.action(func(ctx context.Context, d *Daemon, req actionRequest) (any, error) {
		if req.All {
			n, err := d.replayAllDeadLetters(ctx, req.Consumer)
			return map[string]int{"replayed": n}, err
		}
		if err := d.replayDeadLetter(ctx, req.Stream, req.Seq); err != nil {
			return map[string]int{"replayed": 0}, err
		}
		return map[string]int{"replayed": 1}, nil
	}))
	mux.HandleFunc("POST /api/deadletters/purge", h.action(func(ctx context.Context, d *Daemon, req actionRequest) (any, error) {
		return d.purgeDeadLetters(ctx, req.Consumer, req.UpTo)
	}))
}

// actionRequest is the JSON body of an action.
type actionRequest struct {
	Stream   string `json:"stream"`
	Seq      uint64 `json:"seq"`
	Consumer string `json:"consumer"`
	All      bool   `json:"all"`
	UpTo     uint64 `json:"upto"`
}

// problem says what is wrong with the fields of a request to path
// (which dead letters: stream and seq for one replay, else all or upto
// with an optional consumer), or "".
func (req actionRequest) problem(path string) string {
	one := req.Stream != "" || req.Seq != 0
	switch {
	case strings.HasSuffix(path, "/replay") && req.All && one:
		return `give "stream" and "seq" to replay one dead letter, or "all" (with "consumer") to replay every one, not both`
	case strings.HasSuffix(path, "/replay") && !req.All && (req.Stream == "" || req.Seq == 0):
		return `which dead letter: give "stream" (its dead-letter stream) and "seq" (its sequence there), or "all": true`
	case strings.HasSuffix(path, "/purge") && one:
		return `purge takes "consumer" and "upto", not "stream" or "seq"`
	case req.UpTo != 0 && !strings.HasSuffix(path, "/purge"):
		return `"upto" is for purge`
	}
	return ""
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// serving runs f once holdfast serves; 503 before.
func (h *httpServer) serving(f func(http.ResponseWriter, *http.Request, *Daemon)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Content-Type-Options", "nosniff")
		h.mu.Lock()
		d, phase := h.dl, h.phase
		h.mu.Unlock()
		if d == nil || phase != phaseReady {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "holdfast is not serving yet"})
			return
		}
		f(w, r, d)
	}
}

// action runs f for an admin with a valid CSRF token and a JSON body,
// logging who did what.
func (h *httpServer) action(f func(context.Context, *Daemon, actionRequest) (any, error)) http.HandlerFunc {
	return h.serving(func(w http.ResponseWriter, r *http.Request, d *Daemon) {
		id, ok := h.auth.admin(w, r)
		if !ok {
			return
		}
		var req actionRequest
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4<<10))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "the body must be JSON: " + err.Error()})
			return
		}
		if dec.More() {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "the body must be one JSON object: something follows it"})
			return
		}
		if why := req.problem(r.URL.Path); why != "" {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": why})
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 50*time.Second)
		defer cancel()
		out, err := f(ctx, d, req)
		h.log.Info("status page action", "user", id.name, "path", r.URL.Path, "stream", req.Stream, "seq", req.Seq,
			"consumer", req.Consumer, "all", req.All, "upto", req.UpTo, "err", err)
		if err != nil {
			writeJSON(w, http.StatusConflict, map[string]any{"error": err.Error(), "result": out})
			return
		}
		writeJSON(w, http.StatusOK, out)
	})
}
