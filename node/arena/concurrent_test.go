package arena

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestConcurrentUse runs 8 goroutines that write, read, hold, remove and check
// objects in a small arena under constant eviction, background and synchronous,
// then checks the arena's invariants with a full walk.
func TestConcurrentUse(t *testing.T) {
	const (
		workers  = 8
		keys     = 96
		maxSize  = 64 << 10
		runFor   = 400 * time.Millisecond
		maxHeld  = 3 // leases a worker holds at once
		formatOK = 1
	)
	// An object's bytes are a prefix of its key's pattern, computed once here.
	patterns := map[string][]byte{}
	for k := range keys {
		key := fmt.Sprintf("key-%d", k)
		patterns[key] = pattern(key, maxSize)
	}
	pattern := func(key string, n int) []byte { return patterns[key][:n] }
	cfg := testConfig(t, 1<<20)
	var evicted, badEvict atomic.Int64
	cfg.OnEvict = func(e Evicted) bool {
		if !bytes.Equal(e.Bytes, pattern(e.Key, len(e.Bytes))) {
			badEvict.Add(1)
		}
		return evicted.Add(1)%3 != 0
	}
	a := newArena(t, cfg)
	var ops [6]atomic.Int64 // written, exists, no space, read, missed, removed
	deadline := time.Now().Add(runFor)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			var held []*Lease
			var hold *Pending
			defer func() {
				for _, l := range held {
					l.Release()
				}
				if hold != nil {
					hold.Abort()
				}
			}()
			for i := 0; time.Now().Before(deadline); i++ {
				key := fmt.Sprintf("key-%d", rng.IntN(keys))
				format := uint64(formatOK)
				if rng.IntN(20) == 0 {
					format = 2
				}
				switch r := rng.IntN(100); {
				case r < 40: // write
					size := 1 + rng.IntN(maxSize)
					if rng.IntN(2) == 0 {
						size = 1 + rng.IntN(4000) // a small object: a slot in a slab
					}
					p, err := a.Reserve(key, format, int64(size))
					switch {
					case errors.Is(err, ErrExists):
						ops[1].Add(1)
						continue
					case errors.Is(err, ErrNoSpace):
						ops[2].Add(1)
						continue
					case err != nil:
						t.Errorf("reserve %s: %v", key, err)
						return
					}
					copy(p.Bytes(), pattern(key, size))
					switch {
					case rng.IntN(10) == 0:
						p.Abort()
					case rng.IntN(10) == 0 && hold == nil:
						hold = p // committed a while later
					default:
						if err := p.Commit(); err != nil && !errors.Is(err, ErrRemoved) {
							t.Errorf("commit %s: %v", key, err)
							return
						}
						ops[0].Add(1)
					}
				case r < 80: // read
					l, err := a.Acquire(key, format)
					if errors.Is(err, ErrNotFound) || errors.Is(err, ErrFormat) {
						ops[4].Add(1)
						continue
					}
					if err != nil {
						t.Errorf("acquire %s: %v", key, err)
						return
					}
					ops[3].Add(1)
					if !bytes.Equal(l.Bytes(), pattern(key, len(l.Bytes()))) {
						t.Errorf("%s: read bytes differ from the written", key)
					}
					held = append(held, l)
				case r < 84: // a batch read under one lock
					batch := []string{key, fmt.Sprintf("key-%d", rng.IntN(keys))}
					ls, errs := make([]Lease, len(batch)), make([]error, len(batch))
					if err := a.AcquireInto(batch, format, ls, errs); err != nil {
						t.Errorf("acquire %q: %v", batch, err)
						return
					}
					for i := range ls {
						l := &ls[i]
						if errs[i] != nil {
							if !errors.Is(errs[i], ErrNotFound) && !errors.Is(errs[i], ErrFormat) {
								t.Errorf("acquire %s in a batch: %v", batch[i], errs[i])
							}
							continue
						}
						ops[3].Add(1)
						if !bytes.Equal(l.Bytes(), pattern(l.Key(), len(l.Bytes()))) {
							t.Errorf("%s: read bytes differ from the written", l.Key())
						}
						held = append(held, l)
					}
				case r < 88:
					if a.Remove(key) {
						ops[5].Add(1)
					}
				case r < 90:
					if hold != nil {
						// A removal of the key while it was written dooms it.
						if err := hold.Commit(); err != nil && !errors.Is(err, ErrRemoved) {
							t.Errorf("commit %s: %v", hold.Key(), err)
						}
						hold = nil
					}
				case r < 92 && w == 0:
					if err := a.Check(); err != nil {
						t.Errorf("check while running: %v", err)
					}
				default:
					_ = a.Contains(key, format)
					_ = a.Stats()
				}
				// Check leased bytes still hold, then let the oldest go.
				if len(held) > maxHeld || len(held) > 0 && rng.IntN(3) == 0 {
					l := held[0]
					if !bytes.Equal(l.Bytes(), pattern(l.Key(), len(l.Bytes()))) {
						t.Errorf("%s: leased bytes changed", l.Key())
					}
					l.Release()
					held = held[1:]
				}
			}
		}()
	}
	wg.Wait()
	mustCheck(t, a)
	st := a.Stats()
	t.Logf("written %d, exists %d, no space %d, read %d, missed %d, removed %d; %+v",
		ops[0].Load(), ops[1].Load(), ops[2].Load(), ops[3].Load(), ops[4].Load(), ops[5].Load(), st)
	if badEvict.Load() > 0 {
		t.Errorf("OnEvict saw wrong bytes %d times", badEvict.Load())
	}
	if st.Leases != 0 || st.LeasedObjects != 0 || st.PendingObjects != 0 || st.PendingBytes != 0 {
		t.Errorf("leases or writes left after every worker ended its own: %+v", st)
	}
	if st.Evictions == 0 || st.Spilled+st.Dropped != st.Evictions || st.Dropped == 0 || st.Spilled == 0 {
		t.Errorf("eviction counters: %+v", st)
	}
	if st.UsedBytes > st.SizeBytes || st.HeldBytes > st.UsedBytes || st.ObjectBytes > st.HeldBytes || st.Slabs == 0 {
		t.Errorf("fill out of range: %+v", st)
	}
	// Every remaining object reads back as written.
	for k := range keys {
		key := fmt.Sprintf("key-%d", k)
		for _, f := range []uint64{1, 2} {
			if l, err := a.Acquire(key, f); err == nil {
				if !bytes.Equal(l.Bytes(), pattern(key, len(l.Bytes()))) {
					t.Errorf("%s: bytes differ at the end", key)
				}
				l.Release()
			}
		}
	}
}
