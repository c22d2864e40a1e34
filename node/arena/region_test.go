package arena

import (
	"fmt"
	"testing"
)

// Region eviction: a Reserve in a fragmented arena evicts in proportion to the
// size it needs, not object after object in LRU order. The tests count
// evictions; none depends on time.

// useInOrder acquires and releases keys in order, so that the first is the least
// recently used afterwards.
func useInOrder(t *testing.T, a *Arena, keys []string) {
	t.Helper()
	for _, k := range keys {
		l, err := a.Acquire(k, 1)
		if err != nil {
			t.Fatalf("acquire %s: %v", k, err)
		}
		l.Release()
	}
}

func TestReserveInFragmentedArenaEvictsRegions(t *testing.T) {
	const unit = 4096
	const n = 240 // and one slab of 16 units for their descriptors
	cfg := testConfig(t, (n+16)*unit)
	cfg.HighWatermark, cfg.LowWatermark = 1, 0.99 // only the Reserve evicts
	evicted := 0
	cfg.OnEvict = func(Evicted) bool { evicted++; return true }
	a := newArena(t, cfg)
	key := func(i int) string { return fmt.Sprintf("obj-%03d", i) }
	for i := range n {
		put(t, a, key(i), 1, unit)
	}
	// LRU order: every even object, then every odd one. Evicting in that order
	// leaves 1-unit holes until half the arena is gone.
	var order []string
	for i := 0; i < n; i += 2 {
		order = append(order, key(i))
	}
	for i := 1; i < n; i += 2 {
		order = append(order, key(i))
	}
	useInOrder(t, a, order)

	const need = 16 // 64 KiB
	put(t, a, "big", 1, need*unit)
	// LRU eviction alone takes the 128 even objects and then 8 odd ones (136).
	// Region eviction: lruVictims, then the neighbours of the largest free
	// extent until it holds 16 units: at most one per unit it needs.
	t.Logf("a 64 KiB Reserve evicted %d objects (%d regions)", evicted, a.Stats().RegionEvictions)
	if max := lruVictims + need; evicted > max {
		t.Fatalf("a 64 KiB Reserve in a fragmented arena evicted %d objects; want at most %d", evicted, max)
	}
	st := a.Stats()
	if st.Evictions != int64(evicted) || st.RegionEvictions == 0 {
		t.Fatalf("stats %+v after %d evictions: want them counted, some as regions", st, evicted)
	}
	read(t, a, "big", 1, need*unit)
	mustCheck(t, a)
}

func TestReserveInArenaFullOfSlabsEvictsOneSlab(t *testing.T) {
	const unit = 4096
	const slabs = 16
	cfg := testConfig(t, slabs*64<<10) // 16 slabs of 64 KiB
	cfg.HighWatermark, cfg.LowWatermark = 1, 0.99
	evicted := 0
	cfg.OnEvict = func(Evicted) bool { evicted++; return true }
	a := newArena(t, cfg)
	const size = 100
	key := func(i int) string { return fmt.Sprintf("s-%05d", i) }
	// 100 bytes, a 7-byte key and the trailer: class 160, 409 per slab.
	perSlab := int(int64(64<<10) / classes[classOf(size+7+trailerBytes)])
	total := slabs * perSlab
	for i := range total {
		put(t, a, key(i), 1, size)
	}
	if st := a.Stats(); st.Slabs != slabs || st.UsedBytes != st.SizeBytes || st.FreeExtents != 0 {
		t.Fatalf("after filling: %+v, want %d full slabs and nothing free", st, slabs)
	}
	// LRU order round robin over the slabs: evicting in LRU order would empty no
	// slab until nearly every object is gone.
	var order []string
	for i := range perSlab {
		for s := range slabs {
			order = append(order, key(s*perSlab+i))
		}
	}
	useInOrder(t, a, order)

	// The first large object needs a slab for its descriptor too: two slabs'
	// worth of room, one for its bytes, one for the descriptors of every large
	// object after it.
	put(t, a, "big", 1, 16*unit)
	t.Logf("a 64 KiB Reserve evicted %d objects, %d per slab", evicted, perSlab)
	if max := 2 * (lruVictims + perSlab); evicted > max {
		t.Fatalf("a 64 KiB Reserve in an arena full of slabs evicted %d objects; want at most %d (two slabs')", evicted, max)
	}
	if st := a.Stats(); st.Slabs != slabs-1 || st.Objects != int64(total-evicted+1) {
		t.Fatalf("stats %+v after %d evictions: want two slabs gone and one of descriptors", st, evicted)
	}
	// The next large object's descriptor takes a slot of that slab: one
	// slab's worth at most.
	evicted = 0
	put(t, a, "big2", 1, 16*unit)
	if max := lruVictims + perSlab; evicted > max {
		t.Fatalf("a second 64 KiB Reserve evicted %d objects; want at most %d (one slab's)", evicted, max)
	}
	read(t, a, "big", 1, 16*unit)
	mustCheck(t, a)
}

