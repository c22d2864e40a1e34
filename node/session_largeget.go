package node

import (
	"context"

	"github.com/stratakv/strata/node/wire"
)

// chunkItems is how many items of a large Get a copy worker leases under one
// lock (arena.AcquireInto) before it copies them, and how many of a Put it
// reserves and commits under one (arena.ReserveInto, CommitAll). A lease
// taken one object at a time was a fifth of a one-token page's Get beside its
// copy: a Lease
// allocated per object, the arena's lock taken twice, and a key compared in
// arena memory while nothing else was in flight. A chunk takes the lock twice
// for all of its objects and looks their keys up back to back; it is small
// enough that the leases it holds while it copies keep few objects from
// eviction, and that the workers still share a batch's items evenly.
const chunkItems = 32

// getLarge serves a Get of at least inlineBatchBytes on up to CopyWorkers
// goroutines, each taking chunkItems items at a time: the objects the arena
// holds are leased under one lock and copied, and the others are served one by
// one once the chunk's leases are released (getResolved: waits for writes,
// the spill). A chunk whose items the arena cannot lease at once (items of
// several formats, a closed arena) is served one by one too.
func (c *session) getLarge(ctx context.Context, items []wire.Item, w *window, results []wire.Result) {
	b := c.resolveBatch(items, w, true)
	defer b.done()
	scratch := make([]getScratch, c.chunkWorkers())
	c.flushGets(c.eachChunk(b, len(items), func(wk, lo, hi int, t *tally) {
		c.getChunk(ctx, items, lo, hi, b, &scratch[wk], results, t)
	}))
}

// chunkWorkers is the most goroutines eachChunk serves a batch on.
func (c *session) chunkWorkers() int { return max(1, c.srv.cfg.CopyWorkers) }

// eachChunk calls serve for the items [lo, hi) of each chunk of chunkItems of
// the n items b resolved, on the request's goroutine for a batch under
// inlineBatchBytes and on up to chunkWorkers goroutines otherwise, wk naming
// the one that runs it (0 to chunkWorkers-1, for its scratch), and returns the
// workers' tallies.
func (c *session) eachChunk(b *batchRanges, n int, serve func(wk, lo, hi int, t *tally)) []tally {
	chunks := (n + chunkItems - 1) / chunkItems
	workers := 1
	if b.bytes >= inlineBatchBytes {
		workers = max(1, min(c.chunkWorkers(), chunks))
	}
	tallies := make([]tally, workers)
	c.srv.forEach(chunks, workers, func(wk, k int) {
		lo := k * chunkItems
		serve(wk, lo, min(lo+chunkItems, n), &tallies[wk])
	})
	return tallies
}

// getChunk serves items[lo:hi] of a large Get into results (getLarge).
func (c *session) getChunk(ctx context.Context, items []wire.Item, lo, hi int, b *batchRanges, sc *getScratch, results []wire.Result, t *tally) {
	one := func(i int) {
		if r, ok := b.item(i); ok {
			results[i] = c.getResolved(ctx, items[i], r, t)
		} else {
			results[i] = c.refuseIn(b, items, i)
		}
	}
	if !c.lease(items[lo:hi], sc) {
		for i := lo; i < hi; i++ {
			one(i)
		}
		return
	}
	left := c.copyHits(items, lo, b, sc, results, t)
	sc.done(c.srv.arena)
	if !left {
		return
	}
	for j, err := range sc.errs[:hi-lo] {
		if _, ok := b.item(lo + j); ok && err != nil {
			one(lo + j)
		}
	}
}
