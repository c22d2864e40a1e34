// Package storagetest is the conformance suite that every storage.Backend runs:
// real host pool groups (target, draft, MLA; page-first and layer-first layouts)
// moved through the backend, byte for byte, with the per-key error contract of
// storage.Backend checked case by case.
//
// A backend's test calls Run with a constructor:
//
//	func TestConformance(t *testing.T) {
//		root := t.TempDir()
//		storagetest.Run(t, func(t *testing.T, shared string) storage.Backend {
//			s, err := file.New(file.DefaultConfig(filepath.Join(root, shared)))
//			if err != nil {
//				t.Fatal(err)
//			}
//			return s
//		})
//	}
package storagetest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/kvlayout"
	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/storage"
)

// Run runs the conformance suite against backends made by newBackend.
//
// newBackend returns a new Backend over the store named shared: the first call
// with a given shared string must give an empty store, and later calls with the
// same string (within the same subtest) must give further Backends over that same
// store, as two engine processes see it (for a file backend, the same directory;
// for a service, the same service with a fresh client). shared is a short name of
// [a-z0-9-] that the suite never reuses across subtests, so it can be used as a
// directory name or key prefix. The suite closes every Backend it makes.
func Run(t *testing.T, newBackend func(t *testing.T, shared string) storage.Backend) {
	s := &suite{newBackend: newBackend}
	t.Run("allocator", s.testAllocator)
	t.Run("round-trip", func(t *testing.T) { s.testRoundTrip(t, "rt-page-first", kvlayout.PageFirst, mhaPools) })
	t.Run("round-trip-layer-first", func(t *testing.T) { s.testRoundTrip(t, "rt-layer-first", kvlayout.LayerFirst, mhaPools) })
	t.Run("round-trip-page-first-direct", func(t *testing.T) {
		s.testRoundTrip(t, "rt-page-first-direct", kvlayout.PageFirstDirect, mhaPools)
	})
	t.Run("round-trip-mla", func(t *testing.T) { s.testRoundTrip(t, "rt-mla", kvlayout.PageFirst, mlaPools) })
	t.Run("round-trip-mla-layer-first", func(t *testing.T) { s.testRoundTrip(t, "rt-mla-layer-first", kvlayout.LayerFirst, mlaPools) })
	t.Run("missing", s.testMissing)
	t.Run("write-once", s.testWriteOnce)
	t.Run("batch", s.testBatch)
	t.Run("formats", s.testFormats)
	t.Run("shared-store", s.testShared)
	t.Run("context", s.testContext)
	t.Run("concurrency", s.testConcurrency)
	t.Run("close", s.testClose)
}

// Geometries: small pools so the suite runs in well under a second, with a target
// part of exactly 4 KiB (so direct-I/O backends meet aligned host memory), a draft
// part of 128 bytes and an MLA part of an odd size (unaligned everything).
var (
	// TargetGeometry is the suite's target model: 2 layers, 4 KV heads of dim 64, 2-byte dtype.
	TargetGeometry = kvlayout.Geometry{Layers: 2, KVHeads: 4, HeadDim: 64, DTypeBytes: 2}
	// DraftGeometry is the suite's EAGLE draft model: 1 layer, 2 KV heads of dim 8.
	DraftGeometry = kvlayout.Geometry{Layers: 1, KVHeads: 2, HeadDim: 8, DTypeBytes: 2}
	// MLAGeometry is the suite's MLA model: 3 layers, a latent of 36, 2-byte dtype.
	MLAGeometry = kvlayout.Geometry{Layers: 3, MLA: true, LatentDim: 36, DTypeBytes: 2}

	mhaPools = []pool.PoolSpec{{Name: pagekey.TargetPool, Geometry: TargetGeometry}, {Name: pagekey.DraftPool, Geometry: DraftGeometry}}
	mlaPools = []pool.PoolSpec{{Name: pagekey.TargetPool, Geometry: MLAGeometry}, {Name: pagekey.DraftPool, Geometry: DraftGeometry}}
)

