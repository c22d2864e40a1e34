package spill

import (
	"sync"

	"github.com/stratakv/strata/internal/vecio"
)

// directChunk is the bounce buffer of a direct write.
const directChunk = 1 << 20

// scratchPools hold block-aligned buffers by power-of-two size class. The
// Go heap does not move objects, so the alignment holds for a buffer's life.
type scratchPools [48]sync.Pool

func sizeClass(n int64) int {
	c := 16 // 64 KiB at least
	for int64(1)<<c < n {
		c++
	}
	return c
}

func (s *Store) getScratch(n int64) *[]byte {
	c := sizeClass(n)
	if v := s.scratch[c].Get(); v != nil {
		b := v.(*[]byte)
		*b = (*b)[:n]
		return b
	}
	b := vecio.AlignedBytes(1<<c, block)
	b = b[:n]
	return &b
}

func (s *Store) putScratch(b *[]byte) {
	c := sizeClass(int64(cap(*b)))
	*b = (*b)[:cap(*b)]
	s.scratch[c].Put(b)
}
