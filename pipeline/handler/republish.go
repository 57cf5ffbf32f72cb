package handler

import (
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/holdfast-io/holdfast/internal/subjects"
)

// MaxPublishSubject is the longest subject holdfast's workers publish to
// (a dead letter, a forwarded message): subjects.ControlLineBudget less
// room for the reply subject of a JetStream publish (_INBOX.<nuid>.<token>,
// under 64 bytes): 4000 bytes.
const MaxPublishSubject = subjects.ControlLineBudget - 64

// MaxStoredHeader is the largest header block a JetStream stream stores:
// nats-server refuses a message with a larger one (error 10097), at any
// max_payload. A message that fits it can exceed it once holdfast adds
// headers (a forwarded message's origin headers).
const MaxStoredHeader = 65535

// HeaderUnsendable carries a header of the original message whose name
// the NATS client refuses to publish (the server stores what a client
// sent raw, such as "X-Eq=Name"), as the quoted name, ": " and the value.
const HeaderUnsendable = "Holdfast-Original-Header"

// AddHeader adds k: v to h, or, when k is not a name the NATS client
// publishes (printable ASCII without any of "()/,:;<=>?@[\]{} and the
// double quote), keeps it in HeaderUnsendable: else the publish of the
// dead letter or forwarded message would fail every time.
func AddHeader(h nats.Header, k, v string) {
	if sendableHeaderName(k) {
		h.Add(k, v)
		return
	}
	h.Add(HeaderUnsendable, strconv.Quote(k)+": "+v)
}

func sendableHeaderName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; c < 33 || c > 126 || strings.IndexByte(`"()/,:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}
