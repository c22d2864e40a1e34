package arena

import (
	"bytes"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/storage"
)

// fataler is what test helpers need of a *testing.T, a *testing.B or a
// *rapid.T.
type fataler interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

// testAllocator maps memory without prefaulting or a reserve, so tests start fast.
func testAllocator(t fataler) *hostmem.Allocator {
	t.Helper()
	al, err := hostmem.New(hostmem.Config{Kind: hostmem.Mmap})
	if err != nil {
		t.Fatal(err)
	}
	return al
}

// testConfig is an arena of size bytes with the default watermarks, test memory
// handed out at once (no warm-up, so that what a test sees does not depend on
// how far a background goroutine got) and no log output.
func testConfig(t fataler, size int64) Config {
	cfg := DefaultConfig(size)
	cfg.Allocator = testAllocator(t)
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.Warmup = false
	return cfg
}

func newArena(t testing.TB, cfg Config) *Arena {
	t.Helper()
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	return a
}

// pattern is size bytes that depend on key, so any reader can check an object.
func pattern(key string, size int) []byte {
	h := fnv.New64a()
	h.Write([]byte(key))
	s := h.Sum64()
	b := make([]byte, size)
	for i := range b {
		if i%8 == 0 {
			s ^= s << 13
			s ^= s >> 7
			s ^= s << 17
		}
		b[i] = byte(s >> (i % 8 * 8))
	}
	return b
}

// put writes key as the pattern of size bytes.
func put(t testing.TB, a *Arena, key string, format uint64, size int) {
	t.Helper()
	p, err := a.Reserve(key, format, int64(size))
	if err != nil {
		t.Fatalf("reserve %s: %v", key, err)
	}
	copy(p.Bytes(), pattern(key, size))
	if err := p.Commit(); err != nil {
		t.Fatalf("commit %s: %v", key, err)
	}
}

// read checks that key holds its pattern of size bytes.
func read(t testing.TB, a *Arena, key string, format uint64, size int) {
	t.Helper()
	l, err := a.Acquire(key, format)
	if err != nil {
		t.Fatalf("acquire %s: %v", key, err)
	}
	defer l.Release()
	if !bytes.Equal(l.Bytes(), pattern(key, size)) {
		t.Fatalf("%s: bytes differ from what was written", key)
	}
}

// descSlab is the slab that holds large objects' descriptors (their keys and
// trailers, layout.go): the first large object of an arena takes one.
const descSlab = 64 << 10

// descSlot is the descriptor slot of a large object under a key of n bytes.
func descSlot(n int) int64 { return classes[classOf(int64(n)+descBytes)] }

func mustCheck(t testing.TB, a *Arena) {
	t.Helper()
	if err := a.Check(); err != nil {
		t.Fatal(err)
	}
}

func TestConfigValidation(t *testing.T) {
	al := testAllocator(t)
	for _, c := range []struct {
		name  string
		tweak func(*Config)
		ok    bool
	}{
		{"default", func(*Config) {}, true},
		{"zero alignment means 4096", func(c *Config) { c.Alignment = 0 }, true},
		{"alignment 1", func(c *Config) { c.Alignment = 1 }, true},
		{"high of 1", func(c *Config) { c.HighWatermark = 1 }, true},
		{"zero size", func(c *Config) { c.SizeBytes = 0 }, false},
		{"negative size", func(c *Config) { c.SizeBytes = -1 }, false},
		{"size below alignment", func(c *Config) { c.SizeBytes = 100 }, false},
		{"alignment not a power of two", func(c *Config) { c.Alignment = 3000 }, false},
		{"negative alignment", func(c *Config) { c.Alignment = -4096 }, false},
		{"huge alignment", func(c *Config) { c.Alignment = 1 << 31 }, false},
		{"low equals high", func(c *Config) { c.LowWatermark = c.HighWatermark }, false},
		{"low above high", func(c *Config) { c.LowWatermark, c.HighWatermark = 0.9, 0.8 }, false},
		{"zero low", func(c *Config) { c.LowWatermark = 0 }, false},
		{"high above 1", func(c *Config) { c.HighWatermark = 1.1 }, false},
		{"NaN high", func(c *Config) { c.HighWatermark = math.NaN() }, false},
		{"zero value", func(c *Config) { *c = Config{Allocator: c.Allocator} }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := DefaultConfig(1 << 20)
			cfg.Allocator = al
			c.tweak(&cfg)
			a, err := New(cfg)
			if c.ok {
				if err != nil {
					t.Fatal(err)
				}
				if err := a.Close(); err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrConfig) {
				t.Fatalf("got %v, want ErrConfig", err)
			}
		})
	}
}

