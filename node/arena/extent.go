package arena

import (
	"cmp"
	"fmt"
	"runtime"
	"slices"

	"github.com/stratakv/strata/internal/offheap"
)

// Extents is an offset allocator: it hands out extents (runs of consecutive units)
// of the range [0, size) and takes them back. The arena uses it in units of its
// alignment, for objects of at least the alignment (which so start on an aligned
// address) and for slabs of smaller ones.
//
// Placement is best fit: Alloc takes the smallest free extent that holds n units,
// and of equal-sized ones the lowest offset, and carves the object from that
// extent's low end. Best fit leaves the large extents whole for the large objects
// (a page part is anything from 64 KiB to 8 MiB, so a first fit would chip the big
// holes for small objects); the lowest offset among equals packs objects towards
// the start, so that free space gathers at the end and coalesces there.
//
// Free extents sit in a treap ordered by (size, offset), which finds the best
// fit and the largest extent in O(log n). Two arrays of a word per unit say
// what starts and what ends at each unit: the length of an allocated extent,
// or the node of a free one (freeTag set). They find the neighbours a freed
// extent merges with, and check a Free, in one load each; they were Go maps
// (free extents by start and by end, allocated extents by start and by end),
// whose probes were half of what a small object's Reserve cost beside the
// copy, and whose memory grew with the objects anyway. They cost 8 bytes a
// unit (2 MiB for a GiB arena of 4 KiB units), mapped outside the Go heap. Free extents are always maximal: no two touch. Free checks
// that it is given exactly an allocated extent and refuses anything else with
// ErrExtent instead of corrupting the free lists.
//
// An Extents is not safe for concurrent use; the arena calls it under its lock.
type Extents struct {
	size     int64
	free     int64 // free units
	root     *freeExtent
	nodes    []*freeExtent // free extents by id, as head and tail name them
	head     []uint32      // at an extent's first unit: its length, or freeTag|id
	tail     []uint32      // at an extent's last unit: the same
	freeN    int           // free extents
	allocN   int           // allocated extents
	rng      uint64        // treap priorities
	recycled *freeExtent   // spare nodes, linked through right; they keep their ids
}

// freeTag marks a head or tail word that names a free extent's node; without
// it the word is an allocated extent's length, so an allocated extent is
// shorter than 2^31 units (the arena's are at most maxExtentUnits).
const freeTag = 1 << 31

// freeExtent is a free extent and its treap node: a binary search tree by
// (n, off) that is a max-heap by prio.
type freeExtent struct {
	off, n      int64
	prio        uint64
	id          uint32
	left, right *freeExtent
}

// NewExtents returns an allocator of size units, all free in one extent. A size
// that is not positive gives an allocator with nothing to hand out.
func NewExtents(size int64) *Extents {
	x := &Extents{
		size: max(size, 0),
		rng:  0x9e3779b97f4a7c15,
	}
	x.words()
	if x.size > 0 {
		x.insertFree(0, x.size)
	}
	return x
}

// words gives x its head and tail words, outside the Go heap (mapped, so that
// a large arena's adds nothing to what the collector paces itself by, as its
// records and index do not), given back when x is unreachable. Where the
// mapping fails they come from the heap, which holds them as well.
func (x *Extents) words() {
	if x.size == 0 {
		return
	}
	n := int(x.size)
	head, err := offheap.Slice[uint32](n)
	if err != nil {
		x.head, x.tail = make([]uint32, n), make([]uint32, n)
		return
	}
	tail, err := offheap.Slice[uint32](n)
	if err != nil {
		offheap.Free(head)
		x.head, x.tail = make([]uint32, n), make([]uint32, n)
		return
	}
	x.head, x.tail = head, tail
	runtime.AddCleanup(x, func(w [2][]uint32) {
		offheap.Free(w[0])
		offheap.Free(w[1])
	}, [2][]uint32{head, tail})
}

// Span is a run of units: an extent.
type Span struct{ Off, N int64 }

