package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stratakv/strata/internal/redistest"
)

func TestBenchTiersSmallRunWritesJSON(t *testing.T) {
	dir := t.TempDir()
	jsonPath := filepath.Join(t.TempDir(), "tiers.json")
	code, out, errs := runCLI(t, "", "bench", "tiers", "--small", "--dir", dir, "--batches", "2", "--pages-per-batch", "8",
		"--exists-calls", "20", "--json", jsonPath)
	if code != 0 {
		t.Fatalf("bench tiers: exit %d, stderr %q", code, errs)
	}
	for _, want := range []string{"backend", "file", "peer GB/s", "put", "get", "mismatched pages: 0"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	data, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Backend         string   `json:"backend"`
		PageBytes       int64    `json:"page_bytes"`
		PagesPerBatch   int      `json:"pages_per_batch"`
		Batches         int      `json:"batches"`
		PutGBps         float64  `json:"put_gbps"`
		GetGBps         float64  `json:"get_gbps"`
		Peer            string   `json:"peer"`
		PeerPutGBps     float64  `json:"peer_put_gbps"`
		PeerGetGBps     float64  `json:"peer_get_gbps"`
		PutRatio        float64  `json:"put_ratio"`
		GetRatio        float64  `json:"get_ratio"`
		ExistsP50us     float64  `json:"exists_p50_us"`
		ExistsP99us     float64  `json:"exists_p99_us"`
		MismatchedPages *int64   `json:"mismatched_pages"`
		Notes           []string `json:"notes"`
	}
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Backend != "file" || rep.PageBytes != 64<<10 || rep.PagesPerBatch != 8 || rep.Batches != 2 || rep.Peer == "" {
		t.Errorf("report header %+v", rep)
	}
	for name, v := range map[string]float64{"put_gbps": rep.PutGBps, "get_gbps": rep.GetGBps, "peer_put_gbps": rep.PeerPutGBps,
		"peer_get_gbps": rep.PeerGetGBps, "put_ratio": rep.PutRatio, "get_ratio": rep.GetRatio,
		"exists_p50_us": rep.ExistsP50us, "exists_p99_us": rep.ExistsP99us} {
		if !(v > 0) {
			t.Errorf("%s = %v, want positive", name, v)
		}
	}
	if rep.MismatchedPages == nil || *rep.MismatchedPages != 0 {
		t.Errorf("mismatched_pages = %v, want 0", rep.MismatchedPages)
	}
	if len(rep.Notes) == 0 {
		t.Error("no notes: the report should say whether reads bypassed the page cache")
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) != 0 {
		t.Errorf("the run left %v in --dir", left)
	}
}

func TestBenchTiersBadFlagsExitTwo(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--backend", "memcached"}, "--backend: backend \"memcached\": the storage benchmark can measure file, node, redis"},
		{[]string{"--redis", "127.0.0.1:6379"}, "--redis applies only to --backend redis"},
		{[]string{"--backend", "redis", "--redis", "127.0.0.1:6379", "--redis-cluster"}, "--redis and --redis-cluster"},
		{[]string{"--batches", "0"}, "--batches"},
		{[]string{"--pages-per-batch", "200"}, "--pages-per-batch"},
		{[]string{"--pages-per-batch", "x"}, "pages-per-batch"},
		{[]string{"--geometry", "gpt-5"}, "--geometry"},
		{[]string{"--small", "--geometry", "llama-3-8b"}, "disagree"},
		{[]string{"--exists-calls", "-3"}, "--exists-calls"},
		{[]string{"--object-bytes", "1000"}, "--object-bytes: object size of 1000 bytes"},
		{[]string{"--object-bytes", "1024", "--geometry", "small"}, "--object-bytes: an object size and page shape"},
		{[]string{"--small", "--object-bytes", "1024"}, "--small and --object-bytes disagree"},
		{[]string{"--nope"}, "nope"},
		{[]string{"extra"}, "unexpected argument"},
		{[]string{"--dir", filepath.Join(dir, "missing")}, "--dir"},
		{[]string{"--socket", filepath.Join(dir, "node.sock")}, "--socket applies only to --backend node"},
		{[]string{"--engines", "4"}, "--engines applies only to --backend node"},
		{[]string{"--backend", "node", "--engines", "1"}, "--engines: 1 engines at once: want 2 to 64"},
		{[]string{"--backend", "node", "--engines", "65"}, "--engines: 65 engines at once"},
	} {
		code, out, errs := runCLI(t, "", append([]string{"bench", "tiers"}, c.args...)...)
		if code != 2 || out != "" || strings.Count(errs, "\n") != 1 || !strings.Contains(errs, c.msg) ||
			!strings.HasPrefix(errs, "strata bench tiers: ") {
			t.Errorf("bench tiers %v: exit %d, stdout %q, stderr %q (want 2 and one line, strata bench tiers: naming %q)",
				c.args, code, out, errs, c.msg)
		}
	}
	if code, help, _ := runCLI(t, "", "bench", "tiers", "-h"); code != 0 || !strings.Contains(help, "pages-per-batch") ||
		!strings.Contains(help, "no-redis") || !strings.Contains(help, "socket string") {
		t.Errorf("bench tiers -h: exit %d, stdout %q", code, help)
	}
}