// A small object of a class with no free slot, in an arena without a free
// extent, evicts a slab's worth at most, not the arena.
func TestSmallReserveWithoutFreeSlotEvictsOneSlab(t *testing.T) {
	const slabs = 8
	cfg := testConfig(t, slabs*64<<10)
	cfg.HighWatermark, cfg.LowWatermark = 1, 0.99
	evicted := 0
	cfg.OnEvict = func(Evicted) bool { evicted++; return true }
	a := newArena(t, cfg)
	key := func(i int) string { return fmt.Sprintf("s-%05d", i) }
	perSlab := int(int64(64<<10) / classes[classOf(100+7+trailerBytes)])
	for i := range slabs * perSlab {
		put(t, a, key(i), 1, 100)
	}
	var order []string
	for i := range perSlab {
		for s := range slabs {
			order = append(order, key(s*perSlab+i))
		}
	}
	useInOrder(t, a, order)
	// 1000 bytes: another class, whose first slab needs a free extent.
	put(t, a, "other-class", 1, 1000)
	t.Logf("a Reserve of a new class evicted %d objects, %d per slab", evicted, perSlab)
	if max := lruVictims + perSlab; evicted > max {
		t.Fatalf("a small Reserve of a new class evicted %d objects; want at most %d", evicted, max)
	}
	read(t, a, "other-class", 1, 1000)
	mustCheck(t, a)
}

// Slabs left mostly empty by removals fill the extents while the objects hold
// little: the background evictor frees whole slabs until the extents are back at
// the low watermark, so that large Reserves find room without evicting.
func TestBackgroundEvictsSparseSlabs(t *testing.T) {
	const slabs = 16
	cfg := testConfig(t, slabs*64<<10)
	a := newArena(t, cfg)
	key := func(i int) string { return fmt.Sprintf("s-%05d", i) }
	// 14 slabs of 100-byte objects: 87.5 %, below the high watermark (90 %) and
	// above the low one, so nothing may ask the evictor for a pass (paused, it
	// keeps any request where the test sees it).
	resume := pauseEvictor(a)
	perSlab := int(int64(64<<10) / classes[classOf(100+7+trailerBytes)])
	n := 14 * perSlab
	for i := range n {
		put(t, a, key(i), 1, 100)
	}
	if evictorAsked(a) {
		t.Fatalf("14 of 16 slabs asked for an eviction pass below the high watermark: %+v", a.Stats())
	}
	// Nine in ten go: the slabs stay, and the objects hold a tenth of them.
	for i := range n {
		if i%10 != 0 && !a.Remove(key(i)) {
			t.Fatalf("remove of %s failed", key(i))
		}
	}
	if st := a.Stats(); st.Slabs != 14 || st.Evictions != 0 || st.Objects != int64((n+9)/10) || evictorAsked(a) {
		t.Fatalf("after removals: %+v, pass asked for %v", st, evictorAsked(a))
	}
	resume()
	// Two slabs of another class fill the extents: past the high watermark.
	for i := range 100 {
		put(t, a, fmt.Sprintf("kib-%03d", i), 1, 1000)
	}
	// Each Reserve or Commit that leaves the extents past the high watermark wakes
	// the evictor, which frees regions until they are at the low one: once it
	// has, they stay at or below the high watermark.
	high := int64(cfg.HighWatermark * float64(cfg.SizeBytes))
	waitFor(t, "region eviction of the extents", func() bool {
		st := a.Stats()
		return st.RegionEvictions > 0 && st.UsedBytes <= high
	})
	st := a.Stats()
	t.Logf("after background eviction: %+v", st)
	if st.Evictions == 0 || st.Slabs >= slabs {
		t.Fatalf("stats %+v: want slabs freed by region eviction", st)
	}
	mustCheck(t, a)
}
