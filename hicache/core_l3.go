package hicache

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/radix"
	"github.com/stratakv/strata/storage"
)

// pageKeys returns the keys of pages [cached, upto) of tokens in namespace seed,
// chained from last, the key of page cached-1 (rehashing from the seed when the
// tree did not keep it).
func (c *core[E]) pageKeys(seed pagekey.Key, tokens []uint32, cached int, last pagekey.Key, upto int) []pagekey.Key {
	if upto <= cached {
		return nil
	}
	ps := c.cfg.PageSize
	start, prior := cached, last
	if cached == 0 || last.IsZero() {
		start, prior = 0, seed
	}
	end := upto * ps
	if c.cfg.Bigram {
		end++
	}
	keys := c.hasher.Keys(prior, tokens[start*ps:end])
	return keys[cached-start:]
}

// freeHost returns host pages to the group; an error is a bug in the accounting.
func (c *core[E]) freeHost(pages []pool.PageID) {
	if err := c.host.Free(pages); err != nil {
		panic(fmt.Sprintf("hicache: freeing host pages the group did not hand out: %v", err))
	}
}

// backupToL3 queues nodes whose L2 pages are complete for backup to L3. A node is
// host-referenced until its job is accounted for, so its L2 pages stay put.
func (c *core[E]) backupToL3(nodes []*radix.Node[E]) {
	if c.l3 == nil || !c.l3.enabled {
		return
	}
	limit := c.l3.cfg.BackupQueuePages
	if limit == 0 {
		limit = c.host.Pages()
	}
	for _, n := range nodes {
		if !n.InTree() || n.Host() == nil {
			continue
		}
		pages := n.Pages()
		if c.l3.down() || c.l3.backupPending+pages > limit {
			c.l3.st.BackupSkippedPages += int64(pages)
			continue
		}
		keys := c.tree.AppendPageKeys(nil, n)
		if slices.ContainsFunc(keys, pagekey.Key.IsZero) {
			continue // inserted without keys: nothing to name it by
		}
		must(c.tree.HostRef(n)) // n is in the tree: only a bug fails it
		job := &backupJob{node: n, keys: keys, host: slices.Clone(n.Host())}
		if !c.l3.enqueue(job) {
			must(c.tree.HostUnref(n))
			c.l3.st.BackupSkippedPages += int64(pages)
			continue
		}
		c.l3.backupPending += pages
	}
}

// refill backs up again what the cache holds in L2 once the backend says its
// store was emptied (a node service that restarted cold; storage.ContentTracker):
// the pages it believed in L3 are gone there, and without this every later
// request would miss them in L3 until they were computed again. It runs at
// the lowest priority: nodes are fed to the backup queue only while regular
// backups leave it half empty (prefetches run ahead of backups anyway), and a
// node gone from L2 meanwhile is skipped. Puts are write-once, so pages the
// service kept (its spill) cost a lookup, not a write.
func (c *core[E]) refill() {
	l := c.l3
	if l == nil || !l.enabled {
		return
	}
	if e := storage.ContentEpochOf(l.backend); e != l.contentEpoch {
		l.contentEpoch = e
		l.refillQ = l.refillQ[:0]
		pages := 0
		c.tree.Walk(func(_ pagekey.Key, _ []E, n *radix.Node[E]) bool {
			if n.Host() != nil {
				l.refillQ = append(l.refillQ, n)
				pages += n.Pages()
			}
			return true
		})
		l.st.Refills++
		l.st.RefillPages += int64(pages)
		l.log.Info("hicache: the L3 backend came back emptied; backing up again what L2 holds, at the lowest priority",
			"backend", l.backend.Name(), "nodes", len(l.refillQ), "pages", pages)
	}
	limit := l.cfg.BackupQueuePages
	if limit == 0 {
		limit = c.host.Pages()
	}
	for len(l.refillQ) > 0 && l.backupPending < limit/2 && !l.down() {
		n := l.refillQ[0].(*radix.Node[E])
		l.refillQ[0] = nil
		l.refillQ = l.refillQ[1:]
		c.backupToL3([]*radix.Node[E]{n})
	}
	if len(l.refillQ) == 0 {
		l.refillQ = nil
	}
}

