package handler

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

const (
	// maxRetryAfter caps a Retry-After the endpoint asks for, so a
	// misconfigured endpoint cannot park a message for days.
	maxRetryAfter = time.Hour

	// bodySnippetLimit is how much of a failed response's body goes into
	// the Reason (and so into a dead letter's Holdfast-Error header).
	bodySnippetLimit = 200

	// drainLimit is how much of a response body is read to keep the
	// connection for reuse; a longer body closes the connection instead.
	drainLimit = 64 << 10

	// maxRedirects is how many 307/308 redirects a POST follows.
	maxRedirects = 10
)

// HTTPOptions configures an HTTP handler.
type HTTPOptions struct {
	// URL is the http:// or https:// endpoint each message is POSTed to.
	URL string
	// Timeout bounds one request, from connecting to reading the response;
	// zero means only the context given to Handle bounds it.
	Timeout time.Duration
}

// HTTP is the "http" handler: it POSTs each message's payload to a
// URL and judges the message by the response status. It is safe for
// concurrent use and keeps connections alive across messages.
//
// The request carries the message's own headers, then these, which win over
// message headers of the same name:
//
//	Holdfast-Subject, Holdfast-Stream, Holdfast-Consumer,
//	Holdfast-Seq, Holdfast-Delivery, Idempotency-Key
//
// and Content-Type: application/octet-stream unless the message has a
// Content-Type. Of the message's headers, NATS's own Nats-* headers are not
// sent (they steer JetStream, not the endpoint) except Nats-Msg-Id, the
// publisher's id for the message, nor are headers that HTTP cannot carry (a
// name that is not a token, a value with control characters), which are
// logged.
//
// A publisher does not get to speak for holdfast to the endpoint: message
// headers that carry credentials, that proxies use to say who the client
// is, or that describe the connection are sent only under the prefix
// Holdfast-Header- (a message's Authorization arrives as
// Holdfast-Header-Authorization), where they inform the endpoint without
// authenticating, redirecting or re-framing the request. They are
// Authorization, Cookie, Proxy-*, Forwarded, X-Forwarded-*, Via, X-Real-IP,
// True-Client-IP, X-Client-IP, X-Original-URL, X-Rewrite-URL,
// X-HTTP-Method-Override, X-HTTP-Method, X-Method-Override, Host,
// Connection, Keep-Alive, TE, Trailer, Transfer-Encoding, Upgrade,
// Content-Length and Expect. Credentials in the URL (https://user:pass@host)
// are what authenticates the request.
//
// A 2xx response succeeds. 429 and 503 retry, after the Retry-After the
// response gives (seconds or an HTTP date, at most an hour). Other 5xx
// responses, timeouts (a 408 Request Timeout and a 425 Too Early too: the
// endpoint did not take the request) and connection errors retry. Every other status fails
// the message permanently, with the status and the start of the body as the
// reason (a 101 Switching Protocols included, without reading what follows).
// The status decides: a 2xx whose body is cut off or never ends succeeds, and
// the timeout bounds reading the body as well as the request. Redirects are
// followed only when they keep the POST and its body (307, 308) and lead to
// an http or https URL; a 301, 302 or 303, or a 307 or 308 to another
// scheme, fails the message. A failure after a redirect, a status
// included, names where it led (without password, query or fragment).
type HTTP struct {
	url        string
	errURL     string // url as net/http's errors show it
	timeout    time.Duration
	timeoutErr error
	client     *http.Client
	logger     *slog.Logger
}

// NewHTTP checks cfg and returns an HTTP handler. A nil logger means
// slog.Default().
func NewHTTP(cfg HTTPOptions, logger *slog.Logger) (*HTTP, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil {
		// url.Error quotes the URL, which may hold a password.
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		return nil, fmt.Errorf("http handler: invalid url: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("http handler: url %s: scheme must be http or https", u.Redacted())
	}
	if u.Hostname() == "" {
		return nil, fmt.Errorf("http handler: url %s: no host", u.Redacted())
	}
	if port := u.Port(); port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("http handler: url %s: port %s is not between 1 and 65535", u.Redacted(), port)
		}
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("http handler: timeout %s is negative", cfg.Timeout)
	}
	if logger == nil {
		logger = slog.Default()
	}
	transport := &http.Transport{
		Proxy: http.ProxyFromEnvironment,
		DialContext: (&net.Dialer{
			Timeout:   30 * time.Second,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          128,
		MaxIdleConnsPerHost:   64, // one per worker, for many workers
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: 1 * time.Second,
	}
	client := &http.Client{
		Transport: transport,
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			// 301/302/303 turn the POST into a GET without the payload: a
			// 2xx to that would ack a message nobody received.
			if req.Method != http.MethodPost || len(via) >= maxRedirects {
				return http.ErrUseLastResponse
			}
			if req.URL.Scheme != "http" && req.URL.Scheme != "https" {
				return http.ErrUseLastResponse // judged by the 3xx itself
			}
			return nil
		},
	}
	h := &HTTP{
		url:        u.String(),
		errURL:     u.String(),
		timeout:    cfg.Timeout,
		timeoutErr: fmt.Errorf("timed out after %s", cfg.Timeout),
		client:     client,
		logger:     logger,
	}
	if _, ok := u.User.Password(); ok {
		// net/http's errors show the password as ***.
		h.errURL = strings.Replace(h.url, u.User.String()+"@", u.User.Username()+":***@", 1)
	}
	return h, nil
}

