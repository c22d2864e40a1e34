package arena

import (
	"runtime"
	"sync"
	"testing"
	"time"
)

// The warm-up populates chunks on more than one goroutine where there are
// cores for them (page faults scale with cores; BenchmarkWarmup): here two
// chunks are being populated at once, or neither returns. With OnWarmup it
// keeps to one, so that a hook that blocks holds it.
func TestWarmupPopulatesChunksInParallel(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	for _, hooked := range []bool{false, true} {
		cfg := testConfig(t, 4*warmChunkBytes)
		cfg.Warmup = true
		var mu sync.Mutex
		inFlight, most := 0, 0
		both := make(chan struct{})
		bothOnce := sync.OnceFunc(func() { close(both) })
		cfg.populate = func(off, n int64) error {
			mu.Lock()
			inFlight++
			most = max(most, inFlight)
			if inFlight == 2 {
				bothOnce()
			}
			mu.Unlock()
			if !hooked {
				select {
				case <-both:
				case <-time.After(10 * time.Second):
					t.Error("one chunk populated alone for 10 s: the warm-up runs on one goroutine")
				}
			}
			mu.Lock()
			inFlight--
			mu.Unlock()
			return nil
		}
		if hooked {
			cfg.OnWarmup = func(ready, total int64) {}
		}
		a := newArena(t, cfg)
		<-a.Ready()
		if st := a.Stats(); st.ReadyBytes != 4*warmChunkBytes {
			t.Fatalf("after the warm-up: %+v", st)
		}
		if want := map[bool]int{false: 2, true: 1}[hooked]; most != want {
			t.Fatalf("OnWarmup set %v: at most %d chunks populated at once, want %d", hooked, most, want)
		}
		mustCheck(t, a)
	}
}