const (
	// PageSize is the suite's tokens per page.
	PageSize = 4
	// pages is the host pages of each group the suite builds.
	pages = 64
)

// names is how the suite spells its objects.
var names = pagekey.Names{ModelPrefix: "conformance", TPRank: 0}

type suite struct {
	newBackend func(t *testing.T, shared string) storage.Backend
}

// backend makes a Backend over the store shared and closes it when t ends.
func (s *suite) backend(t *testing.T, shared string) storage.Backend {
	t.Helper()
	b := s.newBackend(t, shared)
	if b == nil {
		t.Fatal("newBackend returned nil")
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil && !errors.Is(err, storage.ErrClosed) {
			t.Errorf("close %s backend: %v", b.Name(), err)
		}
	})
	return b
}

// Group is a host pool group built for a backend, with its specs.
type Group struct {
	*pool.Group
	specs map[string]storage.PoolSpec
}

// Spec is the registration spec of pool name.
func (g *Group) Spec(name string) storage.PoolSpec { return g.specs[name] }

// NewGroup builds a pool group of pools with 64 host pages of pageSize tokens and
// memory from b's allocator (mmap when it takes any memory), closed when t ends.
func NewGroup(t testing.TB, b storage.Backend, layout kvlayout.Kind, pageSize int, pools []pool.PoolSpec) *Group {
	t.Helper()
	return NewGroupPages(t, b, layout, pageSize, pages, pools)
}

