package hicache

import (
	"slices"

	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/radix"
)

// account adds a finished copy to the stats of its kind.
func (c *core[E]) account(kind opKind, t *pool.Transfer, pages int) {
	tr := &c.st.Backup
	if kind != opBackup {
		tr = &c.st.LoadBack
	}
	tr.Transfers++
	tr.Pages += int64(pages)
	tr.Bytes += int64(pages) * c.pageBytes
	tr.Elapsed += t.Elapsed()
	if kind != opBackup {
		c.st.LoadBackSeconds.observe(t.Elapsed().Seconds())
	}
}

// reap accounts for finished copies: loads release their locks and host
// references, backups theirs; failures undo what the copy was to provide.
func (c *core[E]) reap() {
	kept := c.ops[:0]
	for _, op := range c.ops {
		select {
		case <-op.t.Done():
		default:
			kept = append(kept, op)
			continue
		}
		c.account(op.kind, op.t, op.pages)
		failed := op.t.Err() != nil
		for _, n := range op.nodes {
			if op.kind != opLoadOwned {
				must(c.tree.Unlock(n))
			}
			must(c.tree.HostUnref(n))
		}
		switch op.kind {
		case opLoad:
			if failed {
				c.poisoned = appendHolders(c.poisoned, op.nodes, op.dev, (*radix.Node[E]).Device)
			}
		case opLoadOwned:
			if op.staged != nil {
				c.freeHost(op.staged)
				c.l3.reserved -= len(op.staged)
			}
		case opBackup:
			if failed {
				c.unbacked = appendHolders(c.unbacked, op.nodes, op.host, (*radix.Node[E]).Host)
			} else {
				// A request that matched part of a node while the copy ran split
				// it: the node kept its tail, and a new head above it holds the
				// first of the copied pages. Both go to L3, heads first, so that
				// L3 holds prefixes as it fills.
				written := appendHolders(nil, op.nodes, op.host, (*radix.Node[E]).Host)
				slices.Reverse(written)
				c.backupToL3(written)
			}
		}
		// A failed load's pages in the tree stay marked until they are dropped,
		// so that requests served them meanwhile are told; a request's own pages
		// are its alone, and it was told.
		if !failed || op.kind == opLoadOwned {
			for _, p := range op.dev {
				if c.loading[p] == op.t {
					delete(c.loading, p)
				}
			}
		}
		if pages, ok := c.freeAfter[op.t]; ok {
			delete(c.freeAfter, op.t)
			for _, p := range pages {
				delete(c.loading, p)
			}
			c.freeDev(pages)
		}
	}
	for i := len(kept); i < len(c.ops); i++ {
		c.ops[i] = copyOp[E]{}
	}
	c.ops = kept
	if c.l3 != nil {
		for _, job := range c.l3.finished() {
			switch j := job.(type) {
			case *prefetchOp:
				c.settlePrefetch(j)
			case *backupJob:
				must(c.tree.HostUnref(j.node.(*radix.Node[E])))
				c.l3.backupPending -= len(j.host)
				c.l3.st.BackedUpTokens += int64(j.written * c.cfg.PageSize)
			}
		}
		c.refill()
	}
	c.poisoned = c.retry(c.poisoned, func(n *radix.Node[E]) bool {
		if n.Device() == nil {
			return true // evicted from L1 meanwhile
		}
		if n.Locked() || hasDeviceChild(n) {
			return false
		}
		if n.Host() == nil {
			if n.HostRef() > 0 {
				return false
			}
			c.remove(n)
			return true
		}
		pages, err := c.tree.DropDevice(n)
		must(err)
		c.freeDev(pages)
		return true
	})
	c.unbacked = c.retry(c.unbacked, func(n *radix.Node[E]) bool {
		if n.Host() == nil {
			return true
		}
		if n.HostRef() > 0 {
			return false
		}
		if n.Device() == nil {
			// Its L1 copy was evicted meanwhile: the garbage in L2 is all that is
			// left of it, so it goes, with its subtree, once nothing holds it.
			if n.Locked() {
				return false
			}
			c.remove(n)
			return true
		}
		pages, err := c.tree.DropHost(n)
		must(err)
		c.freeHost(pages)
		return true
	})
}

// remove drops n and its subtree from the tree and frees their pages in both
// tiers: for nodes the cache's own accounting says nothing holds.
func (c *core[E]) remove(n *radix.Node[E]) {
	dev, host, err := c.tree.Remove(n)
	must(err)
	c.freeDev(dev)
	c.freeHost(host)
}

// appendHolders appends to out the nodes whose pages in one tier (tier returns
// them) include any of pages: each of nodes and, above it, the heads that splits
// cut from it since the copy started (a split moves a node's first pages into a
// new parent). Deepest first, so that dropping them in order never meets a child
// still in L1.
func appendHolders[E radix.Elem](out, nodes []*radix.Node[E], pages []pool.PageID, tier func(*radix.Node[E]) []pool.PageID) []*radix.Node[E] {
	bad := make(map[pool.PageID]bool, len(pages))
	for _, p := range pages {
		bad[p] = true
	}
	holds := func(n *radix.Node[E]) bool {
		return slices.ContainsFunc(tier(n), func(p pool.PageID) bool { return bad[p] })
	}
	for i := len(nodes) - 1; i >= 0; i-- {
		for x := nodes[i]; x.InTree() && !x.IsRoot() && holds(x); x = x.Parent() {
			if !slices.Contains(out, x) {
				out = append(out, x)
			}
		}
	}
	return out
}

func hasDeviceChild[E radix.Elem](n *radix.Node[E]) bool { return n.DeviceChildren() > 0 }

// retry keeps the nodes (still in the tree) that fix could not settle yet.
func (c *core[E]) retry(nodes []*radix.Node[E], fix func(*radix.Node[E]) bool) []*radix.Node[E] {
	kept := nodes[:0]
	for _, n := range nodes {
		if n.InTree() && !fix(n) {
			kept = append(kept, n)
		}
	}
	return kept
}
