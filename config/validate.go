package config

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Validate checks every value and the relations between them and returns a
// *ValidationError listing all problems, or nil. It accepts server.port = -1
// (a free port) for programs that embed holdfast; Load does not.
func (c *Config) Validate() error { return c.check(false) }

// validateFile is Validate for a config an operator runs: Load's.
func (c *Config) validateFile() error { return c.check(true) }

func (c *Config) check(file bool) error {
	v := &validator{file: file}
	c.validate(v)
	c.validateCluster(v, file)
	c.validateLeafNodes(v, file)
	if len(v.problems) == 0 {
		return nil
	}
	return &ValidationError{Problems: v.problems}
}

type validator struct {
	problems []Problem
	// file holds the config to what holdfast run can serve: no random port.
	file bool
}

func (v *validator) add(key, value, format string, args ...any) {
	v.problems = append(v.problems, Problem{Key: key, Value: value, Reason: fmt.Sprintf(format, args...)})
}

func q(s string) string { return strconv.Quote(s) }

// size reports an unparsable size and returns whether it is usable.
func (v *validator) size(key string, s Size) bool {
	if s.bad != nil {
		v.add(key, q(s.bad.text), "%v", s.bad.err)
		return false
	}
	return true
}

func (v *validator) duration(key string, d Duration) bool {
	if d.bad != nil {
		v.add(key, q(d.bad.text), "%v", d.bad.err)
		return false
	}
	return true
}

func (v *validator) oneOf(key, value string, allowed ...string) {
	for _, a := range allowed {
		if value == a {
			return
		}
	}
	v.add(key, q(value), "must be one of %s", strings.Join(allowed, ", "))
}