// prefetch starts an L3 lookup for the pages of tokens that L1 and L2 lack.
func (c *core[E]) prefetch(tokens []uint32, ns pagekey.Namespace, cache *Cache) *Prefetch {
	if c.l3 == nil || !c.l3.enabled {
		return nil
	}
	ps := c.cfg.PageSize
	seed := c.hasher.Seed(ns)
	pages := c.cfg.pages(len(tokens))
	cached, last := c.tree.PeekKey(seed, c.toKey(tokens))
	if cached >= pages {
		return nil
	}
	st := &c.l3.st.Prefetch
	if (pages-cached)*ps < c.l3.cfg.PrefetchThreshold {
		st.Started++
		st.BelowThreshold++
		return nil
	}
	keys := c.pageKeys(seed, tokens, cached, last, pages)
	if op := c.l3.inflight[keys[0]]; op != nil && !op.abandoned && op.ns == seed && op.from == cached {
		op.waiters++
		st.Joined++
		return &Prefetch{op: op, cache: cache, Tokens: len(op.keys) * ps}
	}
	st.Started++
	if c.l3.down() {
		st.Failed++
		return nil
	}
	op := &prefetchOp{
		ns:       seed,
		tokens:   slices.Clone(tokens),
		from:     cached,
		keys:     keys,
		started:  time.Now(),
		deadline: time.Now().Add(c.l3.cfg.deadline((pages - cached) * ps)),
		done:     make(chan struct{}),
		waiters:  1,
	}
	op.ctx, op.cancel = context.WithCancel(c.l3.ctx)
	if cached > 0 {
		// The fetched pages extend the cached prefix: keep its host pages until
		// they are in the tree. Otherwise reserving host pages for them can
		// evict that very prefix (the least recently used, in a full L2), and
		// the fetched pages are dropped as stale.
		if _, n := c.tree.PeekNode(seed, c.toKey(tokens)); n != nil && c.tree.HostRef(n) == nil {
			op.unpin = func() { must(c.tree.HostUnref(n)) } // taken just now: only a bug fails it
		}
	}
	op.reserve = func(n int) []pool.PageID {
		c.mu.Lock()
		defer c.mu.Unlock()
		if op.abandoned || c.closing {
			return nil
		}
		n = min(n, int(c.l3.cfg.PrefetchCapacity*float64(c.host.Pages()))-c.l3.reserved)
		if n <= 0 {
			return nil
		}
		host, ok := c.allocHost(n)
		if !ok {
			if host, ok = c.allocHost(min(n, c.host.FreePages())); !ok {
				return nil
			}
		}
		c.l3.reserved += len(host)
		return host
	}
	op.release = func() {
		if op.taken {
			return
		}
		c.freeHost(op.host[:op.usable])
		c.l3.reserved -= op.usable
		op.staged = false
	}
	c.l3.inflight[keys[0]] = op
	if !c.l3.enqueue(op) {
		op.setOutcome(outcomeFailed)
		op.elapsed.Store(1)
		c.l3.dmu.Lock()
		c.l3.done = append(c.l3.done, op)
		c.l3.dmu.Unlock()
		close(op.done)
	}
	return &Prefetch{op: op, cache: cache, Tokens: (pages - cached) * ps}
}

// settlePrefetch accounts for a finished prefetch: its pages become L2 pages of
// the tree when every pool has them, are kept for the first request to load when a
// draft pool's KV is missing, and are returned otherwise. Pages it put in the
// tree stay host referenced (and reserved) for the requests that wait for them,
// until they match or give up: an L2 that is full, as it is where L3 serves, would
// otherwise evict them for the next backup before the request that fetched them
// is scheduled.
func (c *core[E]) settlePrefetch(op *prefetchOp) {
	if op.accounted {
		return
	}
	op.accounted = true
	if c.l3.inflight[op.keys[0]] == op {
		delete(c.l3.inflight, op.keys[0])
	}
	// The prefix pin of prefetch is replaced by one on the inserted pages below,
	// kept for the staged pages, and released on every other way out.
	prefix := op.unpin
	op.unpin = nil
	defer func() {
		if prefix != nil {
			prefix()
		}
		op.unpinIfUnwanted()
	}()
	st := &c.l3.st.Prefetch
	o := outcome(op.result.Load())
	ps := c.cfg.PageSize
	giveBack := func(pages []pool.PageID) {
		c.freeHost(pages)
		c.l3.reserved -= len(pages)
	}
	if op.abandoned || op.usable == 0 {
		giveBack(op.host)
		c.countOutcome(o)
		return
	}
	giveBack(op.host[op.usable:])
	if c.l3.partial || op.draftUsable < op.usable {
		op.staged = true
		// The staged pages continue the prefix: keep it for the request.
		op.unpin, prefix = prefix, nil
		if op.waiters == 0 {
			op.abandoned = true
			op.release()
		}
		c.countOutcome(o)
		return
	}
	end := op.from + op.usable
	keys := make([]pagekey.Key, end)
	copy(keys[op.from:], op.keys[:op.usable])
	last, dup, err := c.tree.InsertHost(op.ns, c.toKey(op.tokens)[:end*ps], op.host[:op.usable], keys)
	if err != nil {
		giveBack(op.host[:op.usable])
		st.Stale++
		return
	}
	giveBack(dup)
	n := op.usable - len(dup) // the rest now belongs to the tree
	op.inserted = n
	c.l3.st.PrefetchedTokens += int64(n * ps)
	if last != nil && op.waiters > 0 && c.tree.HostRef(last) == nil {
		op.unpin = func() {
			must(c.tree.HostUnref(last)) // taken here: only a bug fails it
			c.l3.reserved -= n
		}
	} else {
		c.l3.reserved -= n
	}
	c.countOutcome(o)
}

func (c *core[E]) countOutcome(o outcome) {
	st := &c.l3.st.Prefetch
	switch o {
	case outcomeCompleted:
		st.Completed++
	case outcomeTimedOut:
		st.TimedOut++
	case outcomeCanceled:
		st.Canceled++
	case outcomeBelowThreshold:
		st.BelowThreshold++
	case outcomeNoRoom:
		st.NoRoom++
	case outcomeStale:
		st.Stale++
	default:
		st.Failed++
	}
}

// releaseOwned frees the pages the cache loaded for r alone (not the tree's).
func (c *core[E]) releaseOwned(r *Request) error {
	if len(r.DevicePages) > r.owned {
		if err := c.freeDevAll(r.DevicePages[r.owned:]); err != nil { // loads into them finish first
			return fmt.Errorf("free the request's loaded pages: %w", err)
		}
		r.DevicePages = r.DevicePages[:r.owned]
	}
	return nil
}

func (c *core[E]) l3Idle() bool { return c.l3 == nil || c.l3.idle() }
