package arena

import (
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stratakv/strata/hostmem"
)

// Warm-up. Memory that was never touched costs a page fault per 4 KiB on
// first write, and a copy into it runs at a quarter to a third of memcpy
// speed; prefaulting the whole arena before serving kept a node dark for
// seconds per GiB. So New populates nothing: the arena's free memory is
// withheld from the allocator in chunks, and background goroutines (one per
// core, up to maxWarmWorkers) populate them in order (MADV_POPULATE_WRITE,
// 3.4 GB/s per core of anonymous memory here, ten times that for the pages of
// a warm restart, which only need mapping) and hand each chunk's free extents
// to the allocator when it is done, so that the allocator only ever gives
// out memory that is populated. A Reserve that finds no room while chunks are
// still withheld waits for the next chunk instead of evicting; the warm-up
// runs ahead of the writers at the speed the machine's page faults allow. A
// chunk that cannot be populated (its tmpfs or huge page pool is full) stays
// withheld for good, logged once, rather than become a SIGBUS in a writer.
//
// Objects recovered from an arena file lie in memory that exists already:
// they are served at once, and the warm-up maps their pages on its way.

// warmChunkBytes is the warm-up's unit of work: 32 MiB, 10-20 ms of
// populating here, long beside the lock and the allocator's bookkeeping a
// chunk costs (BenchmarkWarmup).
const warmChunkBytes = 32 << 20

// warmup is the state of the background warm-up.
type warmup struct {
	chunkUnits int64
	chunks     []warmChunk
	withheld   int64 // units withheld in chunks not warmed yet
	failed     int64 // units of chunks that could not be populated
	readyBytes int64 // bytes of chunks done (their memory given out)
	running    bool
	waits      int64 // Reserves that waited for a chunk
	took       time.Duration
	err        error // the first chunk that failed
}

// warmChunk is a chunk of the data region and the free extents withheld in
// it until it is populated.
type warmChunk struct {
	pieces []Span
}

func (w *warmup) active() bool { return w.running }

// warmPieces splits the free runs between the allocated extents exts (offset
// order) at chunk boundaries, and returns all of them, allocated and
// withheld, in offset order for RebuildExtents.
func (a *Arena) warmPieces(exts []Span) []Span {
	units := a.size / a.unit
	w := &a.warm
	w.chunkUnits = max(warmChunkBytes/a.unit, 1)
	w.chunks = make([]warmChunk, (units+w.chunkUnits-1)/w.chunkUnits)
	out := make([]Span, 0, len(exts)+len(w.chunks)+1)
	withhold := func(from, to int64) {
		for from < to {
			c := from / w.chunkUnits
			end := min(to, (c+1)*w.chunkUnits)
			w.chunks[c].pieces = append(w.chunks[c].pieces, Span{from, end - from})
			out = append(out, Span{from, end - from})
			w.withheld += end - from
			from = end
		}
	}
	next := int64(0)
	for _, e := range exts {
		withhold(next, e.Off)
		out = append(out, e)
		next = e.Off + e.N
	}
	withhold(next, units)
	w.running = true
	return out
}

// warmUp populates the chunks, in order of their offsets, on warmWorkers
// goroutines, and hands each one's free extents to the allocator as it is
// done. It stops when the arena breaks (fault.go), which also ends the start
// (checkReadyLocked).
func (a *Arena) warmUp() {
	defer a.done.Done()
	start := time.Now()
	w := &a.warm
	var next atomic.Int64
	var wg sync.WaitGroup
	for range a.warmWorkers() - 1 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.warmChunks(&next)
		}()
	}
	a.warmChunks(&next)
	wg.Wait()
	a.mu.Lock()
	w.running, w.took = false, time.Since(start)
	unusable := w.failed * a.unit
	a.cond.Broadcast()
	a.checkReadyLocked()
	a.mu.Unlock()
	a.cfg.Logger.Info("arena warmed", "bytes", a.size, "took", w.took.Round(time.Millisecond),
		"GBps", float64(a.size)/w.took.Seconds()/1e9, "unusable", hostmem.FormatBytes(unusable))
}

// warmWorkers is how many goroutines populate the memory. A page fault is
// the kernel zeroing and mapping a page, which scales with cores: on this
// project's 2-core machines one goroutine populated 3.4 GB/s, two 6.5 GB/s
// (BenchmarkWarmup), and a bench that waits for its node service to be ready
// waits half as long. Past maxWarmWorkers a machine's memory bandwidth, not
// its cores, bounds it, and the engines beside the service keep the rest.
// With OnWarmup, one: its contract is that a call that blocks holds the
// warm-up, every chunk seen in order, which a second goroutine would not.
func (a *Arena) warmWorkers() int {
	if a.cfg.OnWarmup != nil {
		return 1
	}
	return max(1, min(runtime.GOMAXPROCS(0), maxWarmWorkers, len(a.warm.chunks)))
}

// maxWarmWorkers bounds the warm-up's goroutines (warmWorkers).
const maxWarmWorkers = 8

// warmChunks populates the chunks next hands out, one after the other, until
// none is left, the arena stops or it breaks.
func (a *Arena) warmChunks(next *atomic.Int64) {
	defer a.guard(debug.SetPanicOnFault(true), nil)
	w := &a.warm
	chunkBytes := w.chunkUnits * a.unit
	// Without the lock: the memory stays mapped until Close has waited for
	// every warm-up goroutine.
	populate := a.back.populate
	if a.cfg.populate != nil {
		populate = a.cfg.populate
	}
	for {
		c := int(next.Add(1) - 1)
		if c >= len(w.chunks) {
			return
		}
		select {
		case <-a.stop:
			return
		default:
		}
		if a.broken() {
			return
		}
		off := int64(c) * chunkBytes
		n := min(chunkBytes, a.size-off)
		ready := a.warmed(c, off, n, populate(off, n))
		if h := a.cfg.OnWarmup; h != nil {
			h(ready, a.size)
		}
	}
}

// warmed hands chunk c, at off for n bytes, to the allocator, or leaves it
// withheld for good when err says it could not be populated, and returns the
// bytes ready so far.
func (a *Arena) warmed(c int, off, n int64, err error) int64 {
	w := &a.warm
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.broken() {
		return w.readyBytes
	}
	var units int64
	for _, p := range w.chunks[c].pieces {
		units += p.N
	}
	w.withheld -= units
	if err != nil {
		w.failed += units
		// The watermarks apply to the memory the arena can use.
		usable := float64(a.size - w.failed*a.unit)
		a.high, a.low = int64(a.cfg.HighWatermark*usable), int64(a.cfg.LowWatermark*usable)
		if w.err == nil {
			w.err = err
			a.cfg.Logger.Warn("arena: memory that cannot be populated is left unused; the arena holds less",
				"file", a.cfg.File, "at", off, "err", err, "fix", "give the arena's tmpfs or huge page pool more room, or lower --arena")
		}
	} else {
		for _, p := range w.chunks[c].pieces {
			delete(a.owner, p.Off)
			if err := a.ext.Free(p.Off, p.N); err != nil {
				panic("arena: warming: " + err.Error()) // a bookkeeping bug
			}
		}
		w.readyBytes += n
	}
	w.chunks[c].pieces = nil
	a.cond.Broadcast()
	return w.readyBytes
}