func TestWriteOnceReadBack(t *testing.T) {
	a := newArena(t, testConfig(t, 1<<20))
	p, err := a.Reserve("k", 7, 10000)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Abort() // a no-op after Commit
	if len(p.Bytes()) != 10000 || cap(p.Bytes()) != 10000 {
		t.Fatalf("reserved %d bytes (cap %d), want 10000", len(p.Bytes()), cap(p.Bytes()))
	}
	if addr := uintptr(unsafe.Pointer(unsafe.SliceData(p.Bytes()))); addr%4096 != 0 {
		t.Fatalf("object at %#x is not 4 KiB aligned", addr)
	}
	copy(p.Bytes(), pattern("k", 10000))

	// Pending: invisible, but the key is taken.
	if _, err := a.Acquire("k", 7); !errors.Is(err, ErrNotFound) || !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("acquire of a pending object: %v", err)
	}
	if a.Contains("k", 7) || a.ContainsPrefix([]string{"k"}, 7) != 0 {
		t.Fatal("a pending object is visible to Contains or ContainsPrefix")
	}
	if _, err := a.Reserve("k", 7, 10000); !errors.Is(err, ErrExists) {
		t.Fatalf("second reserve of a pending key: %v", err)
	}
	// The object's extent and its descriptor's slot, in a slab of descriptors.
	if st := a.Stats(); st.PendingObjects != 1 || st.PendingBytes != 12288+descSlot(1) || st.Objects != 0 || st.UsedBytes != 12288+descSlab {
		t.Fatalf("stats while pending: %+v", st)
	}

	if err := p.Commit(); err != nil {
		t.Fatal(err)
	}
	if p.Bytes() != nil {
		t.Fatal("Pending.Bytes after Commit is not nil")
	}
	if err := p.Commit(); !errors.Is(err, ErrDone) {
		t.Fatalf("second commit: %v", err)
	}
	read(t, a, "k", 7, 10000)
	if !a.Contains("k", 7) || a.Contains("k", 8) || a.Contains("other", 7) {
		t.Fatal("Contains is wrong")
	}
	for _, tc := range []struct {
		keys   []string
		format uint64
		want   int
	}{
		{nil, 7, 0},
		{[]string{"k", "k"}, 7, 2},
		{[]string{"k", "other", "k"}, 7, 1},
		{[]string{"other", "k"}, 7, 0},
		{[]string{"k"}, 8, 0},
	} {
		if got := a.ContainsPrefix(tc.keys, tc.format); got != tc.want {
			t.Fatalf("ContainsPrefix(%q, %d) = %d, want %d", tc.keys, tc.format, got, tc.want)
		}
	}
	if _, err := a.Acquire("k", 8); !errors.Is(err, ErrFormat) {
		t.Fatalf("acquire in another format: %v", err)
	}
	if _, err := a.Reserve("k", 7, 500); !errors.Is(err, ErrExists) || errors.Is(err, ErrFormat) {
		t.Fatalf("reserve of a committed key: %v", err)
	}
	if _, err := a.Reserve("k", 8, 500); !errors.Is(err, ErrExists) || !errors.Is(err, ErrFormat) {
		t.Fatalf("reserve of a committed key in another format: %v", err)
	}
	st := a.Stats()
	if st.Objects != 1 || st.ObjectBytes != 10000 || st.UsedBytes != 12288+descSlab || st.PendingObjects != 0 || st.FreeExtents != 1 {
		t.Fatalf("stats: %+v", st)
	}
	if !a.Remove("k") || a.Remove("k") {
		t.Fatal("Remove did not remove exactly once")
	}
	if st := a.Stats(); st.UsedBytes != 0 || st.Objects != 0 {
		t.Fatalf("stats after remove: %+v", st)
	}
	mustCheck(t, a)
}

func TestAbortFrees(t *testing.T) {
	a := newArena(t, testConfig(t, 1<<20))
	p, err := a.Reserve("k", 1, 5000)
	if err != nil {
		t.Fatal(err)
	}
	p.Abort()
	p.Abort()
	if err := p.Commit(); !errors.Is(err, ErrDone) {
		t.Fatalf("commit after abort: %v", err)
	}
	if st := a.Stats(); st.UsedBytes != 0 || st.PendingObjects != 0 || st.PendingBytes != 0 {
		t.Fatalf("stats after abort: %+v", st)
	}
	put(t, a, "k", 1, 5000) // the key is free again
	mustCheck(t, a)
}

