package file

import (
	"testing"
	"time"

	"github.com/stratakv/strata/kvlayout"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/storage/storagetest"
)

// BenchmarkPutGet128 puts a batch of 128 fresh pages (64 KiB K and V parts, 16 MiB
// in all) and gets them back into other pages, and reports its throughput as a
// fraction of memcpy of the same bytes in the same run.
func BenchmarkPutGet128(b *testing.B) {
	geometry := kvlayout.Geometry{Layers: 2, KVHeads: 8, HeadDim: 128, DTypeBytes: 2}
	for _, c := range []struct {
		name         string
		direct, sync bool
	}{
		{"direct-sync", true, true},
		{"direct", true, false},
		{"buffered", false, false},
	} {
		b.Run(c.name, func(b *testing.B) {
			cfg := testConfig(b.TempDir(), nil)
			cfg.DirectIO, cfg.Sync = c.direct, c.sync
			cfg.CapacityBytes = 1 << 30
			s := newStore(b, cfg)
			const n = 128
			g := storagetest.NewGroupPages(b, s, kvlayout.PageFirst, 16, 2*n, []pool.PoolSpec{{Name: kv, Geometry: geometry}})
			storagetest.Register(b, s, g)
			spec := g.Spec(kv)
			src, dst := make([]pool.PageID, n), make([]pool.PageID, n)
			for i := range src {
				src[i], dst[i] = pool.PageID(i), pool.PageID(n+i)
			}
			bytes := int64(n) * spec.Layout.PageBytes()
			mem := spec.Region.Bytes()
			start := time.Now()
			for range 8 {
				copy(mem[bytes:2*bytes], mem[:bytes])
			}
			memcpy := time.Since(start) / 8
			b.SetBytes(2 * bytes)
			var putTime, getTime time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				keys := storagetest.Keys(b, uint64(i)+1000, n)
				t0 := time.Now()
				for j, err := range s.Put(bg, kv, keys, src) {
					if err != nil {
						b.Fatalf("put %d: %v", j, err)
					}
				}
				t1 := time.Now()
				for j, err := range s.Get(bg, kv, keys, dst) {
					if err != nil {
						b.Fatalf("get %d: %v", j, err)
					}
				}
				putTime += t1.Sub(t0)
				getTime += time.Since(t1)
			}
			b.ReportMetric(float64(bytes)*float64(b.N)/putTime.Seconds()/1e6, "put-MB/s")
			b.ReportMetric(float64(bytes)*float64(b.N)/getTime.Seconds()/1e6, "get-MB/s")
			per := b.Elapsed() / time.Duration(b.N)
			b.ReportMetric(float64(2*memcpy)/float64(per), "x-of-memcpy")
			if st := s.Stats(); st.DirectIO != c.direct {
				b.Logf("direct I/O fell back to buffered")
			}
		})
	}
}
