package spill

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stratakv/strata/storage"
)

// Puts, gets and removes from many goroutines, over a spill small enough to
// drop segments while they run: a get serves the key's own bytes or misses,
// never another key's or damaged ones, and the stats add up.
func TestConcurrent(t *testing.T) {
	cfg := testConfig(t.TempDir())
	cfg.CapacityBytes = 2 << 20
	s := open(t, cfg)
	const workers, per = 4, 150
	sizes := []int{700, 9000, 40_000, 100_000} // the last is written directly
	var wg sync.WaitGroup
	errs := make(chan error, workers*per)
	for w := 0; w < workers; w++ {
		wg.Go(func() {
			for i := 0; i < per; i++ {
				// Keys repeat across workers, so puts of one key race.
				k := i*workers + w%2
				key, n := fmt.Sprintf("k%d", k), sizes[k%len(sizes)]
				want := data(n, k)
				if err := s.PutObject(bg, key, 7, want); err != nil {
					errs <- fmt.Errorf("put %s: %w", key, err)
					continue
				}
				for _, back := range []int{0, 3, 17} {
					j := k - back*workers
					if j < 0 {
						continue
					}
					key, n := fmt.Sprintf("k%d", j), sizes[j%len(sizes)]
					got, err := get(s, key, n)
					switch {
					case errors.Is(err, storage.ErrNotFound):
					case err != nil:
						errs <- fmt.Errorf("get %s: %w", key, err)
					case string(got) != string(data(n, j)):
						errs <- fmt.Errorf("get %s: another object's bytes", key)
					}
				}
				if i%10 == 0 {
					if _, err := s.RemoveObject(bg, key); err != nil {
						errs <- fmt.Errorf("remove %s: %w", key, err)
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	s.flush()
	st := s.Stats()
	if st.Bytes > cfg.CapacityBytes || st.CorruptRemoved != 0 || st.WriteErrors != 0 || st.BufferedBytes != 0 {
		t.Fatalf("stats %+v", st)
	}
	if st.Writes-st.Removed-st.Evictions != st.Objects {
		t.Fatalf("writes %d - removed %d - evictions %d != objects %d", st.Writes, st.Removed, st.Evictions, st.Objects)
	}
}
