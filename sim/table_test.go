package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// outputTestReport is a report with the three standard runs: strata has L3 with a
// disabled draft pool, and the ceiling run served corrupt pages.
func outputTestReport() *Report {
	ms := func(n int) Duration { return Duration(time.Duration(n) * time.Millisecond) }
	return &Report{
		Workload:             "multiturn",
		Seed:                 42,
		Model:                "llama-3.1-8b",
		Draft:                "eagle3-8b",
		PageSize:             64,
		L1Tokens:             100_000,
		L2Tokens:             400_000,
		L3:                   "file",
		Requests:             1000,
		PromptTokens:         3_000_000,
		DistinctPrefixTokens: 800_000,
		Elapsed:              ms(12_345),
		Runs: []RunReport{
			{
				Name:          "l1-only",
				Description:   "device pool only",
				HitTokens:     TierTokens{L1: 1_050_000},
				PromptTokens:  3_000_000,
				HitRatio:      0.35,
				VerifiedPages: 16_000,
				TTFTms:        Quantiles{P50: 120.5, P90: 410.25, P99: 800, Mean: 180},
				Failed:        2,
				Elapsed:       ms(3_000),
			},
			{
				Name:          "ceiling",
				Description:   "unbounded device pool",
				HitTokens:     TierTokens{L1: 2_229_000},
				PromptTokens:  3_000_000,
				HitRatio:      0.743,
				VerifiedPages: 34_000,
				CorruptPages:  3,
				TTFTms:        Quantiles{P50: 40, P90: 90},
				Elapsed:       ms(2_500),
			},
			{
				Name:                "strata",
				Description:         "L1 + L2 + L3",
				HitTokens:           TierTokens{L1: 1_050_000, L2: 800_000, L3: 286_000},
				PromptTokens:        3_000_000,
				HitRatio:            0.712,
				VerifiedPages:       33_000,
				DraftRecomputePages: 1_234,
				TTFTms:              Quantiles{P50: 45.5, P90: 101},
				LoadBack:            Traffic{Pages: 12_500, Bytes: 12 << 30, Elapsed: ms(1_000)},
				Backup:              Traffic{Pages: 20_000, Bytes: 20 << 30, Elapsed: ms(2_000)},
				L3: &L3Report{
					Backend:      "file",
					BytesRead:    1288490189, // 1.2 GiB
					BytesWritten: 5 << 30,
					Prefetch:     PrefetchOutcomes{Completed: 900, TimedOut: 12, BelowThreshold: 40, Canceled: 3},
					Faults:       map[string]int64{"timeout": 4, "io": 1, "corrupt": 2},
					Pools: []PoolL3Status{
						{Pool: "kv", Enabled: true},
						{Pool: "draft", Reason: "layer_first layout; use page_first"},
					},
				},
				Elapsed: ms(4_567),
			},
		},
	}
}

func TestWriteTable(t *testing.T) {
	r := outputTestReport()
	var buf bytes.Buffer
	if err := r.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	t.Logf("\n%s", out)
	for _, want := range []string{
		"multiturn (seed 42)",
		"llama-3.1-8b, draft eagle3-8b",
		"64 tokens",
		"100,000 tokens (12.5% of working set)",
		"400,000 tokens (50.0% of working set)",
		"800,000 tokens",
		"3,000,000",
		"35.0%", "74.3%", "71.2%",
		"45.5", "101.0", "410.2",
		"12.88", // load-back GB/s: 12 GiB in 1 s
		"4.567s",
		"CORRUPT PAGES: ceiling served 3 pages whose bytes did not match",
		"strata: L3 file read 1.2 GiB, wrote 5.0 GiB",
		"prefetch 900 completed, 12 timed out, 40 below threshold, 3 canceled",
		"faults corrupt 2, io 1, timeout 4",
		"pools kv: enabled, draft: disabled (layer_first layout; use page_first)",
		"l1-only: 2 requests failed",
		"strata: 1,234 hit pages recomputed their draft KV",
		"strata hit ratio 71.2% vs l1-only 35.0% (+36.2 points); gap to ceiling 3.1 points",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q", want)
		}
	}
	for i, line := range strings.Split(out, "\n") {
		if strings.TrimRight(line, " ") != line {
			t.Errorf("line %d ends in blanks: %q", i+1, line)
		}
	}

	var again bytes.Buffer
	if err := r.WriteTable(&again); err != nil {
		t.Fatal(err)
	}
	if again.String() != out {
		t.Errorf("two renders differ:\n%s\n---\n%s", out, again.String())
	}
}

