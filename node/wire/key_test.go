package wire

import (
	"math/rand/v2"
	"strings"
	"testing"
)

func printableSlow(k string) bool {
	for i := 0; i < len(k); i++ {
		if c := k[i]; c < 0x20 || c > 0x7e {
			return false
		}
	}
	return true
}

// printable checks sixteen bytes, then eight, then one at a time; it must
// agree with the byte loop on every byte value at every position of each, and
// on random strings.
func TestPrintableAgreesWithTheByteLoop(t *testing.T) {
	for n := 0; n <= 28; n++ {
		for pos := 0; pos < n; pos++ {
			for c := 0; c < 256; c++ {
				b := []byte(strings.Repeat("a~ 0", 8)[:n])
				b[pos] = byte(c)
				if k := string(b); printable(k) != printableSlow(k) {
					t.Fatalf("printable(%q) = %v", k, printable(k))
				}
			}
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		b := make([]byte, rng.IntN(40))
		for i := range b {
			b[i] = byte(0x1c + rng.IntN(0x66)) // mostly printable, edges on both sides
			if rng.IntN(50) == 0 {
				b[i] = byte(rng.IntN(256))
			}
		}
		if k := string(b); printable(k) != printableSlow(k) {
			t.Fatalf("printable(%q) = %v", k, printable(k))
		}
	}
}