func (c *Config) validate(v *validator) {
	s := c.Server
	if s.Name == "" || strings.ContainsAny(s.Name, " \t\n") {
		v.add("server.name", q(s.Name), "must be non-empty and contain no spaces")
	}
	if s.Host == "" || (net.ParseIP(s.Host) == nil && s.Host != "localhost") {
		v.add("server.host", q(s.Host), "must be an IP address such as 127.0.0.1")
	} else if !IsLoopback(s.Host) && !c.Auth.Enabled() && !s.AllowAnonymous {
		v.add("server.host", q(s.Host), "listening on a non-loopback address %s", anonymousReason)
	}
	switch {
	case s.Port == -1 && v.file:
		v.add("server.port", "-1", "must be 1-65535: a random port is one `holdfast status`, the CLI and clients cannot find (-1 is only for programs that embed holdfast)")
	case s.Port < -1 || s.Port == 0 || s.Port > 65535:
		v.add("server.port", strconv.Itoa(s.Port), "must be 1-65535 (nats-server would take 0 as 4222)")
	}
	if v.size("server.max_payload", s.MaxPayload) && (s.MaxPayload.Bytes <= 0 || s.MaxPayload.Bytes > 64<<20) {
		v.add("server.max_payload", s.MaxPayload.String(), "must be between 1 byte and 64MiB")
	}

	js := c.JetStream
	if js.StoreDir == "" {
		v.add("jetstream.store_dir", `""`, "must be set: an empty store dir makes the server use a temporary directory")
	}
	if v.size("jetstream.max_memory_store", js.MaxMemoryStore) && js.MaxMemoryStore.Bytes <= 0 {
		v.add("jetstream.max_memory_store", js.MaxMemoryStore.String(), "must be a positive size such as \"1GB\": unlimited would let the server take 75%% of RAM")
	}
	if v.size("jetstream.max_file_store", js.MaxFileStore) && js.MaxFileStore.Bytes <= 0 {
		v.add("jetstream.max_file_store", js.MaxFileStore.String(), "must be a positive size such as \"10GB\": unlimited would let the server take 75%% of the free disk at each start")
	}
	if js.Sync != "always" {
		if d, err := time.ParseDuration(js.Sync); err != nil || d <= 0 {
			v.add("jetstream.sync", q(js.Sync), "must be \"always\" (fsync every write) or a positive interval such as \"2m\"")
		} else if d < MinSyncInterval {
			v.add("jetstream.sync", q(js.Sync), "an interval must be at least %s (a shorter one makes the server fsync without pause, or panic): use \"always\" to fsync every write", MinSyncInterval)
		}
	}
	v.oneOf("jetstream.on_data_loss", js.OnDataLoss, "warn", "refuse")
	if js.Domain != "" && !validName(js.Domain) {
		v.add("jetstream.domain", q(js.Domain), "must not contain spaces, '.', '*', '>' or path separators")
	}

	if v.duration("run.shutdown_timeout", c.Run.ShutdownTimeout) && c.Run.ShutdownTimeout.Duration <= 0 {
		v.add("run.shutdown_timeout", c.Run.ShutdownTimeout.String(), "must be positive")
	}

	if c.HTTP.Listen != "" {
		host, port, err := splitListen(c.HTTP.Listen)
		if err != nil {
			v.add("http.listen", q(c.HTTP.Listen), "must be host:port such as 127.0.0.1:8222, or \"\" to disable")
		} else if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
			v.add("http.listen", q(c.HTTP.Listen), "port must be 0-65535")
		} else if !IsLoopback(host) && !c.Auth.Enabled() && !s.AllowAnonymous {
			v.add("http.listen", q(c.HTTP.Listen), "monitoring on a non-loopback address %s", anonymousReason)
		}
	}
	for i, h := range c.HTTP.AllowedHosts {
		// A name as the Host header carries it, without its port.
		if h == "" || strings.ContainsAny(h, ":/[]@ ") || strings.Trim(h, ".") != h {
			v.add(fmt.Sprintf("http.allowed_hosts[%d]", i), q(h), "must be a host name as clients write it, without scheme or port, such as \"edge-01.example.net\"")
		}
	}
	c.validateStallTimeout(v)
	v.oneOf("log.level", c.Log.Level, "debug", "info", "warn", "error")
	v.oneOf("log.format", c.Log.Format, "text", "json")

	c.validateSecurity(v)
	c.validateMQTT(v)
	c.validateStreams(v)
	c.validateGroupCommit(v)
	c.validateCommitWindow(v)
	c.validateConsumers(v)
}

// Lower bounds of durations that holdfast cannot run with below them.
const (
	// MinSyncInterval is the shortest jetstream.sync interval: below it the
	// file store fsyncs without pause (and at 1ns nats-server panics).
	MinSyncInterval = 10 * time.Millisecond
	// MaxPrefetch is the largest consumers.NAME.prefetch.
	MaxPrefetch = 10000
	// MinAckWait is the shortest consumer ack_wait: the workers keep a
	// message alive with in-progress acks every ack_wait/2, which must
	// leave time to handle it.
	MinAckWait = time.Second
	// MinBackoff is the shortest retry delay, so that a message that fails
	// at once is not redelivered in a tight loop.
	MinBackoff = 10 * time.Millisecond
	// MinHandlerTimeout is the shortest exec or http handler timeout.
	MinHandlerTimeout = 100 * time.Millisecond
)

// replySubjects are where replies to requests go: _INBOX.> by convention of
// every NATS client (JetStream API calls and PubAcks included), _R_.> and
// _GR_.> for the server's own service-import and gateway replies.
var replySubjects = []string{"_INBOX.>", "_R_.>", "_GR_.>"}

// replySubject returns the reply subject space subj overlaps, or "".
func replySubject(subj string) string {
	for _, r := range replySubjects {
		if server.SubjectsCollide(subj, r) {
			return r
		}
	}
	return ""
}

// splitListen splits a host:port listen address.
func splitListen(listen string) (host, port string, err error) {
	return net.SplitHostPort(listen)
}

