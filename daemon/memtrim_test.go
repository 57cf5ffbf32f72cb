package daemon

import (
	"runtime"
	"testing"
)

func TestMemTrim(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name string
		// allocations per tick, in MiB
		perTick []uint64
		// ticks (1-based) after which a trim is expected
		want []int
	}{
		{"idle from the start: nothing to give back", []uint64{0, 0, 0, 0, 0, 0, 0, 0}, nil},
		{"burst then quiet: one trim after five quiet ticks", []uint64{40, 40, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, []int{7}},
		{"small allocations count as quiet", []uint64{100, 0, 0, 0, 0, 0, 0}, []int{6}},
		{"quiet broken by more load: the count starts again", []uint64{100, 0, 0, 0, 1, 0, 0, 0, 0, 0}, []int{10}},
		{"still busy: no trim", []uint64{30, 30, 30, 30, 30, 30, 30, 30}, nil},
		{"a small burst is not worth a collection", []uint64{10, 0, 0, 0, 0, 0, 0, 0}, nil}, // < memTrimBurst
		{"a second burst trims again", []uint64{100, 0, 0, 0, 0, 0, 0, 0, 100, 0, 0, 0, 0, 0}, []int{6, 14}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var total uint64
			var trims []int
			tick := 0
			m := newMemTrim(func() uint64 { return total }, func() { trims = append(trims, tick) })
			for _, a := range tc.perTick {
				tick++
				total += a * mib
				m.tick()
			}
			if len(trims) != len(tc.want) {
				t.Fatalf("trims after ticks %v, want %v", trims, tc.want)
			}
			for i := range trims {
				if trims[i] != tc.want[i] {
					t.Fatalf("trims after ticks %v, want %v", trims, tc.want)
				}
			}
		})
	}
}

func TestMemTrimTrickle(t *testing.T) {
	// 256 KiB per tick is quiet, yet once memTrimBurst is reached it is
	// worth a trim.
	var total uint64
	trims := 0
	m := newMemTrim(func() uint64 { return total }, func() { trims++ })
	for range 2 * memTrimBurst / (256 << 10) {
		total += 256 << 10
		m.tick()
	}
	if trims != 2 {
		t.Fatalf("%d trims after 2×%d MiB allocated in quiet ticks, want 2", trims, memTrimBurst>>20)
	}
}

var sink []byte

func TestHeapAllocatedGrows(t *testing.T) {
	before := heapAllocated()
	if before == 0 {
		t.Fatal("runtime/metrics /gc/heap/allocs:bytes reads 0")
	}
	for range 64 {
		sink = make([]byte, 64<<10)
	}
	runtime.KeepAlive(sink)
	if after := heapAllocated(); after < before+4<<20 {
		t.Fatalf("allocated 4 MiB, counter went from %d to %d", before, after)
	}
}
