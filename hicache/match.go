package hicache

import (
	"errors"
	"fmt"
	"slices"

	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/radix"
)

// match finds tokens' cached prefix and locks it for a new request, then
// completes it as complete does. A non-empty wait means the request needs L1
// room that only copies in flight can free: the caller waits for them without
// the cache and calls complete again.
func (c *core[E]) match(tokens []uint32, opts MatchOptions) (*Request, []*pool.Transfer, error) {
	c.st.Requests++
	c.st.PromptTokens += int64(len(tokens))
	seed := c.hasher.Seed(opts.Namespace)
	m := c.tree.Match(seed, c.toKey(tokens))
	if err := c.tree.Lock(m.Last); err != nil {
		return nil, nil, err
	}
	r := &Request{Tokens: len(tokens), node: m.Last, ns: seed}
	wait, err := c.complete(r, opts, true)
	return r, wait, err
}

// path returns the nodes from the root down to n.
func path[E radix.Elem](n *radix.Node[E]) []*radix.Node[E] {
	var out []*radix.Node[E]
	for x := n; !x.IsRoot(); x = x.Parent() {
		out = append(out, x)
	}
	slices.Reverse(out)
	return out
}

// complete serves r its locked prefix: the L1 part as it is, the L2 part loaded
// back, the prefetch's staged pages after it. The prefix is read from the tree
// each time: while the caller waited without the cache, other requests may have
// split its nodes or loaded some of them (the lock keeps every page cached).
// With mayWait, when L1 lacks the room and copies in flight would free some, it
// changes nothing but evictions and returns them to wait for; otherwise a load
// without room is skipped and the engine recomputes those tokens.
func (c *core[E]) complete(r *Request, opts MatchOptions, mayWait bool) ([]*pool.Transfer, error) {
	ps := c.cfg.PageSize
	last := r.node.(*radix.Node[E])
	nodes := path(last)
	pages, l1 := 0, 0
	for _, n := range nodes {
		if n.Device() != nil && l1 == pages {
			l1 += n.Pages()
		}
		pages += n.Pages()
	}
	l2 := pages - l1
	loadL2 := l2 > 0 && c.host != nil && l2*ps >= c.cfg.LoadBackMinTokens
	if mayWait {
		need := 0
		if loadL2 {
			need = l2
		}
		if p := opts.Prefetch; p != nil && (loadL2 || l2 == 0) {
			need += c.stagedPages(r, p.op, pages)
		}
		if need > 0 {
			if wait, err := c.roomWait(need); err != nil || len(wait) > 0 {
				return wait, err
			}
		}
	}
	r.DevicePages = make([]pool.PageID, 0, pages)
	for _, n := range nodes {
		if n.Device() == nil {
			break
		}
		r.DevicePages = append(r.DevicePages, n.Device()...)
	}
	r.L1Tokens = l1 * ps
	r.owned = len(r.DevicePages)
	r.loads = nil
	c.addLoads(r, r.DevicePages) // loaded for another request, maybe not yet done
	if l2 > 0 {
		if !loadL2 {
			c.st.SkippedL2Tokens += int64(l2 * ps)
		} else if err := c.loadBack(r, nodes, l2); err != nil {
			if !errors.Is(err, ErrDeviceFull) {
				return nil, err
			}
			c.st.SkippedL2Tokens += int64(l2 * ps)
		}
	}
	r.owned = len(r.DevicePages)
	if p := opts.Prefetch; p != nil {
		// Pages the prefetch put in the tree that this request now loads count as
		// its L3 hits.
		if op := p.op; op.inserted > 0 && op.ns == r.ns && l1 <= op.from && len(r.DevicePages) >= op.from+op.inserted {
			r.L2Tokens -= op.inserted * ps
			r.L3Tokens += op.inserted * ps
		}
		if len(r.DevicePages) == pages {
			if err := c.takeStaged(r, p.op, pages); err != nil {
				return nil, err
			}
		}
		p.settled = true
		p.op.waiters--
		if p.op.waiters == 0 && p.op.staged && !p.op.taken && !p.op.abandoned {
			p.op.abandoned = true
			p.op.release()
		}
		p.op.unpinIfUnwanted() // r's lock holds its prefix from here
	}
	r.HitTokens = r.L1Tokens + r.L2Tokens + r.L3Tokens
	c.st.HitTokensL1 += int64(r.L1Tokens)
	c.st.HitTokensL2 += int64(r.L2Tokens)
	c.st.HitTokensL3 += int64(r.L3Tokens)
	c.st.DraftRecomputeTokens += int64(r.DraftRecomputeTokens)
	if c.cfg.WritePolicy == WriteThroughSelective && c.host != nil {
		var hot []*radix.Node[E]
		for _, n := range nodes {
			if n.Device() != nil && n.Host() == nil && n.Hits() >= c.cfg.WriteThroughThreshold {
				hot = append(hot, n)
			}
		}
		if err := c.backup(hot); err != nil {
			return nil, err
		}
	}
	return nil, nil
}