// NewGroupPages is NewGroup with n host pages.
func NewGroupPages(t testing.TB, b storage.Backend, layout kvlayout.Kind, pageSize, n int, pools []pool.PoolSpec) *Group {
	t.Helper()
	kind := b.Allocator()
	if kind == "" {
		kind = hostmem.Mmap
	}
	alloc := Allocator(t, kind)
	g, err := pool.BuildGroup(pool.GroupSpec{Pools: pools, Layout: layout, PageSize: pageSize, Pages: n}, alloc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	out := &Group{Group: g, specs: map[string]storage.PoolSpec{}}
	for _, p := range g.Pools() {
		out.specs[p.Name()] = storage.SpecOf(p, names)
	}
	return out
}

// Allocator returns a prefaulting allocator of kind without a memory reserve.
func Allocator(t testing.TB, kind hostmem.Kind) *hostmem.Allocator {
	t.Helper()
	cfg := hostmem.DefaultConfig(kind)
	cfg.ReserveBytes = 0
	cfg.TransparentHugePages = false
	cfg.Logger = slog.New(slog.DiscardHandler)
	a, err := hostmem.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// Register registers every pool of g with b.
func Register(t testing.TB, b storage.Backend, g *Group) {
	t.Helper()
	for _, p := range g.Pools() {
		if err := b.RegisterPool(context.Background(), g.Spec(p.Name())); err != nil {
			t.Fatalf("register pool %q with %s: %v", p.Name(), b.Name(), err)
		}
	}
}

// Keys returns a chain of n SHA-256 page keys over random tokens drawn from seed.
func Keys(t testing.TB, seed uint64, n int) []pagekey.Key {
	t.Helper()
	h, err := pagekey.New(pagekey.Config{PageSize: PageSize, Algorithm: pagekey.SHA256})
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	tokens := make([]uint32, n*PageSize)
	for i := range tokens {
		tokens[i] = r.Uint32N(150000)
	}
	return h.Keys(pagekey.Key{}, tokens)
}

// patternByte is byte off (in part order) of logical page lp of a pool salted by
// salt, in pattern generation gen.
func patternByte(salt uint64, lp, gen int, off int64) byte {
	x := salt ^ uint64(lp)<<40 ^ uint64(gen)<<56 ^ uint64(off)*0x9E3779B97F4A7C15
	x ^= x >> 31
	x *= 0xBF58476D1CE4E5B9
	x ^= x >> 29
	return byte(x)
}

func poolSalt(spec storage.PoolSpec) uint64 {
	var h uint64 = 14695981039346656037
	for i := 0; i < len(spec.Name); i++ {
		h = (h ^ uint64(spec.Name[i])) * 1099511628211
	}
	return h
}

// eachByte calls fn with the address in the pool's memory and the part-order
// offset of every byte of page's object parts.
func eachByte(spec storage.PoolSpec, page pool.PageID, fn func(addr, off int64)) {
	off := int64(0)
	for _, s := range storage.Parts(spec, page) {
		for r := 0; r < s.Count; r++ {
			base := s.Offset + int64(r)*s.Stride
			for i := int64(0); i < s.RunBytes; i++ {
				fn(base+i, off)
				off++
			}
		}
	}
}

// Fill writes logical page lp's pattern of generation gen into host page page.
func Fill(spec storage.PoolSpec, page pool.PageID, lp, gen int) {
	mem, salt := spec.Region.Bytes(), poolSalt(spec)
	eachByte(spec, page, func(addr, off int64) { mem[addr] = patternByte(salt, lp, gen, off) })
}

// Clear zeroes host page page's object bytes.
func Clear(spec storage.PoolSpec, page pool.PageID) {
	mem := spec.Region.Bytes()
	eachByte(spec, page, func(addr, _ int64) { mem[addr] = 0 })
}

// Check reports whether host page page holds logical page lp's pattern of
// generation gen, and where it first does not.
func Check(spec storage.PoolSpec, page pool.PageID, lp, gen int) error {
	mem, salt := spec.Region.Bytes(), poolSalt(spec)
	var bad error
	eachByte(spec, page, func(addr, off int64) {
		if bad == nil && mem[addr] != patternByte(salt, lp, gen, off) {
			bad = fmt.Errorf("pool %q host page %d: byte %d of the object is %#x, want %#x (logical page %d, generation %d)",
				spec.Name, page, off, mem[addr], patternByte(salt, lp, gen, off), lp, gen)
		}
	})
	return bad
}

// fillRange fills host pages first..first+n-1 with logical pages 0..n-1.
func fillRange(spec storage.PoolSpec, first pool.PageID, n, gen int) {
	for i := 0; i < n; i++ {
		Fill(spec, first+pool.PageID(i), i, gen)
	}
}

func pageIDs(ids ...int) []pool.PageID {
	out := make([]pool.PageID, len(ids))
	for i, id := range ids {
		out[i] = pool.PageID(id)
	}
	return out
}

func seq(first, n int) []pool.PageID {
	out := make([]pool.PageID, n)
	for i := range out {
		out[i] = pool.PageID(first + i)
	}
	return out
}

func pick(keys []pagekey.Key, idx ...int) []pagekey.Key {
	out := make([]pagekey.Key, len(idx))
	for i, k := range idx {
		out[i] = keys[k]
	}
	return out
}

var bg = context.Background()

// expectAll fails t unless every entry of errs is nil.
func expectAll(t *testing.T, what string, errs []error, n int) {
	t.Helper()
	if len(errs) != n {
		t.Fatalf("%s: %d results for %d keys", what, len(errs), n)
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("%s: key %d: %v", what, i, err)
		}
	}
}

// expectEach fails t unless errs has n entries that each match.
func expectEach(t *testing.T, what string, errs []error, n int, match func(error) bool, want string) {
	t.Helper()
	if len(errs) != n {
		t.Fatalf("%s: %d results for %d keys", what, len(errs), n)
	}
	for i, err := range errs {
		if !match(err) {
			t.Fatalf("%s: key %d: got %v, want %s", what, i, err, want)
		}
	}
}

func is(target error) func(error) bool { return func(err error) bool { return errors.Is(err, target) } }

func expectExists(t *testing.T, b storage.Backend, poolName string, keys []pagekey.Key, want int) {
	t.Helper()
	n, err := b.Exists(bg, poolName, keys)
	if err != nil || n != want {
		t.Fatalf("Exists(%s, %d keys) = %d, %v; want %d, nil", poolName, len(keys), n, err, want)
	}
}

func (s *suite) testAllocator(t *testing.T) {
	b := s.backend(t, "allocator")
	g := NewGroup(t, b, kvlayout.PageFirst, PageSize, mhaPools)
	if kind := b.Allocator(); kind != "" && g.AllocatorKind() != kind {
		t.Fatalf("group built with %s memory, backend asks for %s", g.AllocatorKind(), kind)
	}
	Register(t, b, g)

	kv := g.Spec(pagekey.TargetPool)
	kind := g.AllocatorKind()
	alloc := Allocator(t, kind)
	small, err := alloc.Allocate("small", 4096)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = small.Close() })
	closed, err := alloc.Allocate("closed", kv.Layout.PoolBytes())
	if err != nil {
		t.Fatal(err)
	}
	if err := closed.Close(); err != nil {
		t.Fatal(err)
	}
	bad := map[string]storage.PoolSpec{}
	spec := kv
	spec.Name = "nil-region"
	spec.Region = nil
	bad[spec.Name] = spec
	spec = kv
	spec.Name = "closed-region"
	spec.Region = closed
	bad[spec.Name] = spec
	spec = kv
	spec.Name = "small-region"
	spec.Region = small
	bad[spec.Name] = spec
	spec = kv
	spec.Name = "Bad Name!"
	bad["bad-name"] = spec
	spec = kv
	spec.Name = "bad-layout"
	spec.Layout.PageSize = 0
	bad[spec.Name] = spec
	for what, spec := range bad {
		if err := b.RegisterPool(bg, spec); !errors.Is(err, storage.ErrConfig) {
			t.Errorf("register %s: %v, want an error wrapping ErrConfig", what, err)
		}
	}

	keys := Keys(t, 1, 4)
	for _, name := range []string{"nope", "nil-region", "closed-region", "small-region"} {
		if n, err := b.Exists(bg, name, keys); n != 0 || !errors.Is(err, storage.ErrNotRegistered) {
			t.Errorf("Exists on unregistered pool %q = %d, %v; want 0, ErrNotRegistered", name, n, err)
		}
		expectEach(t, "Get on unregistered pool "+name, b.Get(bg, name, keys, seq(0, 4)), 4, is(storage.ErrNotRegistered), "ErrNotRegistered")
		expectEach(t, "Put on unregistered pool "+name, b.Put(bg, name, keys, seq(0, 4)), 4, is(storage.ErrNotRegistered), "ErrNotRegistered")
	}
	// The registered pools still work.
	fillRange(kv, 0, 4, 0)
	expectAll(t, "put after refused registrations", b.Put(bg, pagekey.TargetPool, keys, seq(0, 4)), 4)
	expectExists(t, b, pagekey.TargetPool, keys, 4)
}

