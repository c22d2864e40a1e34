package arena

import (
	"log/slog"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/internal/memstat"
)

// Benchmarks of many small objects: the metadata each costs the service and the
// garbage collector, and the per-operation cost of the index. Values are 64 to
// 256 bytes under 64-byte keys (the length of an SGLang page key).

// smallKey writes the i-th benchmark key, 64 bytes, into buf and returns it.
func smallKey(buf []byte, i int) []byte {
	buf = append(buf[:0], "model/llama-3-8b/tp0/"...)
	buf = strconv.AppendInt(buf, int64(i), 16)
	for len(buf) < 64 {
		buf = append(buf, '.')
	}
	return buf
}

// smallSize is the i-th object's value size: 64 to 256 bytes.
func smallSize(i int) int64 { return 64 + int64(i*37)%193 }

// sparseArena is an arena over memory that is mapped, not prefaulted, and
// exempt from the allocator's available-memory check, so that only the pages
// objects touch become resident.
func sparseArena(b *testing.B, size int64) *Arena {
	al, err := hostmem.New(hostmem.Config{Kind: hostmem.Mmap, Available: func() (int64, error) { return 1 << 50, nil }})
	if err != nil {
		b.Fatal(err)
	}
	cfg := DefaultConfig(size)
	cfg.Allocator, cfg.Logger = al, slog.New(slog.DiscardHandler)
	cfg.HighWatermark, cfg.LowWatermark = 1, 0.99
	cfg.Warmup = false // sparse: only what objects touch becomes resident
	a, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = a.Close() })
	return a
}

// rssBytes is the process's resident memory; a benchmark that cannot read it
// states nothing.
func rssBytes(b *testing.B) int64 {
	n, err := memstat.RSSBytes()
	if err != nil {
		b.Fatal(err)
	}
	return n
}

// BenchmarkObjectMemory stores 1M and 10M small objects (or the counts of
// STRATA_BENCH_OBJECTS, see bench_scale_test.go) and states what each costs the
// service beyond its own bytes, and what a garbage collection costs with them
// held:
//
//	go test -run '^$' -bench ObjectMemory -benchtime 1x ./node/arena
//
// metaB/object is the Go heap's growth plus the index's mapped, touched bytes
// (Stats.IndexBytes), per object; heapB/object the Go heap part alone;
// rssB/object the growth of the resident set (the objects' bytes included) per
// object; gc-ms the wall time of a runtime.GC() with the objects held and
// gcCPU-ms the collector's CPU time in it. One op stores every object.
func BenchmarkObjectMemory(b *testing.B) {
	for _, n := range objectCounts(b, 1_000_000, 10_000_000) {
		b.Run("objects="+countName(n), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				heap0, rss0 := memstat.HeapInuse(), rssBytes(b)
				b.StartTimer()
				// Room for every object rounded up to 4 KiB: the arena is sparse,
				// so only what the objects touch costs memory.
				a := sparseArena(b, int64(n)*4096)
				fillSmall(b, a, n)
				b.StopTimer()
				heap1, rss1 := memstat.HeapInuse(), rssBytes(b)
				gc0 := memstat.GCCPUSeconds()
				start := time.Now()
				runtime.GC()
				gcWall := time.Since(start)
				gcCPU := memstat.GCCPUSeconds() - gc0
				st := a.Stats()
				if st.Objects != int64(n) {
					b.Fatalf("%d objects stored, want %d", st.Objects, n)
				}
				heap := float64(heap1 - heap0)
				b.ReportMetric((heap+float64(st.IndexBytes))/float64(n), "metaB/object")
				b.ReportMetric(heap/float64(n), "heapB/object")
				b.ReportMetric(float64(rss1-rss0)/float64(n), "rssB/object")
				b.ReportMetric(float64(st.UsedBytes)/float64(n), "arenaB/object")
				b.ReportMetric(float64(gcWall.Microseconds())/1e3, "gc-ms")
				b.ReportMetric(gcCPU*1e3, "gcCPU-ms")
				_ = a.Close()
				b.StartTimer()
			}
		})
	}
}

// BenchmarkSmallAcquireRelease leases and releases 64K small objects round robin:
// the index lookup, the LRU update and the Lease.
//
//	go test -run '^$' -bench 'Small(AcquireRelease|ReserveCommit)' -count 5 ./node/arena
func BenchmarkSmallAcquireRelease(b *testing.B) {
	const n = 1 << 16
	a := sparseArena(b, 256<<20)
	keys := make([]string, n)
	buf := make([]byte, 0, 80)
	for i := range keys {
		keys[i] = string(smallKey(buf, i))
		p, err := a.Reserve(keys[i], 1, smallSize(i))
		if err != nil {
			b.Fatal(err)
		}
		if err := p.Commit(); err != nil {
			b.Fatal(err)
		}
	}
	i := 0
	for b.Loop() {
		l, err := a.Acquire(keys[i%n], 1)
		if err != nil {
			b.Fatal(err)
		}
		l.Release()
		i += 7919 // a stride, so that consecutive lookups miss the cache as a server's would
	}
}

// BenchmarkSmallReserveCommit writes small objects round robin over 64K keys,
// removing each key's previous object first: Reserve, a copy in, Commit, Remove.
func BenchmarkSmallReserveCommit(b *testing.B) {
	const n = 1 << 16
	a := sparseArena(b, 256<<20)
	keys := make([]string, n)
	buf := make([]byte, 0, 80)
	for i := range keys {
		keys[i] = string(smallKey(buf, i))
	}
	src := make([]byte, 256)
	i := 0
	for b.Loop() {
		k := keys[i%n]
		a.Remove(k)
		size := smallSize(i)
		p, err := a.Reserve(k, 1, size)
		if err != nil {
			b.Fatal(err)
		}
		copy(p.Bytes(), src)
		if err := p.Commit(); err != nil {
			b.Fatal(err)
		}
		i += 7919
	}
}
