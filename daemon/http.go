package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/holdfast-io/holdfast/daemon/statuspage"
	"github.com/holdfast-io/holdfast/embedded"
	"github.com/holdfast-io/holdfast/pipeline/monitor"
)

// Phases of the daemon, as /readyz reports them.
const (
	phaseStarting = "starting"
	phaseReady    = "ready"
	phaseStopping = "stopping"
)

// natsMonitorPrefix is where the embedded server's own monitoring
// endpoints are served, so that NATS dashboards and
// prometheus-nats-exporter (pointed at http://LISTEN/nats) work. They are
// at the root too, where stock nats-server has them (/varz, /jsz, ...),
// but for /healthz, which is holdfast's own.
const natsMonitorPrefix = "/nats/"

// Limits of the [http] listener, so that clients that are slow or that
// keep connections open cannot hold its connections (and file
// descriptors, shared with the NATS server) for ever.
const (
	// httpReadHeaderTimeout bounds reading a request's header.
	httpReadHeaderTimeout = 10 * time.Second
	// httpReadTimeout bounds reading a whole request, body included.
	httpReadTimeout = 30 * time.Second
	// httpWriteTimeout bounds answering a request, from the end of its
	// header; it exceeds the 10s /metrics gathers may take.
	httpWriteTimeout = time.Minute
	// httpIdleTimeout closes a keep-alive connection no request uses.
	httpIdleTimeout = 2 * time.Minute
)

// httpServer serves [http] listen: the status page and its
// /status.json, /metrics, /healthz, /readyz and the embedded NATS
// server's monitoring under /nats/. It starts before the
// NATS server (answering 503 while the store is recovered) and stops
// after it.
type httpServer struct {
	addr    string
	version string
	metrics *monitor.Metrics
	log     *slog.Logger

	mu  sync.Mutex
	ns  *server.Server
	mon *monitor.Monitor
	// status collects what /status.json serves, set with the monitor.
	status func(context.Context) *ClientStatus
	// auth decides who may read and who may change; dl serves the dead
	// letters to the page, set with the monitor.
	auth  *httpAuth
	dl    *Daemon
	phase string
	// step is what start-up is doing (the sd_notify STATUS= line), for
	// /healthz while it is not serving.
	step string

	// Timeouts of the server, the http* constants unless a test sets them.
	readTimeout, writeTimeout, idleTimeout time.Duration
	// maxConns bounds the open connections, httpMaxConns unless a test
	// sets it.
	maxConns int

	ln   net.Listener
	srv  *http.Server
	done chan struct{}
	once sync.Once
}

func newHTTPServer(addr string, metrics *monitor.Metrics, log *slog.Logger, version string) *httpServer {
	return &httpServer{
		addr: addr, metrics: metrics, log: log.With("component", "http"), phase: phaseStarting, version: version,
		readTimeout: httpReadTimeout, writeTimeout: httpWriteTimeout, idleTimeout: httpIdleTimeout, maxConns: httpMaxConns,
	}
}

// Open listens and starts serving.
func (h *httpServer) Open(ctx context.Context) error {
	ln, err := net.Listen("tcp", h.addr)
	if err != nil {
		return fmt.Errorf("http.listen %s: %w", h.addr, err)
	}
	h.ln = &boundedListener{Listener: ln, max: int64(h.maxConns), log: h.log}
	h.srv = &http.Server{
		Handler:           h.auth.guard(h.routes()),
		ReadHeaderTimeout: min(httpReadHeaderTimeout, h.readTimeout),
		ReadTimeout:       h.readTimeout,
		WriteTimeout:      h.writeTimeout,
		IdleTimeout:       h.idleTimeout,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(h.log.Handler(), slog.LevelWarn),
	}
	h.done = make(chan struct{})
	go func() {
		defer close(h.done)
		if err := h.srv.Serve(h.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			h.log.Error("http server stopped", "err", err)
		}
	}()
	h.log.Info("serving metrics and health", "listen", ln.Addr().String(), "max_connections", h.maxConns,
		"endpoints", "/ /status.json /endpoints /metrics /healthz /readyz "+natsMonitorPrefix+"{"+strings.Join(NATSEndpoints, ",")+"}")
	return nil
}

// Addr is the address it listens on (with the port picked for ":0").
func (h *httpServer) Addr() string {
	if h == nil || h.ln == nil {
		return ""
	}
	return h.ln.Addr().String()
}

