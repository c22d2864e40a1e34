package hicache

import (
	"errors"
	"fmt"
	"time"

	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/radix"
)

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
			pages, err := c.tree.DropDevice(v) // a victim of the tree's own heap, in L2
			must(err)
			c.freeDev(pages)
			freed += len(pages)
			c.st.EvictedTokensL1 += int64(len(pages) * c.cfg.PageSize)
			continue
		}
		if c.cfg.WritePolicy == WriteBack && c.host != nil {
			if host, ok := c.allocHost(v.Pages()); ok {
				must(c.tree.SetHost(v, host)) // not in L2, and host is its size
				// Locked, it leaves the victim heap while its copy runs.
				must(errors.Join(c.tree.Lock(v), c.tree.HostRef(v)))
				batch = append(batch, v)
				pending += v.Pages()
				continue
			}
		}
		dev, host, err := c.tree.Remove(v) // an unlocked victim, unreferenced in L2
		must(err)
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
