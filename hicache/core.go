package hicache

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/radix"
)

// core is the cache logic for key elements E. Every method runs under Cache.mu.
type core[E radix.Elem] struct {
	cfg    Config
	tree   *radix.Tree[E]
	dev    pool.DeviceGroup
	host   *pool.Group // nil for an L1-only cache
	copier *pool.CopyEngine
	toKey  func([]uint32) []E

	ops []copyOp[E]
	// loading maps every L1 page a load writes to its transfer. It is kept by page,
	// not by node: a split moves pages into a new node and an insert hands a
	// node's pages to another request, but a page stays the page the copy writes,
	// so whoever is served it waits for the copy. A failed load's pages keep their
	// (failed) transfer until they are freed, so requests served them are told.
	loading map[pool.PageID]*pool.Transfer
	// freeAfter holds L1 pages released while a load still writes them: they go
	// back to the page space once the copy is done, never while it could
	// overwrite the page's next owner.
	freeAfter map[*pool.Transfer][]pool.PageID
	poisoned  []*radix.Node[E] // loads that failed: drop their L1 pages once unlocked
	unbacked  []*radix.Node[E] // backups that failed: drop their L2 pages once unreferenced
	pageBytes int64            // bytes of one page across every pool
	st        Stats
	closing   bool // Close has begun: L3 workers must no longer touch the tree

	hasher *pagekey.Hasher
	l3     *l3Tier     // nil without storage
	mu     *sync.Mutex // the Cache's, for L3 workers reserving host pages
}

type opKind uint8

const (
	opLoad      opKind = iota // L2 pages into the L1 pages of tree nodes
	opBackup                  // L1 pages into L2 (write-through, or a write-back eviction)
	opLoadOwned               // pages into L1 pages one request owns (a prefetch's staged pages)
)

// copyOp is a copy in flight and what it holds until it is accounted for: loads
// lock their nodes (the L1 pages they write) and host-reference them (the L2
// pages they read); backups do the same for the pages they read and write.
type copyOp[E radix.Elem] struct {
	kind   opKind
	t      *pool.Transfer
	nodes  []*radix.Node[E]
	pages  int
	dev    []pool.PageID // loads: the L1 pages written
	host   []pool.PageID // backups: the L2 pages written
	staged []pool.PageID // opLoadOwned from a prefetch: host pages to free when the load is done
}

func newCore[E radix.Elem](cfg Config, dev pool.DeviceGroup, host *pool.Group, maxPages int, toKey func([]uint32) []E, opts Options, mu *sync.Mutex) (*core[E], error) {
	withL3 := opts.Storage != nil && host != nil
	tree, err := radix.New[E](radix.Config{PageSize: cfg.PageSize, Policy: cfg.Eviction, MaxPages: maxPages, PageKeys: withL3})
	if err != nil {
		return nil, err
	}
	hasher, err := pagekey.New(pagekey.Config{PageSize: cfg.PageSize, Bigram: cfg.Bigram, Algorithm: cfg.KeyAlgorithm})
	if err != nil {
		return nil, errors.Join(err, tree.Close())
	}
	c := &core[E]{cfg: cfg, tree: tree, dev: dev, host: host, toKey: toKey, hasher: hasher, mu: mu,
		loading: map[pool.PageID]*pool.Transfer{}, freeAfter: map[*pool.Transfer][]pool.PageID{}}
	for _, p := range dev.Pools {
		c.pageBytes += p.Layout().PageBytes()
	}
	if host != nil {
		if c.copier, err = pool.NewCopyEngine(cfg.Copy); err != nil {
			return nil, errors.Join(err, tree.Close())
		}
	}
	if withL3 {
		log := opts.Logger
		if log == nil {
			log = slog.Default()
		}
		c.l3 = newL3Tier(cfg.L3, opts.Storage, host, log)
	}
	return c, nil
}