// testRoundTrip puts pages of every pool and gets them into other, cleared pages.
func (s *suite) testRoundTrip(t *testing.T, shared string, layout kvlayout.Kind, pools []pool.PoolSpec) {
	b := s.backend(t, shared)
	g := NewGroup(t, b, layout, PageSize, pools)
	Register(t, b, g)
	keys := Keys(t, 2, 8)
	for pi, p := range g.Pools() {
		spec := g.Spec(p.Name())
		name := p.Name()
		fillRange(spec, 0, 8, 0)
		expectAll(t, "put keys 0-4 of "+name, b.Put(bg, name, keys[:5], seq(0, 5)), 5)
		expectAll(t, "put key 6 of "+name, b.Put(bg, name, keys[6:7], pageIDs(6)), 1)
		expectExists(t, b, name, keys, 5)
		expectExists(t, b, name, keys[5:], 0)
		expectExists(t, b, name, keys[6:7], 1)
		expectExists(t, b, name, nil, 0)
		if pi == 0 && len(g.Pools()) > 1 {
			// Pools of a group are separate objects: the draft pool has none of these yet.
			expectExists(t, b, g.Pools()[1].Name(), keys, 0)
		}
		// Get into different pages, cleared, with the source pages cleared as well.
		for i := 0; i < 8; i++ {
			Clear(spec, pool.PageID(i))
			Clear(spec, pool.PageID(16+i))
		}
		want := []int{0, 1, 2, 3, 4, 6}
		dst := pageIDs(20, 16, 30, 17, 40, 63)
		expectAll(t, "get of "+name, b.Get(bg, name, pick(keys, want...), dst), len(want))
		for i, lp := range want {
			if err := Check(spec, dst[i], lp, 0); err != nil {
				t.Fatal(err)
			}
		}
		if err := Check(spec, 0, 0, 0); err == nil {
			t.Fatalf("pool %q: get wrote into the source page", name)
		}
	}
	expectAll(t, "empty put", b.Put(bg, pagekey.TargetPool, nil, nil), 0)
	expectAll(t, "empty get", b.Get(bg, pagekey.TargetPool, nil, nil), 0)
}

