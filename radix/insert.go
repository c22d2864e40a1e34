package radix

import (
	"fmt"

	"github.com/stratakv/strata/pool"
)

// Inserted is what Insert did.
type Inserted[E Elem] struct {
	// Last is the node holding the key's last whole page (the root for a key shorter
	// than a page).
	Last *Node[E]
	// Duplicate lists the caller's device pages the tree did not take because the
	// tree already holds those pages of the key in other device pages. The caller
	// frees them.
	Duplicate []pool.PageID
	// New lists nodes created for the key: in L1 only, candidates for backup.
	New []*Node[E]
	// Revived lists nodes that were in L2 only and took the caller's device pages.
	Revived []*Node[E]
	// NewPages is the number of pages in New.
	NewPages int
}

// Insert adds key with device holding one device page per whole page of key (a
// partial last page is ignored, and device must not list a page for it). Pages of
// key already cached keep their device pages; the caller's pages for them are
// either the same pages (a prefix it matched) or listed in Duplicate. Pages cached
// only in L2 take the caller's device pages.
//
// Insert fails with ErrFull, changing nothing, when the new pages do not fit the
// token arena (MaxPages).
func (t *Tree[E]) Insert(key []E, device []pool.PageID) (Inserted[E], error) {
	ps := t.cfg.PageSize
	pages := len(key) / ps
	if len(device) != pages {
		return Inserted[E]{}, fmt.Errorf("insert of %d whole pages with %d device pages: %w", pages, len(device), ErrPages)
	}
	// Check capacity before changing anything, since the walk below may split nodes;
	// only when the arena is nearly full does it take a second walk to count.
	if free := t.cfg.MaxPages - t.tokens.used(); pages > free {
		if need := pages - t.Peek(key); need > free {
			return Inserted[E]{}, fmt.Errorf("insert of %d new pages with %d of %d free: %w", need, free, t.cfg.MaxPages, ErrFull)
		}
	}
	now := t.tick()
	var res Inserted[E]
	n := t.root
	for pos := 0; pos < pages; {
		c := t.child(n, key[pos*ps:pos*ps+ps])
		if c == nil {
			keys, _ := t.tokens.store(key[pos*ps : pages*ps])
			leaf := &Node[E]{
				parent:     n,
				keys:       keys,
				device:     append([]pool.PageID(nil), device[pos:]...),
				lastAccess: now,
				heapIdx:    [2]int32{-1, -1},
			}
			t.addChild(n, leaf)
			n.deviceChildren++
			t.nodes++
			t.devicePages += len(leaf.device)
			t.refresh(leaf)
			t.refresh(n)
			res.New = append(res.New, leaf)
			res.NewPages += len(leaf.device)
			n = leaf
			break
		}
		k := t.matchPages(c, key[pos*ps:pages*ps])
		if k < len(c.keys) {
			c = t.split(c, k)
		}
		if c.device == nil {
			// The parent is in L1 (or the root): the walk revives from the top down.
			c.device = append([]pool.PageID(nil), device[pos:pos+k]...)
			n.deviceChildren++
			t.devicePages += k
			res.Revived = append(res.Revived, c)
			t.refresh(n)
		} else {
			for i, p := range c.device {
				if p != device[pos+i] {
					res.Duplicate = append(res.Duplicate, device[pos+i])
				}
			}
		}
		c.lastAccess = now
		t.refresh(c)
		pos += k
		n = c
	}
	res.Last = n
	return res, nil
}