// RebuildExtents returns an allocator of size units in which exactly the
// extents of allocated are allocated; they must be in offset order, each of
// at least one unit, inside [0, size) and not overlapping. A restarted arena
// rebuilds its allocator so, in one pass, from the extents its unit map
// records.
func RebuildExtents(size int64, allocated []Span) (*Extents, error) {
	x := NewExtents(0)
	x.size = max(size, 0)
	x.words()
	next := int64(0)
	for _, s := range allocated {
		if s.N <= 0 || s.N >= freeTag || s.Off < next || s.Off+s.N > x.size {
			return nil, fmt.Errorf("rebuild [%d, +%d): out of order, overlapping or outside [0, %d): %w", s.Off, s.N, x.size, ErrExtent)
		}
		if s.Off > next {
			x.insertFree(next, s.Off-next)
		}
		x.markAlloc(s.Off, s.N)
		next = s.Off + s.N
	}
	if next < x.size {
		x.insertFree(next, x.size-next)
	}
	return x, nil
}

// Size is the number of units the allocator manages.
func (x *Extents) Size() int64 { return x.size }

// WordBytes is the memory of the head and tail words: 8 bytes a unit.
func (x *Extents) WordBytes() int64 { return 8 * x.size }

// FreeUnits is the number of units in free extents.
func (x *Extents) FreeUnits() int64 { return x.free }

// UsedUnits is the number of units in allocated extents.
func (x *Extents) UsedUnits() int64 { return x.size - x.free }

// FreeExtents is the number of free extents (maximal runs of free units).
func (x *Extents) FreeExtents() int { return x.freeN }

// AllocatedExtents is the number of extents handed out and not yet freed.
func (x *Extents) AllocatedExtents() int { return x.allocN }

// LargestFree is the length of the largest free extent, 0 when nothing is free.
func (x *Extents) LargestFree() int64 {
	t := x.root
	if t == nil {
		return 0
	}
	for t.right != nil {
		t = t.right
	}
	return t.n
}

// Fragmentation is 1 - LargestFree/FreeUnits: 0 when the free units form one
// extent (or none are free), towards 1 when they are scattered in small pieces.
func (x *Extents) Fragmentation() float64 {
	if x.free == 0 {
		return 0
	}
	return 1 - float64(x.LargestFree())/float64(x.free)
}

// Alloc hands out an extent of n units and returns its offset, or false when no
// free extent holds n units (or n is not positive).
func (x *Extents) Alloc(n int64) (off int64, ok bool) {
	if n <= 0 || n >= freeTag {
		return 0, false
	}
	best := x.bestFit(n)
	if best == nil {
		return 0, false
	}
	off, rest := best.off, best.n-n
	x.removeFree(best)
	if rest > 0 {
		x.insertFree(off+n, rest)
	}
	x.markAlloc(off, n)
	return off, true
}

// markAlloc records [off, off+n) as allocated.
func (x *Extents) markAlloc(off, n int64) {
	x.head[off], x.tail[off+n-1] = uint32(n), uint32(n)
	x.allocN++
}

// allocatedAt is the length of the allocated extent that starts at off, 0
// when none does.
func (x *Extents) allocatedAt(off int64) int64 {
	if off < 0 || off >= x.size {
		return 0
	}
	if w := x.head[off]; w&freeTag == 0 {
		return int64(w)
	}
	return 0
}

// freeStartingAt is the free extent that starts at unit u, nil when none does.
func (x *Extents) freeStartingAt(u int64) *freeExtent {
	if u < 0 || u >= x.size {
		return nil
	}
	if w := x.head[u]; w&freeTag != 0 {
		return x.nodes[w&^freeTag]
	}
	return nil
}

// freeEndingAt is the free extent whose last unit is u-1, nil when none is.
func (x *Extents) freeEndingAt(u int64) *freeExtent {
	if u <= 0 || u > x.size {
		return nil
	}
	if w := x.tail[u-1]; w&freeTag != 0 {
		return x.nodes[w&^freeTag]
	}
	return nil
}

// Free returns the extent [off, off+n), which Alloc handed out with exactly that
// offset and length, and merges it with the free extents it touches. Anything
// else (a double free, an unknown offset, the wrong length) is refused with
// ErrExtent and changes nothing.
func (x *Extents) Free(off, n int64) error {
	got := x.allocatedAt(off)
	if got == 0 {
		return fmt.Errorf("free [%d, +%d): no extent is allocated at %d (double free or foreign offset): %w", off, n, off, ErrExtent)
	}
	if got != n {
		return fmt.Errorf("free [%d, +%d): the extent allocated there has %d units: %w", off, n, got, ErrExtent)
	}
	x.head[off], x.tail[off+n-1] = 0, 0
	x.allocN--
	start, end := off, off+n
	if left := x.freeEndingAt(start); left != nil {
		start = left.off
		x.removeFree(left)
	}
	if right := x.freeStartingAt(end); right != nil {
		end = right.off + right.n
		x.removeFree(right)
	}
	x.insertFree(start, end-start)
	return nil
}

