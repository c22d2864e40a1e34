package pool

import (
	"errors"
	"log/slog"
	"testing"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/kvlayout"
	"github.com/stratakv/strata/pagekey"
)

var (
	testTarget = kvlayout.Geometry{Layers: 3, KVHeads: 2, HeadDim: 8, DTypeBytes: 2}
	testDraft  = kvlayout.Geometry{Layers: 1, KVHeads: 2, HeadDim: 8, DTypeBytes: 2}
	testMLA    = kvlayout.Geometry{Layers: 2, MLA: true, LatentDim: 12, DTypeBytes: 2}
)

func testAllocator(t testing.TB, kind hostmem.Kind) *hostmem.Allocator {
	t.Helper()
	cfg := hostmem.DefaultConfig(kind)
	cfg.ReserveBytes = 0
	cfg.Logger = slog.New(slog.DiscardHandler)
	a, err := hostmem.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func testSpec(layout kvlayout.Kind, pages int) GroupSpec {
	return GroupSpec{
		Pools:    []PoolSpec{{Name: pagekey.TargetPool, Geometry: testTarget}, {Name: pagekey.DraftPool, Geometry: testDraft}},
		Layout:   layout,
		PageSize: 4,
		Pages:    pages,
	}
}

// The seed failure: a draft pool allocated with different memory than the target's.
// BuildGroup has one allocator for every pool, so with shm every pool is a memfd.
func TestEveryPoolOfAGroupUsesTheGroupAllocator(t *testing.T) {
	for _, kind := range []hostmem.Kind{hostmem.Shm, hostmem.Mmap} {
		g, err := BuildGroup(testSpec(kvlayout.PageFirst, 8), testAllocator(t, kind))
		if err != nil {
			t.Fatal(err)
		}
		if g.AllocatorKind() != kind {
			t.Fatalf("group kind %s, want %s", g.AllocatorKind(), kind)
		}
		for _, p := range g.Pools() {
			if p.Region().Kind() != kind {
				t.Errorf("pool %q is in %s memory, group allocator is %s", p.Name(), p.Region().Kind(), kind)
			}
			if (kind == hostmem.Shm) != (p.Region().Fd() >= 0) {
				t.Errorf("pool %q: fd %d with allocator %s", p.Name(), p.Region().Fd(), kind)
			}
			if int64(len(p.Bytes())) != p.Layout().PoolBytes() {
				t.Errorf("pool %q: %d bytes, layout says %d", p.Name(), len(p.Bytes()), p.Layout().PoolBytes())
			}
		}
		if g.Pool("draft") == nil || g.Target().Name() != "kv" || g.Pool("nope") != nil {
			t.Fatal("pool lookup")
		}
		if err := g.Close(); err != nil {
			t.Fatal(err)
		}
		if err := g.Close(); err != nil {
			t.Fatalf("second Close returned %v; it should repeat the first result", err)
		}
	}
}

func TestGroupSharesOnePageSpace(t *testing.T) {
	g, err := BuildGroup(testSpec(kvlayout.PageFirst, 8), testAllocator(t, hostmem.Mmap))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	pages, err := g.Alloc(8)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Alloc(1); !errors.Is(err, ErrFull) {
		t.Fatalf("alloc past capacity: %v", err)
	}
	if err := g.Free(pages[:3]); err != nil {
		t.Fatal(err)
	}
	if err := g.Free(pages[:1]); !errors.Is(err, ErrDoubleFree) {
		t.Fatalf("double free: %v", err)
	}
	if err := g.Free([]PageID{99}); !errors.Is(err, ErrForeignPage) {
		t.Fatalf("foreign free: %v", err)
	}
	if g.FreePages() != 3 {
		t.Fatalf("free pages %d, want 3", g.FreePages())
	}
}

func TestBuildGroupRejectsBadSpecs(t *testing.T) {
	a := testAllocator(t, hostmem.Mmap)
	for _, c := range []struct {
		name string
		spec GroupSpec
		want error
	}{
		{"no pools", GroupSpec{}, ErrConfig},
		{"a pool twice", GroupSpec{Pools: []PoolSpec{{Name: "kv", Geometry: testTarget}, {Name: "kv", Geometry: testDraft}}, PageSize: 4, Pages: 4}, ErrConfig},
		{"a bad name", GroupSpec{Pools: []PoolSpec{{Name: "KV!", Geometry: testTarget}}, PageSize: 4, Pages: 4}, ErrConfig},
		{"no name", GroupSpec{Pools: []PoolSpec{{Name: "", Geometry: testTarget}}, PageSize: 4, Pages: 4}, ErrConfig},
		{"page size 0", GroupSpec{Pools: []PoolSpec{{Name: "kv", Geometry: testTarget}}, PageSize: 0, Pages: 4}, kvlayout.ErrLayout},
		{"no pages", GroupSpec{Pools: []PoolSpec{{Name: "kv", Geometry: testTarget}}, PageSize: 4, Pages: 0}, kvlayout.ErrLayout},
		{"a bad geometry", GroupSpec{Pools: []PoolSpec{{Name: "kv", Geometry: kvlayout.Geometry{Layers: 1}}}, PageSize: 4, Pages: 4}, kvlayout.ErrGeometry},
	} {
		if g, err := BuildGroup(c.spec, a); !errors.Is(err, c.want) || g != nil {
			t.Errorf("%s: BuildGroup = %v, %v; want no group and %v", c.name, g, err, c.want)
		}
	}
	if _, err := BuildGroup(testSpec(kvlayout.PageFirst, 4), nil); !errors.Is(err, ErrConfig) {
		t.Errorf("nil allocator: %v", err)
	}
}

func TestBuildGroupReleasesEverythingOnFailure(t *testing.T) {
	spec := testSpec(kvlayout.PageFirst, 64)
	target := spec.Pools[0].Geometry.TokenBytes() * spec.PageSize * spec.Pages
	cfg := hostmem.Config{Kind: hostmem.Mmap, Available: func() (int64, error) { return int64(target) + 4096, nil }}
	a, err := hostmem.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The target pool fits, the draft pool does not: the target must be released.
	if _, err := BuildGroup(spec, a); !errors.Is(err, hostmem.ErrNoMemory) {
		t.Fatalf("BuildGroup = %v, want ErrNoMemory", err)
	}
	// With the target released, its memory is available again.
	r, err := a.Allocate("again", int64(target))
	if err != nil {
		t.Fatalf("target pool memory leaked by the failed build: %v", err)
	}
	r.Close()
}

func TestPageBuffer(t *testing.T) {
	for _, kind := range []kvlayout.Kind{kvlayout.PageFirst, kvlayout.PageFirstDirect, kvlayout.LayerFirst} {
		g, err := BuildGroup(testSpec(kind, 4), testAllocator(t, hostmem.Mmap))
		if err != nil {
			t.Fatal(err)
		}
		p := g.Target()
		b, ok := p.PageBuffer(1, 2)
		if kind == kvlayout.LayerFirst {
			if ok {
				t.Fatal("layer_first page buffer reported contiguous")
			}
		} else if !ok || int64(len(b)) != p.Layout().PageBufferBytes() {
			t.Fatalf("%v: page buffer %d bytes ok=%v", kind, len(b), ok)
		}
		if _, ok := p.PageBuffer(0, 4); ok {
			t.Fatal("page out of range returned a buffer")
		}
		if _, ok := p.PageBuffer(2, 0); ok {
			t.Fatal("buffer out of range returned a buffer")
		}
		g.Close()
	}
}
