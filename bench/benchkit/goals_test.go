package benchkit

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteGoalsVerdicts(t *testing.T) {
	goals := []Goal{
		{Figure: "drain", Against: "stock", AtLeast: true, Target: 1, Values: []float64{1.1, 0.9, 1.2}},
		{Figure: "bytes", Against: "today", Target: 0.125, Values: []float64{0.2, 0.21}},
		{Figure: "idle writes", Against: "–", Unit: "B", Values: []float64{0, 0}},
		{Figure: "cpu", Against: "1/4", Target: 0.43, Unit: "ms", Values: []float64{0.4}},
		{Figure: "lone", Against: "stock", AtLeast: true, Target: 0.9},
	}
	var b bytes.Buffer
	WriteGoals(&b, goals)
	for _, want := range []string{
		"| drain | stock | ≥ 1× | 1.10× (0.90×–1.20×) | in 2 of 3 runs |",
		"| bytes | today | ≤ 0.125× | 0.21× (0.20×–0.21×) | no |",
		"| idle writes | – | ≤ 0 B | 0 B (0 B–0 B) | **yes** |",
		"| cpu | 1/4 | ≤ 0.43 ms | 0.40 ms (0.40 ms–0.40 ms) | **yes** |",
		"| lone | stock | ≥ 0.9× | not measured | – |",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("no line %q in\n%s", want, b.String())
		}
	}
}

func TestGoalsSaveLoad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "goals.json")
	in := []Goal{{Figure: "lone", Against: "stock", AtLeast: true, Target: 0.9, Values: []float64{0.85, 0.93}}}
	if err := SaveGoals(path, in); err != nil {
		t.Fatal(err)
	}
	out, err := LoadGoals(path)
	if err != nil || len(out) != 1 || out[0].Figure != "lone" || !out[0].AtLeast || len(out[0].Values) != 2 {
		t.Fatalf("LoadGoals = %+v, %v; want what was saved", out, err)
	}
}
