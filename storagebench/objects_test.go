package storagebench

import (
	"context"
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

func TestObjectShape(t *testing.T) {
	for _, n := range []int64{MinObjectBytes, 1024, 4096, 16 << 10, MaxObjectBytes} {
		s, err := ObjectShape(n)
		if err != nil {
			t.Fatalf("ObjectShape(%d): %v", n, err)
		}
		if err := s.Geometry.Validate(); err != nil {
			t.Errorf("ObjectShape(%d): %v", n, err)
		}
		if s.PartBytes() != n || s.PageBytes() != 2*n || s.Geometry.Buffers() != 2 {
			t.Errorf("ObjectShape(%d): pages of %d bytes in %d parts of %d", n, s.PageBytes(), s.Geometry.Buffers(), s.PartBytes())
		}
	}
	for _, n := range []int64{-16, 0, 8, 1000, MaxObjectBytes + 16} {
		if _, err := ObjectShape(n); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "object size") {
			t.Errorf("ObjectShape(%d) = %v, want ErrConfig naming the object size", n, err)
		}
	}
	cfg := DefaultConfig()
	cfg.ObjectBytes = 1000
	if err := cfg.Validate(); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "object size of 1000 bytes") {
		t.Errorf("Validate with 1000-byte objects = %v", err)
	}
	cfg.ObjectBytes, cfg.Shape = 1024, ShapeSmall
	if err := cfg.Validate(); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "give one") {
		t.Errorf("Validate with an object size and a shape = %v", err)
	}
	cfg.Shape = ""
	if err := cfg.Validate(); err != nil || cfg.shape().PartBytes() != 1024 {
		t.Errorf("Validate = %v, shape %+v", err, cfg.shape())
	}
}

func TestParseRedisBenchmarkGet(t *testing.T) {
	out := `"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
"SET","296441.00","0.263","0.064","0.071","0.791","1.255","3.047"
"GET","775342.69","0.102","0.040","0.071","0.207","0.415","1.335"
`
	got, err := parseRedisBenchmarkGet(strings.NewReader(out))
	if err != nil || got != 775342.69 {
		t.Fatalf("parse = %v, %v; want 775342.69", got, err)
	}
	for _, bad := range []string{"", `"test","rps"` + "\n" + `"SET","1.0"` + "\n", `"GET","fast"` + "\n", `"GET","0"` + "\n"} {
		if v, err := parseRedisBenchmarkGet(strings.NewReader(bad)); err == nil {
			t.Errorf("parse %q = %v, want an error", bad, v)
		}
	}
	args, err := redisBenchmarkArgs("127.0.0.1:6380", 256, 1024)
	if err != nil || strings.Join(args, " ") != "-h 127.0.0.1 -p 6380 -c 1 -P 256 -d 1024 -n 100000 -t set,get --csv" {
		t.Errorf("args %q, %v", args, err)
	}
}

// TestRunNodeSmallObjects runs the node backend with 1 KiB objects: every
// object comes back whole, and with Redis installed the run reports Redis
// beside it, and redis-benchmark's figure when that is installed too.
func TestRunNodeSmallObjects(t *testing.T) {
	cfg := nodeConfig(t)
	cfg.Shape, cfg.ObjectBytes = "", 1024
	withRedis := redisInstalled(t)
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.PartBytes != 1024 || rep.Shape != "objects-1024" || rep.MismatchedPages != 0 || !(rep.GetGBps > 0) {
		t.Fatalf("report: shape %s, parts of %d, %d mismatched, get %v GB/s", rep.Shape, rep.PartBytes, rep.MismatchedPages, rep.GetGBps)
	}
	if !slices.ContainsFunc(rep.Notes, func(n string) bool { return strings.Contains(n, "memcpy ratio is low by nature") }) {
		t.Errorf("no note on what the memcpy ratio means for small objects: %q", rep.Notes)
	}
	if !withRedis {
		return
	}
	if !(rep.GetVsRedis > 0) {
		t.Errorf("no ratio to Redis: %v", rep.GetVsRedis)
	}
	_, lookErr := exec.LookPath("redis-benchmark")
	rb := rep.RedisBenchmark
	switch {
	case lookErr != nil && rb != nil:
		t.Errorf("a redis-benchmark figure without redis-benchmark: %+v", rb)
	case lookErr == nil && rb == nil:
		t.Errorf("no redis-benchmark figure; notes %q", rep.Notes)
	case rb != nil:
		if !(rb.GetPerSec > 0) || !(rb.BackendGetPerSec > 0) || rb.Ratio == nil || !(rb.Ratio.Median > 0) ||
			rb.Ratio.Batches != redisBenchmarkRounds || !strings.Contains(rb.Command, "-P 16 -d 1024") {
			t.Errorf("redis-benchmark reference %+v", rb)
		}
		var table strings.Builder
		if err := rep.WriteTable(&table); err != nil || !strings.Contains(table.String(), "redis-benchmark (C client") {
			t.Errorf("table (%v) lacks the redis-benchmark line:\n%s", err, table.String())
		}
	}
}
