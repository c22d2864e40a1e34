package pool

import (
	"errors"
	"fmt"
	"sync"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/kvlayout"
)

// HostPool is one model's KV buffers in host memory. Only BuildGroup makes them, so
// every pool of a group lives in memory from the same allocator.
type HostPool struct {
	name   string
	layout kvlayout.Layout
	region *hostmem.Region
}

// Name is the pool's name within its group ("kv" for the target model, "draft" for
// the EAGLE draft model).
func (p *HostPool) Name() string { return p.name }

// Layout is the pool's geometry and byte order.
func (p *HostPool) Layout() kvlayout.Layout { return p.layout }

// Region is the mapped memory the pool lives in (for registration with storage).
func (p *HostPool) Region() *hostmem.Region { return p.region }

// Bytes is the pool's memory.
func (p *HostPool) Bytes() []byte { return p.region.Bytes()[:p.layout.PoolBytes()] }

// PageBuffer returns the bytes of buffer buf (0 = K or MLA latent, 1 = V) of page,
// across every layer, when they are one run (page_first and page_first_direct
// layouts): the zero-copy source and destination of an L3 object part. ok is false
// for layer_first pools, whose page buffers are one run per layer.
func (p *HostPool) PageBuffer(buf int, page PageID) (b []byte, ok bool) {
	if page < 0 || int(page) >= p.layout.Pages || buf < 0 || buf >= p.layout.Geometry.Buffers() {
		return nil, false
	}
	s := p.layout.PageBufferSpan(buf, int(page))
	if !s.Contiguous() {
		return nil, false
	}
	return p.Bytes()[s.Offset : s.Offset+s.Bytes() : s.Offset+s.Bytes()], true
}

// PoolSpec names one pool of a group and its model geometry.
type PoolSpec struct {
	// Name identifies the pool in the group, in L3 object names and in stats. Use
	// pagekey.TargetPool ("kv") for the target model and pagekey.DraftPool ("draft")
	// for the EAGLE draft model.
	Name string `json:"name"`
	// Geometry is the model's KV geometry on this rank.
	Geometry kvlayout.Geometry `json:"geometry"`
}

// GroupSpec sizes a pool group: pools that cache the same tokens and share one page
// space, so page i of the draft pool holds the same tokens as page i of the target.
type GroupSpec struct {
	// Pools lists the group's pools, target model first.
	Pools []PoolSpec `json:"pools"`
	// Layout is the host byte order. PageFirst suits L3 backends (one contiguous
	// object per page and buffer); LayerFirst suits groups without L3.
	Layout kvlayout.Kind `json:"layout"`
	// PageSize is tokens per page; it must equal the device pools' page size.
	PageSize int `json:"pageSize"`
	// Pages is the number of host pages. Host memory is Pages * PageSize * the sum of
	// every pool's per-token bytes; SGLang sizes it at 2 to 4 times the device pool.
	Pages int `json:"pages"`
}

// Bytes is the host memory the group needs.
func (s GroupSpec) Bytes() int64 {
	var n int64
	for _, p := range s.Pools {
		n += int64(s.PageSize) * int64(s.Pages) * int64(p.Geometry.TokenBytes())
	}
	return n
}

// Validate reports whether s describes a group.
func (s GroupSpec) Validate() error {
	if len(s.Pools) == 0 {
		return fmt.Errorf("pool group with no pools: %w", ErrConfig)
	}
	seen := map[string]bool{}
	for _, p := range s.Pools {
		if err := ValidName(p.Name); err != nil {
			return err
		}
		if seen[p.Name] {
			return fmt.Errorf("pool group lists pool %q twice: %w", p.Name, ErrConfig)
		}
		seen[p.Name] = true
		if _, err := kvlayout.New(p.Geometry, s.Layout, s.PageSize, s.Pages); err != nil {
			return fmt.Errorf("pool %q: %w", p.Name, err)
		}
	}
	return nil
}