// Close stops serving, letting requests in progress finish for a while.
// It is idempotent and does nothing on a nil server.
func (h *httpServer) Close(ctx context.Context) error {
	if h == nil || h.srv == nil {
		return nil
	}
	var err error
	h.once.Do(func() {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err = h.srv.Shutdown(sctx); err != nil {
			_ = h.srv.Close()
		}
		<-h.done
	})
	return err
}

func (h *httpServer) setNATS(ns *server.Server) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ns = ns
}

func (h *httpServer) setMonitor(mon *monitor.Monitor) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.mon = mon
}

// setDeadLetters lets the page read the dead letters (and an admin act on
// them) through d.
func (h *httpServer) setDeadLetters(d *Daemon) {
	if h == nil {
		return
	}
	h.mu.Lock()
	h.dl = d
	h.mu.Unlock()
}

// setStatus sets what collects /status.json.
func (h *httpServer) setStatus(status func(context.Context) *ClientStatus) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.status = status
}

func (h *httpServer) setPhase(phase string) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.phase = phase
}

// setStep records what start-up is doing.
func (h *httpServer) setStep(step string) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.step = step
}

func (h *httpServer) state() (*server.Server, *monitor.Monitor, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ns, h.mon, h.phase
}

// NATSEndpoints are the embedded server's monitoring endpoints served
// under natsMonitorPrefix.
// (all of nats-server's own monitoring listener, but its expvar dump).
var NATSEndpoints = []string{"varz", "jsz", "connz", "subsz", "accstatz", "leafz", "healthz", "routez", "raftz", "gatewayz", "accountz", "stacksz", "ipqueuesz"}

// endpoints are the listener's own paths with what each serves, as
// /endpoints lists them (then NATSEndpoints).
var endpoints = [][2]string{
	{"GET /", "the status page"},
	{"GET " + statuspage.ScriptPath, "the status page's script"},
	{"GET /status.json", "what the status page shows: holdfast status --json"},
	{"GET /metrics", "Prometheus metrics"},
	{"GET /deadletters.json", "the newest dead letters (?consumer=NAME&limit=N)"},
	{"GET /deadletter.json", "one dead letter (?stream=S&seq=N)"},
	{"GET /healthz", "200 when healthy, 503 with a JSON reason"},
	{"GET /readyz", "200 once start-up is complete"},
	{"GET /login", "asks the browser for credentials, then back to /"},
	{"GET /api/whoami", "who the request's credentials name (an admin: the CSRF token)"},
	{"POST /api/deadletters/replay", "replay dead letters (an admin, with the CSRF token)"},
	{"POST /api/deadletters/purge", "purge dead letters (an admin, with the CSRF token)"},
	{"GET /endpoints", "this list"},
}

func (h *httpServer) routes() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", h.metrics.Handler())
	mux.HandleFunc("GET /healthz", h.healthz)
	mux.HandleFunc("GET /readyz", h.readyz)
	nats := map[string]func(*server.Server) http.HandlerFunc{
		"varz":      func(s *server.Server) http.HandlerFunc { return s.HandleVarz },
		"jsz":       func(s *server.Server) http.HandlerFunc { return s.HandleJsz },
		"connz":     func(s *server.Server) http.HandlerFunc { return s.HandleConnz },
		"subsz":     func(s *server.Server) http.HandlerFunc { return s.HandleSubsz },
		"accstatz":  func(s *server.Server) http.HandlerFunc { return s.HandleAccountStatz },
		"leafz":     func(s *server.Server) http.HandlerFunc { return s.HandleLeafz },
		"healthz":   func(s *server.Server) http.HandlerFunc { return s.HandleHealthz },
		"routez":    func(s *server.Server) http.HandlerFunc { return s.HandleRoutez },
		"raftz":     func(s *server.Server) http.HandlerFunc { return s.HandleRaftz },
		"gatewayz":  func(s *server.Server) http.HandlerFunc { return s.HandleGatewayz },
		"accountz":  func(s *server.Server) http.HandlerFunc { return s.HandleAccountz },
		"stacksz":   func(s *server.Server) http.HandlerFunc { return s.HandleStacksz },
		"ipqueuesz": func(s *server.Server) http.HandlerFunc { return s.HandleIPQueuesz },
	}
	for name, handler := range nats {
		serve := func(w http.ResponseWriter, r *http.Request) {
			ns, _, _ := h.state()
			if ns == nil || !ns.Running() {
				writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "error": "the NATS server is not running"})
				return
			}
			handler(ns)(w, r)
		}
		mux.HandleFunc("GET "+natsMonitorPrefix+name, serve)
		if name != "healthz" {
			mux.HandleFunc("GET /"+name, serve)
		}
	}
	page := statuspage.Handler()
	mux.Handle("GET /{$}", page)
	mux.Handle("GET "+statuspage.ScriptPath, page)
	mux.HandleFunc("GET /status.json", h.statusJSON)
	h.deadLetterRoutes(mux)
	mux.HandleFunc("GET /endpoints", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintf(w, "holdfast %s\n\n", h.version)
		for _, e := range endpoints {
			fmt.Fprintf(w, "%-25s %s\n", e[0], e[1])
		}
		for _, name := range NATSEndpoints {
			fmt.Fprintf(w, "%-25s the NATS server's /%s\n", natsMonitorPrefix+name, name)
		}
		fmt.Fprintf(w, "\nThe same at the root as well (/varz, /jsz, ...), but for /healthz: holdfast's own.\n")
	})
	return mux
}

