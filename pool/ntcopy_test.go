package pool

import (
	"bytes"
	"testing"
)

// copyStreaming must equal copy for every length and alignment, including the
// unaligned destinations and tails it hands to the plain copy.
func TestStreamingCopyMatchesCopy(t *testing.T) {
	src := make([]byte, 8192+64)
	for i := range src {
		src[i] = byte(i*31 + 7)
	}
	for _, n := range []int{0, 1, 15, 63, 64, 65, 127, 1024, 2048, 2049, 4095, 8192} {
		for _, dOff := range []int{0, 1, 8, 16, 32} {
			for _, sOff := range []int{0, 3, 16} {
				dst := make([]byte, n+64)
				want := make([]byte, n+64)
				copy(want[dOff:dOff+n], src[sOff:sOff+n])
				copyStreaming(dst[dOff:dOff+n], src[sOff:sOff+n])
				finishRuns()
				if !bytes.Equal(dst, want) {
					t.Fatalf("n=%d dst+%d src+%d: streaming copy differs", n, dOff, sOff)
				}
			}
		}
	}
}