func TestBadInput(t *testing.T) {
	a := newArena(t, testConfig(t, 1<<20))
	for _, c := range []struct {
		name string
		key  string
		size int64
		want error
	}{
		{"empty key", "", 10, ErrKey},
		{"long key", strings.Repeat("k", MaxKeyBytes+1), 10, ErrKey},
		{"zero size", "k", 0, ErrSize},
		{"negative size", "k", -5, ErrSize},
		{"larger than the arena", "k", 1<<20 + 1, ErrNoSpace},
	} {
		if _, err := a.Reserve(c.key, 1, c.size); !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
	}
	put(t, a, strings.Repeat("k", MaxKeyBytes), 1, 10)
	if st := a.Stats(); st.NoSpace != 1 || st.Objects != 1 {
		t.Fatalf("stats: %+v", st)
	}
	mustCheck(t, a)
}

func TestRemoveOfLeasedObjectDefersFree(t *testing.T) {
	a := newArena(t, testConfig(t, 1<<20))
	put(t, a, "k", 1, 8192)
	l1, err := a.Acquire("k", 1)
	if err != nil {
		t.Fatal(err)
	}
	l2, _ := a.Acquire("k", 1)
	if !a.Remove("k") {
		t.Fatal("remove failed")
	}
	if a.Contains("k", 1) {
		t.Fatal("removed object still found")
	}
	// The key can be written again while the old bytes are still read.
	put(t, a, "k", 1, 4096)
	if st := a.Stats(); st.UsedBytes != 8192+4096+descSlab || st.Objects != 1 || st.LeasedObjects != 1 || st.Leases != 2 {
		t.Fatalf("stats with a removed, leased object: %+v", st)
	}
	if !bytes.Equal(l1.Bytes(), pattern("k", 8192)) {
		t.Fatal("leased bytes changed after Remove")
	}
	mustCheck(t, a)
	l1.Release()
	l1.Release() // idempotent: must not release l2's pin
	if l1.Bytes() != nil {
		t.Fatal("Lease.Bytes after Release is not nil")
	}
	if st := a.Stats(); st.UsedBytes != 8192+4096+descSlab || st.Leases != 1 {
		t.Fatalf("stats after the first release: %+v", st)
	}
	l2.Release()
	if st := a.Stats(); st.UsedBytes != 4096+descSlab || st.LeasedObjects != 0 || st.Leases != 0 {
		t.Fatalf("stats after the last release: %+v", st)
	}
	read(t, a, "k", 1, 4096)
	mustCheck(t, a)
}

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// pauseEvictor stops a's background evictor and returns a function that starts it
// again. While it is paused, a request for an eviction pass stays in a.wake, so a
// test can tell whether an operation asked for one (evictorAsked) whatever the
// scheduling, instead of sleeping and hoping the evictor would have run by then.
func pauseEvictor(a *Arena) (resume func()) {
	close(a.stop)
	a.done.Wait()
	a.stop = make(chan struct{}) // for resume, and for Close
	return func() {
		a.done.Add(1)
		go a.background()
	}
}

// evictorAsked reports whether a pass of the paused evictor has been asked for.
func evictorAsked(a *Arena) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.wake) > 0
}

