package pool

import "unsafe"

//go:noescape
func copyNonTemporal(dst, src *byte, n uintptr)

//go:noescape
func copyNonTemporalPrefetch(dst, src *byte, n uintptr, pf uintptr, pfn uintptr)

func storeFence()

// minStreamingRun is the shortest run worth streaming stores: below it the fence and
// the cache bypass cost more than the read-for-ownership they save.
const minStreamingRun = 1024

// copyRun copies src into dst (equal lengths). Long runs use streaming stores, which
// skip the read-for-ownership of every destination line: a page copy then moves two
// bytes over the memory bus per byte copied instead of three, which is what lets the
// strided layout conversion keep up with a plain large memcpy (Go's memmove streams
// only moves of 1 MiB and more). The caller must call finishRuns before publishing
// the copied bytes to another goroutine. Race-detector builds use the plain copy so
// that the detector sees every write.
func copyRun(dst, src []byte) {
	if raceEnabled || len(src) < minStreamingRun {
		copy(dst, src)
		return
	}
	copyStreaming(dst, src)
}

// copyRunPrefetch is copyRun that also asks the CPU to fetch next, the source of a
// later copy, while this one runs. Reads that jump (one layer of a page_first page
// is a short run at a stride of every layer) restart a hardware prefetcher at every
// run, and the copy waits a full memory latency at the start of each; naming the next
// run keeps the memory pipeline full on any CPU with a prefetch instruction. next
// must lie in mapped memory that stays alive (a prefetch never faults, but the
// address is kept as a number, invisible to the garbage collector).
func copyRunPrefetch(dst, src, next []byte) {
	n := len(src)
	if raceEnabled || n < minStreamingRun || uintptr(unsafe.Pointer(unsafe.SliceData(dst)))&15 != 0 {
		copy(dst, src)
		return
	}
	dst = dst[:n]
	body := n &^ 63
	copyNonTemporalPrefetch(unsafe.SliceData(dst), unsafe.SliceData(src), uintptr(body),
		uintptr(unsafe.Pointer(unsafe.SliceData(next))), uintptr(len(next)))
	if body < n {
		copy(dst[body:n], src[body:n])
	}
}

// copyStreaming copies with streaming stores where dst is 16-byte aligned.
func copyStreaming(dst, src []byte) {
	n := len(src)
	dst = dst[:n]
	if n == 0 || uintptr(unsafe.Pointer(unsafe.SliceData(dst)))&15 != 0 {
		copy(dst, src)
		return
	}
	body := n &^ 63
	if body > 0 {
		copyNonTemporal(unsafe.SliceData(dst), unsafe.SliceData(src), uintptr(body))
	}
	if body < n {
		copy(dst[body:n], src[body:n])
	}
}

// finishRuns orders the streaming stores of earlier copyRun calls before any later
// store, such as the one that signals the copy's completion.
func finishRuns() {
	if !raceEnabled {
		storeFence()
	}
}