// IsLoopback reports whether host (an IP or "localhost") is a loopback
// address. The unspecified addresses 0.0.0.0 and :: are not.
func IsLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// validName matches the server's rule for stream, consumer and domain names.
func validName(n string) bool {
	return n != "" && !strings.ContainsAny(n, " \t\r\n.*>/\\") && len(n) <= 255
}

// nameRule says what is wrong with a name validName refuses.
func nameRule(kind, n string) string {
	if len(n) > 255 {
		return fmt.Sprintf("%s name is %d bytes long: the server takes at most 255", kind, len(n))
	}
	return kind + " name must not contain spaces, '.', '*', '>' or path separators"
}

func (c *Config) validateStreams(v *validator) {
	if len(c.Streams) == 0 {
		v.add("streams", "", "no stream configured: add a [streams.NAME] table")
	}
	type owned struct{ stream, subject string }
	var all []owned
	for _, name := range c.StreamNames() {
		sc := c.Streams[name]
		key := "streams." + name
		if !validName(name) {
			v.add(key, "", "%s", nameRule("stream", name))
		}
		if len(sc.Subjects) == 0 && sc.Mirror == nil && len(sc.Sources) == 0 {
			v.add(key+".subjects", "[]", "at least one subject is required, such as [\"orders.*\"]")
		}
		for _, subj := range sc.Subjects {
			if !server.IsValidSubject(subj) {
				v.add(key+".subjects", q(subj), "not a valid NATS subject")
				continue
			}
			// The server refuses a subject that overlaps its API ($JS.>),
			// which every subject with a wildcard first token does.
			if strings.HasPrefix(subj, "$") || strings.HasPrefix(subj, "dlq.") || server.SubjectsCollide(subj, "$JS.>") {
				v.add(key+".subjects", q(subj), "reserved: subjects starting with $, dlq. or a wildcard overlap the server's API ($JS, $SYS, $KV, $O, $HOLDFAST) or the dead letters: pick subjects of your own, such as \"orders.*\"")
				continue
			}
			if r := replySubject(subj); r != "" {
				v.add(key+".subjects", q(subj), "overlaps %s, where the replies to requests go (every JetStream call and PubAck among them): a stream on it stores its own API replies, a loop that fills the disk; pick subjects of your own, such as \"orders.*\"", r)
				continue
			}
			for _, o := range all {
				if server.SubjectsCollide(o.subject, subj) {
					v.add(key+".subjects", q(subj), "overlaps %q of stream %s: a message may belong to one stream only", o.subject, o.stream)
				}
			}
			all = append(all, owned{name, subj})
		}
		v.oneOf(key+".retention", sc.Retention, "limits", "interest", "workqueue")
		v.oneOf(key+".discard", sc.Discard, "old", "new")
		if sc.MaxMsgs < -1 || sc.MaxMsgs == 0 {
			v.add(key+".max_msgs", strconv.FormatInt(sc.MaxMsgs, 10), "must be positive, or -1 for unlimited")
		}
		if v.size(key+".max_bytes", sc.MaxBytes) && sc.MaxBytes.Bytes == 0 {
			v.add(key+".max_bytes", "0", "must be positive, or \"-1\" for unlimited")
		}
		if v.duration(key+".max_age", sc.MaxAge) && sc.MaxAge.Duration < 0 {
			v.add(key+".max_age", sc.MaxAge.String(), "must not be negative (\"0s\" keeps messages forever)")
		} else if sc.MaxAge.Duration > 0 && sc.MaxAge.Duration < MinStreamWindow {
			v.add(key+".max_age", sc.MaxAge.String(), "must be at least %s (the server refuses a shorter one), or \"0s\" to keep messages forever", MinStreamWindow)
		}
		switch sc.Storage {
		case "file":
		case "memory":
			if !sc.AllowMemory {
				v.add(key+".storage", q(sc.Storage), "memory storage loses every message at restart: set allow_memory = true in this table to accept that")
			}
		default:
			v.add(key+".storage", q(sc.Storage), "must be one of file, memory")
		}
		if v.duration(key+".duplicate_window", sc.DuplicateWindow) && sc.DuplicateWindow.Duration < 0 {
			v.add(key+".duplicate_window", sc.DuplicateWindow.String(), "must not be negative")
		} else if sc.MaxAge.Duration > 0 && sc.DuplicateWindow.Duration > sc.MaxAge.Duration {
			v.add(key+".duplicate_window", sc.DuplicateWindow.String(), "must not be longer than max_age (%s)", sc.MaxAge)
		} else if sc.DuplicateWindow.Duration > 0 && sc.DuplicateWindow.Duration < MinStreamWindow {
			v.add(key+".duplicate_window", sc.DuplicateWindow.String(), "must be at least %s (the server refuses a shorter one)", MinStreamWindow)
		}
	}
	c.validateReservations(v)
}