func (s *suite) testMissing(t *testing.T) {
	b := s.backend(t, "missing")
	g := NewGroup(t, b, kvlayout.PageFirst, PageSize, mhaPools)
	Register(t, b, g)
	keys := Keys(t, 3, 8)
	for _, p := range g.Pools() {
		spec := g.Spec(p.Name())
		fillRange(spec, 0, 8, 0)
		expectAll(t, "put", b.Put(bg, p.Name(), pick(keys, 0, 1, 3), pageIDs(0, 1, 3)), 3)
		dst := pageIDs(10, 11, 12, 13, 14)
		errs := b.Get(bg, p.Name(), pick(keys, 0, 7, 1, 2, 3), dst)
		if len(errs) != 5 {
			t.Fatalf("mixed get: %d results for 5 keys", len(errs))
		}
		for i, want := range []error{nil, storage.ErrNotFound, nil, storage.ErrNotFound, nil} {
			if want == nil && errs[i] != nil || want != nil && !errors.Is(errs[i], want) {
				t.Fatalf("pool %q mixed get: key %d: got %v, want %v", p.Name(), i, errs[i], want)
			}
		}
		for i, lp := range map[int]int{0: 0, 2: 1, 4: 3} {
			if err := Check(spec, dst[i], lp, 0); err != nil {
				t.Fatal(err)
			}
		}
		expectExists(t, b, p.Name(), keys, 2)
		expectExists(t, b, p.Name(), pick(keys, 3, 0, 1, 2), 3)
		expectEach(t, "get of a missing key", b.Get(bg, p.Name(), keys[4:5], pageIDs(20)), 1, is(storage.ErrNotFound), "ErrNotFound")
	}
}

func (s *suite) testWriteOnce(t *testing.T) {
	b := s.backend(t, "write-once")
	g := NewGroup(t, b, kvlayout.PageFirst, PageSize, mhaPools)
	Register(t, b, g)
	keys := Keys(t, 4, 2)
	for _, p := range g.Pools() {
		spec := g.Spec(p.Name())
		Fill(spec, 0, 0, 0)
		expectAll(t, "first put", b.Put(bg, p.Name(), keys[:1], pageIDs(0)), 1)
		Fill(spec, 0, 0, 1)
		expectAll(t, "second put of the same key", b.Put(bg, p.Name(), keys[:1], pageIDs(0)), 1)
		Fill(spec, 1, 0, 2)
		expectAll(t, "put of the same key from another page", b.Put(bg, p.Name(), keys[:1], pageIDs(1)), 1)
		Clear(spec, 5)
		expectAll(t, "get", b.Get(bg, p.Name(), keys[:1], pageIDs(5)), 1)
		if err := Check(spec, 5, 0, 0); err != nil {
			t.Fatalf("write-once broken: %v", err)
		}
	}
}

