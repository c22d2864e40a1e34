package storagebench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stratakv/strata/storage"
)

// tinyConfig is a run that takes well under a second: 2 batches of 8 toy pages.
func tinyConfig(t *testing.T) Config {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Dir = t.TempDir()
	cfg.Shape = ShapeSmall
	cfg.Batches = 2
	cfg.PagesPerBatch = 8
	cfg.ExistsCalls = 20
	return cfg
}

func checkReport(t *testing.T, rep *Report, cfg Config) {
	t.Helper()
	for name, v := range map[string]float64{
		"put_gbps": rep.PutGBps, "get_gbps": rep.GetGBps,
		"peer_put_gbps": rep.PeerPutGBps, "peer_get_gbps": rep.PeerGetGBps,
		"put_ratio": rep.PutRatio, "get_ratio": rep.GetRatio,
		"stream_put_gbps": rep.StreamPutGBps, "stream_get_gbps": rep.StreamGetGBps,
		"exists_p50_us": rep.ExistsP50us, "exists_p99_us": rep.ExistsP99us,
	} {
		if !(v > 0) {
			t.Errorf("%s = %v, want positive", name, v)
		}
	}
	if rep.MismatchedPages != 0 {
		t.Errorf("%d mismatched pages", rep.MismatchedPages)
	}
	if rep.Batches != cfg.Batches || rep.PagesPerBatch != cfg.PagesPerBatch || len(rep.PutBatchGBps) != cfg.Batches || len(rep.GetBatchGBps) != cfg.Batches {
		t.Errorf("report shape %d x %d (%d/%d per-batch figures), want %d x %d",
			rep.Batches, rep.PagesPerBatch, len(rep.PutBatchGBps), len(rep.GetBatchGBps), cfg.Batches, cfg.PagesPerBatch)
	}
	for name, s := range map[string]*RatioSpread{"put_ratio_batches": rep.PutRatioBatches, "get_ratio_batches": rep.GetRatioBatches} {
		switch {
		case s == nil:
			t.Errorf("%s missing", name)
		case s.Batches != cfg.Batches || !(s.Min <= s.Median && s.Median <= s.Max):
			t.Errorf("%s = %+v, want %d batches and min <= median <= max", name, s, cfg.Batches)
		}
	}
	if rep.PutRatioBatches != nil && rep.PutRatio != rep.PutRatioBatches.Median {
		t.Errorf("put_ratio %v is not the batches' median %v", rep.PutRatio, rep.PutRatioBatches.Median)
	}
	shape, _ := ShapeByName(cfg.Shape)
	if rep.PageBytes != shape.PageBytes() || rep.Bytes != int64(cfg.Batches*cfg.PagesPerBatch)*shape.PageBytes() {
		t.Errorf("page bytes %d, bytes %d", rep.PageBytes, rep.Bytes)
	}
	if rep.ExistsP99us < rep.ExistsP50us {
		t.Errorf("exists p99 %v below p50 %v", rep.ExistsP99us, rep.ExistsP50us)
	}
	var table bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	t.Logf("table:\n%s", table.String())
	for _, want := range []string{"backend", "put", "get", "peer GB/s", "mismatched pages: 0", rep.Peer} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	path := filepath.Join(t.TempDir(), "tiers.json")
	if err := rep.WriteJSON(path); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var fields map[string]any
	if err := json.Unmarshal(data, &fields); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"backend", "page_bytes", "pages_per_batch", "batches", "put_gbps", "get_gbps", "peer",
		"peer_put_gbps", "peer_get_gbps", "put_ratio", "get_ratio", "exists_p50_us", "exists_p99_us", "mismatched_pages", "notes"} {
		if _, ok := fields[k]; !ok {
			t.Errorf("JSON lacks %q", k)
		}
	}
}

// scratchLeft reports whether a run left its scratch directory under dir.
func scratchLeft(t *testing.T, dir string) []string {
	t.Helper()
	left, err := filepath.Glob(filepath.Join(dir, "strata-bench-tiers-*"))
	if err != nil {
		t.Fatal(err)
	}
	return left
}