// MinStreamWindow is the shortest max_age and duplicate_window the server
// accepts (other than 0).
const MinStreamWindow = 100 * time.Millisecond

// validateReservations checks the streams' max_bytes against the store
// limits: the server reserves each stream's max_bytes in its storage's
// limit and refuses to create a stream that does not fit ("insufficient
// storage resources"), which stopped holdfast run at start-up.
func (c *Config) validateReservations(v *validator) {
	for _, st := range []struct {
		storage, key string
		limit        Size
	}{
		{"file", "jetstream.max_file_store", c.JetStream.MaxFileStore},
		{"memory", "jetstream.max_memory_store", c.JetStream.MaxMemoryStore},
	} {
		if st.limit.bad != nil || st.limit.Bytes <= 0 {
			continue
		}
		var sum int64
		var parts, unlimited []string
		for _, name := range c.StreamNames() {
			sc := c.Streams[name]
			switch {
			case sc.Storage != st.storage || sc.MaxBytes.bad != nil:
			case sc.MaxBytes.Bytes <= 0:
				unlimited = append(unlimited, name)
			default:
				sum += sc.MaxBytes.Bytes
				parts = append(parts, fmt.Sprintf("%s %s", name, sc.MaxBytes))
			}
		}
		if st.storage == "file" { // dead-letter streams: file storage, no max_bytes
			unlimited = append(unlimited, slices.Sorted(maps.Keys(c.DeadLetterStreams()))...)
		}
		switch {
		case sum > st.limit.Bytes:
			v.add(st.key, st.limit.String(), "is less than the max_bytes of its streams together (%s): the server sets each stream's max_bytes aside in this limit and refuses a stream that does not fit; raise %s or lower max_bytes",
				strings.Join(parts, " + "), st.key)
		case sum == st.limit.Bytes && len(unlimited) > 0:
			// The server needs a byte left for a stream without max_bytes.
			v.add(st.key, st.limit.String(), "is all set aside for the max_bytes of %s, and the server refuses a stream without max_bytes (%s) when nothing is left; raise %s or lower max_bytes",
				strings.Join(parts, " + "), strings.Join(unlimited, ", "), st.key)
		}
	}
}

// checkOtherHandlers refuses what names the target of a handler the
// consumer does not run (exec.command, http.url, forward.subject or
// domain other than their defaults): with handler left out, the log
// handler would take and acknowledge every message while the operator
// believes a command, endpoint or hub gets them. Timeouts alone are not
// refused: the default file writes each handler's table with them.
func (c *Config) checkOtherHandlers(v *validator, key string, cc *ConsumerConfig) {
	other := func(k, value, handler string) {
		v.add(key+"."+k, value, "set, but handler = %q: the %s handler would never run and %s would take (and acknowledge) every message; set handler = %q, or remove %s",
			cc.Handler, handler, cc.Handler, handler, k)
	}
	if cc.Handler != "exec" && len(cc.Exec.Command) > 0 {
		other("exec.command", fmt.Sprintf("%q", cc.Exec.Command), "exec")
	}
	if cc.Handler != "http" && cc.HTTP.URL != "" {
		shown, _ := checkHTTPURL(cc.HTTP.URL)
		other("http.url", q(shown), "http")
	}
	if cc.Handler != "forward" {
		if d := forwardDefaults(); cc.Forward.Subject != d.Subject {
			other("forward.subject", q(cc.Forward.Subject), "forward")
		} else if cc.Forward.Domain != d.Domain {
			other("forward.domain", q(cc.Forward.Domain), "forward")
		}
	}
}

