package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Every flag of `strata bench -h` says its default, the computed ones in words.
func TestBenchHelpShowsEveryDefault(t *testing.T) {
	code, help, _ := runCLI(t, "", "bench", "-h")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, help)
	}
	entries := regexp.MustCompile(`\n  -`).Split(help, -1)[1:]
	if len(entries) < 40 {
		t.Fatalf("%d flags in the help:\n%s", len(entries), help)
	}
	for _, e := range entries {
		if !strings.Contains(strings.ToLower(e), "default") {
			t.Errorf("flag -%s says no default", strings.TrimSpace(e))
		}
	}
	for _, want := range []string{
		"-load float", "(default 0.7)", "-clients int", "(default 48)", "-groups int", "(default 16)",
		"-document-tokens int", "(default 16384)", "sized from the trace", "default: scaled",
		"qwen3-32b (256 KiB of KV per token, prefill 250µs/token, decode step 30ms)",
		"strata bench matrix [flags]",
	} {
		if !strings.Contains(help, want) {
			t.Errorf("help lacks %q", want)
		}
	}
}

// A rate above what the engine serves is said in one line, with the flag that
// fixes it; the default load keeps up and says what it is.
func TestBenchSaysAnOverloadInOneLine(t *testing.T) {
	small := []string{"bench", "--clients", "24", "--rounds", "4", "--request-tokens", "256", "--output-tokens", "32",
		"--l3", "none", "--runs", "l1-only,ceiling"}
	code, out, errs := runCLI(t, "", append(small, "--rate", "1000")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var overload []string
	for line := range strings.Lines(out) {
		if strings.Contains(line, "OVERLOAD") {
			overload = append(overload, line)
		}
	}
	if len(overload) != 1 || !strings.HasPrefix(overload[0], "OVERLOAD: the queue grew in l1-only") ||
		!strings.Contains(overload[0], "--load 0.7") || !strings.Contains(overload[0], "--rate below") {
		t.Fatalf("overload lines %q in:\n%s", overload, out)
	}
	code, out, errs = runCLI(t, "", small...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if strings.Contains(out, "OVERLOAD") || !regexp.MustCompile(`arrivals +[0-9.]+ requests/s \(Poisson\): load 0.70 of the engine's capacity`).MatchString(out) ||
		!strings.Contains(out, "capacity       ") {
		t.Fatalf("default load:\n%s", out)
	}
	if code, _, errs := runCLI(t, "", append(small, "--rate", "10", "--load", "0.5")...); code != 2 || !strings.Contains(errs, "--rate and --load") {
		t.Fatalf("--rate with --load: exit %d, %s", code, errs)
	}
}

// A large model's trace is scaled to the budget, and the header says how; --full
// runs it unscaled.
func TestBenchScalesALargeModelsTrace(t *testing.T) {
	args := []string{"bench", "--model", "qwen3-32b", "--runs", "ceiling", "--l3", "none"}
	code, out, errs := runCLI(t, "", args...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if !regexp.MustCompile(`\nscaled +clients 48 → [0-9]+, so that the prompts' KV fits 12.0 GiB and the working set's 4.0 GiB \(unscaled: .*--full runs it\)\n`).MatchString(out) {
		t.Fatalf("no scaled line:\n%s", out)
	}
	code, out, errs = runCLI(t, "", append(args, "--full")...)
	if code != 0 {
		t.Fatalf("--full: exit %d: %s", code, errs)
	}
	if strings.Contains(out, "\nscaled ") || !strings.Contains(out, "requests       257\n") {
		t.Fatalf("--full:\n%s", out)
	}
}

// `strata bench matrix` runs each cell as a bench of its own and prints the
// README's Markdown table.
func TestBenchMatrixPrintsTheTable(t *testing.T) {
	t.Setenv("STRATA_TEST_AS_MAIN", "1") // the test binary stands in for strata in the runs
	jsonPath := filepath.Join(t.TempDir(), "m.json")
	code, out, errs := runCLI(t, "", "bench", "matrix", "--models", "qwen2.5-0.5b", "--workloads", "long-context", "--repeat", "1",
		"--json", jsonPath, "--", "--documents", "2", "--questions", "3", "--document-tokens", "1024", "--l3", "none")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[0], "| model | workload |") || !strings.HasPrefix(lines[2], "| qwen2.5-0.5b | long-context | 6 requests") ||
		!strings.Contains(lines[4], "`strata bench matrix --models qwen2.5-0.5b --repeat 1 --workloads long-context -- --documents 2") ||
		strings.Contains(lines[4], jsonPath) ||
		!strings.Contains(lines[4], "load average") {
		t.Fatalf("table:\n%s", out)
	}
	if !strings.Contains(errs, "qwen2.5-0.5b long-context: ") {
		t.Errorf("no progress line on stderr: %q", errs)
	}
	raw, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var cells []struct {
		Model       string  `json:"model"`
		Wall        []any   `json:"wall"`
		MaxRSSBytes []int64 `json:"max_rss_bytes"`
	}
	if err := json.Unmarshal(raw, &cells); err != nil {
		t.Fatal(err)
	}
	if len(cells) != 1 || len(cells[0].Wall) != 1 || cells[0].MaxRSSBytes[0] <= 0 {
		t.Fatalf("cells %+v", cells)
	}
	for _, args := range [][]string{
		{"bench", "matrix", "--repeat", "0"},
		{"bench", "matrix", "--models", "gpt-5"},
		{"bench", "matrix", "--workloads", "chat"},
		{"bench", "matrix", "--", "--model", "llama3-8b"},
		{"bench", "matrix", "--", "-model", "llama3-8b"},
		{"bench", "matrix", "--", "-workload=long-context"},
	} {
		if code, _, errs := runCLI(t, "", args...); code != 2 {
			t.Errorf("%v: exit %d, %s", args, code, errs)
		}
	}
}
