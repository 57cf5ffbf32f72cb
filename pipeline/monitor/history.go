package monitor

import (
	"sync"
	"time"
)

// Sample is one point of a consumer's recent history: its backlog
// (messages not delivered yet plus those out for processing) and how many
// messages its workers had acknowledged, at Time.
type Sample struct {
	Time    time.Time `json:"t"`
	Backlog uint64    `json:"backlog"`
	Acked   uint64    `json:"acked"`
}

// How much history the Monitor keeps: a sample every HistoryEvery for
// HistoryLen samples (15 minutes), taken from the report each check or
// confirmation already made, so that keeping it reads nothing.
const (
	HistoryEvery = 10 * time.Second
	HistoryLen   = 90
)

// history holds each consumer's last HistoryLen samples.
type history struct {
	mu   sync.Mutex
	last time.Time
	by   map[string][]Sample // "STREAM/CONSUMER"
}

func (h *history) add(r *Report) {
	if r == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.last.IsZero() && r.Time.Sub(h.last) < HistoryEvery {
		return
	}
	h.last = r.Time
	if h.by == nil {
		h.by = map[string][]Sample{}
	}
	for _, c := range r.Consumers {
		key := c.Stream + "/" + c.Name
		s := append(h.by[key], Sample{Time: r.Time, Backlog: c.Pending + c.AckPending, Acked: c.Workers.Acked})
		if len(s) > HistoryLen {
			s = append(s[:0:0], s[len(s)-HistoryLen:]...)
		}
		h.by[key] = s
	}
}

// History returns the recent samples of consumer name of stream, oldest
// first (a copy).
func (m *Monitor) History(stream, name string) []Sample {
	m.hist.mu.Lock()
	defer m.hist.mu.Unlock()
	return append([]Sample(nil), m.hist.by[stream+"/"+name]...)
}
