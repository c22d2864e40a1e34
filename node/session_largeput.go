package node

import (
	"context"
	"errors"

	"github.com/stratakv/strata/node/arena"
	"github.com/stratakv/strata/node/spill"
	"github.com/stratakv/strata/node/wire"
	"github.com/stratakv/strata/storage"
)

// putScratch is a copy worker's buffers for the chunks of a Put it serves:
// one set per worker and batch instead of a Pending allocated per object.
type putScratch struct {
	keys    []string
	formats []uint64
	sizes   []int64
	items   []int // the item each reservation is for
	ps      []arena.Pending
	errs    []error
	commits []bool // which of ps commitChunk commits
	later   []int  // items served one by one after the chunk
}

func (sc *putScratch) reset() {
	clear(sc.keys) // they are slices of the request's buffer
	sc.keys, sc.formats, sc.sizes, sc.items, sc.later = sc.keys[:0], sc.formats[:0], sc.sizes[:0], sc.items[:0], sc.later[:0]
}

// putBatch serves the items of a Put, chunkItems at a time: a chunk's objects
// are reserved under one lock (arena.ReserveInto), copied, and committed
// under one lock (arena.CommitAll); on up to CopyWorkers goroutines for a batch
// of at least inlineBatchBytes, on the request's own for a smaller one. The
// objects a chunk cannot reserve at once (no room without evicting, a key
// another request is writing, one stored already) are served one by one by
// putResolved once the chunk's own writes are committed, so that a worker never
// waits for another request's write while it holds writes that request could
// be waiting for.
func (c *session) putBatch(ctx context.Context, items []wire.Item, w *window, results []wire.Result) {
	b := c.resolveBatch(items, w, false)
	defer b.done()
	scratch := make([]putScratch, c.chunkWorkers())
	c.flushPuts(c.eachChunk(b, len(items), func(wk, lo, hi int, t *tally) {
		c.putChunk(ctx, items, lo, hi, b, &scratch[wk], results, t)
	}))
}

// putChunk serves items[lo:hi] of a Put into results (putBatch).
func (c *session) putChunk(ctx context.Context, items []wire.Item, lo, hi int, b *batchRanges, sc *putScratch, results []wire.Result, t *tally) {
	s := c.srv
	sc.reset()
	defer sc.reset()
	for i := lo; i < hi; i++ {
		r, ok := b.item(i)
		switch {
		case !ok:
			results[i] = c.refuseIn(b, items, i)
			continue
		case !r.win.open():
			results[i] = c.copyFailed(items[i], r, errDeadline)
			continue
		}
		if s.spill != nil {
			_, err := s.spill.ObjectSize(ctx, items[i].Key, storage.Format(items[i].Format))
			if err == nil {
				s.st.putSkipped.Add(1)
				results[i] = wire.Result{} // write-once: the spill has it
				continue
			}
			if errors.Is(err, spill.ErrOtherFormat) {
				results[i] = formatMismatch(items[i].Key)
				continue
			}
		}
		sc.keys = append(sc.keys, items[i].Key)
		sc.formats = append(sc.formats, items[i].Format)
		sc.sizes = append(sc.sizes, r.size)
		sc.items = append(sc.items, i)
	}
	n := len(sc.keys)
	if n == 0 {
		return
	}
	if cap(sc.ps) < n {
		sc.ps, sc.errs, sc.commits = make([]arena.Pending, n), make([]error, n), make([]bool, n)
	}
	ps, errs := sc.ps[:n], sc.errs[:n]
	if err := s.arena.ReserveInto(sc.keys, sc.formats, sc.sizes, ps, errs); err != nil {
		sc.later = append(sc.later, sc.items...) // closed or broken: putResolved answers each
	} else {
		c.copyChunk(items, b, sc, results)
		c.commitChunk(items, sc, results, t)
	}
	for _, i := range sc.later {
		if r, ok := b.item(i); ok {
			results[i] = c.putResolved(ctx, items[i], r, t)
		} else {
			results[i] = c.refuseIn(b, items, i)
		}
	}
}

// copyChunk copies the client's bytes of each object of sc that ReserveInto
// reserved, and queues the others for putResolved. A copy that fails answers
// its item and aborts its write.
func (c *session) copyChunk(items []wire.Item, b *batchRanges, sc *putScratch, results []wire.Result) {
	for j, i := range sc.items {
		if sc.errs[j] != nil {
			sc.later = append(sc.later, i)
			continue
		}
		p := &sc.ps[j]
		c.srv.hookReserved(items[i].Key)
		// Resolved again: a copy of the chunk that faulted dropped its
		// segment, and the items in it fail as they would have alone.
		r, ok := b.item(i)
		if !ok {
			results[i] = c.refuseIn(b, items, i)
			p.Abort()
			continue
		}
		if err := r.win.copyIn(p.Bytes(), r.runs); err != nil {
			results[i] = c.copyFailed(items[i], r, err)
			p.Abort()
		}
	}
}

// commitChunk commits what copyChunk copied and answers those items.
func (c *session) commitChunk(items []wire.Item, sc *putScratch, results []wire.Result, t *tally) {
	s := c.srv
	n := len(sc.items)
	ps := sc.ps[:n]
	// Every write of the chunk ends here, committed or aborted, whatever
	// CommitAll did: Abort after Commit does nothing.
	defer func() {
		for j := range ps {
			ps[j].Abort()
		}
	}()
	// The reservation errors are spent (copyChunk queued those items): the
	// slice takes the commits' now.
	committing := sc.commits[:n]
	for j := range ps {
		committing[j] = sc.errs[j] == nil && ps[j].Bytes() != nil
	}
	_ = s.arena.CommitAll(ps, sc.errs[:n]) // a fault answers in the errors of what it left
	for j, i := range sc.items {
		if !committing[j] {
			continue
		}
		switch err := sc.errs[j]; {
		case err == nil:
			if s.remote != nil {
				s.remote.enqueue(items[i].Key, items[i].Format, sc.sizes[j])
			}
			fallthrough
		case errors.Is(err, arena.ErrRemoved):
			// A remove of the key landed while it was written: the put ends as
			// if it had come first and been removed (node/arena's remove.go).
			t.objects++
			t.bytes += sc.sizes[j]
			results[i] = wire.Result{}
		default:
			results[i] = wire.Result{Status: wire.Internal, Message: wire.ClipMessage(err.Error())}
		}
	}
}
