package sim

import (
	"errors"
	"image/png"
	"os"
	"path/filepath"
	"testing"
)

func TestWritePlot(t *testing.T) {
	zero := &Report{Workload: "w", Model: "m", Runs: []RunReport{
		{Name: "l1-only"}, {Name: "strata", HitRatio: nan(), TTFTms: Quantiles{P50: nan()}},
	}}
	many := outputTestReport()
	for i := range 20 {
		many.Runs = append(many.Runs, RunReport{Name: "r" + string(rune('a'+i)), HitRatio: 1,
			HitTokens: TierTokens{L2: 10}, TTFTms: Quantiles{P50: 1, P90: 2}})
	}
	tests := []struct {
		name   string
		report *Report
	}{
		{"sample", outputTestReport()},
		{"one run", &Report{Workload: "w", Runs: outputTestReport().Runs[2:]}},
		{"zero and NaN values", zero},
		{"many runs", many},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "bench.png")
			if err := tt.report.WritePlot(path); err != nil {
				t.Fatal(err)
			}
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			img, err := png.Decode(f)
			if err != nil {
				t.Fatalf("decode %s: %v", path, err)
			}
			if b := img.Bounds(); b.Dx() != plotWidthPx || b.Dy() != plotHeightPx {
				t.Errorf("image is %dx%d, want %dx%d", b.Dx(), b.Dy(), plotWidthPx, plotHeightPx)
			}
			entries, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			if len(entries) != 1 {
				t.Errorf("directory holds %d entries, want only bench.png", len(entries))
			}
		})
	}
}

func TestWritePlotErrors(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "empty.png")
	if err := (&Report{Workload: "w"}).WritePlot(path); !errors.Is(err, ErrNoRuns) {
		t.Errorf("no runs: got %v, want ErrNoRuns", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("no runs left a file: %v", err)
	}
	var r *Report
	if err := r.WritePlot(path); err == nil {
		t.Error("nil report: got no error")
	}
	if err := outputTestReport().WritePlot(filepath.Join(dir, "missing", "x.png")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing directory: got %v, want ErrNotExist", err)
	}
}

// The hit ratio axis ends at 100% (it once ran to 125), and each TTFT quantile
// has an axis of its own, so p50 bars of a few milliseconds are not flattened
// beside p90 bars of hundreds.
func TestPlotAxes(t *testing.T) {
	r := &Report{Workload: "w", Runs: []RunReport{
		{Name: "ceiling", HitRatio: 1, HitTokens: TierTokens{L1: 10}, TTFTms: Quantiles{P50: 5.8, P90: 5.8}},
		{Name: "strata", HitRatio: 0.6, HitTokens: TierTokens{L1: 3, L2: 3}, TTFTms: Quantiles{P50: 16.6, P90: 880}},
	}}
	names := []string{"ceiling", "strata"}
	hits, err := r.hitRatioPlot(names, 10)
	if err != nil {
		t.Fatal(err)
	}
	if hits.Y.Min != 0 || hits.Y.Max != 100 {
		t.Errorf("hit ratio axis %v to %v, want 0 to 100", hits.Y.Min, hits.Y.Max)
	}
	p50, err := r.ttftPlot(names, 10, "TTFT p50", func(q Quantiles) float64 { return q.P50 }, 3)
	if err != nil {
		t.Fatal(err)
	}
	if p50.Y.Max > 20 {
		t.Errorf("p50 axis runs to %v ms: p50 bars of 5.8 and 16.6 ms would be slivers", p50.Y.Max)
	}
}
