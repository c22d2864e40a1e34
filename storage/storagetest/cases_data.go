package storagetest

import (
	"errors"
	"testing"

	"github.com/stratakv/strata/kvlayout"
	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/storage"
)

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
	b, g := s.registered(t, shared, layout, pools)
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
	b, g := s.registered(t, "missing", kvlayout.PageFirst, mhaPools)
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
	b, g := s.registered(t, "write-once", kvlayout.PageFirst, mhaPools)
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
	b, g := s.registered(t, "batch", kvlayout.PageFirst, mhaPools)
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
	b1, g1 := s.registered(t, shared, kvlayout.PageFirst, mhaPools)
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
