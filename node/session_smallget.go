package node

import (
	"context"

	"github.com/stratakv/strata/node/arena"
	"github.com/stratakv/strata/node/wire"
)

// existsInArena answers an Exists on the connection's own goroutine when the
// arena alone decides it: it holds every key, or there is no spill or Redis to
// look in after it. That is a few microseconds of map lookups under one lock,
// and it saves the goroutine, the timer and the scheduling of handleBatch,
// which were most of a lookup's round trip on a busy machine (a prefetch asks
// before every request it schedules). It reports whether it answered.
func (c *session) existsInArena(id uint64, m *wire.Exists) bool {
	s := c.srv
	n := s.arena.ContainsPrefix(m.Keys, m.Format)
	if n < len(m.Keys) && (s.spill != nil || s.remote != nil) {
		return false
	}
	c.ops.Add(1)
	s.st.exists.Add(1)
	c.reply(id, wire.TypeExistsReply, wire.ExistsReply{Present: uint32(n)})
	return true
}

// getScratch holds a small Get's keys, leases and results (arena.AcquireInto):
// one of each per batch instead of a Lease allocated per object.
type getScratch struct {
	keys    []string
	leases  []arena.Lease
	errs    []error
	results []wire.Result
}

// lease leases the objects of items under one lock into sc, and reports false,
// leasing nothing, when it cannot: items of several formats (which a client
// never sends, but may), or the arena closed.
func (c *session) lease(items []wire.Item, sc *getScratch) bool {
	format := items[0].Format
	sc.keys = sc.keys[:0]
	for i := range items {
		if items[i].Format != format {
			clear(sc.keys)
			sc.keys = sc.keys[:0]
			return false
		}
		sc.keys = append(sc.keys, items[i].Key)
	}
	n := len(items)
	if cap(sc.leases) < n {
		sc.leases, sc.errs = make([]arena.Lease, n), make([]error, n)
	}
	sc.leases, sc.errs = sc.leases[:n], sc.errs[:n]
	return c.srv.arena.AcquireInto(sc.keys, format, sc.leases, sc.errs) == nil
}

// done releases sc's leases and drops its references to the request (its keys
// are slices of the request's buffer).
func (sc *getScratch) done(a *arena.Arena) {
	a.ReleaseAll(sc.leases)
	clear(sc.keys)
	sc.keys = sc.keys[:0]
}

// smallBatch reports whether items name less than inlineBatchBytes in all.
func smallBatch(items []wire.Item) bool {
	var n uint64
	for i := range items {
		for _, r := range items[i].Ranges {
			if n += r.Length; n >= inlineBatchBytes || r.Length >= inlineBatchBytes {
				return false
			}
		}
		for _, r := range items[i].Runs {
			// A run is at most MaxRunCount ranges: the product does not
			// overflow once the length is under inlineBatchBytes.
			if r.Length >= inlineBatchBytes {
				return false
			}
			if n += uint64(r.Count) * r.Length; n >= inlineBatchBytes {
				return false
			}
		}
	}
	return len(items) > 0
}

// copyHits fills results with the items of items[lo:lo+len(sc.keys)] that sc
// leased (copied into their ranges) and those with a range outside the
// client's segments, counting in t, and reports whether any item is left: one
// the arena did not hold. sc's i-th lease is item lo+i's; b resolved all of
// items.
func (c *session) copyHits(items []wire.Item, lo int, b *batchRanges, sc *getScratch, results []wire.Result, t *tally) (left bool) {
	for j := range sc.keys {
		i := lo + j
		r, ok := b.item(i)
		switch {
		case !ok:
			results[i] = c.refuseIn(b, items, i)
		case sc.errs[j] == nil:
			if results[i] = c.copyLease(&sc.leases[j], items[i], r); results[i].Status == wire.OK {
				t.hits++
				t.objects++
				t.bytes += r.size
			}
		default:
			left = true
		}
	}
	return left
}

// getSmall serves a Get under inlineBatchBytes on the request's goroutine: the
// objects the arena holds from leases taken under one lock, the others one by
// one (getResolved: waits for writes, the spill), once the leases are released.
// It reports false, doing nothing, for a larger batch or one it cannot lease at
// once; eachItem serves those.
func (c *session) getSmall(ctx context.Context, items []wire.Item, w *window, results []wire.Result) bool {
	var sc getScratch
	if !smallBatch(items) || !c.lease(items, &sc) {
		return false
	}
	b := c.resolveBatch(items, w, true)
	defer b.done()
	var t [1]tally
	left := c.copyHits(items, 0, b, &sc, results, &t[0])
	sc.done(c.srv.arena)
	if left {
		for i := range items {
			if r, ok := b.item(i); ok && sc.errs[i] != nil {
				results[i] = c.getResolved(ctx, items[i], r, &t[0])
			}
		}
	}
	c.flushGets(t[:])
	return true
}

// getInArena answers a Get on the connection's own goroutine when nothing in it
// can block: it is under inlineBatchBytes and the arena holds every object (a
// miss may wait for a write, read the spill or ask Redis). That saves the
// goroutine, the timer and the wake-ups of handleBatch, and reuses the
// session's scratch (c.inline) for the leases and results. It reports whether
// it answered; when not, it leased nothing and the Get goes to handleBatch.
func (c *session) getInArena(id uint64, m *wire.Get) bool {
	s := c.srv
	if hk := s.cfg.hooks; hk != nil && hk.admitted != nil {
		return false // a test holds requests admitted: let it
	}
	sc := &c.inline
	if !smallBatch(m.Items) || !c.lease(m.Items, sc) {
		return false
	}
	for _, err := range sc.errs {
		if err != nil {
			sc.done(s.arena)
			return false
		}
	}
	n := len(m.Items)
	if cap(sc.results) < n {
		sc.results = make([]wire.Result, n)
	}
	results := sc.results[:n]
	clear(results)
	b := c.resolveBatch(m.Items, c.newWindow(m.DeadlineNS, m.FenceSlot), true)
	var t [1]tally
	c.copyHits(m.Items, 0, b, sc, results, &t[0])
	sc.done(s.arena)
	b.done()
	c.ops.Add(1)
	s.st.gets.Add(1)
	c.flushGets(t[:])
	c.unscope(results)
	// Send encodes the reply before it returns: results can be reused after.
	c.reply(id, wire.TypeBatchReply, wire.BatchReply{Results: results})
	clear(results)
	return true
}