func (s *suite) testBatch(t *testing.T) {
	b := s.backend(t, "batch")
	g := NewGroup(t, b, kvlayout.PageFirst, PageSize, mhaPools)
	Register(t, b, g)
	name := pagekey.TargetPool
	spec := g.Spec(name)
	fillRange(spec, 0, 8, 0)
	keys := Keys(t, 5, storage.MaxBatch+1)
	isBatch := is(storage.ErrBatch)
	cases := []struct {
		what  string
		keys  []pagekey.Key
		pages []pool.PageID
	}{
		{"more than MaxBatch keys", keys, make([]pool.PageID, len(keys))},
		{"fewer pages than keys", keys[:3], seq(0, 2)},
		{"more pages than keys", keys[:2], seq(0, 3)},
		{"page past the pool", keys[:2], pageIDs(0, pages)},
		{"negative page", keys[:2], pageIDs(-1, 1)},
		{"zero key", []pagekey.Key{keys[0], {}}, seq(0, 2)},
	}
	for _, c := range cases {
		expectEach(t, "put with "+c.what, b.Put(bg, name, c.keys, c.pages), len(c.keys), isBatch, "ErrBatch")
		expectEach(t, "get with "+c.what, b.Get(bg, name, c.keys, c.pages), len(c.keys), isBatch, "ErrBatch")
	}
	if _, err := b.Exists(bg, name, keys); !errors.Is(err, storage.ErrBatch) {
		t.Fatalf("Exists of %d keys: %v, want ErrBatch", len(keys), err)
	}
	if _, err := b.Exists(bg, name, []pagekey.Key{keys[0], {}}); !errors.Is(err, storage.ErrBatch) {
		t.Fatalf("Exists with a zero key: %v, want ErrBatch", err)
	}
	// Nothing of the refused batches was written.
	expectExists(t, b, name, keys[:storage.MaxBatch], 0)
	// MaxBatch itself is fine.
	expectAll(t, "put of MaxBatch keys", b.Put(bg, name, keys[:storage.MaxBatch], make([]pool.PageID, storage.MaxBatch)), storage.MaxBatch)
	expectExists(t, b, name, keys[:storage.MaxBatch], storage.MaxBatch)
}

// testFormats stores objects through one layout and reads them through pools of
// other formats under the same names: they must never pass for the other pool's.
func (s *suite) testFormats(t *testing.T) {
	const shared = "formats"
	b1 := s.backend(t, shared)
	g1 := NewGroup(t, b1, kvlayout.PageFirst, PageSize, mhaPools)
	Register(t, b1, g1)
	keys := Keys(t, 6, 4)
	kv := g1.Spec(pagekey.TargetPool)
	fillRange(kv, 0, 4, 0)
	expectAll(t, "put", b1.Put(bg, pagekey.TargetPool, keys, seq(0, 4)), 4)

	corrupted := false
	others := []struct {
		what     string
		layout   kvlayout.Kind
		pageSize int
		pools    []pool.PoolSpec
	}{
		{"layer-first layout", kvlayout.LayerFirst, PageSize, mhaPools},
		{"page size 8", kvlayout.PageFirst, 8, mhaPools},
		{"other geometry", kvlayout.PageFirst, PageSize, []pool.PoolSpec{{Name: pagekey.TargetPool, Geometry: kvlayout.Geometry{Layers: 2, KVHeads: 4, HeadDim: 64, DTypeBytes: 1}}}},
	}
	for gen, o := range others {
		b2 := s.backend(t, shared)
		g2 := NewGroup(t, b2, o.layout, o.pageSize, o.pools)
		Register(t, b2, g2)
		spec := g2.Spec(pagekey.TargetPool)
		if n, err := b2.Exists(bg, pagekey.TargetPool, keys); err != nil || n != 0 {
			t.Fatalf("%s: Exists = %d, %v; want 0: objects of another format count as missing", o.what, n, err)
		}
		errs := b2.Get(bg, pagekey.TargetPool, keys, seq(10, 4))
		for i, err := range errs {
			switch {
			case errors.Is(err, storage.ErrNotFound):
			case errors.Is(err, storage.ErrCorrupt):
				corrupted = true
			default:
				t.Fatalf("%s: get of another format's object, key %d: %v; want ErrNotFound (or ErrCorrupt)", o.what, i, err)
			}
		}
		// Its own puts under the same names must not clobber the first pool's objects.
		fillRange(spec, 20, 4, gen+1)
		putErrs := b2.Put(bg, pagekey.TargetPool, keys, seq(20, 4))
		for i, err := range b2.Get(bg, pagekey.TargetPool, keys, seq(30, 4)) {
			if err == nil {
				if putErrs[i] != nil {
					t.Fatalf("%s: key %d read back after a failed put (%v)", o.what, i, putErrs[i])
				}
				if cerr := Check(spec, pool.PageID(30+i), i, gen+1); cerr != nil {
					t.Fatalf("%s: a get succeeded with another format's bytes: %v", o.what, cerr)
				}
			}
		}
	}
	for i := 0; i < 4; i++ {
		Clear(kv, pool.PageID(40+i))
	}
	for i, err := range b1.Get(bg, pagekey.TargetPool, keys, seq(40, 4)) {
		switch {
		case err == nil:
			if cerr := Check(kv, pool.PageID(40+i), i, 0); cerr != nil {
				t.Fatalf("first format's object changed by other formats: %v", cerr)
			}
		case corrupted && (errors.Is(err, storage.ErrNotFound) || errors.Is(err, storage.ErrCorrupt)):
		default:
			t.Fatalf("first format's object %d after other formats looked at it: %v", i, err)
		}
	}
}

