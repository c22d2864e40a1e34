package pool

import (
	"fmt"
	"sync"

	"github.com/stratakv/strata/pageid"
)

// PageID names one page of a pool (or of every pool of a group): slots
// PageID*PageSize through PageID*PageSize+PageSize-1. It is pageid.ID, which
// the radix tree shares without depending on pools; the alias keeps pool's
// API and its many callers (storage backends, the benches) as they are.
type PageID = pageid.ID

// PageAllocator hands out whole pages of one page space. Every pool of a group shares
// one PageAllocator, which is what keeps target and draft slots aligned 1:1. It is
// safe for concurrent use. Frees are checked: a page that is out of range or not
// allocated is an error, and a failing Free frees nothing.
type PageAllocator struct {
	mu        sync.Mutex
	free      []PageID // stack; low pages are handed out first
	allocated []uint64 // bitmap
	pages     int
}

// NewPageAllocator returns an allocator of pages pages, all free.
func NewPageAllocator(pages int) (*PageAllocator, error) {
	if pages < 1 || pages > 1<<31-1 {
		return nil, fmt.Errorf("page allocator of %d pages: want 1 to %d: %w", pages, 1<<31-1, ErrConfig)
	}
	a := &PageAllocator{pages: pages, free: make([]PageID, pages), allocated: make([]uint64, (pages+63)/64)}
	for i := range a.free {
		a.free[i] = PageID(pages - 1 - i)
	}
	return a, nil
}

// Pages is the size of the page space.
func (a *PageAllocator) Pages() int { return a.pages }

// Free is the number of free pages.
func (a *PageAllocator) FreePages() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.free)
}

// Alloc takes n pages, or none if fewer than n are free.
func (a *PageAllocator) Alloc(n int) ([]PageID, error) {
	return a.AppendAlloc(nil, n)
}

// AppendAlloc is Alloc appending to dst.
func (a *PageAllocator) AppendAlloc(dst []PageID, n int) ([]PageID, error) {
	if n < 0 {
		return dst, fmt.Errorf("allocate %d pages: %w", n, ErrConfig)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if n > len(a.free) {
		return dst, fmt.Errorf("allocate %d pages: %d of %d free: %w", n, len(a.free), a.pages, ErrFull)
	}
	cut := len(a.free) - n
	for i := len(a.free) - 1; i >= cut; i-- {
		p := a.free[i]
		a.allocated[p>>6] |= 1 << (uint(p) & 63)
		dst = append(dst, p)
	}
	a.free = a.free[:cut]
	return dst, nil
}

// Free returns pages to the allocator. It checks every page first: an index outside
// the page space (ErrForeignPage), a page that is not allocated or listed twice
// (ErrDoubleFree) fails the whole call and frees nothing.
func (a *PageAllocator) Free(pages []PageID) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, p := range pages {
		if p < 0 || int(p) >= a.pages {
			return fmt.Errorf("free page %d of a %d-page space: %w", p, a.pages, ErrForeignPage)
		}
		if a.allocated[p>>6]&(1<<(uint(p)&63)) == 0 {
			a.undoMarks(pages[:i])
			return fmt.Errorf("free page %d: %w", p, ErrDoubleFree)
		}
		// Clear as we go so a duplicate later in the list is caught; undo on failure.
		a.allocated[p>>6] &^= 1 << (uint(p) & 63)
	}
	a.free = append(a.free, pages...)
	return nil
}

func (a *PageAllocator) undoMarks(pages []PageID) {
	for _, p := range pages {
		a.allocated[p>>6] |= 1 << (uint(p) & 63)
	}
}

// Allocated reports whether page p is currently allocated.
func (a *PageAllocator) Allocated(p PageID) bool {
	if p < 0 || int(p) >= a.pages {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.allocated[p>>6]&(1<<(uint(p)&63)) != 0
}
