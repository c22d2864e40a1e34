package arena

import (
	"fmt"
	"path/filepath"
	"sync"
	"testing"
)

// The evictions a start checked are settled: ForgetEvictions keeps the next
// start from reporting them again (a key lost by one kill was reported at
// every start after it), while an eviction made after them is reported.
func TestCheckedEvictionsAreNotReportedAgain(t *testing.T) {
	path := filepath.Join(shmDir(t), "a")
	cfg := fileConfig(t, path, 16<<20)
	cfg.OnEvict = func(Evicted) bool { return true } // "kept elsewhere"
	a := newArena(t, cfg)
	for i := range 40 {
		put(t, a, fmt.Sprintf("k%d", i), 1, 1<<20)
	}
	if a.Stats().Spilled == 0 {
		t.Fatal("nothing was evicted")
	}
	crash(t, a)

	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	recent := b.RecentEvictions()
	if len(recent) == 0 {
		t.Fatal("the restart found no recent evictions")
	}
	b.ForgetEvictions(recent)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}

	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if again := c.RecentEvictions(); len(again) != 0 {
		t.Fatalf("%d evictions checked by the start before are reported again, e.g. %v", len(again), again[0])
	}
	// An eviction after them is reported at the next start; nothing else.
	waitRecovered(t, c)
	_ = c.Close()
	var mu sync.Mutex
	byC := map[string]bool{}
	cfgC := cfg
	cfgC.OnEvict = func(e Evicted) bool { mu.Lock(); byC[e.Key] = true; mu.Unlock(); return true }
	c = newArena(t, cfgC)
	waitRecovered(t, c)
	for i := range 40 {
		put(t, c, fmt.Sprintf("n%d", i), 1, 1<<20)
	}
	crash(t, c)
	d := newArena(t, cfg)
	if len(d.RecentEvictions()) == 0 {
		t.Fatal("the evictions made after the forgotten ones were not reported")
	}
	for _, e := range d.RecentEvictions() {
		if !byC[e.Key] {
			t.Fatalf("%s is reported as a recent eviction; the last service did not evict it", e.Key)
		}
	}
}