// TestBenchTiersRedisSmallRun runs the redis backend end to end on the
// redis-server it starts.
func TestBenchTiersRedisSmallRun(t *testing.T) {
	redistest.Require(t)
	code, out, errs := runCLI(t, "", "bench", "tiers", "--backend", "redis", "--small", "--dir", t.TempDir(), "--batches", "2",
		"--pages-per-batch", "8", "--exists-calls", "20")
	if code != 0 {
		t.Fatalf("bench tiers --backend redis: exit %d, stderr %q", code, errs)
	}
	for _, want := range []string{"redis (local redis-server started for the run", "standalone mode", "raw pipelined SET",
		"exists of 8 keys", "mismatched pages: 0", "removed before the next"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

// TestBenchTiersNodeSmallRun runs the node backend end to end: an embedded
// service, tiny pages, two batches, two engines; Redis is left out here (the
// storagebench tests run it).
func TestBenchTiersNodeSmallRun(t *testing.T) {
	jsonPath := filepath.Join(t.TempDir(), "tiers.json")
	code, out, errs := runCLI(t, "", "bench", "tiers", "--backend", "node", "--small", "--dir", t.TempDir(), "--batches", "2",
		"--pages-per-batch", "8", "--exists-calls", "20", "--no-redis", "--json", jsonPath)
	if code != 0 {
		t.Fatalf("bench tiers --backend node: exit %d, stderr %q", code, errs)
	}
	for _, want := range []string{"node (embedded service", "memcpy, 2 goroutines", "2 engines", "engine 2", "cold batch",
		"exists of 8 keys", "mismatched pages: 0", "redis: skipped (--no-redis)"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	data, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Backend         string  `json:"backend"`
		Shape           string  `json:"shape"`
		PutGBps         float64 `json:"put_gbps"`
		GetGBps         float64 `json:"get_gbps"`
		PutRatio        float64 `json:"put_ratio"`
		GetRatio        float64 `json:"get_ratio"`
		ExistsP50us     float64 `json:"exists_p50_us"`
		ExistsP99us     float64 `json:"exists_p99_us"`
		MismatchedPages *int64  `json:"mismatched_pages"`
		Engines         *struct {
			Engines       int       `json:"engines"`
			PutGBps       float64   `json:"put_gbps"`
			GetGBps       float64   `json:"get_gbps"`
			EnginePutGBps []float64 `json:"engine_put_gbps"`
			PutRatio      float64   `json:"put_ratio"`
			GetRatio      float64   `json:"get_ratio"`
		} `json:"engines"`
	}
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Backend != "node" || rep.Shape != "small" || rep.MismatchedPages == nil || *rep.MismatchedPages != 0 || rep.Engines == nil {
		t.Fatalf("report %s", data)
	}
	for name, v := range map[string]float64{"put_gbps": rep.PutGBps, "get_gbps": rep.GetGBps, "put_ratio": rep.PutRatio,
		"get_ratio": rep.GetRatio, "exists_p50_us": rep.ExistsP50us, "exists_p99_us": rep.ExistsP99us,
		"engines.put_gbps": rep.Engines.PutGBps, "engines.get_gbps": rep.Engines.GetGBps,
		"engines.put_ratio": rep.Engines.PutRatio, "engines.get_ratio": rep.Engines.GetRatio} {
		if !(v > 0) {
			t.Errorf("%s = %v, want positive", name, v)
		}
	}
	if rep.Engines.Engines != 2 || len(rep.Engines.EnginePutGBps) != 2 {
		t.Errorf("per-engine put figures %v", rep.Engines.EnginePutGBps)
	}
}
