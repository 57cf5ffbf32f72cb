package pipeline

import "time"

// SetAckConfirmTimeout shortens how long w waits for the server to
// confirm a batch of acks, for tests whose acks are never confirmed.
func SetAckConfirmTimeout(w *Workers, d time.Duration) { w.ackConfirmTimeout = d }
