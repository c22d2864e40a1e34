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

// must panics on an error that only a broken invariant of the cache's own can
// cause (see the package comment): the tree refusing a lock, a reference or a
// tier change for a node the cache's accounting says allows it. Going on would
// free or serve pages a copy or a request still uses. The tree's error names
// the node's state.
func must(err error) {
	if err != nil {
		panic(fmt.Sprintf("hicache: the cache's accounting of locks, references and tiers is out of step with its tree (a bug): %v", err))
	}
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
