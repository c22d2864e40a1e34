package pool

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/internal/benchpeer"
	"github.com/stratakv/strata/kvlayout"
)

// llama3_8b is Llama-3-8B's KV geometry: 8 MiB per 64-token page (4 MiB K + 4 MiB V).
var llama3_8b = kvlayout.Geometry{Layers: 32, KVHeads: 8, HeadDim: 128, DTypeBytes: 2}

// BenchmarkLoadLlama3 is the figure: an L2→L1 load of whole pages, host
// page_first to device layer_first, on every core, against a plain copy of the same
// bytes on every core in the same run. pages=2048 moves 16 GiB per operation through
// pools of 1024 pages each (8 GiB host + 8 GiB device, because two 16 GiB pools do
// not fit a 24 GiB machine), as two transfers of 1024 pages; it is skipped when the
// machine has less than 17 GiB available.
func BenchmarkLoadLlama3(b *testing.B) {
	for _, pages := range []int{256, 2048} {
		b.Run(fmt.Sprintf("pages=%d", pages), func(b *testing.B) { benchLoad(b, pages) })
	}
}

func benchLoad(b *testing.B, pages int) {
	poolPages := min(pages, 1024)
	spec := GroupSpec{Pools: []PoolSpec{{Name: "kv", Geometry: llama3_8b}}, Layout: kvlayout.PageFirst, PageSize: 64, Pages: poolPages}
	if avail, err := hostmem.AvailableBytes(); err == nil && avail < 2*spec.Bytes()+(1<<30) {
		b.Skipf("needs %s of available memory, have %s", hostmem.FormatBytes(2*spec.Bytes()+(1<<30)), hostmem.FormatBytes(avail))
	}
	a := testAllocator(b, hostmem.Mmap)
	host, err := BuildGroup(spec, a)
	if err != nil {
		b.Fatal(err)
	}
	defer host.Close()
	devSpec := spec
	devSpec.Layout = kvlayout.LayerFirst
	dev, closeDev, err := NewMemDeviceGroup(devSpec, a)
	if err != nil {
		b.Fatal(err)
	}
	defer closeDev()
	e, err := NewCopyEngine(DefaultCopyConfig())
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	// Scatter pages the way a cache does: host page i lands in a device page far away.
	moves := make([]PageMove, poolPages)
	for i := range moves {
		moves[i] = PageMove{Device: PageID((i * 7) % poolPages), Host: PageID(i)}
	}
	if poolPages%7 == 0 {
		b.Fatal("page count must be coprime with 7")
	}
	rounds := pages / poolPages
	ctx := context.Background()
	b.SetBytes(int64(pages) * spec.Pools[0].Geometry.TokenBytes64(64))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for r := 0; r < rounds; r++ {
			tr, err := e.Load(dev, host, moves)
			if err != nil {
				b.Fatal(err)
			}
			if err := tr.Wait(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	src, dst := host.Target().Bytes(), dev.Pools[0].(*MemDevicePool).Bytes()
	workers := runtime.GOMAXPROCS(0)
	benchpeer.Report(b, "x-of-memcpy", func() {
		for r := 0; r < rounds; r++ {
			parallelCopy(dst, src, workers)
		}
	})
}

// parallelCopy is the physical limit: one contiguous copy split across workers.
func parallelCopy(dst, src []byte, workers int) {
	var wg sync.WaitGroup
	n := len(src)
	for w := 0; w < workers; w++ {
		lo, hi := w*n/workers, (w+1)*n/workers
		wg.Add(1)
		go func() { defer wg.Done(); copy(dst[lo:hi], src[lo:hi]) }()
	}
	wg.Wait()
}

// BenchmarkHostPoolHeap shows that pool memory is not Go heap: the heap in use before
// and after building a 4 GiB host pool group (Llama-3-8B, 512 pages of 64 tokens).
// Run it with -benchtime=1x; each iteration maps and prefaults 4 GiB.
func BenchmarkHostPoolHeap(b *testing.B) {
	spec := GroupSpec{Pools: []PoolSpec{{Name: "kv", Geometry: llama3_8b}}, Layout: kvlayout.PageFirst, PageSize: 64, Pages: 512}
	if avail, err := hostmem.AvailableBytes(); err == nil && avail < spec.Bytes()+(1<<30) {
		b.Skipf("needs %s available", hostmem.FormatBytes(spec.Bytes()+(1<<30)))
	}
	a := testAllocator(b, hostmem.Mmap)
	var grew int64
	for i := 0; i < b.N; i++ {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		g, err := BuildGroup(spec, a)
		if err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		grew = int64(after.HeapInuse) - int64(before.HeapInuse)
		if err := g.Close(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(spec.Bytes())/(1<<30), "pool-GiB")
	b.ReportMetric(float64(grew), "heap-bytes-grown")
	b.ReportMetric(float64(grew)/float64(spec.Pages), "heap-bytes/page")
}
