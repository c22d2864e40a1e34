package arena

import (
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BenchmarkWarmup starts an arena of anonymous memory and waits until its
// background warm-up has populated all of it (New to Ready), against its
// limit in the same run: the machine's page-fault rate, measured on a fresh
// anonymous mapping of the same size and kind, touched one write per page
// (what a first write costs), populated by MADV_POPULATE_WRITE on one
// goroutine, and populated so on as many goroutines as the warm-up may use
// (page faults scale with cores). x-of-page-faults is the warm-up's rate
// over the fastest of them; it must not fall below 0.9, or a node service
// (and the bench that waits for it) starts slower than the machine allows.
// Each op maps, populates and unmaps the whole size: run it with
// -benchtime=5x and read the medians it reports.
//
//	go test -run '^$' -bench Warmup -benchtime=5x ./node/arena
func BenchmarkWarmup(b *testing.B) {
	for _, size := range []int64{256 << 20, 1 << 30} {
		b.Run(fmt.Sprintf("%dMiB", size>>20), func(b *testing.B) { benchWarmup(b, size) })
	}
}

func benchWarmup(b *testing.B, size int64) {
	workers := max(1, min(runtime.GOMAXPROCS(0), maxWarmWorkers))
	var warm, touch, populate, parallel []float64
	for b.Loop() {
		// They alternate, so that the machine's drift (other jobs, the memory
		// the kernel has free and zeroed) falls on each alike.
		warm = append(warm, gbps(size, warmArena(b, size)))
		b.StopTimer()
		touch = append(touch, gbps(size, faultPeer(b, size, 0)))
		populate = append(populate, gbps(size, faultPeer(b, size, 1)))
		parallel = append(parallel, gbps(size, faultPeer(b, size, workers)))
		b.StartTimer()
	}
	w, t, p, pp := median(warm), median(touch), median(populate), median(parallel)
	b.SetBytes(size)
	b.ReportMetric(w, "warmup-GB/s")
	b.ReportMetric(t, "touch-GB/s")
	b.ReportMetric(p, "populate-GB/s")
	b.ReportMetric(pp, "populate-all-cores-GB/s")
	b.ReportMetric(w/max(t, p, pp), "x-of-page-faults")
}

// warmArena is the time from New to Ready of a size-byte arena warmed up in
// the background, as a node service starts one.
func warmArena(b *testing.B, size int64) time.Duration {
	cfg := DefaultConfig(size)
	cfg.Logger = slog.New(slog.DiscardHandler)
	start := time.Now()
	a, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	<-a.Ready()
	took := time.Since(start)
	if st := a.Stats(); st.ReadyBytes != a.size || st.UnusableBytes != 0 {
		b.Fatalf("after the warm-up: %+v", st)
	}
	if err := a.Close(); err != nil {
		b.Fatal(err)
	}
	return took
}

// faultPeer maps size bytes of anonymous memory as the arena's allocator does
// (private, no reserve, no huge pages) and faults every page in: one write
// per page with workers 0, else MADV_POPULATE_WRITE on that many goroutines,
// each taking the next 32 MiB.
func faultPeer(b *testing.B, size int64, workers int) time.Duration {
	m, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = unix.Munmap(m) }()
	start := time.Now()
	if workers == 0 {
		page := os.Getpagesize()
		for i := 0; i < len(m); i += page {
			m[i] = 1
		}
		return time.Since(start)
	}
	var next atomic.Int64
	errs := make(chan error, workers)
	for range workers {
		go func() {
			for {
				off := next.Add(warmChunkBytes) - warmChunkBytes
				if off >= size {
					errs <- nil
					return
				}
				if err := unix.Madvise(m[off:min(off+warmChunkBytes, size)], unix.MADV_POPULATE_WRITE); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			b.Skipf("MADV_POPULATE_WRITE: %v (Linux 5.14 or later)", err)
		}
	}
	return time.Since(start)
}

func gbps(n int64, d time.Duration) float64 { return float64(n) / d.Seconds() / 1e9 }

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
