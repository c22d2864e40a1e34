package pagekey

import (
	"crypto/sha256"
	"testing"
	"unsafe"

	"github.com/stratakv/strata/internal/benchpeer"
)

// The figure: keys for 131072 tokens at page 64 against crypto/sha256 over the
// same 512 KiB. Two peers are reported: the same bytes hashed as one message (the
// streaming limit) and hashed as one message per 256-byte page (what any per-page
// content address has to do). A chained page costs 288 input bytes and padding, so 5
// SHA-256 blocks against the 4 that one long message spends on the same 256 bytes;
// against the one-message peer the ceiling is therefore 0.8.
func BenchmarkKeys131072(b *testing.B) {
	for _, algo := range []Algorithm{SHA256, XXH3} {
		b.Run(algo.String(), func(b *testing.B) {
			tokens := benchTokens(131072)
			raw := unsafe.Slice((*byte)(unsafe.Pointer(&tokens[0])), 4*len(tokens))
			h, _ := New(Config{PageSize: 64, Algorithm: algo})
			dst := make([]Key, 0, 2048)
			b.SetBytes(int64(len(raw)))
			ours := func(int) { dst = h.AppendKeys(dst[:0], Key{}, tokens) }
			if algo != SHA256 {
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					ours(i)
				}
				return
			}
			benchpeer.CompareAll(b, ours, []benchpeer.Peer{
				{Unit: "x-of-sha256-per-page", Run: func(int) {
					for p := 0; p < len(raw); p += 256 {
						_ = sha256.Sum256(raw[p : p+256])
					}
				}},
				{Unit: "x-of-sha256-one-message", Run: func(int) { _ = sha256.Sum256(raw) }},
			}, benchpeer.Options{})
		})
	}
}

func benchTokens(n int) []uint32 {
	t := make([]uint32, n)
	x := uint32(2463534242)
	for i := range t {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		t[i] = x % 151936
	}
	return t
}
