package radix

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/pagekey"
)

// tokenArena keeps the tree's key elements off the Go heap, in fixed-size token
// pages (PageSize elements each) of one mapped, prefaulted region. Nodes refer to
// their token pages by index, like they refer to device and host pages, so a split
// only slices an index list and a removal returns whole pages to a free stack: no
// fragmentation, no garbage collector work, no page faults on insert. The region
// is sized to the cache's page capacity, which bounds the tree (every cached page
// holds a device or a host page).
type tokenArena[E Elem] struct {
	ps         int
	region     *hostmem.Region
	elems      []E
	keys       []pagekey.Key // page keys by token page, when kept
	keysRegion *hostmem.Region
	free       []int32
	pages      int
}

func newTokenArena[E Elem](ps, pages int, withKeys bool) (*tokenArena[E], error) {
	var zero E
	bytes := int64(pages) * int64(ps) * int64(unsafe.Sizeof(zero))
	alloc, err := hostmem.New(hostmem.Config{Kind: hostmem.Mmap, Prefault: true, TransparentHugePages: true})
	if err != nil {
		return nil, err
	}
	region, err := alloc.Allocate("radix-tokens", bytes)
	if err != nil {
		return nil, fmt.Errorf("token arena for %d pages: %w", pages, err)
	}
	a := &tokenArena[E]{ps: ps, region: region, pages: pages, free: make([]int32, pages)}
	a.elems = unsafe.Slice((*E)(unsafe.Pointer(unsafe.SliceData(region.Bytes()))), pages*ps)
	if withKeys {
		// pagekey.Key holds no pointers, so it may live in mapped memory.
		size := int64(unsafe.Sizeof(pagekey.Key{}))
		if a.keysRegion, err = alloc.Allocate("radix-page-keys", int64(pages)*size); err != nil {
			_ = region.Close()
			return nil, fmt.Errorf("page key arena for %d pages: %w", pages, err)
		}
		a.keys = unsafe.Slice((*pagekey.Key)(unsafe.Pointer(unsafe.SliceData(a.keysRegion.Bytes()))), pages)
	}
	for i := range a.free {
		a.free[i] = int32(pages - 1 - i)
	}
	return a, nil
}

// page is the elements of token page i.
func (a *tokenArena[E]) page(i int32) []E {
	off := int(i) * a.ps
	return a.elems[off : off+a.ps : off+a.ps]
}

// run is the elements of n consecutive token pages starting at i.
func (a *tokenArena[E]) run(i int32, n int) []E {
	off := int(i) * a.ps
	end := off + n*a.ps
	return a.elems[off:end:end]
}

// key is the page key stored with token page i (zero when none is kept).
func (a *tokenArena[E]) key(i int32) pagekey.Key {
	if a.keys == nil {
		return pagekey.Key{}
	}
	return a.keys[i]
}

// store copies whole pages of key into fresh token pages, with their page keys when
// the arena keeps them and keys is not nil, and returns their indexes, or false
// when the arena has too few free pages. Consecutive free pages are filled with one
// copy per run.
func (a *tokenArena[E]) store(key []E, keys []pagekey.Key) ([]int32, bool) {
	n := len(key) / a.ps
	if n > len(a.free) {
		return nil, false
	}
	out := make([]int32, n)
	top := len(a.free) - 1
	for i := 0; i < n; {
		j := i + 1
		out[i] = a.free[top-i]
		for j < n && a.free[top-j] == out[j-1]+1 {
			out[j] = a.free[top-j]
			j++
		}
		copy(a.run(out[i], j-i), key[i*a.ps:j*a.ps])
		i = j
	}
	if a.keys != nil {
		for i, p := range out {
			if keys != nil {
				a.keys[p] = keys[i]
			} else {
				a.keys[p] = pagekey.Key{}
			}
		}
	}
	a.free = a.free[:len(a.free)-n]
	return out, true
}

// release returns pages to the free stack in reverse, so that the next store pops
// them in their old order and a node's pages stay consecutive runs.
func (a *tokenArena[E]) release(pages []int32) {
	for i := len(pages) - 1; i >= 0; i-- {
		a.free = append(a.free, pages[i])
	}
}

func (a *tokenArena[E]) used() int { return a.pages - len(a.free) }

func (a *tokenArena[E]) close() error {
	if a.keysRegion != nil {
		return errors.Join(a.region.Close(), a.keysRegion.Close())
	}
	return a.region.Close()
}