// testShared runs two backends over one store, as two engine processes.
func (s *suite) testShared(t *testing.T) {
	const shared = "shared-store"
	b1, b2 := s.backend(t, shared), s.backend(t, shared)
	g1 := NewGroup(t, b1, kvlayout.PageFirst, PageSize, mhaPools)
	g2 := NewGroup(t, b2, kvlayout.PageFirst, PageSize, mhaPools)
	Register(t, b1, g1)
	Register(t, b2, g2)
	keys := Keys(t, 7, 8)
	for _, p := range g1.Pools() {
		name := p.Name()
		s1, s2 := g1.Spec(name), g2.Spec(name)
		fillRange(s1, 0, 8, 0)
		fillRange(s2, 0, 8, 0)
		expectAll(t, "put through the first", b1.Put(bg, name, keys[:4], seq(0, 4)), 4)
		expectExists(t, b2, name, keys, 4)
		expectAll(t, "get through the second", b2.Get(bg, name, keys[:4], seq(20, 4)), 4)
		for i := 0; i < 4; i++ {
			if err := Check(s2, pool.PageID(20+i), i, 0); err != nil {
				t.Fatal(err)
			}
		}
		expectAll(t, "put through the second", b2.Put(bg, name, keys[4:], seq(4, 4)), 4)
		expectExists(t, b1, name, keys, 8)
		expectAll(t, "get through the first", b1.Get(bg, name, keys[4:], seq(30, 4)), 4)
		for i := 0; i < 4; i++ {
			if err := Check(s1, pool.PageID(30+i), 4+i, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Both put the same new keys at once: write-once across the two, no damage.
	more := Keys(t, 8, 8)
	var wg sync.WaitGroup
	results := make([][]error, 2)
	for i, b := range []storage.Backend{b1, b2} {
		wg.Go(func() { results[i] = b.Put(bg, pagekey.TargetPool, more, seq(0, 8)) })
	}
	wg.Wait()
	expectAll(t, "concurrent put through the first", results[0], 8)
	expectAll(t, "concurrent put through the second", results[1], 8)
	for i, b := range []storage.Backend{b1, b2} {
		g := []*Group{g1, g2}[i]
		expectAll(t, "get after concurrent puts", b.Get(bg, pagekey.TargetPool, more, seq(40, 8)), 8)
		for j := 0; j < 8; j++ {
			if err := Check(g.Spec(pagekey.TargetPool), pool.PageID(40+j), j, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func (s *suite) testContext(t *testing.T) {
	b := s.backend(t, "context")
	g := NewGroup(t, b, kvlayout.PageFirst, PageSize, mhaPools)
	Register(t, b, g)
	keys := Keys(t, 9, 4)
	name := pagekey.TargetPool
	spec := g.Spec(name)
	fillRange(spec, 0, 4, 0)
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	isCanceled := func(err error) bool { return errors.Is(err, context.Canceled) || errors.Is(err, storage.ErrTimeout) }
	isExpired := func(err error) bool {
		return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, storage.ErrTimeout)
	}
	for _, c := range []struct {
		what  string
		ctx   context.Context
		match func(error) bool
	}{{"canceled", canceled, isCanceled}, {"expired", expired, isExpired}} {
		expectEach(t, "put with a "+c.what+" context", b.Put(c.ctx, name, keys, seq(0, 4)), 4, c.match, "the context's error")
		expectEach(t, "get with a "+c.what+" context", b.Get(c.ctx, name, keys, seq(10, 4)), 4, c.match, "the context's error")
		if _, err := b.Exists(c.ctx, name, keys); !c.match(err) {
			t.Fatalf("Exists with a %s context: %v, want the context's error", c.what, err)
		}
	}
	// Nothing half-done: every key is a clean miss or whole.
	for i, err := range b.Get(bg, name, keys, seq(20, 4)) {
		if err == nil {
			if cerr := Check(spec, pool.PageID(20+i), i, 0); cerr != nil {
				t.Fatal(cerr)
			}
		} else if !errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("get after canceled calls, key %d: %v", i, err)
		}
	}
	expectAll(t, "put with a live context", b.Put(bg, name, keys, seq(0, 4)), 4)
	expectAll(t, "get with a live context", b.Get(bg, name, keys, seq(30, 4)), 4)
}

func (s *suite) testConcurrency(t *testing.T) {
	b := s.backend(t, "concurrency")
	g := NewGroup(t, b, kvlayout.PageFirst, PageSize, mhaPools)
	Register(t, b, g)
	const nkeys, workers, span = 16, 4, 6
	keys := Keys(t, 10, nkeys)
	for _, p := range g.Pools() {
		fillRange(g.Spec(p.Name()), 0, nkeys, 0)
	}
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Go(func() {
			dst := seq(nkeys+w*span, span) // pages only this worker reads into
			for round := 0; round < 3; round++ {
				first := (w*3 + round*2) % (nkeys - span + 1)
				for _, p := range g.Pools() {
					name, spec := p.Name(), g.Spec(p.Name())
					for i, err := range b.Put(bg, name, keys[first:first+span], seq(first, span)) {
						if err != nil {
							t.Errorf("worker %d put %s key %d: %v", w, name, first+i, err)
						}
					}
					for i, err := range b.Get(bg, name, keys[first:first+span], dst) {
						if err != nil {
							t.Errorf("worker %d get %s key %d: %v", w, name, first+i, err)
							continue
						}
						if cerr := Check(spec, dst[i], first+i, 0); cerr != nil {
							t.Errorf("worker %d: %v", w, cerr)
						}
					}
					if n, err := b.Exists(bg, name, keys[first:first+span]); err != nil || n != span {
						t.Errorf("worker %d: Exists = %d, %v; want %d", w, n, err, span)
					}
				}
			}
		})
	}
	wg.Wait()
}

func (s *suite) testClose(t *testing.T) {
	b := s.backend(t, "close")
	g := NewGroup(t, b, kvlayout.PageFirst, PageSize, mhaPools)
	Register(t, b, g)
	keys := Keys(t, 11, 2)
	name := pagekey.TargetPool
	fillRange(g.Spec(name), 0, 2, 0)
	expectAll(t, "put", b.Put(bg, name, keys, seq(0, 2)), 2)
	if err := b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := b.Close(); err != nil && !errors.Is(err, storage.ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
	isClosed := is(storage.ErrClosed)
	expectEach(t, "put after Close", b.Put(bg, name, keys, seq(0, 2)), 2, isClosed, "ErrClosed")
	expectEach(t, "get after Close", b.Get(bg, name, keys, seq(4, 2)), 2, isClosed, "ErrClosed")
	if _, err := b.Exists(bg, name, keys); !errors.Is(err, storage.ErrClosed) {
		t.Fatalf("Exists after Close: %v, want ErrClosed", err)
	}
	if err := b.RegisterPool(bg, g.Spec(pagekey.DraftPool)); !errors.Is(err, storage.ErrClosed) {
		t.Fatalf("RegisterPool after Close: %v, want ErrClosed", err)
	}
}
