package benchkit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Goal is one target a benchmark checks: a figure measured run by run,
// as a ratio to what it is measured against in the same run (or, with a
// Unit, as an absolute value), and the bound it should keep.
type Goal struct {
	Figure  string `json:"figure"`
	Against string `json:"against"`
	// AtLeast: each run's value should reach Target; otherwise it should
	// stay at or under it.
	AtLeast bool    `json:"at_least"`
	Target  float64 `json:"target"`
	// Unit is printed after absolute values ("ms", "B"); empty for a
	// ratio, printed with ×.
	Unit   string    `json:"unit,omitempty"`
	Values []float64 `json:"values"`
}

// met counts the runs whose value keeps the goal's bound.
func (g Goal) met() int {
	n := 0
	for _, v := range g.Values {
		if (g.AtLeast && v >= g.Target) || (!g.AtLeast && v <= g.Target) {
			n++
		}
	}
	return n
}

func (g Goal) format(v float64) string {
	switch g.Unit {
	case "":
		return fmt.Sprintf("%.2f×", v)
	case "B":
		return fmt.Sprintf("%.0f B", v)
	default:
		return fmt.Sprintf("%.2f %s", v, g.Unit)
	}
}

// WriteGoals writes goals as a markdown table: each goal's target, its
// median and range over the runs, and in how many runs it was met.
func WriteGoals(w *bytes.Buffer, goals []Goal) {
	fmt.Fprintln(w, "| goal | against | target | median (min–max) over the runs | met |")
	fmt.Fprintln(w, "| --- | --- | ---: | ---: | --- |")
	for _, g := range goals {
		bound := "≤ "
		if g.AtLeast {
			bound = "≥ "
		}
		measured, verdict := "not measured", "–"
		if len(g.Values) > 0 {
			s := slices.Clone(g.Values)
			slices.Sort(s)
			med := s[len(s)/2]
			if len(s)%2 == 0 {
				med = (s[len(s)/2-1] + s[len(s)/2]) / 2
			}
			measured = fmt.Sprintf("%s (%s–%s)", g.format(med), g.format(s[0]), g.format(s[len(s)-1]))
			switch n := g.met(); n {
			case len(s):
				verdict = "**yes**"
			case 0:
				verdict = "no"
			default:
				verdict = fmt.Sprintf("in %d of %d runs", n, len(s))
			}
		}
		target := strconv.FormatFloat(g.Target, 'f', -1, 64)
		if g.Unit == "" {
			target += "×"
		} else {
			target += " " + g.Unit
		}
		fmt.Fprintf(w, "| %s | %s | %s%s | %s | %s |\n", g.Figure, g.Against, bound, target, measured, verdict)
	}
}

// SaveGoals writes goals to path as JSON, for another benchmark's report
// (bench/compare's throughput goals in bench/footprint's).
func SaveGoals(path string, goals []Goal) error {
	b, err := json.MarshalIndent(goals, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// LoadGoals reads goals SaveGoals wrote.
func LoadGoals(path string) ([]Goal, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var goals []Goal
	if err := json.Unmarshal(b, &goals); err != nil {
		return nil, fmt.Errorf("%s: %w (written by bench/compare -goals?)", path, err)
	}
	for _, g := range goals {
		if strings.TrimSpace(g.Figure) == "" {
			return nil, fmt.Errorf("%s: a goal without a figure (written by bench/compare -goals?)", path)
		}
	}
	return goals, nil
}
