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