func TestBackgroundEvictionToLowWatermark(t *testing.T) {
	const obj = 64 << 10
	const n = 64 // objects that fill the arena, beside their descriptors' slab
	cfg := testConfig(t, n*obj+descSlab)
	var mu sync.Mutex
	var victims []string
	cfg.OnEvict = func(e Evicted) bool {
		mu.Lock()
		defer mu.Unlock()
		if !bytes.Equal(e.Bytes, pattern(e.Key, obj)) {
			t.Errorf("OnEvict(%s): bytes differ from the object's", e.Key)
		}
		if e.Format != 3 {
			t.Errorf("OnEvict(%s): format %d", e.Key, e.Format)
		}
		victims = append(victims, e.Key)
		return len(victims)%2 == 1 // spill the 1st and 3rd, drop the 2nd and 4th
	}
	a := newArena(t, cfg)
	key := func(i int) string { return fmt.Sprintf("obj-%02d", i) }
	// 0.90 of the 65 objects' worth of memory is 58.5: the 59th object, with
	// the descriptor slots (56 B each; the free rest of their slab is left out
	// of the fill), passes the high watermark. Until it, no Commit or Release
	// may ask for a pass (the fill is past the low watermark from the 56th
	// on): the paused evictor keeps any request.
	resume := pauseEvictor(a)
	for i := range 58 {
		put(t, a, key(i), 3, obj)
		if evictorAsked(a) {
			t.Fatalf("object %d of 64 asked for an eviction pass below the high watermark", i+1)
		}
	}
	read(t, a, key(0), 3, obj) // object 0 is now the most recently used
	if evictorAsked(a) {
		t.Fatal("a read below the high watermark asked for an eviction pass")
	}
	put(t, a, key(58), 3, obj)
	if !evictorAsked(a) {
		t.Fatal("the object past the high watermark asked for no eviction pass")
	}
	if st := a.Stats(); st.Evictions != 0 || st.Objects != 59 {
		t.Fatalf("evicted with the evictor paused: %+v", st)
	}
	resume()
	// 0.85 of 65 is 55.25: eviction stops at 55 objects, after 4 victims.
	waitFor(t, "eviction to the low watermark", func() bool { return a.Stats().Evictions >= 4 })
	st := a.Stats()
	if st.HeldBytes > int64(0.85*float64(st.SizeBytes)) || st.Objects != 55 || st.Evictions != 4 {
		t.Fatalf("after eviction: %+v", st)
	}
	read(t, a, key(0), 3, obj)
	for i := 1; i <= 4; i++ {
		if a.Contains(key(i), 3) {
			t.Fatalf("victim %s still found", key(i))
		}
	}
	mustCheck(t, a)
	// And no further. When Stats saw the 4th eviction the pass held no lock, so it
	// was over or already in the next victim's OnEvict; Close waits for the pass
	// to end, so the counters after it are final.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	st = a.Stats()
	if st.Evictions != 4 || st.Spilled != 2 || st.Dropped != 2 || st.EvictedBytes != 4*obj {
		t.Fatalf("evictions %d (spilled %d, dropped %d, %d bytes); want 4 (2, 2, %d bytes): the pass went past the low watermark",
			st.Evictions, st.Spilled, st.Dropped, st.EvictedBytes, 4*obj)
	}
	mu.Lock()
	got := fmt.Sprint(victims)
	mu.Unlock()
	if want := fmt.Sprint([]string{key(1), key(2), key(3), key(4)}); got != want {
		t.Fatalf("victims %s, want %s (least recently used first, object 0 was read)", got, want)
	}
}