func (c *Config) validateConsumers(v *validator) {
	for _, name := range c.ConsumerNames() {
		cc := c.Consumers[name]
		key := "consumers." + name
		if !validName(name) {
			v.add(key, "", "%s", nameRule("consumer", name))
		}
		_, ok := c.Streams[cc.Stream]
		switch {
		case cc.Stream == "":
			v.add(key+".stream", `""`, "must name the stream this consumer reads")
		case !ok:
			if len(c.Streams) == 0 {
				v.add(key+".stream", q(cc.Stream), "no such stream: no stream is configured; add a [streams.%s] table", cc.Stream)
			} else {
				v.add(key+".stream", q(cc.Stream), "no such stream: configured streams are %s", strings.Join(c.StreamNames(), ", "))
			}
		}
		if cc.FilterSubject != "" {
			if !server.IsValidSubject(cc.FilterSubject) {
				v.add(key+".filter_subject", q(cc.FilterSubject), "not a valid NATS subject")
			} else if subjects, known := c.messageSubjects(cc.Stream, 0); ok && known {
				inStream := false
				for _, s := range subjects {
					if server.SubjectsCollide(s, cc.FilterSubject) {
						inStream = true
					}
				}
				if !inStream {
					v.add(key+".filter_subject", q(cc.FilterSubject), "matches none of stream %s's subjects %v", cc.Stream, subjects)
				}
			}
		}
		if v.duration(key+".ack_wait", cc.AckWait) && cc.AckWait.Duration < MinAckWait {
			v.add(key+".ack_wait", cc.AckWait.String(), "must be at least %s, such as \"30s\": a shorter one redelivers messages while they are handled", MinAckWait)
		}
		if cc.MaxDeliver < 1 {
			v.add(key+".max_deliver", strconv.Itoa(cc.MaxDeliver), "must be at least 1: holdfast never retries forever, failures go to the dead-letter stream")
		}
		for i, b := range cc.Backoff {
			bk := fmt.Sprintf("%s.backoff[%d]", key, i)
			if v.duration(bk, b) && b.Duration < MinBackoff {
				v.add(bk, b.String(), "must be at least %s: a shorter delay retries a failing message in a tight loop", MinBackoff)
			}
		}
		if cc.MaxAckPending < 1 {
			v.add(key+".max_ack_pending", strconv.Itoa(cc.MaxAckPending), "must be at least 1")
		}
		if cc.Workers < 0 || cc.Workers > 1024 {
			v.add(key+".workers", strconv.Itoa(cc.Workers), "must be between 0 (no in-process workers) and 1024")
		} else if cc.MaxAckPending >= 1 && cc.Workers > cc.MaxAckPending {
			v.add(key+".workers", strconv.Itoa(cc.Workers), "more than max_ack_pending (%d): the extra workers would never get a message", cc.MaxAckPending)
		}
		if cc.Prefetch < 0 || cc.Prefetch > MaxPrefetch {
			v.add(key+".prefetch", strconv.Itoa(cc.Prefetch), "must be between 0 (pull one message per free worker) and %d", MaxPrefetch)
		}
		switch cc.Handler {
		case "log":
		case "exec":
			if len(cc.Exec.Command) == 0 || cc.Exec.Command[0] == "" {
				v.add(key+".exec.command", "[]", "handler = \"exec\" needs a command, such as [\"/usr/local/bin/process-order\"]")
			} else if !strings.HasPrefix(cc.Exec.Command[0], "/") {
				v.add(key+".exec.command", q(cc.Exec.Command[0]), "must be an absolute path: the handler runs without a shell or PATH lookup")
			}
			for i, arg := range cc.Exec.Command {
				if strings.IndexByte(arg, 0) >= 0 {
					// The command could never start: every message would
					// be retried up to max_deliver and dead-lettered.
					v.add(fmt.Sprintf("%s.exec.command[%d]", key, i), q(arg), "contains a NUL byte (\\u0000), which no program or argument can carry")
				}
			}
		case "forward": // validateLeafNodes
		case "http":
			if cc.HTTP.URL == "" {
				v.add(key+".http.url", `""`, "handler = \"http\" needs a url, such as \"http://127.0.0.1:8080/orders\"")
			} else if shown, problem := checkHTTPURL(cc.HTTP.URL); problem != "" {
				v.add(key+".http.url", q(shown), "%s", problem)
			}
		default:
			v.add(key+".handler", q(cc.Handler), "must be one of log, exec, http, forward")
		}
		c.checkOtherHandlers(v, key, cc)
		if v.duration(key+".exec.timeout", cc.Exec.Timeout) && cc.Exec.Timeout.Duration < MinHandlerTimeout {
			v.add(key+".exec.timeout", cc.Exec.Timeout.String(), "must be at least %s: a shorter one fails every message before the command can run", MinHandlerTimeout)
		}
		if v.duration(key+".http.timeout", cc.HTTP.Timeout) && cc.HTTP.Timeout.Duration < MinHandlerTimeout {
			v.add(key+".http.timeout", cc.HTTP.Timeout.String(), "must be at least %s: a shorter one fails every message before the endpoint can answer", MinHandlerTimeout)
		}
		if cc.DeadLetter != "" {
			switch {
			case !validName(cc.DeadLetter):
				v.add(key+".dead_letter", q(cc.DeadLetter), "%s", nameRule("stream", cc.DeadLetter))
			case c.Streams[cc.DeadLetter] != nil:
				suggest := cc.Stream + "_DLQ"
				for c.Streams[suggest] != nil {
					suggest += "_DEAD"
				}
				v.add(key+".dead_letter", q(cc.DeadLetter), "is a configured stream: dead-letter streams are created by holdfast, pick another name such as %q", suggest)
			}
		}
	}
	c.validateWorkQueues(v)
}