func TestWriteTableRunColumnsAlign(t *testing.T) {
	var buf bytes.Buffer
	if err := outputTestReport().WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	// The run table's rows are the lines from the header row to the first blank line;
	// right-aligned columns end every row at the same column.
	lines := strings.Split(buf.String(), "\n")
	start := -1
	for i, l := range lines {
		if strings.HasPrefix(l, "run ") {
			start = i
			break
		}
	}
	if start < 0 {
		t.Fatal("no run table header")
	}
	width := len(lines[start])
	for _, l := range lines[start+1 : start+4] {
		if len(l) != width {
			t.Errorf("row %q is %d wide, header %d", l, len(l), width)
		}
	}
}

func TestWriteTableEdgeCases(t *testing.T) {
	tests := []struct {
		name    string
		report  *Report
		want    []string
		notWant []string
	}{
		{
			name:   "no runs",
			report: &Report{Workload: "w"},
			want:   []string{"no runs"},
		},
		{
			name: "strata alone",
			report: &Report{Workload: "w", Runs: []RunReport{
				{Name: "strata", HitRatio: 0.5},
			}},
			notWant: []string{"hit ratio 50.0%", "CORRUPT", "strata: L3"},
		},
		{
			name: "strata without ceiling",
			report: &Report{Workload: "w", Runs: []RunReport{
				{Name: "l1-only", HitRatio: 0.25},
				{Name: "strata", HitRatio: 0.5},
			}},
			want:    []string{"strata hit ratio 50.0% vs l1-only 25.0% (+25.0 points)\n"},
			notWant: []string{"ceiling"},
		},
		{
			name:    "unknown working set",
			report:  &Report{Workload: "w", L1Tokens: 10, Runs: []RunReport{{Name: "x"}}},
			want:    []string{"10 tokens\n", "none\n"},
			notWant: []string{"of working set", "NaN", "Inf"},
		},
		{
			name: "concurrent replay",
			report: &Report{Workload: "w", Concurrent: 8, Runs: []RunReport{
				{Name: "ceiling"},
				{Name: "strata", Concurrency: 8, MaxInFlight: 7},
			}},
			want:    []string{"concurrent: 8 goroutines", "hits vary run to run", "strata: 8 goroutines, at most 7 requests in flight at once\n"},
			notWant: []string{"ceiling: 0 goroutines"},
		},
		{
			name:    "event loop",
			report:  &Report{Workload: "w", Runs: []RunReport{{Name: "strata"}}},
			notWant: []string{"goroutines", "replay"},
		},
		{
			name: "L3 with no faults and no pools",
			report: &Report{Workload: "w", Runs: []RunReport{
				{Name: "strata", L3: &L3Report{Backend: "redis"}},
			}},
			want: []string{"strata: L3 redis read 0 B, wrote 0 B", "faults none\n"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := tt.report.WriteTable(&buf); err != nil {
				t.Fatal(err)
			}
			out := buf.String()
			if strings.Contains(out, " \n") {
				t.Errorf("a line ends in blanks:\n%s", out)
			}
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("lacks %q in\n%s", w, out)
				}
			}
			for _, w := range tt.notWant {
				if strings.Contains(out, w) {
					t.Errorf("has %q in\n%s", w, out)
				}
			}
		})
	}
}

type failingWriter struct{}

var errWriterBroken = errors.New("writer broken")

func (failingWriter) Write([]byte) (int, error) { return 0, errWriterBroken }

func TestWriteTableErrors(t *testing.T) {
	if err := outputTestReport().WriteTable(failingWriter{}); !errors.Is(err, errWriterBroken) {
		t.Errorf("failing writer: got %v, want %v", err, errWriterBroken)
	}
	var r *Report
	if err := r.WriteTable(&bytes.Buffer{}); err == nil {
		t.Error("nil report: got no error")
	}
}

func TestFormatBytes(t *testing.T) {
	tests := []struct {
		n    int64
		want string
	}{
		{0, "0 B"},
		{1023, "1023 B"},
		{1024, "1.0 KiB"},
		{1536, "1.5 KiB"},
		{1288490189, "1.2 GiB"},
		{5 << 40, "5.0 TiB"},
		{1<<63 - 1, "8.0 EiB"},
		{-2048, "-2.0 KiB"},
	}
	for _, tt := range tests {
		if got := formatBytes(tt.n); got != tt.want {
			t.Errorf("formatBytes(%d) = %q, want %q", tt.n, got, tt.want)
		}
	}
}

