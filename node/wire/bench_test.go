package wire

import (
	"context"
	"fmt"
	"testing"
)

// A Put of 128 pages × 2 objects (K and V), each object in 1 range (page-first
// layouts) or 32 (one per layer, layer-first), encoded and decoded.
func BenchmarkPutEncodeDecode(b *testing.B) {
	for _, ranges := range []int{1, 32} {
		m := &Put{Items: putItems(128, 2, ranges)}
		b.Run(fmt.Sprintf("ranges=%d", ranges), func(b *testing.B) {
			var buf []byte
			b.ReportAllocs()
			for b.Loop() {
				buf = m.Marshal(buf[:0])
				if _, err := Decode(TypePut, buf); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(buf)), "body-bytes")
		})
	}
}

// The same Put sent and received over a socketpair: framing, validation and two
// syscalls a side.
func BenchmarkConnPut(b *testing.B) {
	for _, ranges := range []int{1, 32} {
		m := &Put{Items: putItems(128, 2, ranges)}
		b.Run(fmt.Sprintf("ranges=%d", ranges), func(b *testing.B) {
			a, c := socketpair(b)
			ctx := context.Background()
			errc := make(chan error, 1)
			b.ReportAllocs()
			for b.Loop() {
				go func() { errc <- a.Send(ctx, TypePut, 1, m) }()
				if _, _, _, err := c.Recv(ctx); err != nil {
					b.Fatal(err)
				}
				if err := <-errc; err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
