//go:build !amd64

package pool

// copyRun copies src into dst.
func copyRun(dst, src []byte) { copy(dst, src) }

// copyRunPrefetch copies src into dst; next is a hint that only amd64 uses.
func copyRunPrefetch(dst, src, next []byte) { copy(dst, src) }

// copyStreaming has no streaming-store version off amd64.
func copyStreaming(dst, src []byte) { copy(dst, src) }

func finishRuns() {}

// copyRuns copies count runs of run bytes, the i-th from src[soff+i*sstep:] to
// dst[doff+i*dstep:].
func copyRuns(dst []byte, doff, dstep int64, src []byte, soff, sstep, run int64, count int, pf int64) {
	for i := int64(0); i < int64(count); i++ {
		d, s := doff+i*dstep, soff+i*sstep
		copy(dst[d:d+run], src[s:s+run])
	}
}

// touch reads one byte of every 64-byte cache line of b, so that a copy that skips
// part of a sequential source still reads it as one stream (see copyPageLayers).
// It is not inlined, so that the compiler keeps the loads whose result it drops.
//
//go:noinline
func touch(b []byte) byte {
	var x byte
	for i := 0; i < len(b); i += 64 {
		x ^= b[i]
	}
	return x
}