func TestFullOfLeasedObjects(t *testing.T) {
	const obj = 64 << 10
	cfg := testConfig(t, 16*obj+descSlab)
	// No background eviction: it could take an object between its put and its lease.
	cfg.HighWatermark, cfg.LowWatermark = 1, 0.95
	evicted := 0
	var mu sync.Mutex
	cfg.OnEvict = func(Evicted) bool { mu.Lock(); evicted++; mu.Unlock(); return true }
	a := newArena(t, cfg)
	var leases []*Lease
	for i := range 16 {
		k := fmt.Sprint(i)
		put(t, a, k, 1, obj)
		l, err := a.Acquire(k, 1)
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	// The high watermark is the whole arena, so nothing wakes the background
	// evictor: only the Reserve below may change the stats.
	before := a.Stats()
	done := make(chan error, 1)
	go func() {
		_, err := a.Reserve("new", 1, obj)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, ErrNoSpace) || !errors.Is(err, storage.ErrNoSpace) {
			t.Fatalf("reserve in an arena of leased objects: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("reserve in an arena of leased objects blocked")
	}
	after := a.Stats()
	before.NoSpace++
	if after != before {
		t.Fatalf("a failed reserve changed the arena:\n%+v\n%+v", before, after)
	}
	if a.Contains("new", 1) {
		t.Fatal("the failed object is visible")
	}
	mu.Lock()
	if evicted != 0 {
		t.Fatalf("OnEvict called %d times for leased objects", evicted)
	}
	mu.Unlock()
	mustCheck(t, a)

	for _, l := range leases {
		l.Release()
	}
	put(t, a, "new", 1, obj)
	read(t, a, "new", 1, obj)
	mustCheck(t, a)
}

func TestPendingWritesAreNotEvicted(t *testing.T) {
	const obj = 64 << 10
	a := newArena(t, testConfig(t, 4*obj+descSlab))
	var ps []*Pending
	for i := range 4 {
		p, err := a.Reserve(fmt.Sprint(i), 1, obj)
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	if _, err := a.Reserve("x", 1, obj); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("reserve in an arena of pending writes: %v", err)
	}
	ps[2].Abort()
	put(t, a, "x", 1, obj)
	for _, p := range ps {
		p.Abort()
	}
	mustCheck(t, a)
}

func TestSynchronousEvictionMakesRoom(t *testing.T) {
	const obj = 64 << 10
	cfg := testConfig(t, 8*obj+descSlab)
	cfg.HighWatermark, cfg.LowWatermark = 1, 0.99 // no background eviction
	var victims []string
	cfg.OnEvict = func(e Evicted) bool { victims = append(victims, e.Key); return true }
	a := newArena(t, cfg)
	for i := range 8 {
		put(t, a, fmt.Sprint(i), 1, obj)
	}
	read(t, a, "0", 1, obj)
	// Two objects' room: the two least recently used (1 and 2) go.
	put(t, a, "big", 1, 2*obj)
	if got := fmt.Sprint(victims); got != "[1 2]" {
		t.Fatalf("victims %s, want [1 2]", got)
	}
	read(t, a, "big", 1, 2*obj)
	mustCheck(t, a)
}

func TestLeasedDuringOnEvictIsKept(t *testing.T) {
	const obj = 64 << 10
	cfg := testConfig(t, 4*obj+descSlab)
	cfg.HighWatermark, cfg.LowWatermark = 1, 0.99
	var a *Arena
	var held *Lease
	calls := 0
	cfg.OnEvict = func(e Evicted) bool {
		calls++
		if e.Key == "0" && held == nil {
			// A reader comes for the victim while it is being spilled.
			l, err := a.Acquire(e.Key, e.Format)
			if err != nil {
				t.Errorf("acquire during OnEvict: %v", err)
				return true
			}
			held = l
		}
		return true
	}
	a = newArena(t, cfg)
	for i := range 4 {
		put(t, a, fmt.Sprint(i), 1, obj)
	}
	put(t, a, "new", 1, obj) // victim 0 is read during OnEvict and kept; 1 goes
	if held == nil || calls != 2 {
		t.Fatalf("OnEvict called %d times, lease %v", calls, held)
	}
	st := a.Stats()
	if st.EvictSkipped != 1 || st.Evictions != 1 || !a.Contains("0", 1) || a.Contains("1", 1) {
		t.Fatalf("after eviction with a read during OnEvict: %+v", st)
	}
	if !bytes.Equal(held.Bytes(), pattern("0", obj)) {
		t.Fatal("the kept victim's bytes changed")
	}
	mustCheck(t, a)
	held.Release()
	// Object 0 is now the most recent: 2 is the next victim.
	put(t, a, "newer", 1, obj)
	if a.Contains("2", 1) || !a.Contains("0", 1) {
		t.Fatal("the kept victim did not become the most recently used")
	}
	mustCheck(t, a)
}

// A Remove that lands while OnEvict copies the object out waits for the copy to
// end (remove.go), so the caller can remove what OnEvict stored; the victim's
// bytes stay whole during OnEvict, and its space is freed as removed, not
// evicted.
func TestRemovedDuringOnEvict(t *testing.T) {
	const obj = 64 << 10
	cfg := testConfig(t, 2*obj+descSlab)
	cfg.HighWatermark, cfg.LowWatermark = 1, 0.99
	var a *Arena
	removed := make(chan bool, 1)
	cfg.OnEvict = func(e Evicted) bool {
		go func() { removed <- a.Remove(e.Key) }()
		deadline := time.Now().Add(10 * time.Second)
		for a.Stats().RemoveWaits == 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if a.Stats().RemoveWaits != 1 {
			t.Error("the remove did not wait for the eviction in flight")
		}
		select {
		case <-removed:
			t.Error("the remove returned while its object's eviction was in flight")
		default:
		}
		if !bytes.Equal(e.Bytes, pattern(e.Key, obj)) {
			t.Error("victim's bytes changed by Remove during OnEvict")
		}
		return true
	}
	a = newArena(t, cfg)
	put(t, a, "a", 1, obj)
	put(t, a, "b", 1, obj)
	put(t, a, "c", 1, obj)
	select {
	case ok := <-removed:
		if !ok {
			t.Fatal("remove of a during its eviction found nothing")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the remove did not return after the eviction ended")
	}
	st := a.Stats()
	if st.Evictions != 0 || st.Objects != 2 || st.Removals != 1 || a.Contains("a", 1) {
		t.Fatalf("after removal during eviction: %+v", st)
	}
	mustCheck(t, a)
}

func TestOnEvictPanicLeavesArenaConsistent(t *testing.T) {
	const obj = 64 << 10
	cfg := testConfig(t, 2*obj+descSlab)
	cfg.HighWatermark, cfg.LowWatermark = 1, 0.99
	fail := true
	cfg.OnEvict = func(Evicted) bool {
		if fail {
			panic("spill bug")
		}
		return true
	}
	a := newArena(t, cfg)
	put(t, a, "a", 1, obj)
	put(t, a, "b", 1, obj)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("OnEvict's panic did not reach the caller")
			}
		}()
		_, _ = a.Reserve("c", 1, obj)
	}()
	mustCheck(t, a)
	read(t, a, "a", 1, obj)
	fail = false
	put(t, a, "c", 1, obj)
	mustCheck(t, a)
}

