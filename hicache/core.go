package hicache

import (
	"errors"
	"fmt"
	"log/slog"
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

	ops       []copyOp[E]
	loading   map[*radix.Node[E]]*pool.Transfer // L1 pages still being loaded
	poisoned  []*radix.Node[E]                  // loads that failed: drop their L1 pages once unlocked
	unbacked  []*radix.Node[E]                  // backups that failed: drop their L2 pages once unreferenced
	pageBytes int64                             // bytes of one page across every pool
	st        Stats

	hasher *pagekey.Hasher
	l3     *l3Tier     // nil without storage
	mu     *sync.Mutex // the Cache's, for L3 workers reserving host pages
}

type opKind uint8

const (
	opLoad opKind = iota
	opBackup
	opLoadStaged // L3 pages loaded from reserved host pages for one request
)

// copyOp is a copy in flight and the nodes whose references it holds.
type copyOp[E radix.Elem] struct {
	kind   opKind
	t      *pool.Transfer
	nodes  []*radix.Node[E]
	pages  int
	staged []pool.PageID // opLoadStaged: host pages to free when the load is done
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
	c := &core[E]{cfg: cfg, tree: tree, dev: dev, host: host, toKey: toKey, loading: map[*radix.Node[E]]*pool.Transfer{}, hasher: hasher, mu: mu}
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

func (c *core[E]) close() error {
	if c.l3 != nil {
		c.l3.close()
	}
	if c.copier != nil {
		c.copier.Close()
	}
	return c.tree.Close()
}

func (c *core[E]) match(tokens []uint32, opts MatchOptions) (*Request, error) {
	ps := c.cfg.PageSize
	c.st.Requests++
	c.st.PromptTokens += int64(len(tokens))
	seed := c.hasher.Seed(opts.Namespace)
	m := c.tree.Match(seed, c.toKey(tokens))
	r := &Request{Tokens: len(tokens), node: m.Last, ns: seed}
	if err := c.tree.Lock(m.Last); err != nil {
		return nil, err
	}
	l1 := m.DevicePages()
	r.DevicePages = m.AppendDevice(make([]pool.PageID, 0, m.Pages))
	r.L1Tokens = l1 * ps
	for _, s := range m.Spans {
		if s.Device == nil {
			break
		}
		if t := c.loading[s.Node]; t != nil {
			r.loads = append(r.loads, t) // loaded for another request, maybe not yet done
		}
	}
	if l2 := m.Pages - l1; l2 > 0 {
		if c.host == nil || l2*ps < c.cfg.LoadBackMinTokens {
			c.st.SkippedL2Tokens += int64(l2 * ps)
		} else if err := c.loadBack(r, m.Spans, l1, l2); err != nil {
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
		if op := p.op; op.inserted > 0 && op.ns == seed && l1 <= op.from && len(r.DevicePages) >= op.from+op.inserted {
			r.L2Tokens -= op.inserted * ps
			r.L3Tokens += op.inserted * ps
		}
		if len(r.DevicePages) == m.Pages {
			if err := c.takeStaged(r, p.op, m.Pages); err != nil {
				return nil, err
			}
		}
		p.settled = true
		p.op.waiters--
		if p.op.waiters == 0 && p.op.staged && !p.op.taken && !p.op.abandoned {
			p.op.abandoned = true
			p.op.release()
		}
	}
	r.HitTokens = r.L1Tokens + r.L2Tokens + r.L3Tokens
	c.st.HitTokensL1 += int64(r.L1Tokens)
	c.st.HitTokensL2 += int64(r.L2Tokens)
	c.st.HitTokensL3 += int64(r.L3Tokens)
	c.st.DraftRecomputeTokens += int64(r.DraftRecomputeTokens)
	if c.cfg.WritePolicy == WriteThroughSelective && c.host != nil {
		var hot []*radix.Node[E]
		for _, s := range m.Spans {
			n := s.Node
			if n.Device() != nil && n.Host() == nil && n.Hits() >= c.cfg.WriteThroughThreshold {
				hot = append(hot, n)
			}
		}
		if err := c.backup(hot); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// takeStaged loads the pages a prefetch kept for its first request (L3 pages
// whose draft KV is missing) into fresh L1 pages after the request's prefix, when
// they continue exactly that prefix: the prefetch started at or before its end
// (pages the tree has cached meanwhile are dropped from the staged ones).
func (c *core[E]) takeStaged(r *Request, op *prefetchOp, prefix int) error {
	if !op.staged || op.taken || op.abandoned || op.ns != r.ns || op.from > prefix || prefix >= op.from+op.usable {
		return nil
	}
	skip := prefix - op.from // staged pages the tree now has
	n := op.usable - skip
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
	c.ops = append(c.ops, copyOp[E]{kind: opLoadStaged, t: t, pages: n, staged: op.host[skip:op.usable]})
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

// loadBack gives the L2-only spans of a match L1 pages and starts copying them in.
// The match is locked, so evicting for room cannot touch it.
func (c *core[E]) loadBack(r *Request, spans []radix.Span[E], l1, l2 int) error {
	dev, err := c.allocDevice(l2)
	if err != nil {
		return err
	}
	moves := make([]pool.PageMove, 0, l2)
	var nodes []*radix.Node[E]
	j := 0
	for _, s := range spans {
		if s.Device != nil {
			continue
		}
		for i, h := range s.Host {
			moves = append(moves, pool.PageMove{Device: dev[j+i], Host: h})
		}
		if err := c.tree.SetDevice(s.Node, dev[j:j+s.Pages]); err != nil {
			return fmt.Errorf("load back: %w", err) // a bug: the match's L2 spans follow its L1 spans
		}
		if err := c.tree.HostRef(s.Node); err != nil {
			return err
		}
		nodes = append(nodes, s.Node)
		j += s.Pages
	}
	t, err := c.copier.Load(c.dev, c.host, moves)
	if err != nil {
		return fmt.Errorf("load back %d pages: %w", l2, err)
	}
	for _, n := range nodes {
		c.loading[n] = t
	}
	c.ops = append(c.ops, copyOp[E]{kind: opLoad, t: t, nodes: nodes, pages: l2})
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
	if err := c.dev.Pages.Free(res.Duplicate); err != nil {
		return nil, fmt.Errorf("free duplicate pages: %w", err)
	}
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
	var moves []pool.PageMove
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
		for i, d := range n.Device() {
			moves = append(moves, pool.PageMove{Device: d, Host: host[i]})
		}
		_ = c.tree.Lock(n)
		_ = c.tree.HostRef(n)
		started = append(started, n)
	}
	if len(moves) == 0 {
		return nil
	}
	t, err := c.copier.Backup(c.dev, c.host, moves)
	if err != nil {
		return fmt.Errorf("backup %d pages: %w", len(moves), err)
	}
	c.ops = append(c.ops, copyOp[E]{kind: opBackup, t: t, nodes: started, pages: len(moves)})
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

func (c *core[E]) allocDevice(n int) ([]pool.PageID, error) {
	if n < 0 {
		return nil, fmt.Errorf("allocate %d pages: %w", n, ErrRequest)
	}
	if free := c.dev.Pages.FreePages(); free < n {
		if err := c.evictDevice(n - free); err != nil {
			return nil, err
		}
	}
	if free := c.dev.Pages.FreePages(); free < n && c.waitBackups() {
		// Pages being backed up are locked until their copy is accounted for; the
		// copies take microseconds, so wait for them rather than fail.
		if err := c.evictDevice(n - free); err != nil {
			return nil, err
		}
	}
	pages, err := c.dev.Pages.Alloc(n)
	if err != nil {
		return nil, fmt.Errorf("allocate %d L1 pages: %d free after evicting every unlocked page: %v: %w", n, c.dev.Pages.FreePages(), err, ErrDeviceFull)
	}
	return pages, nil
}

// waitBackups waits for the L1→L2 copies in flight and accounts for them; it
// reports whether there were any.
func (c *core[E]) waitBackups() bool {
	waited := false
	for _, op := range c.ops {
		if op.kind == opBackup {
			<-op.t.Done()
			waited = true
		}
	}
	if waited {
		c.reap()
	}
	return waited
}

func (c *core[E]) freeDevice(pages []pool.PageID) error {
	if err := c.dev.Pages.Free(pages); err != nil {
		return fmt.Errorf("free L1 pages: %w: %w", err, ErrRequest)
	}
	return nil
}

// evictDevice frees at least need L1 pages if it can. Victims backed up in L2 keep
// their L2 copy; with write-back, victims that are not are backed up first (the
// eviction waits for that copy); others are dropped with their subtree.
func (c *core[E]) evictDevice(need int) error {
	start := time.Now()
	defer func() {
		d := time.Since(start)
		c.st.EvictionTime += d
		c.st.EvictionSeconds.observe(d.Seconds())
	}()
	freed := 0
	for freed < need {
		var batch []*radix.Node[E]
		batchPages := 0
		for freed+batchPages < need {
			v := c.tree.DeviceVictim()
			if v == nil {
				break
			}
			if v.Host() != nil {
				pages, err := c.tree.DropDevice(v)
				if err != nil {
					return err
				}
				if err := c.dev.Pages.Free(pages); err != nil {
					return fmt.Errorf("free evicted L1 pages: %w", err)
				}
				freed += len(pages)
				c.st.EvictedTokensL1 += int64(len(pages) * c.cfg.PageSize)
				continue
			}
			if c.cfg.WritePolicy == WriteBack && c.host != nil {
				if host, ok := c.allocHost(v.Pages()); ok {
					if err := c.tree.SetHost(v, host); err != nil {
						return err
					}
					_ = c.tree.Lock(v) // out of the victim heap while its copy runs
					_ = c.tree.HostRef(v)
					batch = append(batch, v)
					batchPages += v.Pages()
					continue
				}
			}
			dev, host, err := c.tree.Remove(v)
			if err != nil {
				return err
			}
			if err := c.dev.Pages.Free(dev); err != nil {
				return fmt.Errorf("free evicted L1 pages: %w", err)
			}
			if c.host != nil {
				if err := c.host.Free(host); err != nil {
					return fmt.Errorf("free evicted L2 pages: %w", err)
				}
			}
			freed += len(dev)
			c.st.EvictedTokensL1 += int64(len(dev) * c.cfg.PageSize)
			c.st.EvictedTokensL2 += int64(len(host) * c.cfg.PageSize)
		}
		if len(batch) == 0 {
			if c.tree.DeviceVictim() == nil {
				break
			}
			continue
		}
		n, err := c.writeBack(batch)
		freed += n
		if err != nil {
			return err
		}
	}
	return nil
}

// writeBack copies victims' L1 pages to their new L2 pages, waits, and drops their
// L1 pages. A victim whose copy failed loses its L2 pages instead and stays in L1.
func (c *core[E]) writeBack(batch []*radix.Node[E]) (int, error) {
	var moves []pool.PageMove
	for _, v := range batch {
		for i, d := range v.Device() {
			moves = append(moves, pool.PageMove{Device: d, Host: v.Host()[i]})
		}
	}
	t, err := c.copier.Backup(c.dev, c.host, moves)
	var copyErr error
	if err == nil {
		copyErr = t.Wait(contextBackground())
		c.account(opBackup, t, len(moves))
	} else {
		copyErr = err
	}
	freed := 0
	for _, v := range batch {
		_ = c.tree.Unlock(v)
		_ = c.tree.HostUnref(v)
		if copyErr != nil {
			if host, err := c.tree.DropHost(v); err == nil {
				_ = c.host.Free(host)
			}
			continue
		}
		pages, err := c.tree.DropDevice(v)
		if err != nil {
			return freed, err
		}
		if err := c.dev.Pages.Free(pages); err != nil {
			return freed, fmt.Errorf("free evicted L1 pages: %w", err)
		}
		freed += len(pages)
		c.st.EvictedTokensL1 += int64(len(pages) * c.cfg.PageSize)
	}
	if copyErr != nil {
		return freed, fmt.Errorf("write back %d pages: %w", len(moves), copyErr)
	}
	c.backupToL3(batch)
	return freed, nil
}

func (c *core[E]) account(kind opKind, t *pool.Transfer, pages int) {
	tr := &c.st.Backup
	if kind == opLoad {
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

// reap accounts for finished copies: loads release their host references, backups
// their locks; failures undo what the copy was to provide.
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
		if op.kind == opLoadStaged {
			c.freeHost(op.staged)
			c.l3.reserved -= len(op.staged)
		}
		if op.kind == opBackup && !failed {
			c.backupToL3(op.nodes)
		}
		for _, n := range op.nodes {
			_ = c.tree.HostUnref(n)
			switch op.kind {
			case opLoad:
				if c.loading[n] == op.t {
					delete(c.loading, n)
				}
				if failed {
					c.poisoned = append(c.poisoned, n)
				}
			case opBackup:
				_ = c.tree.Unlock(n)
				if failed {
					c.unbacked = append(c.unbacked, n)
				}
			}
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
				_ = c.tree.HostUnref(j.node.(*radix.Node[E]))
				c.l3.backupPending -= len(j.host)
				c.l3.st.BackedUpTokens += int64(j.written * c.cfg.PageSize)
			}
		}
	}
	c.poisoned = c.retry(c.poisoned, func(n *radix.Node[E]) bool {
		if n.Locked() {
			return false
		}
		if pages, err := c.tree.DropDevice(n); err == nil {
			_ = c.dev.Pages.Free(pages)
		}
		return true
	})
	c.unbacked = c.retry(c.unbacked, func(n *radix.Node[E]) bool {
		if n.HostRef() > 0 {
			return false
		}
		if pages, err := c.tree.DropHost(n); err == nil {
			_ = c.host.Free(pages)
		}
		return true
	})
}

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