// Allocated calls fn for every allocated extent, in no particular order, until fn
// returns false.
func (x *Extents) Allocated(fn func(off, n int64) bool) {
	for u := int64(0); u < x.size; {
		w := x.head[u]
		switch {
		case w == 0:
			return // a bookkeeping bug: Check says which
		case w&freeTag != 0:
			u += x.nodes[w&^freeTag].n
		default:
			if !fn(u, int64(w)) {
				return
			}
			u += int64(w)
		}
	}
}

// FreeList calls fn for every free extent in (length, offset) order, the order
// Alloc considers them in, until fn returns false.
func (x *Extents) FreeList(fn func(off, n int64) bool) {
	var stack []*freeExtent
	for t := x.root; t != nil || len(stack) > 0; {
		for ; t != nil; t = t.left {
			stack = append(stack, t)
		}
		t = stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if !fn(t.off, t.n) {
			return
		}
		t = t.right
	}
}

// FreeListDescending calls fn for every free extent from the largest down (of
// equal lengths, the highest offset first) until fn returns false.
func (x *Extents) FreeListDescending(fn func(off, n int64) bool) {
	var stack []*freeExtent
	for t := x.root; t != nil || len(stack) > 0; {
		for ; t != nil; t = t.right {
			stack = append(stack, t)
		}
		t = stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if !fn(t.off, t.n) {
			return
		}
		t = t.left
	}
}

// AllocatedBefore is the offset of the allocated extent that ends where off
// begins, -1 when none does.
func (x *Extents) AllocatedBefore(off int64) int64 {
	if off <= 0 || off > x.size {
		return -1
	}
	if w := x.tail[off-1]; w != 0 && w&freeTag == 0 {
		return off - int64(w)
	}
	return -1
}

// Check verifies the allocator's invariants and returns the first violation: the
// treap's order and heap property, the maps agreeing with it, free extents
// maximal, free and allocated extents tiling [0, size) without overlap, and the
// counters. It walks everything; tests and debugging use it.
func (x *Extents) Check() error {
	type ext struct {
		off, n int64
		free   bool
	}
	var all []ext
	var free, nodes int64
	var walk func(t *freeExtent, lo, hi *freeExtent) error
	walk = func(t *freeExtent, lo, hi *freeExtent) error {
		if t == nil {
			return nil
		}
		nodes++
		if lo != nil && !less(lo, t) || hi != nil && !less(t, hi) {
			return fmt.Errorf("free extent [%d, +%d) is out of (size, offset) order", t.off, t.n)
		}
		for _, c := range []*freeExtent{t.left, t.right} {
			if c != nil && c.prio > t.prio {
				return fmt.Errorf("free extent [%d, +%d) breaks the heap order", c.off, c.n)
			}
		}
		if t.n <= 0 || t.off < 0 || t.off+t.n > x.size {
			return fmt.Errorf("free extent [%d, +%d) outside [0, %d)", t.off, t.n, x.size)
		}
		if x.freeStartingAt(t.off) != t || x.freeEndingAt(t.off+t.n) != t {
			return fmt.Errorf("free extent [%d, +%d) is missing from the unit words", t.off, t.n)
		}
		free += t.n
		all = append(all, ext{t.off, t.n, true})
		if err := walk(t.left, lo, t); err != nil {
			return err
		}
		return walk(t.right, t, hi)
	}
	if err := walk(x.root, nil, nil); err != nil {
		return err
	}
	if nodes != int64(x.freeN) {
		return fmt.Errorf("%d free extents in the tree, %d counted", nodes, x.freeN)
	}
	if free != x.free {
		return fmt.Errorf("free extents hold %d units, the counter says %d", free, x.free)
	}
	// Every word names an extent that starts or ends there: walked unit by
	// unit, the allocated ones are exactly those the words say.
	var allocs int
	for u := int64(0); u < x.size; u++ {
		w := x.head[u]
		if w == 0 || w&freeTag != 0 {
			continue
		}
		n := int64(w)
		if u+n > x.size || x.tail[u+n-1] != w {
			return fmt.Errorf("allocated extent [%d, +%d) does not end where its words say", u, n)
		}
		all = append(all, ext{u, n, false})
		allocs++
	}
	if allocs != x.allocN {
		return fmt.Errorf("%d allocated extents, %d counted", allocs, x.allocN)
	}
	slices.SortFunc(all, func(a, b ext) int { return cmp.Compare(a.off, b.off) })
	next := int64(0)
	for i, e := range all {
		if e.off != next {
			return fmt.Errorf("extent [%d, +%d) does not start where the one before ends (%d): overlap or leak", e.off, e.n, next)
		}
		if e.n <= 0 {
			return fmt.Errorf("extent at %d has length %d", e.off, e.n)
		}
		if e.free && i > 0 && all[i-1].free {
			return fmt.Errorf("free extents at %d and %d touch and were not merged", all[i-1].off, e.off)
		}
		next = e.off + e.n
	}
	if next != x.size {
		return fmt.Errorf("extents cover [0, %d) of [0, %d)", next, x.size)
	}
	return nil
}

