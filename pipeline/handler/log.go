package handler

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// logPayloadLimit is how much of a payload the log handler shows at debug
// level.
const logPayloadLimit = 256

// logLinesPerSecond is how many messages a second the log handler logs
// one by one at info level; the rest are counted in one line a second.
const logLinesPerSecond = 20

// NewLog returns the "log" handler: it logs each message's subject,
// stream, consumer, sequence, delivery attempt, idempotency key and size at
// info level, and succeeds. Under load it logs at most 20 messages a second
// that way and counts the others in one line a second, so that a terminal
// or the journal is not flooded; at debug level every message is logged,
// with the first 256 bytes of its payload (never at info).
// A nil logger means slog.Default().
func NewLog(logger *slog.Logger) Handler {
	if logger == nil {
		logger = slog.Default()
	}
	return &logHandler{logger: logger}
}

type logHandler struct {
	logger *slog.Logger

	mu          sync.Mutex
	windowStart time.Time
	inWindow    int         // messages logged one by one since windowStart
	unlogged    uint64      // messages handled and not logged since the last summary
	summary     *time.Timer // logs unlogged at the end of the window
}

// oneByOne tells whether this message gets its own info line.
func (h *logHandler) oneByOne(now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if now.Sub(h.windowStart) >= time.Second {
		h.windowStart, h.inWindow = now, 0
	}
	if h.inWindow < logLinesPerSecond {
		h.inWindow++
		return true
	}
	h.unlogged++
	if h.summary == nil {
		h.summary = time.AfterFunc(h.windowStart.Add(time.Second).Sub(now), h.logSummary)
	}
	return false
}

func (h *logHandler) logSummary() {
	h.mu.Lock()
	n := h.unlogged
	h.unlogged, h.summary = 0, nil
	h.mu.Unlock()
	h.logger.Info("messages handled without a line each", "count", n,
		"why", fmt.Sprintf("the log handler logs at most %d messages a second at info; log.level = \"debug\" logs every one", logLinesPerSecond))
}

func (h *logHandler) Handle(ctx context.Context, msg *Message) Result {
	if !h.logger.Enabled(ctx, slog.LevelDebug) && !h.oneByOne(time.Now()) {
		return Ok()
	}
	h.logger.LogAttrs(ctx, slog.LevelInfo, "message",
		slog.String("subject", msg.Subject),
		slog.String("stream", msg.Stream),
		slog.String("consumer", msg.Consumer),
		slog.Uint64("seq", msg.Sequence),
		slog.Uint64("delivery", msg.Delivery),
		slog.String("msg_id", idempotencyKey(msg)),
		slog.Int("size", len(msg.Data)),
	)
	if h.logger.Enabled(ctx, slog.LevelDebug) {
		payload := msg.Data
		if len(payload) > logPayloadLimit {
			payload = payload[:logPayloadLimit]
		}
		h.logger.LogAttrs(ctx, slog.LevelDebug, "message payload",
			slog.Uint64("seq", msg.Sequence),
			slog.String("subject", msg.Subject),
			slog.String("payload", string(payload)),
			slog.Bool("truncated", len(payload) < len(msg.Data)),
		)
	}
	return Ok()
}

// idempotencyKey is msg.IdempotencyKey, or when a caller left it empty, what
// the worker would have put there: the Nats-Msg-Id header, else "STREAM:seq".
func idempotencyKey(msg *Message) string {
	if msg.IdempotencyKey != "" {
		return msg.IdempotencyKey
	}
	// nats.Header is case-sensitive; publishers do not always use the
	// canonical spelling.
	for name, values := range msg.Header {
		if strings.EqualFold(name, nats.MsgIdHdr) && len(values) > 0 && values[0] != "" {
			return values[0]
		}
	}
	return msg.Stream + ":" + strconv.FormatUint(msg.Sequence, 10)
}
