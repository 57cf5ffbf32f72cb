package config

import (
	"testing"
	"time"
)

// http.stall_timeout needs no relation to the backoff, a Retry-After,
// handler timeouts or ack_wait (the monitor accounts for those waits), so
// a short one next to long waits is accepted; below a second is refused.
func TestStallTimeoutBounds(t *testing.T) {
	long := "[http]\nstall_timeout = \"2s\"\n[streams.ORDERS]\nsubjects = [\"orders.*\"]\n[consumers.WORKER1]\nstream = \"ORDERS\"\nack_wait = \"10m\"\nbackoff = [\"1m\", \"10m\"]\nhandler = \"exec\"\n" +
		"[consumers.WORKER1.exec]\ncommand = [\"/bin/true\"]\ntimeout = \"30m\"\n"
	cfg := mustParse(t, long)
	if err := cfg.Validate(); err != nil {
		t.Fatalf("stall_timeout 2s with backoff 1m/10m and a 30m exec timeout: %v", err)
	}
	if cfg.HTTP.StallTimeout.Duration != 2*time.Second {
		t.Fatalf("stall_timeout = %s", cfg.HTTP.StallTimeout)
	}
	wantProblems(t, mustParse(t, "[http]\nstall_timeout = \"500ms\"\n").Validate(), "http.stall_timeout = 500ms: must be at least 1s")
}
