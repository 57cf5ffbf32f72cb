package main

import (
	"fmt"
	"slices"
	"strings"
)

// figures collects, figure by figure, stock's and holdfast's result of each
// of -runs runs (the two measured alternately within a run), so that a
// ratio is reported as its median and its range over the runs: on a
// shared 2-CPU machine one run's ratio says little.
type figures struct {
	order []string
	by    map[string]*pairs
}

// pairs are one figure's results, run by run.
type pairs struct{ stock, hold []float64 }

func newFigures() *figures { return &figures{by: map[string]*pairs{}} }

// add records one run's stock and holdfast result of the figure name.
func (f *figures) add(name string, stock, hold float64) {
	p, ok := f.by[name]
	if !ok {
		p = &pairs{}
		f.by[name] = p
		f.order = append(f.order, name)
	}
	p.stock = append(p.stock, stock)
	p.hold = append(p.hold, hold)
}

// get returns the figure name's results (empty when never added).
func (f *figures) get(name string) pairs {
	if p, ok := f.by[name]; ok {
		return *p
	}
	return pairs{}
}

// median of vs (0 for none; the mean of the two middle ones for an even
// count).
func median(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// ratios returns hold/stock of each run in which both were measured.
func (p pairs) ratios() []float64 {
	var rs []float64
	for i := range p.stock {
		if i < len(p.hold) && p.stock[i] > 0 && p.hold[i] > 0 {
			rs = append(rs, p.hold[i]/p.stock[i])
		}
	}
	return rs
}

// ratio is the figure's holdfast/stock: the median of the runs' ratios
// and, for more than one run, their range and every run's value in order,
// e.g. "0.93× (0.80–1.10×: 0.93, 0.80, 1.10)".
func (p pairs) ratio() string {
	rs := p.ratios()
	switch len(rs) {
	case 0:
		return "–"
	case 1:
		return fmt.Sprintf("%.2f×", rs[0])
	}
	each := make([]string, len(rs))
	for i, r := range rs {
		each[i] = fmt.Sprintf("%.2f", r)
	}
	return fmt.Sprintf("%.2f× (%.2f–%.2f×: %s)", median(rs), slices.Min(rs), slices.Max(rs), strings.Join(each, ", "))
}

// rate is a median rate over the runs, formatted like num.
func rate(vs []float64) string { return num(median(vs)) }
