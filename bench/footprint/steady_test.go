package main

import "testing"

// TestAckedSeq: the stream sequence of an acknowledgement subject, in the
// server's short form and with a domain and an account hash, for the
// watched consumer only.
func TestAckedSeq(t *testing.T) {
	for _, c := range []struct {
		subject string
		seq     uint64
		ok      bool
	}{
		{"$JS.ACK.ORDERS.WORKER1.1.42.40.1733300000000000000.3", 42, true},
		{"$JS.ACK.hub.ACCHASH.ORDERS.WORKER1.2.7.9.1733300000000000000.0.tok", 7, true},
		{"$JS.ACK.ORDERS.OTHER.1.42.40.1733300000000000000.3", 0, false},
		{"$JS.ACK.EDGE.WORKER1.1.42.40.1733300000000000000.3", 0, false},
		{"$JS.ACK.ORDERS.WORKER1.1.x.40.1733300000000000000.3", 0, false},
		{"$JS.ACK.ORDERS.WORKER1", 0, false},
		{"orders.created", 0, false},
	} {
		seq, ok := ackedSeq(c.subject, "ORDERS", "WORKER1")
		if seq != c.seq || ok != c.ok {
			t.Errorf("ackedSeq(%q) = %d, %v; want %d, %v", c.subject, seq, ok, c.seq, c.ok)
		}
	}
}