// statusJSON answers what `holdfast status --json` prints, collected
// when asked (nothing runs for it between requests); 503 with the
// health's reason until holdfast is ready and while it stops.
func (h *httpServer) statusJSON(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	status, phase := h.status, h.phase
	h.mu.Unlock()
	// Reasons and subjects in it are raw text: never read as HTML.
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if status == nil || phase != phaseReady {
		health := h.health()
		writeJSON(w, http.StatusServiceUnavailable, &ClientStatus{Version: StatusVersion, Health: &health, Error: health.Reason})
		return
	}
	writeJSON(w, http.StatusOK, status(r.Context()))
}

// healthz answers 200 {"status":"ok"} when holdfast is healthy and 503
// with the reasons otherwise (200 "degraded" for a retention loss when
// fail_on_loss is off).
func (h *httpServer) healthz(w http.ResponseWriter, r *http.Request) {
	health := h.health()
	writeJSON(w, health.HTTPStatus(), health)
}

// health is the monitor's verdict once holdfast serves, else unhealthy
// with what start-up is doing.
func (h *httpServer) health() monitor.Health {
	_, mon, phase := h.state()
	if mon != nil && phase == phaseReady {
		return mon.Health()
	}
	reason := phase + ": not serving yet"
	h.mu.Lock()
	if h.step != "" {
		reason += ": " + h.step
	}
	h.mu.Unlock()
	if phase == phaseStopping {
		reason = "stopping"
	}
	return monitor.Health{Status: monitor.HealthUnhealthy, Reason: reason, Problems: []string{reason}}
}

// readyz answers 200 once the streams and consumers are bootstrapped and
// the workers started, and 503 before that and while stopping.
func (h *httpServer) readyz(w http.ResponseWriter, r *http.Request) {
	_, _, phase := h.state()
	code := http.StatusServiceUnavailable
	if phase == phaseReady {
		code = http.StatusOK
	}
	writeJSON(w, code, map[string]string{"status": phase})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// jetStreamCheck verifies, at every monitor check, what start-up
// verified: the server runs with JetStream on the file store in the
// configured directory.
func jetStreamCheck(srv *embedded.Server) func() error {
	return func() error {
		if err := srv.StoreWriteFault(); err != nil {
			return err
		}
		// Seen again every few seconds while the two keep connecting.
		if err := srv.DuplicateName(time.Minute); err != nil {
			return err
		}
		ns := srv.NATS()
		if ns == nil || !ns.Running() {
			return errors.New("the NATS server is not running")
		}
		if !ns.JetStreamEnabled() {
			return errors.New("JetStream is disabled")
		}
		jc := ns.JetStreamConfig()
		if jc == nil || jc.MaxStore <= 0 {
			return errors.New("JetStream has no file storage")
		}
		if want := filepath.Join(srv.StoreDir(), server.JetStreamStoreDir); filepath.Clean(jc.StoreDir) != want {
			return fmt.Errorf("JetStream stores in %s, not in %s", jc.StoreDir, want)
		}
		return nil
	}
}