func TestGroupDigits(t *testing.T) {
	tests := []struct {
		n    int64
		want string
	}{
		{0, "0"}, {999, "999"}, {1000, "1,000"}, {123456, "123,456"},
		{1234567, "1,234,567"}, {-1234, "-1,234"}, {-100, "-100"},
		{-9223372036854775808, "-9,223,372,036,854,775,808"},
	}
	for _, tt := range tests {
		if got := groupDigits(tt.n); got != tt.want {
			t.Errorf("groupDigits(%d) = %q, want %q", tt.n, got, tt.want)
		}
	}
}

func TestWriteJSON(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "report.json")
	// An existing file is replaced whole.
	if err := os.WriteFile(path, []byte("old contents that are longer than nothing"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := outputTestReport().WriteJSON(path); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatalf("parse %s: %v\n%s", path, err, data)
	}
	if got["workload"] != "multiturn" || got["page_size"] != 64.0 || got["elapsed"] != 12.345 {
		t.Errorf("header fields: workload %v, page_size %v, elapsed %v", got["workload"], got["page_size"], got["elapsed"])
	}
	runs, ok := got["runs"].([]any)
	if !ok || len(runs) != 3 {
		t.Fatalf("runs = %v", got["runs"])
	}
	run0 := runs[0].(map[string]any)
	if run0["name"] != "l1-only" || run0["hit_ratio"] != 0.35 || run0["prompt_tokens"] != 3e6 {
		t.Errorf("runs[0] = %v", run0)
	}
	if l1 := run0["hit_tokens"].(map[string]any)["l1"]; l1 != 1.05e6 {
		t.Errorf("runs[0].hit_tokens.l1 = %v, want 1050000", l1)
	}
	if p90 := run0["ttft_ms"].(map[string]any)["p90"]; p90 != 410.25 {
		t.Errorf("runs[0].ttft_ms.p90 = %v, want 410.25", p90)
	}
	if c := runs[1].(map[string]any)["corrupt_pages"]; c != 3.0 {
		t.Errorf("runs[1].corrupt_pages = %v, want 3", c)
	}
	l3 := runs[2].(map[string]any)["l3"].(map[string]any)
	if l3["bytes_written"] != float64(5<<30) || l3["faults"].(map[string]any)["io"] != 1.0 {
		t.Errorf("runs[2].l3 = %v", l3)
	}
	if _, ok := run0["l3"]; ok {
		t.Error("runs[0] without L3 has an l3 field")
	}

	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if perm := info.Mode().Perm(); perm != 0o644 {
		t.Errorf("mode %v, want 0644", perm)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("directory holds %v, want only report.json", names)
	}
}

func TestWriteJSONErrors(t *testing.T) {
	dir := t.TempDir()
	if err := outputTestReport().WriteJSON(filepath.Join(dir, "missing", "report.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing directory: got %v, want ErrNotExist", err)
	}
	// A value JSON cannot hold fails before anything is written.
	bad := outputTestReport()
	bad.Runs[0].HitRatio = nan()
	path := filepath.Join(dir, "bad.json")
	if err := bad.WriteJSON(path); err == nil {
		t.Error("NaN hit ratio: got no error")
	}
	// Renaming over a directory fails; the temporary file must not stay behind.
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sub, "x"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := outputTestReport().WriteJSON(sub); err == nil {
		t.Error("path is a non-empty directory: got no error")
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != "sub" {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("directory holds %v, want only sub", names)
	}
	var r *Report
	if err := r.WriteJSON(filepath.Join(dir, "nil.json")); err == nil {
		t.Error("nil report: got no error")
	}
}

func nan() float64 {
	zero := 0.0
	return zero / zero
}

// L3 bytes read beside few L3 hits are explained: prefetched tokens that a later
// match found in L2 count there.
func TestTableExplainsPrefetchedTokensThatAreNotL3Hits(t *testing.T) {
	r := outputTestReport()
	r.Runs = r.Runs[2:]
	r.Runs[0].L3 = &L3Report{Backend: "node", BytesRead: 3 << 30, PrefetchedTokens: 26_000}
	r.Runs[0].HitTokens.L3 = 0
	var buf strings.Builder
	if err := r.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "prefetches fetched 26,000 tokens from L3 into L2; 0 were L3 hits") {
		t.Fatalf("no explanation of L3 reads without L3 hits:\n%s", buf.String())
	}
}
