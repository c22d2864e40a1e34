package node

import (
	"fmt"
	"testing"
	"time"

	"github.com/stratakv/strata/node/wire"
)

// BenchmarkCopyGuard measures what the fault guard (guard: SetPanicOnFault and
// a deferred recover per copy) adds to a copy into a client's runs: copyToRuns
// against the same loop without the guard, alternated within each iteration so
// that both see the same machine, for a 2 MiB object part (a Llama-3-8B page of
// 32 tokens, K or V) and a small 16 KiB one. x-of-unguarded is the ratio of
// their times: 1.00 means the guard costs nothing visible.
func BenchmarkCopyGuard(b *testing.B) {
	for _, size := range []int{16 << 10, 2 << 20} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			src := make([]byte, size)
			for i := range src {
				src[i] = byte(i)
			}
			runs := [][]byte{make([]byte, size/2), make([]byte, size-size/2)}
			unguarded := func() {
				s := src
				for _, r := range runs {
					n := copy(r, s)
					s = s[n:]
				}
			}
			unguarded() // both copies find the destination mapped
			var guarded, plain time.Duration
			b.SetBytes(int64(2 * size))
			guardedCopy := func() {
				if err := copyToRuns(runs, src); err != nil {
					b.Fatal(err)
				}
			}
			for i := 0; i < b.N; i++ {
				// Each goes first every other time: the second copy of an iteration
				// finds the caches as the first left them.
				first, second, ft, st := guardedCopy, unguarded, &guarded, &plain
				if i%2 == 1 {
					first, second, ft, st = unguarded, guardedCopy, &plain, &guarded
				}
				t0 := time.Now()
				first()
				t1 := time.Now()
				second()
				t2 := time.Now()
				*ft += t1.Sub(t0)
				*st += t2.Sub(t1)
			}
			b.ReportMetric(float64(guarded)/float64(plain), "x-of-unguarded")
		})
	}
}

// BenchmarkExistsVsPing measures the service's Exists of 128 pages of an MHA
// model (256 object names, as the SGLang plugin's batch_exists sends) against a
// bare Ping on the same connection, alternated: x-of-ping is the ratio of their
// round trips, what the plugin's batch_exists target (<= 3x a Ping) is about.
func BenchmarkExistsVsPing(b *testing.B) {
	s := start(b, nil)
	c := dial(b, s)
	_, seg := c.segment(1 << 20)
	keys := make([]string, 0, 256)
	for i := range 128 {
		for _, part := range []string{"k", "v"} {
			keys = append(keys, fmt.Sprintf("org_2fmodel-1:%064x_0_%s", i, part))
		}
	}
	for i := 0; i < len(keys); i += 64 {
		items := make([]wire.Item, 0, 64)
		for _, k := range keys[i : i+64] {
			items = append(items, item(k, seg, 0, 4096))
		}
		for _, r := range c.batch(wire.TypePut, items...) {
			if r.Status != wire.OK {
				b.Fatalf("put: %v %s", r.Status, r.Message)
			}
		}
	}
	var exists, ping time.Duration
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		m, err := c.call(wire.TypeExists, wire.Exists{Keys: keys, Format: 7})
		t1 := time.Now()
		if _, err2 := c.call(wire.TypePing, wire.Ping{Nonce: uint64(i)}); err != nil || err2 != nil || m.(*wire.ExistsReply).Present != 256 {
			b.Fatalf("exists %+v %v, ping %v", m, err, err2)
		}
		exists += t1.Sub(t0)
		ping += time.Since(t1)
	}
	b.ReportMetric(float64(exists)/float64(b.N)/1e3, "exists-us")
	b.ReportMetric(float64(ping)/float64(b.N)/1e3, "ping-us")
	b.ReportMetric(float64(exists)/float64(ping), "x-of-ping")
}
