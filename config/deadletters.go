package config

import (
	"strconv"
	"strings"
)

// ReplayClaimPrefix begins the name of the consumer that claims a dead
// letter on its dead-letter stream while a replay of it runs in a cluster
// (one node runs the handler; the consumer is deleted when the replay
// ends). A stream restored from a backup taken meanwhile holds it too,
// with no replay running.
const ReplayClaimPrefix = "holdfast-claim-"

// ReplayClaim is the name of the consumer that claims dead letter seq.
func ReplayClaim(seq uint64) string { return ReplayClaimPrefix + strconv.FormatUint(seq, 10) }

// IsReplayClaim reports whether a consumer's name is a replay claim's.
func IsReplayClaim(name string) bool { return strings.HasPrefix(name, ReplayClaimPrefix) }
