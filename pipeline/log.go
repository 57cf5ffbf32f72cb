package pipeline

import (
	"context"
	"log/slog"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
)

// logPayloadLimit is how much of a payload the log handler shows at debug
// level.
const logPayloadLimit = 256

// NewLogHandler returns the "log" handler: it logs each message's subject,
// stream, consumer, sequence, delivery attempt, idempotency key and size at
// info level, and succeeds. The payload never goes to the info log; at debug
// level its first 256 bytes are logged too. A nil logger means slog.Default().
func NewLogHandler(logger *slog.Logger) Handler {
	if logger == nil {
		logger = slog.Default()
	}
	return &logHandler{logger: logger}
}

type logHandler struct {
	logger *slog.Logger
}

func (h *logHandler) Handle(ctx context.Context, msg *Message) Result {
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