// CloseIdleConnections closes the connections kept alive for reuse. Call it
// when the handler is no longer used.
func (h *HTTP) CloseIdleConnections() {
	h.client.CloseIdleConnections()
}

// Handle POSTs msg and reads the response.
func (h *HTTP) Handle(ctx context.Context, msg *Message) Result {
	if h.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, h.timeout, h.timeoutErr)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, bytes.NewReader(msg.Data))
	if err != nil {
		return RetryLater(fmt.Sprintf("cannot build request: %v", err))
	}
	if reason := h.setHeaders(ctx, req.Header, msg); reason != "" {
		return Fail(reason)
	}

	resp, err := h.client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			cause := context.Cause(ctx)
			if cause == h.timeoutErr {
				return RetryLater(cause.Error())
			}
			return RetryLater("stopped: " + cause.Error())
		}
		// Not the url.Error itself: it quotes the URL, whose query may
		// hold a token.
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
			if uerr.URL != h.url && uerr.URL != h.errURL {
				// Failed at the place a 307 or 308 sent it to, which the
				// operator must be told of: the error names only it.
				return RetryLater(fmt.Sprintf("POST failed after a redirect to %s: %v", redirectTarget(uerr.URL), err))
			}
		}
		return RetryLater(fmt.Sprintf("POST failed: %v", err))
	}
	// The timeout covers reading the body too: a 101's body is the raw
	// connection, which the request's context no longer watches.
	stop := context.AfterFunc(ctx, func() { _ = resp.Body.Close() })
	defer stop()
	code := resp.StatusCode
	if code == http.StatusSwitchingProtocols {
		// Not asked for: what follows is not HTTP, so read none of it.
		_ = resp.Body.Close()
		return Fail("HTTP 101 Switching Protocols: the endpoint switched to another protocol, which holdfast never asks for")
	}
	defer drainAndClose(resp.Body)

	status := strconv.Itoa(code)
	if text := http.StatusText(code); text != "" {
		status += " " + text
	}
	if resp.Request != nil && resp.Request.URL.String() != req.URL.String() {
		// Answered where a 307 or 308 led, not by the configured URL
		// (which answered with the redirect): say where.
		status += " (after a redirect to " + redirectTarget(resp.Request.URL.String()) + ")"
	}
	switch {
	case code >= 200 && code <= 299:
		return Ok()
	case code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable:
		r := RetryLater(withLine("HTTP "+status, bodySnippet(resp.Body)))
		r.RetryAfter = parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
		return r
	case code >= 500 && code <= 599:
		return RetryLater(withLine("HTTP "+status, bodySnippet(resp.Body)))
	case code == http.StatusRequestTimeout || code == http.StatusTooEarly:
		// The endpoint did not take the request (it timed out reading
		// it, or will not act on it yet): a timeout, not a verdict on
		// the message (RFC 9110 15.5.9; RFC 8470).
		return RetryLater(withLine("HTTP "+status, bodySnippet(resp.Body)))
	case code >= 300 && code <= 399:
		reason := "HTTP " + status
		if loc := resp.Header.Get("Location"); loc != "" {
			reason += " to " + OneLine(loc, bodySnippetLimit)
			if code == http.StatusTemporaryRedirect || code == http.StatusPermanentRedirect {
				if target, err := resp.Request.URL.Parse(loc); err == nil && target.Scheme != "http" && target.Scheme != "https" {
					reason += " (not followed: not an http or https URL)"
				} else {
					reason += fmt.Sprintf(" (not followed: more than %d redirects)", maxRedirects)
				}
			} else {
				reason += " (not followed: only 307 and 308 keep the POST and its body)"
			}
		}
		return Fail(withLine(reason, bodySnippet(resp.Body)))
	}
	return Fail(withLine("HTTP "+status, bodySnippet(resp.Body)))
}

// redirectTarget shows a URL a redirect led to without its password, query
// and fragment, which may hold tokens.
func redirectTarget(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(an unparsable URL)"
	}
	u.RawQuery, u.ForceQuery, u.Fragment, u.RawFragment = "", false, "", ""
	return u.Redacted()
}

