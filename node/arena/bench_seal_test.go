package arena

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
)

// BenchmarkSealCost is what sealing (seal.go) costs a put: two writers, as
// the node's copy workers, Reserve, copy and Commit large objects into an
// arena file with the sealer on and with it off, alternated round by round
// (A B A B), next to a memcpy of the same bytes by two goroutines into
// memory of the same kind. Each round puts 256 MiB.
//
//	go test -run '^$' -bench SealCost -benchtime 1x ./node/arena
//
// sealed-on/off is the put rate with the sealer over the rate without
// (medians); on/memcpy the rate with it over memcpy's; lag-% how much of a
// round's bytes the sealer had not sealed when its last Commit returned
// (what a kill right then would drop), max-catchup-ms how long the sealer
// took after that to seal the rest (at most, polled every millisecond).
func BenchmarkSealCost(b *testing.B) {
	const rounds, perRound, writers = 5, 256 << 20, 2
	for _, size := range []int{256 << 10, 4 << 20} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			dir := shmDir(b)
			open := func(name string, noSeal bool) *Arena {
				cfg := DefaultConfig(perRound + 64<<20)
				cfg.File = filepath.Join(dir, name)
				cfg.Logger = slog.New(slog.DiscardHandler)
				cfg.noSeal = noSeal
				a, err := New(cfg)
				if err != nil {
					b.Skip(err)
				}
				b.Cleanup(func() { _ = a.Close() })
				<-a.Ready()
				return a
			}
			on, off := open("on", false), open("off", true)
			src := make([]byte, size)
			for i := range src {
				src[i] = byte(i * 7)
			}
			n := perRound / size
			var catchups []time.Duration
			round := func(a *Arena, r int) (time.Duration, float64) {
				keys := make([]string, n)
				for i := range keys {
					keys[i] = fmt.Sprintf("r%d/%d", r, i)
				}
				start := time.Now()
				var wg sync.WaitGroup
				for w := range writers {
					wg.Go(func() {
						for i := w; i < n; i += writers {
							p, err := a.Reserve(keys[i], 1, int64(size))
							if err != nil {
								b.Error(err)
								return
							}
							copy(p.Bytes(), src)
							if err := p.Commit(); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				wg.Wait()
				took := time.Since(start)
				lag := float64(a.Stats().Unsealed) / float64(n)
				ended := time.Now()
				for deadline := time.Now().Add(30 * time.Second); a.Stats().Unsealed > 0; time.Sleep(time.Millisecond) {
					if time.Now().After(deadline) {
						b.Fatal("the sealer did not catch up in 30 s")
					}
				}
				if !a.cfg.noSeal && r >= 0 {
					catchups = append(catchups, time.Since(ended))
				}
				for _, k := range keys {
					a.Remove(k)
				}
				return took, lag
			}
			// memcpy's peer: the same bytes into the same kind of memory (a
			// third arena file's mapping, touched first), two goroutines.
			ref := open("memcpy", true)
			dst := ref.mem[:perRound]
			memcpy := func() time.Duration {
				start := time.Now()
				var wg sync.WaitGroup
				for w := range writers {
					wg.Go(func() {
						for i := w; i < n; i += writers {
							copy(dst[i*size:(i+1)*size], src)
						}
					})
				}
				wg.Wait()
				return time.Since(start)
			}
			memcpy()
			round(on, -1)
			round(off, -1)
			var tOn, tOff, tCopy []time.Duration
			var lags []float64
			for b.Loop() {
				for r := range rounds {
					d, lag := round(on, r)
					tOn, lags = append(tOn, d), append(lags, lag)
					d, _ = round(off, r)
					tOff = append(tOff, d)
					tCopy = append(tCopy, memcpy())
				}
			}
			gbps := func(ds []time.Duration) float64 {
				return float64(perRound) / slices.Sorted(slices.Values(ds))[len(ds)/2].Seconds() / 1e9
			}
			b.ReportMetric(gbps(tOn), "sealed-GB/s")
			b.ReportMetric(gbps(tOff), "unsealed-GB/s")
			b.ReportMetric(gbps(tCopy), "memcpy-GB/s")
			b.ReportMetric(gbps(tOn)/gbps(tOff), "sealed-on/off")
			b.ReportMetric(gbps(tOn)/gbps(tCopy), "on/memcpy")
			b.ReportMetric(100*slices.Sorted(slices.Values(lags))[len(lags)/2], "lag-%")
			b.ReportMetric(float64(slices.Max(catchups).Microseconds())/1e3, "max-catchup-ms")
			b.ReportMetric(0, "ns/op")
		})
	}
}
