package main

import "testing"

func TestFiguresRatio(t *testing.T) {
	f := newFigures()
	f.add("drain", 100, 80)
	f.add("publish", 10, 20)
	f.add("drain", 100, 120)
	f.add("drain", 200, 190)
	f.add("drain", 0, 50) // stock not measured in this run: no ratio
	if got := f.order; len(got) != 2 || got[0] != "drain" || got[1] != "publish" {
		t.Fatalf("order = %q, want [drain publish]", got)
	}
	d := f.get("drain")
	if got, want := d.ratio(), "0.95× (0.80–1.20×: 0.80, 1.20, 0.95)"; got != want {
		t.Errorf("drain ratio = %q, want %q", got, want)
	}
	if got, want := rate(d.stock), "100"; got != want {
		t.Errorf("drain stock median = %q, want %q", got, want)
	}
	if got, want := rate(d.hold), "100"; got != want { // median of 50, 80, 120, 190
		t.Errorf("drain holdfast median = %q, want %q", got, want)
	}
	if got, want := f.get("publish").ratio(), "2.00×"; got != want {
		t.Errorf("one run's ratio = %q, want %q", got, want)
	}
	if got := f.get("none").ratio(); got != "–" {
		t.Errorf("ratio of a figure never measured = %q, want –", got)
	}
}
