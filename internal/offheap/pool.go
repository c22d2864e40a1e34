// Package offheap holds the building blocks of indexes kept outside the Go
// heap: a Pool of fixed-size elements addressed by uint32 and a Table, an
// open-addressing hash table of such indexes. The node's arena and spill index
// their objects with them.
//
// Both live in memory mapped with mmap, never allocated by Go, so the garbage
// collector neither scans nor sweeps them: holding 100M objects costs a
// collection nothing, where a Go map of the same entries costs over 100 bytes
// an object and collection time that grows with it. The price is that what
// they hold must not contain Go pointers (the collector would not see them)
// and that their memory must be given back with Close.
//
// Neither is safe for concurrent use: their users guard them with a mutex.
package offheap

import "unsafe"

// chunkShift sets the elements per mapped chunk of a pool: 64 Ki, so 3 MiB of
// 48-byte records. Chunks are mapped as the pool grows and never move, so an
// element's address stays valid until Close.
const chunkShift = 16

// Pool hands out fixed-size elements of T from chunks of memory mapped outside
// the Go heap, addressed by uint32 indexes: an index is half a pointer, and a
// struct of indexes holds no pointers. T must hold no Go pointers. Freed
// indexes are reused first, last freed first. The zero Pool is empty and ready
// to use.
type Pool[T any] struct {
	chunks [][]T    // each a mapped chunk of 1<<chunkShift elements
	n      uint32   // indexes handed out so far, freed ones included
	free   []uint32 // freed indexes: a pointer-free slice the GC does not scan
	live   int
}

// Get is element i, which Alloc handed out. Its address is stable until Close.
func (p *Pool[T]) Get(i uint32) *T { return &p.chunks[i>>chunkShift][i&(1<<chunkShift-1)] }

// Alloc returns the index of a zeroed element. It fails with ErrMap when a new
// chunk cannot be mapped and with ErrFull past 2^32-1 elements.
func (p *Pool[T]) Alloc() (uint32, error) {
	var i uint32
	if k := len(p.free); k > 0 {
		i = p.free[k-1]
		p.free = p.free[:k-1]
	} else {
		if p.n == 1<<32-1 {
			return 0, ErrFull
		}
		if int(p.n>>chunkShift) == len(p.chunks) {
			c, err := mapSlice[T](1 << chunkShift)
			if err != nil {
				return 0, err
			}
			p.chunks = append(p.chunks, c)
		}
		i = p.n
		p.n++
	}
	p.live++
	var zero T
	*p.Get(i) = zero
	return i, nil
}

// Release returns element i, which Alloc handed out, for reuse. Its bytes stay
// as they are until Alloc hands it out again, zeroed.
func (p *Pool[T]) Release(i uint32) {
	p.free = append(p.free, i)
	p.live--
}

// Len is the indexes handed out so far, freed ones included: every index
// below it has been handed out, and none from it on.
func (p *Pool[T]) Len() uint32 { return p.n }

// Live is the elements handed out and not released.
func (p *Pool[T]) Live() int { return p.live }

// Bytes is the memory the pool has mapped. Only the pages written are
// resident (MAP_NORESERVE): at most one chunk's worth is mapped and untouched.
func (p *Pool[T]) Bytes() int64 {
	var zero T
	return int64(len(p.chunks)) << chunkShift * int64(unsafe.Sizeof(zero))
}

// Close unmaps the pool's memory and empties it: elements from Get must not be
// used any more. The pool is ready for use again.
func (p *Pool[T]) Close() {
	for _, c := range p.chunks {
		unmapSlice(c)
	}
	*p = Pool[T]{}
}
