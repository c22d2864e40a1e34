package storagetest

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"testing"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/kvlayout"
	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/storage"
)

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