// bestFit is the free extent with the least (n, off) of those at least n long.
func (x *Extents) bestFit(n int64) *freeExtent {
	var best *freeExtent
	for t := x.root; t != nil; {
		if t.n >= n {
			best, t = t, t.left
		} else {
			t = t.right
		}
	}
	return best
}

func (x *Extents) insertFree(off, n int64) {
	e := x.recycled
	if e != nil {
		x.recycled = e.right
		*e = freeExtent{id: e.id}
	} else {
		e = &freeExtent{id: uint32(len(x.nodes))}
		x.nodes = append(x.nodes, e)
	}
	// xorshift64: priorities need only be independent of the keys.
	x.rng ^= x.rng << 13
	x.rng ^= x.rng >> 7
	x.rng ^= x.rng << 17
	e.off, e.n, e.prio = off, n, x.rng
	x.root = insertNode(x.root, e)
	x.head[off], x.tail[off+n-1] = freeTag|e.id, freeTag|e.id
	x.free += n
	x.freeN++
}

func (x *Extents) removeFree(e *freeExtent) {
	x.root = deleteNode(x.root, e)
	x.head[e.off], x.tail[e.off+e.n-1] = 0, 0
	x.free -= e.n
	x.freeN--
	*e = freeExtent{id: e.id, right: x.recycled}
	x.recycled = e
}

// less orders free extents by length, then offset.
func less(a, b *freeExtent) bool {
	if a.n != b.n {
		return a.n < b.n
	}
	return a.off < b.off
}

// insertNode adds e to the treap t: it descends by key until e's priority wins,
// then splits the subtree there around e.
func insertNode(t, e *freeExtent) *freeExtent {
	if t == nil {
		return e
	}
	if e.prio > t.prio {
		e.left, e.right = split(t, e)
		return e
	}
	if less(e, t) {
		t.left = insertNode(t.left, e)
	} else {
		t.right = insertNode(t.right, e)
	}
	return t
}

// split divides t into the nodes ordered before e and those after it.
func split(t, e *freeExtent) (l, r *freeExtent) {
	if t == nil {
		return nil, nil
	}
	if less(t, e) {
		t.right, r = split(t.right, e)
		return t, r
	}
	l, t.left = split(t.left, e)
	return l, t
}

// deleteNode removes e, which is in t, and joins its children in its place.
func deleteNode(t, e *freeExtent) *freeExtent {
	if t == e {
		return merge(t.left, t.right)
	}
	if less(e, t) {
		t.left = deleteNode(t.left, e)
	} else {
		t.right = deleteNode(t.right, e)
	}
	return t
}

// merge joins treaps l and r, every node of l ordered before every node of r.
func merge(l, r *freeExtent) *freeExtent {
	switch {
	case l == nil:
		return r
	case r == nil:
		return l
	case l.prio > r.prio:
		l.right = merge(l.right, r)
		return l
	default:
		r.left = merge(l, r.left)
		return r
	}
}
