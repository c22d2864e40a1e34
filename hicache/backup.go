package hicache

import (
	"errors"
	"fmt"
	"time"

	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/radix"
)

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
		// n is in the tree, in L1 and not in L2, and host is its size: only a
		// bug fails these.
		must(c.tree.SetHost(n, host))
		must(errors.Join(c.tree.Lock(n), c.tree.HostRef(n)))
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
