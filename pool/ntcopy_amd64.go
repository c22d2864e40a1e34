package pool

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

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

//go:noescape
func copyRunsAVX(dst *byte, dstep uintptr, src *byte, sstep uintptr, run uintptr, count uintptr, pf uintptr)

//go:noescape
func touchLines(p *byte, n uintptr)

// copyRuns copies count runs of run bytes, the i-th from src[soff+i*sstep:] to
// dst[doff+i*dstep:], with streaming stores, prefetching the source pf bytes ahead
// of every load (copyRunsAVX), where the CPU has AVX (every x86-64 server CPU since
// 2011), run is a multiple of 128 and every destination run is 32-byte aligned;
// else run by run with copyRunPrefetch. One call copies many runs, because a call
// from Go per 2 KiB run costs about as much as the copy. The caller must call
// finishRuns before publishing the bytes; race-detector builds should copy with
// copy() instead, because the detector does not see assembly stores.
func copyRuns(dst []byte, doff, dstep int64, src []byte, soff, sstep, run int64, count int, pf int64) {
	if count <= 0 || run <= 0 {
		return
	}
	last := int64(count - 1)
	if doff < 0 || soff < 0 || dstep < 0 || sstep < 0 ||
		doff+last*dstep+run > int64(len(dst)) || soff+last*sstep+run > int64(len(src)) {
		panic("pool: copyRuns out of range") // a bug in the caller, never outside input
	}
	d := unsafe.Pointer(unsafe.SliceData(dst))
	if cpu.X86.HasAVX && run%128 == 0 && dstep%32 == 0 && (uintptr(d)+uintptr(doff))%32 == 0 {
		copyRunsAVX((*byte)(unsafe.Add(d, doff)), uintptr(dstep),
			(*byte)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(src)), soff)), uintptr(sstep), uintptr(run), uintptr(count), uintptr(pf))
		return
	}
	for i := int64(0); i <= last; i++ {
		dd, ss := doff+i*dstep, soff+i*sstep
		// Prefetch by name only what lies beyond this run (a strided source): a
		// sequential one is what hardware prefetchers follow by themselves.
		var next []byte
		if p := ss + pf; pf >= run && p+run <= int64(len(src)) {
			next = src[p : p+run]
		}
		copyRunPrefetch(dst[dd:dd+run], src[ss:ss+run], next)
	}
}

// touch reads one word of every cache line of b and discards it: see touchLines.
func touch(b []byte) {
	if len(b) > 0 {
		touchLines(unsafe.SliceData(b), uintptr(len(b)))
	}
}