// addLoads makes r wait for the loads in flight (or failed) into any of pages.
func (c *core[E]) addLoads(r *Request, pages []pool.PageID) {
	if len(c.loading) == 0 {
		return
	}
	for _, p := range pages {
		if t := c.loading[p]; t != nil && !slices.Contains(r.loads, t) {
			r.loads = append(r.loads, t)
		}
	}
}

// startLoad records a load in flight and the L1 pages it writes.
func (c *core[E]) startLoad(op copyOp[E]) {
	for _, p := range op.dev {
		c.loading[p] = op.t
	}
	c.ops = append(c.ops, op)
}

// stagedPages is how many pages takeStaged would load for r after a prefix of
// prefix pages.
func (c *core[E]) stagedPages(r *Request, op *prefetchOp, prefix int) int {
	if !op.staged || op.taken || op.abandoned || op.ns != r.ns || op.from > prefix || prefix >= op.from+op.usable {
		return 0
	}
	return op.usable - (prefix - op.from)
}

// takeStaged loads the pages a prefetch kept for its first request (L3 pages
// whose draft KV is missing) into fresh L1 pages after the request's prefix, when
// they continue exactly that prefix: the prefetch started at or before its end
// (pages the tree has cached meanwhile are dropped from the staged ones).
func (c *core[E]) takeStaged(r *Request, op *prefetchOp, prefix int) error {
	n := c.stagedPages(r, op, prefix)
	if n == 0 {
		return nil
	}
	skip := prefix - op.from // staged pages the tree now has
	dev, err := c.allocDevice(n)
	if errors.Is(err, ErrDeviceFull) {
		return nil // no room: the request recomputes, the pages are released below
	}
	if err != nil {
		return err
	}
	moves := make([]pool.PageMove, n)
	for i := range moves {
		moves[i] = pool.PageMove{Device: dev[i], Host: op.host[skip+i]}
	}
	t, err := c.copier.Load(c.dev, c.host, moves)
	if err != nil {
		return errors.Join(fmt.Errorf("load %d prefetched pages: %w", n, err), c.dev.Pages.Free(dev))
	}
	op.taken = true
	c.freeHost(op.host[:skip])
	c.l3.reserved -= skip
	c.startLoad(copyOp[E]{kind: opLoadOwned, t: t, pages: n, dev: dev, staged: op.host[skip:op.usable]})
	r.loads = append(r.loads, t)
	r.DevicePages = append(r.DevicePages, dev...)
	ps := c.cfg.PageSize
	r.L3Tokens += n * ps
	valid := 0 // leading loaded pages whose draft KV arrived too
	if !c.l3.partial {
		valid = min(max(op.draftUsable-skip, 0), n)
	}
	r.DraftRecomputeFrom = (prefix + valid) * ps
	r.DraftRecomputeTokens = (n - valid) * ps
	return nil
}

// loadBack gives the L2-only nodes at the end of a match l2 L1 pages and starts
// copying them in. The match is locked, so evicting for room cannot touch it; the
// load locks and host-references the nodes too, so that neither the L1 pages it
// writes nor the L2 pages it reads are freed before it is accounted for, even if
// the request ends first.
func (c *core[E]) loadBack(r *Request, nodes []*radix.Node[E], l2 int) error {
	dev, err := c.allocDevice(l2)
	if err != nil {
		return err
	}
	moves := make([]pool.PageMove, 0, l2)
	var loaded []*radix.Node[E]
	j := 0
	for _, n := range nodes {
		if n.Device() != nil {
			continue
		}
		for i, h := range n.Host() {
			moves = append(moves, pool.PageMove{Device: dev[j+i], Host: h})
		}
		if err := c.tree.SetDevice(n, dev[j:j+n.Pages()]); err != nil {
			return fmt.Errorf("load back: %w", err) // a bug: the match's L2 nodes follow its L1 nodes
		}
		if err := errors.Join(c.tree.Lock(n), c.tree.HostRef(n)); err != nil {
			return err
		}
		loaded = append(loaded, n)
		j += n.Pages()
	}
	t, err := c.copier.Load(c.dev, c.host, moves)
	if err != nil {
		return fmt.Errorf("load back %d pages: %w", l2, err)
	}
	c.startLoad(copyOp[E]{kind: opLoad, t: t, nodes: loaded, pages: l2, dev: dev})
	r.loads = append(r.loads, t)
	r.DevicePages = append(r.DevicePages, dev...)
	r.L2Tokens = l2 * c.cfg.PageSize
	return nil
}
