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
	} {
		code, _, errs := runCLI(t, "", args...)
		if code != 2 || strings.Count(errs, "\n") < 1 {
			t.Errorf("%v: exit %d, stderr %q", args, code, errs)
		}
	}
}
