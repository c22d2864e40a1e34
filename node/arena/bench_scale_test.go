package arena

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Benchmarks of the arena at a scale of objects: how fast Exists answers with N
// objects held, and (BenchmarkObjectMemory, BenchmarkRecovery) what N objects
// cost in metadata and in the rebuild after a SIGKILL. N is what the machine
// allows, so it is set from outside:
//
//	STRATA_BENCH_OBJECTS=10M go test -run '^$' -bench 'ExistsAtN|ObjectMemory|Recovery/small' -benchtime 1x ./node/arena
//
// A count is a number with an optional K or M suffix; several are separated by
// commas. Without the variable each benchmark runs the counts its comment says.

// objectCountsEnv names the environment variable with the object counts.
const objectCountsEnv = "STRATA_BENCH_OBJECTS"

// objectCounts returns the counts of STRATA_BENCH_OBJECTS, or def when it is
// unset; a value that is not a list of counts fails the benchmark, so that a
// typo never runs the default silently.
func objectCounts(b *testing.B, def ...int) []int {
	v := strings.TrimSpace(os.Getenv(objectCountsEnv))
	if v == "" {
		return def
	}
	var out []int
	for f := range strings.SplitSeq(v, ",") {
		n, err := parseCount(strings.TrimSpace(f))
		if err != nil {
			b.Fatalf("%s=%q: %v", objectCountsEnv, v, err)
		}
		out = append(out, n)
	}
	return out
}

// parseCount reads "1000", "64K" or "10M".
func parseCount(s string) (int, error) {
	mult := 1
	switch {
	case strings.HasSuffix(s, "M"):
		mult, s = 1_000_000, strings.TrimSuffix(s, "M")
	case strings.HasSuffix(s, "K"):
		mult, s = 1_000, strings.TrimSuffix(s, "K")
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 1<<40/mult {
		return 0, fmt.Errorf("count %q: want a positive number with an optional K or M suffix", s)
	}
	return n * mult, nil
}

// countName is n as a sub-benchmark name: 1M, 64K or 1500.
func countName(n int) string {
	switch {
	case n%1_000_000 == 0:
		return strconv.Itoa(n/1_000_000) + "M"
	case n%1_000 == 0:
		return strconv.Itoa(n/1_000) + "K"
	}
	return strconv.Itoa(n)
}

// fillSmall stores objects 0..n-1 (smallKey, smallSize) in a, committed.
func fillSmall(b *testing.B, a *Arena, n int) {
	buf := make([]byte, 0, 80)
	for i := range n {
		p, err := a.Reserve(string(smallKey(buf, i)), 1, smallSize(i))
		if err != nil {
			b.Fatalf("object %d of %d: %v", i, n, err)
		}
		if err := p.Commit(); err != nil {
			b.Fatalf("object %d of %d: %v", i, n, err)
		}
	}
}

// existsBatch is the keys of one Exists call, as an engine sends them: a
// 128-page batch (storage.MaxBatch).
const existsBatch = 128

// BenchmarkExistsAtN holds N small objects (default 1M) in a sparse arena and
// times what the node service does for an Exists call: ContainsPrefix of a
// batch of 128 keys under one lock, each batch of fresh random held keys (so
// that the lookups miss the CPU caches as a large index's do), and single
// Contains of one random held key and of one absent key. One op is one batch
// and the building of its keys (ns/op is not the figure); batch-p50-us and
// batch-p99-us are the batch's latency percentiles, key-ns the mean per key,
// one-p50-ns / one-p99-ns a single held key's and miss-p50-ns an absent key's.
//
//	go test -run '^$' -bench ExistsAtN -benchtime 5000x ./node/arena
func BenchmarkExistsAtN(b *testing.B) {
	for _, n := range objectCounts(b, 1_000_000) {
		b.Run("objects="+countName(n), func(b *testing.B) {
			a := sparseArena(b, int64(n)*4096)
			fillSmall(b, a, n)
			rng := rand.New(rand.NewPCG(uint64(n), 7))
			// Every batch is of fresh random keys, built outside its timing: keys
			// reused would stay in the CPU caches, and an index of millions does not.
			keys := make([]string, existsBatch)
			buf := make([]byte, 0, 80)
			var lat []time.Duration
			for b.Loop() {
				for j := range keys {
					keys[j] = string(smallKey(buf, rng.IntN(n)))
				}
				s := time.Now()
				got := a.ContainsPrefix(keys, 1)
				lat = append(lat, time.Since(s))
				if got != len(keys) {
					b.Fatalf("ContainsPrefix found %d of %d held keys", got, len(keys))
				}
			}
			b.StopTimer()
			var total time.Duration
			for _, d := range lat {
				total += d
			}
			b.ReportMetric(pctl(lat, 50).Seconds()*1e6, "batch-p50-us")
			b.ReportMetric(pctl(lat, 99).Seconds()*1e6, "batch-p99-us")
			b.ReportMetric(float64(total.Nanoseconds())/float64(len(lat)*existsBatch), "key-ns")

			// Single keys, held and absent: 20000 of each.
			const singles = 20000
			one, miss := make([]time.Duration, singles), make([]time.Duration, singles)
			held := make([]string, singles)
			absent := make([]string, singles)
			for j := range singles {
				held[j] = string(smallKey(buf, rng.IntN(n)))
				absent[j] = string(smallKey(buf, n+rng.IntN(n)))
			}
			for j := range singles {
				s := time.Now()
				ok := a.Contains(held[j], 1)
				one[j] = time.Since(s)
				s = time.Now()
				bad := a.Contains(absent[j], 1)
				miss[j] = time.Since(s)
				if !ok || bad {
					b.Fatalf("Contains: held key %v, absent key %v", ok, bad)
				}
			}
			b.ReportMetric(float64(pctl(one, 50).Nanoseconds()), "one-p50-ns")
			b.ReportMetric(float64(pctl(one, 99).Nanoseconds()), "one-p99-ns")
			b.ReportMetric(float64(pctl(miss, 50).Nanoseconds()), "miss-p50-ns")
		})
	}
}

// pctl is the p-th percentile of ds (sorted in place).
func pctl(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[min(len(ds)-1, len(ds)*p/100)]
}

// TestParseCount checks the counts STRATA_BENCH_OBJECTS accepts and refuses.
func TestParseCount(t *testing.T) {
	for in, want := range map[string]int{"1500": 1500, "64K": 64_000, "10M": 10_000_000, "100M": 100_000_000} {
		if got, err := parseCount(in); err != nil || got != want {
			t.Errorf("parseCount(%q) = %d, %v; want %d", in, got, err, want)
		}
		if name := countName(want); name != in {
			t.Errorf("countName(%d) = %q, want %q", want, name, in)
		}
	}
	for _, in := range []string{"", "0", "-3M", "10G", "1.5M", "M", "2000000M"} {
		if got, err := parseCount(in); err == nil {
			t.Errorf("parseCount(%q) = %d, want an error", in, got)
		}
	}
}
