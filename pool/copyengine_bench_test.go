package pool

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/internal/benchpeer"
	"github.com/stratakv/strata/kvlayout"
)

// llama3_8b is Llama-3-8B's KV geometry: 8 MiB per 64-token page (4 MiB K + 4 MiB V).
var llama3_8b = kvlayout.Geometry{Layers: 32, KVHeads: 8, HeadDim: 128, DTypeBytes: 2}

// BenchmarkLoadLlama3 is the figure: an L2→L1 load of whole pages, host
// page_first to device layer_first, on every core, against a plain copy of the same
// bytes on every core, the two alternating in the same run ("x-of-memcpy", median
// and min-max over the rounds). Beside it, "layer0-ms" is the time until layer 0 of
// the first transfer is ready, the latency the engine sees before it can start, and
// "layer0-frac" that time as a fraction of the operation. pages=2048 moves 16 GiB
// per operation through pools of 1024 pages each (8 GiB host + 8 GiB device, because
// two 16 GiB pools do not fit a 24 GiB machine), as two transfers of 1024 pages; it
// is skipped when the machine has less than 17 GiB available. Use pages=256 while
// others share the machine.
func BenchmarkLoadLlama3(b *testing.B) {
	for _, pages := range []int{256, 2048} {
		b.Run(fmt.Sprintf("pages=%d", pages), func(b *testing.B) {
			benchCopy(b, Load, pages, []CopyConfig{DefaultCopyConfig()})
		})
	}
}

// BenchmarkBackupLlama3 is the reverse copy, device layer_first to host page_first,
// measured the same way.
func BenchmarkBackupLlama3(b *testing.B) {
	for _, pages := range []int{256, 2048} {
		b.Run(fmt.Sprintf("pages=%d", pages), func(b *testing.B) {
			benchCopy(b, Backup, pages, []CopyConfig{DefaultCopyConfig()})
		})
	}
}

// BenchmarkLayerGroups is the trade-off behind the defaults, on 256 pages: loads led
// by 1 to 8 layers, and loads and backups in equal groups of 1 (layer by layer) to
// 32 (whole pages) layers, throughput against memcpy beside the time until layer 0
// is ready.
func BenchmarkLayerGroups(b *testing.B) {
	var lead, equal []CopyConfig
	for _, n := range []int{1, 2, 4, 8} {
		c := DefaultCopyConfig()
		c.LoadLeadLayers = n
		lead = append(lead, c)
	}
	for _, n := range []int{1, 2, 4, 8, 16, 32} {
		c := DefaultCopyConfig()
		c.LayersPerJob, c.LoadLeadLayers = n, -1
		equal = append(equal, c)
	}
	b.Run("load", func(b *testing.B) { benchCopy(b, Load, 256, append(lead, equal...)) })
	b.Run("backup", func(b *testing.B) { benchCopy(b, Backup, 256, equal) })
}

// benchCopy runs one sub-benchmark per engine configuration over one pair of pools.
func benchCopy(b *testing.B, dir Direction, pages int, configs []CopyConfig) {
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
	// Scatter pages the way a cache does: host page i lands in a device page far away.
	moves := make([]PageMove, poolPages)
	for i := range moves {
		moves[i] = PageMove{Device: PageID((i * 7) % poolPages), Host: PageID(i)}
	}
	if poolPages%7 == 0 {
		b.Fatal("page count must be coprime with 7")
	}
	rounds := pages / poolPages
	src, dst := host.Target().Bytes(), dev.Pools[0].(*MemDevicePool).Bytes()
	if dir == Backup {
		src, dst = dst, src
	}
	workers := runtime.GOMAXPROCS(0)
	for _, cfg := range configs {
		name := fmt.Sprintf("lead=%d", cfg.LoadLeadLayers)
		if dir == Backup || cfg.LoadLeadLayers < 0 {
			name = fmt.Sprintf("groups=%d", cfg.LayersPerJob)
		}
		if len(configs) == 1 {
			name = "" // the figure the README quotes keeps its name
		}
		run := func(b *testing.B) {
			e, err := NewCopyEngine(cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			ctx := context.Background()
			var layer0, total []time.Duration
			var peerTime time.Duration
			b.SetBytes(int64(pages) * spec.Pools[0].Geometry.TokenBytes64(64))
			benchpeer.Compare(b, "x-of-memcpy", func(int) {
				start := time.Now()
				for r := 0; r < rounds; r++ {
					var tr *Transfer
					var err error
					if dir == Load {
						tr, err = e.Load(dev, host, moves)
					} else {
						tr, err = e.Backup(dev, host, moves)
					}
					if err != nil {
						b.Fatal(err)
					}
					if r == 0 {
						if err := tr.WaitLayer(ctx, 0, 0); err != nil {
							b.Fatal(err)
						}
						layer0 = append(layer0, time.Since(start))
					}
					if err := tr.Wait(ctx); err != nil {
						b.Fatal(err)
					}
				}
				total = append(total, time.Since(start))
			}, func(i int) {
				start := time.Now()
				for r := 0; r < rounds; r++ {
					parallelCopy(dst, src, workers)
				}
				if i >= 0 { // not the warm-up
					peerTime += time.Since(start)
				}
			}, benchpeer.Options{})
			// The peer's own speed, to compare runs on different machines or loads.
			b.ReportMetric(float64(b.N)*float64(pages)*float64(spec.Pools[0].Geometry.TokenBytes64(64))/peerTime.Seconds()/1e6, "memcpy-MB/s")
			fracs := make([]float64, len(total))
			for i := range total {
				fracs[i] = float64(layer0[i]) / float64(total[i])
			}
			slices.Sort(layer0)
			slices.Sort(fracs)
			b.ReportMetric(float64(layer0[len(layer0)/2])/1e6, "layer0-ms")
			b.ReportMetric(fracs[len(fracs)/2], "layer0-frac")
		}
		if name == "" {
			run(b)
		} else {
			b.Run(name, run)
		}
	}
}

// parallelCopy is the physical limit: one contiguous copy split across workers. It is
// the best plain copy of the same bytes: the runtime's memmove copies a move of 1 MiB
// and more on an amd64 CPU with AVX with 32-byte streaming stores and software
// prefetching (REP MOVSQ on Intel CPUs with ERMS and FSRM), the technique the copy
// engine's kernels use.
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