// messageSubjects returns the subjects the messages of a configured stream
// can have: its own, and those of what it mirrors or sources (their
// filter, else their subjects). known is false when an origin is not a
// stream of this config (another domain): its subjects are not known here.
func (c *Config) messageSubjects(stream string, depth int) (subjects []string, known bool) {
	sc := c.Streams[stream]
	if sc == nil || depth > len(c.Streams) {
		return nil, false
	}
	subjects = slices.Clone(sc.Subjects)
	origins := slices.Clone(sc.Sources)
	if sc.Mirror != nil {
		origins = append(origins, *sc.Mirror)
	}
	for _, o := range origins {
		switch {
		case o.Domain != "" || c.Streams[o.Name] == nil:
			return nil, false
		case o.FilterSubject != "":
			subjects = append(subjects, o.FilterSubject)
		default:
			sub, ok := c.messageSubjects(o.Name, depth+1)
			if !ok {
				return nil, false
			}
			subjects = append(subjects, sub...)
		}
	}
	return subjects, true
}

// validateWorkQueues checks the consumers of each workqueue stream as the
// server does when it creates them: a message of such a stream goes to one
// consumer only, so with several consumers each needs a filter_subject,
// none overlapping another's. The server refuses the second consumer
// otherwise, and holdfast run stopped at start-up after check had passed.
func (c *Config) validateWorkQueues(v *validator) {
	for _, stream := range c.StreamNames() {
		if c.Streams[stream].Retention != "workqueue" {
			continue
		}
		var names []string
		for _, name := range c.ConsumerNames() {
			if c.Consumers[name].Stream == stream {
				names = append(names, name)
			}
		}
		for i, name := range names {
			cc := c.Consumers[name]
			key := "consumers." + name + ".filter_subject"
			for _, other := range names[:i] {
				oc := c.Consumers[other]
				switch {
				case cc.FilterSubject == "" || oc.FilterSubject == "":
					v.add(key, q(cc.FilterSubject), "stream %s has retention \"workqueue\", where a message goes to one consumer only: consumers %s and %s each need a filter_subject, not overlapping the other's (or retention \"limits\" or \"interest\" for every consumer to get every message)", stream, other, name)
				case server.SubjectsCollide(cc.FilterSubject, oc.FilterSubject):
					v.add(key, q(cc.FilterSubject), "overlaps %q of consumer %s on stream %s, whose retention \"workqueue\" gives a message to one consumer only: pick filters that do not overlap (or retention \"limits\" or \"interest\" for every consumer to get every message)", oc.FilterSubject, other, stream)
				default:
					continue
				}
				break
			}
		}
	}
}