func TestCloseWhileInUse(t *testing.T) {
	a, err := New(testConfig(t, 1<<20))
	if err != nil {
		t.Fatal(err)
	}
	put(t, a, "k", 1, 5000)
	l, err := a.Acquire("k", 1)
	if err != nil {
		t.Fatal(err)
	}
	p, err := a.Reserve("w", 1, 5000)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second close: %v", err)
	}
	// The memory stays mapped for the lease and the writer.
	if !bytes.Equal(l.Bytes(), pattern("k", 5000)) {
		t.Fatal("leased bytes changed at Close")
	}
	copy(p.Bytes(), pattern("w", 5000))
	if _, err := a.Acquire("k", 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("acquire after close: %v", err)
	}
	if _, err := a.Reserve("x", 1, 10); !errors.Is(err, ErrClosed) {
		t.Fatalf("reserve after close: %v", err)
	}
	if a.Contains("k", 1) || a.Remove("k") {
		t.Fatal("closed arena still finds objects")
	}
	if err := p.Commit(); !errors.Is(err, ErrClosed) {
		t.Fatalf("commit after close: %v", err)
	}
	l.Release()
	a.mu.Lock()
	unmapped := a.back == nil
	a.mu.Unlock()
	if !unmapped {
		t.Fatal("memory still mapped after the last lease ended")
	}
	if st := a.Stats(); st.UsedBytes != 0 || st.Objects != 0 || st.Leases != 0 || st.PendingObjects != 0 {
		t.Fatalf("stats after the memory is released: %+v", st)
	}
}

func TestLargeAlignment(t *testing.T) {
	cfg := testConfig(t, 16<<20)
	cfg.Alignment = 2 << 20
	a := newArena(t, cfg)
	// Objects of at least the alignment start on it; smaller ones share a slab.
	for i, size := range []int{3 << 20, 2 << 20, 100, 100, 100, 100} {
		p, err := a.Reserve(fmt.Sprint(i), 1, int64(size))
		if err != nil {
			t.Fatal(err)
		}
		if addr := uintptr(unsafe.Pointer(unsafe.SliceData(p.Bytes()))); size >= 2<<20 && addr%(2<<20) != 0 {
			t.Fatalf("object of %d bytes at %#x is not 2 MiB aligned", size, addr)
		}
		copy(p.Bytes(), pattern(fmt.Sprint(i), size))
		if err := p.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	// 4 MiB and 2 MiB for the large ones, one 2 MiB slab for the four small
	// ones and one for the large ones' descriptors.
	if st := a.Stats(); st.UsedBytes != 10<<20 || st.Slabs != 2 {
		t.Fatalf("stats %+v: want 10 MiB used and two slabs", st)
	}
	for i, size := range []int{3 << 20, 2 << 20, 100, 100, 100, 100} {
		read(t, a, fmt.Sprint(i), 1, size)
	}
	mustCheck(t, a)
}

func TestArenaStaysOffTheGoHeap(t *testing.T) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	cfg := DefaultConfig(256 << 20) // the default allocator: mmap, prefaulted, THP
	cfg.Logger = slog.New(slog.DiscardHandler)
	a, err := New(cfg)
	if errors.Is(err, hostmem.ErrNoMemory) {
		t.Skipf("not enough free memory for a 256 MiB arena: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	for i := range 16 {
		p, err := a.Reserve(fmt.Sprint(i), 1, 8<<20)
		if err != nil {
			t.Fatal(err)
		}
		b := p.Bytes()
		for j := range b {
			b[j] = byte(j)
		}
		if err := p.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapInuse) - int64(before.HeapInuse); grew > 4<<20 {
		t.Fatalf("a 256 MiB arena with 128 MiB of objects grew the Go heap by %d bytes", grew)
	}
}