// close stops the L3 workers (waiting for them until deadline) and the copy
// engine, then releases the tree. It runs without Cache.mu: the L3 workers take
// it to reserve host pages.
func (c *core[E]) close(deadline time.Time) error {
	c.mu.Lock()
	c.closing = true // from now on a worker's reservation gets nothing
	c.mu.Unlock()
	if c.l3 != nil {
		c.l3.close(deadline)
	}
	if c.copier != nil {
		c.copier.Close()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tree.Close()
}

// must panics on an error that can only come from the cache's own accounting of
// locks and references (a bug): going on would free or serve pages a copy or a
// request still uses.
func must(err error) {
	if err != nil {
		panic(fmt.Sprintf("hicache: lock or reference count out of step with the cache's copies: %v", err))
	}
}

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

func (c *core[E]) insert(r *Request, tokens []uint32, pages []pool.PageID) ([]pool.PageID, error) {
	ps := c.cfg.PageSize
	whole := c.cfg.pages(len(tokens))
	if len(pages) < whole {
		return nil, fmt.Errorf("%d tokens make %d whole pages, the page table has %d: %w", len(tokens), whole, len(pages), ErrRequest)
	}
	if len(pages) < len(r.DevicePages) {
		return nil, fmt.Errorf("page table of %d pages is shorter than the request's prefix of %d: %w", len(pages), len(r.DevicePages), ErrRequest)
	}
	for i, p := range r.DevicePages {
		if pages[i] != p {
			return nil, fmt.Errorf("page table entry %d is page %d, the cached prefix has %d there: %w", i, pages[i], p, ErrRequest)
		}
	}
	key := c.toKey(tokens)[:whole*ps]
	var keys []pagekey.Key
	if c.l3 != nil {
		cached, last := c.tree.PeekKey(r.ns, key)
		keys = make([]pagekey.Key, whole)
		copy(keys[cached:], c.pageKeys(r.ns, tokens, cached, last, whole))
	}
	res, err := c.tree.Insert(r.ns, key, pages[:whole], keys)
	if err != nil {
		return nil, err
	}
	c.freeDev(res.Duplicate)
	newPages := res.NewPages
	for _, n := range res.Revived {
		newPages += n.Pages()
	}
	c.st.InsertedTokens += int64(newPages * ps)
	// The page table of the whole pages is the tree's path to the new end.
	prefix := make([]pool.PageID, whole)
	at := whole
	for n := res.Last; !n.IsRoot(); n = n.Parent() {
		at -= n.Pages()
		copy(prefix[at:], n.Device())
	}
	if err := c.tree.Lock(res.Last); err != nil {
		return nil, err
	}
	if err := c.unlock(r); err != nil {
		return nil, err
	}
	r.node = res.Last
	r.DevicePages = prefix
	r.owned = len(prefix)
	// Where the tree had the pages already, the engine now uses the tree's, which
	// a load may still be writing.
	c.addLoads(r, prefix)
	if c.cfg.WritePolicy == WriteThrough && c.host != nil {
		if err := c.backup(res.New); err != nil {
			return nil, err
		}
	}
	return prefix, nil
}

func (c *core[E]) unlock(r *Request) error {
	n, ok := r.node.(*radix.Node[E])
	if !ok {
		return fmt.Errorf("request holds no node of this cache: %w", ErrRequest)
	}
	return c.tree.Unlock(n)
}

// backup starts copying nodes' L1 pages into fresh L2 pages. Nodes stay locked (their
// L1 pages must not be freed) and referenced (their L2 pages are not valid yet)
// until the copy is accounted for. Nodes L2 has no room for are left in L1 only.
func (c *core[E]) backup(nodes []*radix.Node[E]) error {
	var started []*radix.Node[E]
	for _, n := range nodes {
		if !n.InTree() || n.Device() == nil || n.Host() != nil {
			continue
		}
		host, ok := c.allocHost(n.Pages())
		if !ok {
			c.st.BackupSkipped += int64(n.Pages())
			continue
		}
		if err := c.tree.SetHost(n, host); err != nil {
			return errors.Join(err, c.host.Free(host))
		}
		if err := errors.Join(c.tree.Lock(n), c.tree.HostRef(n)); err != nil {
			return err
		}
		started = append(started, n)
	}
	return c.startBackup(started)
}

// startBackup starts copying the L1 pages of nodes, locked and host-referenced
// with their L2 pages set, into those L2 pages. If the copy cannot start, the
// nodes are left as they were.
func (c *core[E]) startBackup(nodes []*radix.Node[E]) error {
	if len(nodes) == 0 {
		return nil
	}
	var moves []pool.PageMove
	var host []pool.PageID
	for _, n := range nodes {
		for i, d := range n.Device() {
			moves = append(moves, pool.PageMove{Device: d, Host: n.Host()[i]})
		}
		host = append(host, n.Host()...)
	}
	t, err := c.copier.Backup(c.dev, c.host, moves)
	if err != nil {
		errs := []error{fmt.Errorf("backup %d pages: %w", len(moves), err)}
		for _, n := range nodes {
			errs = append(errs, c.tree.Unlock(n), c.tree.HostUnref(n))
			pages, err := c.tree.DropHost(n)
			errs = append(errs, err, c.host.Free(pages))
		}
		return errors.Join(errs...)
	}
	c.ops = append(c.ops, copyOp[E]{kind: opBackup, t: t, nodes: nodes, pages: len(moves), host: host})
	return nil
}

// allocHost takes n L2 pages, evicting L2-only pages when too few are free.
func (c *core[E]) allocHost(n int) ([]pool.PageID, bool) {
	if free := c.host.FreePages(); free < n {
		start := time.Now()
		freed := c.tree.EvictHost(n - free)
		c.st.EvictedTokensL2 += int64(len(freed) * c.cfg.PageSize)
		if err := c.host.Free(freed); err != nil {
			panic(fmt.Sprintf("hicache: tree returned host pages the pool did not hand out: %v", err))
		}
		c.st.EvictionTime += time.Since(start)
	}
	pages, err := c.host.Alloc(n)
	return pages, err == nil
}

// allocDevice takes n L1 pages, evicting unlocked pages when too few are free. It
// never waits for a copy (roomWait says which to wait for): ErrDeviceFull when
// the pages are not free now.
func (c *core[E]) allocDevice(n int) ([]pool.PageID, error) {
	if n < 0 {
		return nil, fmt.Errorf("allocate %d pages: %w", n, ErrRequest)
	}
	if err := c.evictFor(n); err != nil {
		return nil, err
	}
	pages, err := c.dev.Pages.Alloc(n)
	if err != nil {
		return nil, fmt.Errorf("allocate %d L1 pages: %d free after evicting every unlocked page: %v: %w", n, c.dev.Pages.FreePages(), err, ErrDeviceFull)
	}
	return pages, nil
}

// allocDeviceOrWait is allocDevice for a caller that can wait without the cache:
// when the pages are not free but L1→L2 copies in flight hold some, it returns
// those copies instead (having only evicted).
func (c *core[E]) allocDeviceOrWait(n int, mayWait bool) ([]pool.PageID, []*pool.Transfer, error) {
	if mayWait && n > 0 {
		if wait, err := c.roomWait(n); err != nil || len(wait) > 0 {
			return nil, wait, err
		}
	}
	pages, err := c.allocDevice(n)
	return pages, nil, err
}

// evictFor evicts until n L1 pages are free, as far as it can without waiting.
func (c *core[E]) evictFor(n int) error {
	if free := c.dev.Pages.FreePages(); free < n {
		return c.evictDevice(n - free)
	}
	return nil
}

// roomWait evicts for n L1 pages and, when that does not free enough, returns
// the L1→L2 copies in flight: the pages they read are locked until they are
// accounted for (write-back evictions among them), and the copies take
// microseconds, so waiting for them, without the cache, frees more.
func (c *core[E]) roomWait(n int) ([]*pool.Transfer, error) {
	if err := c.evictFor(n); err != nil {
		return nil, err
	}
	if c.dev.Pages.FreePages() >= n {
		return nil, nil
	}
	var wait []*pool.Transfer
	for _, op := range c.ops {
		if op.kind == opBackup {
			wait = append(wait, op.t)
		}
	}
	return wait, nil
}

func (c *core[E]) countWait() { c.st.CopyWaits++ }

// freeDevice returns pages the engine allocated.
func (c *core[E]) freeDevice(pages []pool.PageID) error {
	if err := c.freeDevAll(pages); err != nil {
		return fmt.Errorf("free L1 pages: %w: %w", err, ErrRequest)
	}
	return nil
}

// freeDev returns L1 pages the cache's accounting says are held: an error is a bug.
func (c *core[E]) freeDev(pages []pool.PageID) {
	if err := c.freeDevAll(pages); err != nil {
		panic(fmt.Sprintf("hicache: freeing L1 pages the page space did not hand out: %v", err))
	}
}

// freeDevAll returns L1 pages to the page space, except those a load still
// writes: they wait in freeAfter for the load to be accounted for.
func (c *core[E]) freeDevAll(pages []pool.PageID) error {
	if len(c.loading) == 0 {
		return c.dev.Pages.Free(pages)
	}
	now := make([]pool.PageID, 0, len(pages))
	for _, p := range pages {
		t := c.loading[p]
		if t == nil {
			now = append(now, p)
			continue
		}
		select {
		case <-t.Done(): // a failed load's page: free to go
			delete(c.loading, p)
			now = append(now, p)
		default:
			c.freeAfter[t] = append(c.freeAfter[t], p)
		}
	}
	return c.dev.Pages.Free(now)
}

// evictDevice frees at least need L1 pages if it can without waiting. Victims
// backed up in L2 keep their L2 copy; with write-back, victims that are not are
// backed up first (their pages are freed by a later eviction, once the copy is
// accounted for); others are dropped with their subtree.
func (c *core[E]) evictDevice(need int) error {
	start := time.Now()
	defer func() {
		d := time.Since(start)
		c.st.EvictionTime += d
		c.st.EvictionSeconds.observe(d.Seconds())
	}()
	freed, pending := 0, 0
	var batch []*radix.Node[E]
	for freed+pending < need {
		v := c.tree.DeviceVictim()
		if v == nil {
			break
		}
		if v.Host() != nil {
			pages, err := c.tree.DropDevice(v)
			if err != nil {
				return err
			}
			c.freeDev(pages)
			freed += len(pages)
			c.st.EvictedTokensL1 += int64(len(pages) * c.cfg.PageSize)
			continue
		}
		if c.cfg.WritePolicy == WriteBack && c.host != nil {
			if host, ok := c.allocHost(v.Pages()); ok {
				if err := c.tree.SetHost(v, host); err != nil {
					return errors.Join(err, c.host.Free(host))
				}
				// Locked, it leaves the victim heap while its copy runs.
				if err := errors.Join(c.tree.Lock(v), c.tree.HostRef(v)); err != nil {
					return err
				}
				batch = append(batch, v)
				pending += v.Pages()
				continue
			}
		}
		dev, host, err := c.tree.Remove(v)
		if err != nil {
			return err
		}
		c.freeDev(dev)
		if c.host != nil {
			c.freeHost(host)
		}
		freed += len(dev)
		c.st.EvictedTokensL1 += int64(len(dev) * c.cfg.PageSize)
		c.st.EvictedTokensL2 += int64(len(host) * c.cfg.PageSize)
	}
	return c.startBackup(batch)
}

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
			dev, host, err := c.tree.Remove(n)
			must(err)
			c.freeDev(dev)
			c.freeHost(host)
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
			dev, host, err := c.tree.Remove(n)
			must(err)
			c.freeDev(dev)
			c.freeHost(host)
			return true
		}
		pages, err := c.tree.DropHost(n)
		must(err)
		c.freeHost(pages)
		return true
	})
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

func (c *core[E]) inflight() []*pool.Transfer {
	out := make([]*pool.Transfer, len(c.ops))
	for i, op := range c.ops {
		out[i] = op.t
	}
	return out
}

func (c *core[E]) stats() Stats {
	s := c.st
	s.LoadBackSeconds = s.LoadBackSeconds.clone()
	s.EvictionSeconds = s.EvictionSeconds.clone()
	if c.l3 != nil {
		s.L3 = c.l3.stats()
	}
	s.DevicePages = c.dev.Pages.Pages()
	s.DevicePagesUsed = s.DevicePages - c.dev.Pages.FreePages()
	if c.host != nil {
		s.HostPages = c.host.Pages()
		s.HostPagesUsed = s.HostPages - c.host.FreePages()
	}
	s.TreePages = c.tree.Pages()
	s.TreeNodes = c.tree.Nodes()
	return s
}
