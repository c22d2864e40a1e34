package storagebench

import (
	"context"
	"fmt"
	"runtime"
	"slices"

	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/storage"
)

func (e *engine) parts() int { return e.r.shape.Geometry.Buffers() }

// srcPages are the host pages batch b is put from.
func (e *engine) srcPages(b int) []pool.PageID {
	first := 0
	if e.holdAll {
		first = b * e.r.cfg.PagesPerBatch
	}
	return pageRange(first, e.r.cfg.PagesPerBatch)
}

// dstPages are the host pages every batch is read back into: the pool's last batch.
func (e *engine) dstPages() []pool.PageID {
	return pageRange(e.group.Pages()-e.r.cfg.PagesPerBatch, e.r.cfg.PagesPerBatch)
}

func pageRange(first, n int) []pool.PageID {
	out := make([]pool.PageID, n)
	for i := range out {
		out[i] = pool.PageID(first + i)
	}
	return out
}

// chunks returns the object parts of pages in host memory, page by page, K before V.
func (e *engine) chunks(pages []pool.PageID) [][]byte {
	out := make([][]byte, 0, len(pages)*e.parts())
	for _, p := range pages {
		for part := range e.parts() {
			b, ok := e.hp.PageBuffer(part, p)
			if !ok {
				panic(fmt.Sprintf("storagebench: page %d part %d of a page_first pool is not contiguous", p, part))
			}
			out = append(out, b)
		}
	}
	return out
}

// names returns the object names of batch b's chunks, in the order of chunks: the
// names the backend stores them under.
func (e *engine) names(b int) []string {
	out := make([]string, 0, len(e.keys[b])*e.parts())
	for _, k := range e.keys[b] {
		out = append(out, storage.ObjectNames(e.spec, k)...)
	}
	return out
}

// fill writes batch b's contents into its source pages and records their hashes.
func (e *engine) fill(b int) {
	chunks := e.chunks(e.srcPages(b))
	parts := e.parts()
	_ = parallel(context.Background(), runtime.GOMAXPROCS(0), len(chunks), func(i int) error {
		fillChunk(chunks[i], chunkSeed(e.seed, b, i/parts, i%parts))
		e.hashes[b][i] = hashChunk(chunks[i])
		return nil
	})
}

// verify counts the pages of batch b whose bytes in dst differ from what was put.
func (e *engine) verify(b int, dst [][]byte) int64 {
	parts := e.parts()
	bad := make([]bool, len(dst))
	_ = parallel(context.Background(), runtime.GOMAXPROCS(0), len(dst), func(i int) error {
		bad[i] = hashChunk(dst[i]) != e.hashes[b][i]
		return nil
	})
	var pages int64
	for p := 0; p < len(dst)/parts; p++ {
		if slices.Contains(bad[p*parts:(p+1)*parts], true) {
			pages++
		}
	}
	return pages
}

// clearAll zeroes the chunks, so that a get that writes nothing is caught.
func clearAll(chunks [][]byte) {
	_ = parallel(context.Background(), runtime.GOMAXPROCS(0), len(chunks), func(i int) error {
		clear(chunks[i])
		return nil
	})
}
