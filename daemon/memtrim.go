package daemon

import (
	"context"
	"log/slog"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// A burst of messages leaves garbage on the heap: holdfast runs the
// server, the clients and the workers in one process, and the heap grows to
// twice what was live during the burst (GOGC=100). An idle process
// allocates nothing, so no collection runs until the runtime's forced one
// (every 2 minutes) and the scavenger hands the pages back slowly: the
// heap and RSS stay high for as long as holdfast is idle.
// memTrim gives that memory back to the host once the burst is over.
const (
	memTrimTick = time.Second
	// memTrimQuiet is how many bytes per tick a quiet process may
	// allocate (pull requests, the monitor, metrics scrapes).
	memTrimQuiet = 512 << 10
	// memTrimQuietTicks quiet ticks in a row end a burst.
	memTrimQuietTicks = 5
	// memTrimBurst is how much must have been allocated since the last
	// trim for the next one to be worth a full collection (a few
	// milliseconds of CPU for holdfast's heap); starting up on a store
	// that holds data allocates more than this, a burst of a few thousand
	// messages too.
	memTrimBurst = 16 << 20
)

// memTrim decides, one tick at a time, when to return memory: after at
// least burst bytes were allocated since the last trim and the process has
// then been quiet for quietTicks ticks.
type memTrim struct {
	allocated  func() uint64 // cumulative bytes allocated
	trim       func()
	quiet      uint64
	quietTicks int
	burst      uint64

	last      uint64
	sinceTrim uint64
	quietFor  int
}

func newMemTrim(allocated func() uint64, trim func()) *memTrim {
	return &memTrim{allocated: allocated, trim: trim, quiet: memTrimQuiet, quietTicks: memTrimQuietTicks,
		burst: memTrimBurst, last: allocated()}
}

// tick reads the allocations since the last tick and trims when a burst
// has ended; it reports whether it trimmed.
func (m *memTrim) tick() bool {
	now := m.allocated()
	delta := now - m.last
	m.last = now
	m.sinceTrim += delta
	if delta > m.quiet {
		m.quietFor = 0
		return false
	}
	m.quietFor++
	if m.quietFor < m.quietTicks || m.sinceTrim < m.burst {
		return false
	}
	m.trim()
	m.sinceTrim, m.quietFor = 0, 0
	m.last = m.allocated()
	return true
}

// heapAllocated is the bytes the process allocated on the heap since it
// started (runtime/metrics, no stop-the-world).
func heapAllocated() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}

// trimMemoryWhenIdle returns memory to the host after each burst until ctx
// ends.
func trimMemoryWhenIdle(ctx context.Context, log *slog.Logger) {
	m := newMemTrim(heapAllocated, debug.FreeOSMemory)
	t := time.NewTicker(memTrimTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if m.tick() {
				log.Debug("burst over: unused heap returned to the system")
			}
		}
	}
}
