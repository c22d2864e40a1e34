package storagebench

import (
	"context"
	"testing"
)

// BenchmarkNodeLargePages is `strata bench tiers --backend node --no-redis` at a
// quarter of its size (2 batches of 64 Llama-3-8B pages of 2 MiB objects, one
// engine then two) as a Go benchmark, so that the service's large-object path
// can be profiled:
//
//	go test -run '^$' -bench NodeLargePages -benchtime 1x -cpuprofile cpu.out ./storagebench
//	go tool pprof -top storagebench.test cpu.out
//
// One op is the whole run; the metrics are its put and get ratios over the
// memcpy peer (the median of the alternated batches), one engine and two.
func BenchmarkNodeLargePages(b *testing.B) {
	cfg := DefaultConfig()
	cfg.Backend, cfg.Dir, cfg.NoRedis = BackendNode, b.TempDir(), true
	cfg.Batches, cfg.PagesPerBatch, cfg.ExistsCalls = 2, 64, 20
	var put, get, put2, get2 float64
	for b.Loop() {
		rep, err := Run(context.Background(), cfg)
		if err != nil {
			b.Fatal(err)
		}
		if rep.MismatchedPages != 0 {
			b.Fatalf("%d pages read back with other bytes", rep.MismatchedPages)
		}
		put, get = put+rep.PutRatio, get+rep.GetRatio
		put2, get2 = put2+rep.Engines.PutRatio, get2+rep.Engines.GetRatio
	}
	n := float64(b.N)
	b.ReportMetric(put/n, "put-x-memcpy")
	b.ReportMetric(get/n, "get-x-memcpy")
	b.ReportMetric(put2/n, "put2-x-memcpy")
	b.ReportMetric(get2/n, "get2-x-memcpy")
}
