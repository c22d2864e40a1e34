package node

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/stratakv/strata/node/wire"
	"github.com/stratakv/strata/storage"
)

func (c *session) handleBatch(id uint64, msg wire.Message) {
	ctx, cancel := context.WithTimeout(c.srv.life, c.srv.cfg.RequestTimeout)
	defer cancel()
	c.ops.Add(1)
	s := c.srv
	switch m := msg.(type) {
	case *wire.Exists:
		s.st.exists.Add(1)
		n := s.arena.ContainsPrefix(m.Keys, m.Format)
		for _, k := range m.Keys[n:] {
			if !s.has(ctx, k, m.Format) {
				break
			}
			n++
		}
		if s.remote != nil && n < len(m.Keys) {
			n += s.remote.exists(ctx, m.Keys[n:], m.Format)
		}
		c.reply(id, wire.TypeExistsReply, wire.ExistsReply{Present: uint32(n)})
	case *wire.Remove:
		n, err := s.remove(ctx, m.Keys)
		s.st.removes.Add(int64(n))
		if err != nil {
			code := wire.Internal
			if errors.Is(err, errStarting) {
				code = wire.Busy
			}
			c.reply(id, wire.TypeError, wire.Error{Code: code, Message: wire.ClipMessage(c.unscopeText(err.Error()))})
			return
		}
		c.reply(id, wire.TypeRemoveReply, wire.RemoveReply{Removed: uint32(n)})
	case *wire.Put:
		s.st.puts.Add(1)
		w := c.newWindow(m.DeadlineNS, m.FenceSlot)
		ctx, cancel := w.context(ctx)
		defer cancel()
		results := make([]wire.Result, len(m.Items))
		c.putBatch(ctx, m.Items, w, results)
		c.unscope(results)
		c.reply(id, wire.TypeBatchReply, wire.BatchReply{Results: results})
	case *wire.Get:
		s.st.gets.Add(1)
		w := c.newWindow(m.DeadlineNS, m.FenceSlot)
		ctx, cancel := w.context(ctx)
		defer cancel()
		results := make([]wire.Result, len(m.Items))
		if !c.getSmall(ctx, m.Items, w, results) {
			c.getLarge(ctx, m.Items, w, results)
		}
		if s.remote != nil {
			var missed []int
			for i, r := range results {
				if r.Status == wire.NotFound {
					missed = append(missed, i)
				}
			}
			// Promoted objects' keys may be kept: copies of their own, not
			// slices of the request's shared key buffer.
			for _, i := range missed {
				m.Items[i].Key = strings.Clone(m.Items[i].Key)
			}
			c.fetchRemote(ctx, m.Items, w, missed, results)
		}
		// Counted once every tier had its say, so that the counter never goes
		// down when Redis serves what the local tiers missed.
		for _, r := range results {
			if r.Status == wire.NotFound {
				s.st.misses.Add(1)
			}
		}
		c.unscope(results)
		c.reply(id, wire.TypeBatchReply, wire.BatchReply{Results: results})
	}
}

// inlineBatchBytes is the size under which a batch's items are served on the
// request's own goroutine rather than fanned out to CopyWorkers. Below it the
// copies are a small part of the work, and two workers serving tiny items
// mostly take turns at the arena's lock: a Get of 256 objects of 1 KiB took the
// same time either way on a 2-core machine (within the noise of
// BenchmarkNodeSmallObjects), so it runs on one core and leaves the other to
// the engine. Above it the copies dominate and spread over the workers.
const inlineBatchBytes = 1 << 20

// tally counts what a worker served, added to the shared counters once per
// batch rather than with four atomic adds per object. Padded to a cache line so
// that workers do not share one.
type tally struct {
	objects, bytes, hits int64
	_                    [40]byte
}

// flushPuts adds the workers' tallies of a Put to the counters.
func (c *session) flushPuts(ts []tally) {
	var t tally
	for i := range ts {
		t.objects, t.bytes = t.objects+ts[i].objects, t.bytes+ts[i].bytes
	}
	if t.objects > 0 {
		c.srv.st.putObjects.Add(t.objects)
		c.srv.st.putBytes.Add(t.bytes)
		c.objects.Add(t.objects)
		c.bytesIn.Add(t.bytes)
	}
}

// flushGets adds the workers' tallies of a Get to the counters.
func (c *session) flushGets(ts []tally) {
	var t tally
	for i := range ts {
		t.objects, t.bytes, t.hits = t.objects+ts[i].objects, t.bytes+ts[i].bytes, t.hits+ts[i].hits
	}
	if t.objects > 0 {
		c.srv.st.arenaHits.Add(t.hits)
		c.objects.Add(t.objects)
		c.bytesOut.Add(t.bytes)
		c.srv.st.getBytes.Add(t.bytes)
	}
}

// forEach runs fn(w, i) for i in 0..n-1 on workers goroutines (the caller's
// among them), w naming the one that runs it (0 to workers-1).
func (s *Server) forEach(n, workers int, fn func(w, i int)) {
	if workers <= 1 || n <= 1 {
		for i := range n {
			fn(0, i)
		}
		return
	}
	var next atomic.Int64
	work := func(w int) {
		for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
			fn(w, i)
		}
	}
	var wg sync.WaitGroup
	for w := 1; w < min(workers, n); w++ {
		wg.Go(func() { work(w) })
	}
	work(0)
	wg.Wait()
}

// has reports whether key exists in format in the arena or the spill directory.
func (s *Server) has(ctx context.Context, key string, format uint64) bool {
	if s.arena.Contains(key, format) {
		return true
	}
	if s.spill == nil {
		return false
	}
	_, err := s.spill.ObjectSize(ctx, key, storage.Format(format))
	return err == nil
}

// refuseRange answers an item with a range outside the client's segments.
func (c *session) refuseRange(it wire.Item) wire.Result { return c.refuseItem(it, -1) }

// refuseItem is refuseRange for item i of its request.
func (c *session) refuseItem(it wire.Item, i int) wire.Result {
	c.srv.st.badRanges.Add(1)
	return wire.Result{Status: wire.BadRange, Message: wire.ClipMessage(c.badRange(it, i))}
}

// refuseIn answers item i of a batch that b did not resolve: a range outside
// the client's segments, or memory another item of a Get names too.
func (c *session) refuseIn(b *batchRanges, items []wire.Item, i int) wire.Result {
	if why, ok := b.overlap[i]; ok {
		c.srv.st.badRanges.Add(1)
		return wire.Result{Status: wire.BadRange, Message: wire.ClipMessage(why)}
	}
	return c.refuseItem(items[i], i)
}
