package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestBenchSmallRunWritesJSONAndPlot(t *testing.T) {
	dir := t.TempDir()
	jsonPath, plotPath := filepath.Join(dir, "r.json"), filepath.Join(dir, "r.png")
	code, out, errs := runCLI(t, "", "bench", "--clients", "6", "--rounds", "3", "--request-tokens", "192",
		"--output-tokens", "16", "--l1-tokens", "1024", "--max-running", "4", "--json", jsonPath, "--plot", plotPath)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{"l1-only", "ceiling", "strata", "hit ratio"} {
		if !strings.Contains(out, want) {
			t.Fatalf("table lacks %q:\n%s", want, out)
		}
	}
	raw, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Runs []struct {
			Name      string `json:"name"`
			HitTokens struct {
				L1, L2, L3 int64
			} `json:"hit_tokens"`
			PromptTokens  int64   `json:"prompt_tokens"`
			HitRatio      float64 `json:"hit_ratio"`
			VerifiedPages int64   `json:"verified_pages"`
			CorruptPages  int64   `json:"corrupt_pages"`
			TTFT          struct {
				P50, P90 float64
			} `json:"ttft_ms"`
		} `json:"runs"`
	}
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Runs) != 3 || rep.Runs[2].Name != "strata" || rep.Runs[2].PromptTokens == 0 || rep.Runs[2].TTFT.P50 <= 0 {
		t.Fatalf("report %+v", rep)
	}
	if st, err := os.Stat(plotPath); err != nil || st.Size() == 0 {
		t.Fatalf("plot: %v", err)
	}
}

func TestBenchBadFlagsExitTwo(t *testing.T) {
	for _, args := range [][]string{
		{"bench", "--workload", "chat"},
		{"bench", "--model", "gpt-5"},
		{"bench", "--write-policy", "write_around"},
		{"bench", "--eviction", "fifo"},
		{"bench", "--l1-tokens", "0"},
		{"bench", "--l2-ratio", "0.5"},
		{"bench", "--clients", "-1"},
		{"bench", "--runs", "strata,nope"},
		{"bench", "--prefill-us-per-token", "-1"},
		{"bench", "--concurrent", "-1"},
		{"bench", "--edit-ratio", "1.5"},
		{"bench", "--regenerate-ratio", "0.6", "--edit-ratio", "0.6"},
		{"bench", "--branch-ratio", "-0.1"},
	} {
		code, _, errs := runCLI(t, "", args...)
		if code != 2 || strings.Count(errs, "\n") < 1 {
			t.Errorf("%v: exit %d, stderr %q", args, code, errs)
		}
	}
}

// --concurrent serves the runs from goroutines: the table says so, every page is
// verified, and the exit status is 0 only with no corrupt pages.
func TestBenchConcurrentFlag(t *testing.T) {
	dir := t.TempDir()
	jsonPath := filepath.Join(dir, "r.json")
	code, out, errs := runCLI(t, "", "bench", "--concurrent", "4", "--clients", "6", "--rounds", "3", "--request-tokens", "192",
		"--output-tokens", "16", "--branch-ratio", "0.5", "--l1-tokens", "1024", "--l3", "none", "--json", jsonPath)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{"concurrent: 4 goroutines", "strata: 4 goroutines, at most"} {
		if !strings.Contains(out, want) {
			t.Fatalf("table lacks %q:\n%s", want, out)
		}
	}
	raw, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Concurrent int `json:"concurrent"`
		Requests   int `json:"requests"`
		Runs       []struct {
			Name          string `json:"name"`
			VerifiedPages int64  `json:"verified_pages"`
			CorruptPages  int64  `json:"corrupt_pages"`
			Concurrency   int    `json:"concurrency"`
		} `json:"runs"`
	}
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatal(err)
	}
	// 18 rounds and about half of the 12 later ones branched.
	if rep.Concurrent != 4 || len(rep.Runs) != 3 || rep.Requests <= 18 {
		t.Fatalf("report %+v", rep)
	}
	for _, r := range rep.Runs {
		want := 4
		if r.Name == "ceiling" {
			want = 0 // the bound keeps the event loop
		}
		if r.Concurrency != want || r.CorruptPages != 0 {
			t.Fatalf("run %+v", r)
		}
	}
}