func TestRunEndToEnd(t *testing.T) {
	for _, tc := range []struct {
		name   string
		target func() TargetFunc
	}{
		{"mem", func() TargetFunc { return memTarget(newMemBackend()) }},
		{"file", func() TargetFunc { return nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tinyConfig(t)
			cfg.NewTarget = tc.target()
			rep, err := Run(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			checkReport(t, rep, cfg)
			if tc.name == "file" && (rep.Backend != BackendFile || !strings.Contains(rep.BackendSettings, "I/O workers")) {
				t.Errorf("backend %q (%s)", rep.Backend, rep.BackendSettings)
			}
			if left := scratchLeft(t, cfg.Dir); len(left) != 0 {
				t.Errorf("scratch left behind: %v", left)
			}
		})
	}
}

// TestRunFileBuffered takes the file target's path for filesystems that refuse
// O_DIRECT (simulated): buffered store and peers, page cache evicted before the gets.
func TestRunFileBuffered(t *testing.T) {
	old := probeDirectIO
	probeDirectIO = func(string) (bool, error) { return false, nil }
	t.Cleanup(func() { probeDirectIO = old })
	cfg := tinyConfig(t)
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkReport(t, rep, cfg)
	notes := strings.Join(rep.Notes, "\n")
	if !strings.HasPrefix(rep.BackendSettings, "buffered") || !strings.HasPrefix(rep.Peer, "buffered") || !strings.Contains(notes, "refuses O_DIRECT") {
		t.Errorf("settings %q, peer %q, notes %q", rep.BackendSettings, rep.Peer, notes)
	}
}

func TestRunReusesHostPagesWhenMemoryIsShort(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.Batches = 3
	shape, _ := ShapeByName(cfg.Shape)
	batch := int64(cfg.PagesPerBatch) * shape.PageBytes()
	// Enough for the allocator's 1 GiB reserve and two batches, not for four.
	cfg.Available = func() (int64, error) { return 1<<30 + 3*batch, nil }
	cfg.NewTarget = memTarget(newMemBackend())
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkReport(t, rep, cfg)
	if rep.HostPoolBytes != 2*batch {
		t.Errorf("host pool of %d bytes, want one batch of sources and one of destinations (%d)", rep.HostPoolBytes, 2*batch)
	}
	if !strings.Contains(strings.Join(rep.Notes, "\n"), "refilled") {
		t.Errorf("notes do not say pages were reused: %q", rep.Notes)
	}
}

func TestRunCountsMismatchedPages(t *testing.T) {
	cfg := tinyConfig(t)
	m := newMemBackend()
	m.corrupt, m.corruptPage = true, 3
	cfg.NewTarget = memTarget(m)
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.MismatchedPages != int64(cfg.Batches) {
		t.Fatalf("%d mismatched pages, want one per batch (%d)", rep.MismatchedPages, cfg.Batches)
	}
	var table bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "MISMATCHED PAGES: 2") {
		t.Errorf("table does not call out the mismatches:\n%s", table.String())
	}
}

func TestRunFailsOnPutFaults(t *testing.T) {
	cfg := tinyConfig(t)
	m := newMemBackend()
	m.putErr = storage.ErrNoSpace
	cfg.NewTarget = memTarget(m)
	_, err := Run(context.Background(), cfg)
	if !errors.Is(err, storage.ErrNoSpace) || !strings.Contains(err.Error(), "8 of 8 pages failed") {
		t.Fatalf("Run = %v, want the put fault", err)
	}
	if left := scratchLeft(t, cfg.Dir); len(left) != 0 {
		t.Errorf("a failed run left its scratch directory: %v", left)
	}
}

func TestRunKeepsScratchWhenAsked(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.Keep = true
	cfg.NewTarget = memTarget(newMemBackend())
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	left := scratchLeft(t, cfg.Dir)
	if len(left) != 1 || rep.Dir != left[0] {
		t.Fatalf("kept %v, report says %q", left, rep.Dir)
	}
}

func TestRunHonoursCancellation(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.NewTarget = memTarget(newMemBackend())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(ctx, cfg); !errors.Is(err, context.Canceled) {
		t.Fatalf("Run on a canceled context = %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		edit func(*Config)
		msg  string
	}{
		{func(c *Config) { c.Backend = "memcached" }, `backend "memcached"`},
		{func(c *Config) { c.Shape = "gpt-5" }, `page shape "gpt-5"`},
		{func(c *Config) { c.PagesPerBatch = 0 }, "0 pages per batch"},
		{func(c *Config) { c.PagesPerBatch = storage.MaxBatch + 1 }, "129 pages per batch"},
		{func(c *Config) { c.Batches = 0 }, "0 batches"},
		{func(c *Config) { c.ExistsCalls = -1 }, "-1 exists calls"},
	} {
		cfg := DefaultConfig()
		tc.edit(&cfg)
		err := cfg.Validate()
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("Validate = %v, want ErrConfig naming %q", err, tc.msg)
		}
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestShapes(t *testing.T) {
	llama, err := ShapeByName(ShapeLlama3)
	if err != nil {
		t.Fatal(err)
	}
	if llama.PartBytes() != 4<<20 || llama.PageBytes() != 8<<20 {
		t.Errorf("llama page %d bytes in parts of %d, want 8 MiB of two 4 MiB parts", llama.PageBytes(), llama.PartBytes())
	}
	for _, s := range Shapes() {
		if err := s.Geometry.Validate(); err != nil {
			t.Errorf("%s: %v", s.Name, err)
		}
		if s.PartBytes()%directAlign != 0 {
			t.Errorf("%s: parts of %d bytes cannot use O_DIRECT", s.Name, s.PartBytes())
		}
	}
}

// A long run reports about every tenth batch, with the first and the last; a
// short one every batch.
func TestBatchProgressIsBounded(t *testing.T) {
	for _, c := range []struct{ batches, min, max int }{{5, 5, 5}, {20, 20, 20}, {300, 11, 12}, {1000, 11, 12}} {
		var out bytes.Buffer
		r := &run{cfg: Config{Batches: c.batches, Progress: &out}}
		for b := range c.batches {
			r.batchProgress("get", b)
		}
		text := out.String()
		n := strings.Count(text, "\n")
		if n < c.min || n > c.max {
			t.Errorf("%d batches: %d progress lines, want %d-%d:\n%s", c.batches, n, c.min, c.max, text)
		}
		if !strings.Contains(text, "get batch 1/") || !strings.HasSuffix(text, fmt.Sprintf("get batch %d/%d\n", c.batches, c.batches)) {
			t.Errorf("%d batches: the first or the last batch is not reported:\n%s", c.batches, text)
		}
	}
}