// ValidName reports whether name can name a pool: 1 to 32 characters from a-z, 0-9,
// '_' and '-', because pool names appear in object names, metrics and file names.
func ValidName(name string) error {
	if len(name) == 0 || len(name) > 32 {
		return fmt.Errorf("pool name %q: want 1 to 32 characters: %w", name, ErrConfig)
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return fmt.Errorf("pool name %q: only a-z, 0-9, '_' and '-' are allowed: %w", name, ErrConfig)
		}
	}
	return nil
}

// Group is a set of host pools that share one page space. Allocating a page
// allocates it in every pool.
type Group struct {
	spec  GroupSpec
	pools []*HostPool
	pages *PageAllocator
	kind  hostmem.Kind

	closeOnce sync.Once
	closeErr  error
}

// BuildGroup allocates every pool of spec from alloc. It is the only constructor of
// host pools: one allocator for the whole group, so a draft pool can never end up
// in memory that the group's storage backend cannot register. On failure nothing
// stays allocated.
func BuildGroup(spec GroupSpec, alloc *hostmem.Allocator) (*Group, error) {
	if alloc == nil {
		return nil, fmt.Errorf("pool group: no allocator: %w", ErrConfig)
	}
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	pages, err := NewPageAllocator(spec.Pages)
	if err != nil {
		return nil, err
	}
	g := &Group{spec: spec, pages: pages, kind: alloc.Kind()}
	for _, ps := range spec.Pools {
		layout, _ := kvlayout.New(ps.Geometry, spec.Layout, spec.PageSize, spec.Pages)
		region, err := alloc.Allocate("host-"+ps.Name, layout.PoolBytes())
		if err != nil {
			return nil, errors.Join(fmt.Errorf("pool group: pool %q (%s): %w", ps.Name, hostmem.FormatBytes(layout.PoolBytes()), err), g.Close())
		}
		g.pools = append(g.pools, &HostPool{name: ps.Name, layout: layout, region: region})
	}
	return g, nil
}

// Spec is what the group was built from.
func (g *Group) Spec() GroupSpec { return g.spec }

// Pools lists the group's pools, target first.
func (g *Group) Pools() []*HostPool { return g.pools }

// Target is the first pool, the target model's.
func (g *Group) Target() *HostPool { return g.pools[0] }

// Pool returns the pool called name, or nil.
func (g *Group) Pool(name string) *HostPool {
	for _, p := range g.pools {
		if p.name == name {
			return p
		}
	}
	return nil
}

// AllocatorKind is the kind of memory every pool of the group was allocated from.
func (g *Group) AllocatorKind() hostmem.Kind { return g.kind }

// PageSize is tokens per page.
func (g *Group) PageSize() int { return g.spec.PageSize }

// Pages is the size of the shared page space.
func (g *Group) Pages() int { return g.spec.Pages }

// FreePages is the number of pages not allocated.
func (g *Group) FreePages() int { return g.pages.FreePages() }

// Alloc takes n pages in every pool of the group, or none.
func (g *Group) Alloc(n int) ([]PageID, error) { return g.pages.Alloc(n) }

// AppendAlloc is Alloc appending to dst.
func (g *Group) AppendAlloc(dst []PageID, n int) ([]PageID, error) {
	return g.pages.AppendAlloc(dst, n)
}

// Free returns pages to the group; see PageAllocator.Free for the checks.
func (g *Group) Free(pages []PageID) error { return g.pages.Free(pages) }

// Allocated reports whether page p is allocated.
func (g *Group) Allocated(p PageID) bool { return g.pages.Allocated(p) }

// Close releases every pool's memory. The caller must have stopped every copy into
// or out of the group. Close runs once; later calls return the first result.
func (g *Group) Close() error {
	g.closeOnce.Do(func() {
		var errs []error
		for _, p := range g.pools {
			if err := p.region.Close(); err != nil {
				errs = append(errs, err)
			}
		}
		g.closeErr = errors.Join(errs...)
	})
	return g.closeErr
}