// DeadLetterStreams maps each dead-letter stream to the consumers that use
// it; its subjects are dlq.<CONSUMER>.> for each of them.
func (c *Config) DeadLetterStreams() map[string][]string {
	out := map[string][]string{}
	for _, name := range c.ConsumerNames() {
		if dl := c.Consumers[name].DeadLetter; dl != "" {
			out[dl] = append(out[dl], name)
		}
	}
	return out
}

// ReplayTimeout is how long a replay of a dead letter of consumer may
// wait for its verdict: the longest its handler may take, and some.
func (c *Config) ReplayTimeout(consumer string) time.Duration {
	d := 30 * time.Second
	if cc := c.Consumers[consumer]; cc != nil {
		d = max(cc.AckWait.Duration, cc.Exec.Timeout.Duration, cc.HTTP.Timeout.Duration)
	}
	return d + 30*time.Second
}

// minStallTimeout is the shortest http.stall_timeout: the monitor checks
// once a second, and a worker takes a moment between two messages.
const minStallTimeout = time.Second

// validateStallTimeout checks http.stall_timeout. It need not exceed the
// backoff, a Retry-After, the exec or http timeouts or ack_wait: the
// monitor counts a message waiting for a delayed retry, a handler running
// within its timeout and a message the server has yet to time out (ack_wait)
// as waiting, not stalled, and starts the stall clock only when the
// workers could progress and do not. So a short stall_timeout cannot make
// a waiting consumer look stalled; only one shorter than a few checks is
// refused.
func (c *Config) validateStallTimeout(v *validator) {
	d := c.HTTP.StallTimeout
	if !v.duration("http.stall_timeout", d) {
		return
	}
	if d.Duration <= 0 {
		v.add("http.stall_timeout", d.String(), "must be positive, such as \"5m\"")
	} else if d.Duration < minStallTimeout {
		v.add("http.stall_timeout", d.String(), "must be at least %s, such as \"5m\": the monitor checks once a second", minStallTimeout)
	}
}

// checkHTTPURL returns what is wrong with an http handler's url, or "", and
// the url as an error may show it (without its password). It refuses what
// the handler refuses at start-up, and a port no request can reach, which
// would retry and then dead-letter every message.
func checkHTTPURL(raw string) (shown, problem string) {
	u, err := url.Parse(raw)
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err // it quotes the url again
		}
		return raw, "is not a valid URL: " + err.Error()
	}
	shown = u.Redacted()
	if u.Scheme != "http" && u.Scheme != "https" {
		return shown, "must be an http:// or https:// URL"
	}
	if u.Hostname() == "" {
		return shown, "has no host, such as http://127.0.0.1:8080/orders"
	}
	if port := u.Port(); port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return shown, "port " + port + " is not between 1 and 65535"
		}
	}
	return shown, ""
}