// setHeaders fills a request's header from msg. It returns a reason to fail
// the message when one of holdfast's own headers cannot be sent.
func (h *HTTP) setHeaders(ctx context.Context, header http.Header, msg *Message) string {
	var skipped []string
	for name, values := range msg.Header {
		sendAs := requestHeaderName(name)
		if sendAs == "" {
			continue
		}
		if !validHeaderName(name) {
			skipped = append(skipped, name)
			continue
		}
		for _, v := range values {
			if !validHeaderValue(v) {
				skipped = append(skipped, name)
				break
			}
			header.Add(sendAs, v)
		}
	}
	if len(skipped) > 0 {
		h.logger.LogAttrs(ctx, slog.LevelWarn, "message headers not sent: HTTP cannot carry them",
			slog.Uint64("seq", msg.Sequence),
			slog.String("subject", msg.Subject),
			slog.String("consumer", msg.Consumer),
			slog.Any("headers", skipped),
		)
	}
	if len(header.Values("Content-Type")) == 0 {
		header.Set("Content-Type", "application/octet-stream")
	}
	for _, kv := range [][2]string{
		{"Holdfast-Subject", msg.Subject},
		{"Holdfast-Stream", msg.Stream},
		{"Holdfast-Consumer", msg.Consumer},
		{"Holdfast-Seq", strconv.FormatUint(msg.Sequence, 10)},
		{"Holdfast-Delivery", strconv.FormatUint(msg.Delivery, 10)},
		{"Idempotency-Key", idempotencyKey(msg)},
	} {
		if !validHeaderValue(kv[1]) {
			return fmt.Sprintf("%s %q cannot be sent as an HTTP header", kv[0], kv[1])
		}
		header.Set(kv[0], kv[1])
	}
	header.Set("User-Agent", "holdfast")
	return ""
}

// protectedHeaderPrefix is put before the name of a message header that
// may not be sent as itself.
const protectedHeaderPrefix = "Holdfast-Header-"

// protectedHeaders may not be set by a message: credentials (the handler's
// own come from its URL), what proxies say about the client and the
// original request (an endpoint may trust them), and the headers that
// describe the connection or that the transport sets.
var protectedHeaders = []string{
	"Authorization", "Cookie",
	"Forwarded", "Via", "X-Real-Ip", "True-Client-Ip", "X-Client-Ip",
	"X-Original-Url", "X-Rewrite-Url",
	"X-Http-Method-Override", "X-Http-Method", "X-Method-Override",
	"Host", "Connection", "Keep-Alive", "Te", "Trailer", "Transfer-Encoding",
	"Upgrade", "Content-Length", "Expect",
}

// protectedHeaderPrefixes start names of protected headers too.
var protectedHeaderPrefixes = []string{"Proxy-", "X-Forwarded-"}

// requestHeaderName returns the name a message header is sent under: its
// own, protectedHeaderPrefix and its own, or "" when it is not sent.
func requestHeaderName(name string) string {
	if strings.EqualFold(name, nats.MsgIdHdr) {
		return name
	}
	if hasPrefixFold(name, "Nats-") {
		return ""
	}
	for _, h := range protectedHeaders {
		if strings.EqualFold(name, h) {
			return protectedHeaderPrefix + name
		}
	}
	for _, p := range protectedHeaderPrefixes {
		if hasPrefixFold(name, p) {
			return protectedHeaderPrefix + name
		}
	}
	return name
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// validHeaderName reports whether name is an RFC 9110 token.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// validHeaderValue reports whether net/http will send v: no control
// characters other than tab.
func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// parseRetryAfter returns the delay a Retry-After header value asks for:
// delta-seconds or an HTTP date, relative to now. It returns 0 for an absent,
// past or unparsable value and caps the delay at maxRetryAfter.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if v[0] >= '0' && v[0] <= '9' {
		secs, err := strconv.ParseUint(v, 10, 64)
		if errors.Is(err, strconv.ErrRange) {
			return maxRetryAfter
		}
		if err != nil {
			return 0
		}
		if secs >= uint64(maxRetryAfter/time.Second) {
			return maxRetryAfter
		}
		return time.Duration(secs) * time.Second
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0
	}
	d := t.Sub(now)
	if d <= 0 {
		return 0
	}
	return min(d, maxRetryAfter)
}

// bodySnippet reads the start of a response body for a Reason.
func bodySnippet(body io.Reader) string {
	buf := make([]byte, bodySnippetLimit+1)
	n, _ := io.ReadFull(body, buf)
	return OneLine(string(buf[:n]), bodySnippetLimit)
}

// drainAndClose reads what is left of a body, up to drainLimit, so the
// connection can carry the next request, and closes it.
func drainAndClose(body io.ReadCloser) {
	_, _ = io.CopyN(io.Discard, body, drainLimit)
	_ = body.Close()
}
