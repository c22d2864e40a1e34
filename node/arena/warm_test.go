package arena

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
)

// The warm-up hands the arena's memory to the allocator chunk by chunk as it
// is populated: a Reserve that finds no room waits for the next chunk rather
// than evict, and memory that cannot be populated is never given out.

// warmConfig is an arena of size bytes warmed up in the background, paused
// once pauseAt bytes are ready until resume is closed.
func warmConfig(t *testing.T, size, pauseAt int64) (cfg Config, paused, resume chan struct{}) {
	cfg = testConfig(t, size)
	cfg.Warmup = true
	paused, resume = make(chan struct{}), make(chan struct{})
	cfg.OnWarmup = func(ready, total int64) {
		if total != size {
			t.Errorf("OnWarmup of %d bytes in all, want %d", total, size)
		}
		if ready == pauseAt {
			close(paused)
			<-resume
		}
	}
	return cfg, paused, resume
}

func TestWarmupGivesOutPopulatedMemoryOnly(t *testing.T) {
	const chunk = warmChunkBytes
	cfg, paused, resume := warmConfig(t, 4*chunk, chunk)
	var populated atomic.Int64
	cfg.populate = func(off, n int64) error { populated.Add(n); return nil }
	evicted := 0
	cfg.OnEvict = func(Evicted) bool { evicted++; return true }
	a := newArena(t, cfg)
	<-paused // chunk 0 is populated, the rest withheld
	st := a.Stats()
	if st.Ready || st.ReadyBytes != chunk || st.UsedBytes != 0 || st.LargestFreeExtent != chunk || populated.Load() != chunk {
		t.Fatalf("one chunk warmed: %+v (populated %d)", st, populated.Load())
	}
	mustCheck(t, a)
	put(t, a, "first", 1, 8<<20) // fits in what is warm
	// Larger than what is free and warm: it waits for the warm-up, evicting
	// nothing.
	done := make(chan error, 1)
	go func() {
		p, err := a.Reserve("big", 1, chunk)
		if err == nil {
			err = p.Commit()
		}
		done <- err
	}()
	waitFor(t, "the reserve to wait for the warm-up", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.warm.waits > 0
	})
	select {
	case err := <-done:
		t.Fatalf("a reserve larger than the warm memory returned before the warm-up went on: %v", err)
	default:
	}
	close(resume)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	<-a.Ready()
	st = a.Stats()
	if !st.Ready || st.ReadyBytes != 4*chunk || evicted != 0 || st.Evictions != 0 || populated.Load() != 4*chunk {
		t.Fatalf("after the warm-up: %+v, %d evicted", st, evicted)
	}
	read(t, a, "first", 1, 8<<20)
	mustCheck(t, a)
}

// A chunk whose memory cannot be populated (its tmpfs or huge page pool is
// full) is never given out: a Reserve that would need it evicts or fails as
// in a smaller arena, and never waits for it.
func TestWarmupLeavesUnpopulatedMemoryUnused(t *testing.T) {
	const chunk = warmChunkBytes
	cfg := testConfig(t, 3*chunk)
	cfg.Warmup = true
	cfg.HighWatermark, cfg.LowWatermark = 1, 0.99
	cfg.populate = func(off, n int64) error {
		if off == chunk {
			return errors.New("no room")
		}
		return nil
	}
	a := newArena(t, cfg)
	<-a.Ready()
	st := a.Stats()
	if st.UnusableBytes != chunk || st.ReadyBytes != 2*chunk || st.UsedBytes != 0 || st.LargestFreeExtent != chunk {
		t.Fatalf("with one chunk unusable: %+v", st)
	}
	for i := range 12 {
		put(t, a, fmt.Sprint(i), 1, 8<<20) // 2 chunks hold 8, less the descriptors' slab
	}
	if st := a.Stats(); st.Evictions == 0 || st.UsedBytes > 2*chunk {
		t.Fatalf("filling past the usable memory: %+v", st)
	}
	mustCheck(t, a)
}
