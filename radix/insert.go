package radix

import (
	"fmt"

	"github.com/stratakv/strata/pageid"
	"github.com/stratakv/strata/pagekey"
)

// Inserted is what Insert did.
type Inserted[E Elem] struct {
	// Last is the node holding the key's last whole page (the root for a key shorter
	// than a page).
	Last *Node[E]
	// Duplicate lists the caller's device pages the tree did not take because the
	// tree already holds those pages of the key in other device pages. The caller
	// frees them.
	Duplicate []pageid.ID
	// New lists nodes created for the key: in L1 only, candidates for backup.
	New []*Node[E]
	// Revived lists nodes that were in L2 only and took the caller's device pages.
	Revived []*Node[E]
	// NewPages is the number of pages in New.
	NewPages int
}

// Insert adds key to namespace ns (the zero Key for none) with device holding one
// device page per whole page of key (a partial last page is ignored, and device
// must not list a page for it) and pageKeys, when the tree keeps page keys, one
// pagekey.Key per page (nil stores zero keys). Pages of key already cached keep
// their device pages and keys; the caller's pages for them are either the same
// pages (a prefix it matched) or listed in Duplicate. Pages cached only in L2 take
// the caller's device pages.
//
// Insert fails with ErrFull, changing nothing, when the new pages do not fit the
// token arena (MaxPages).
func (t *Tree[E]) Insert(ns pagekey.Key, key []E, device []pageid.ID, pageKeys []pagekey.Key) (Inserted[E], error) {
	ps := t.cfg.PageSize
	pages := len(key) / ps
	if len(device) != pages {
		return Inserted[E]{}, fmt.Errorf("insert of %d whole pages with %d device pages: %w", pages, len(device), ErrPages)
	}
	if pageKeys != nil && len(pageKeys) != pages {
		return Inserted[E]{}, fmt.Errorf("insert of %d whole pages with %d page keys: %w", pages, len(pageKeys), ErrPages)
	}
	// Check capacity before changing anything, since the walk below may split nodes;
	// only when the arena is nearly full does it take a second walk to count.
	if free := t.cfg.MaxPages - t.tokens.used(); pages > free {
		if need := pages - t.Peek(ns, key); need > free {
			return Inserted[E]{}, fmt.Errorf("insert of %d new pages with %d of %d free: %w", need, free, t.cfg.MaxPages, ErrFull)
		}
	}
	now := t.tick()
	var res Inserted[E]
	n := t.nsRoot(ns, pages > 0)
	for pos := 0; pos < pages; {
		c := t.child(n, key[pos*ps:pos*ps+ps])
		if c == nil {
			var newKeys []pagekey.Key
			if pageKeys != nil {
				newKeys = pageKeys[pos:]
			}
			keys, _ := t.tokens.store(key[pos*ps:pages*ps], newKeys)
			leaf := &Node[E]{
				parent:     n,
				keys:       keys,
				device:     append([]pageid.ID(nil), device[pos:]...),
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
			c.device = append([]pageid.ID(nil), device[pos:pos+k]...)
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
	if n == nil {
		n = t.root
	}
	res.Last = n
	return res, nil
}

// InsertHost caches the last len(host) whole pages of key in namespace ns as pages
// in L2 only, with pageKeys (nil allowed) one key per whole page of key: what a
// prefetch from L3 brings, hung below the prefix it was fetched for. The prefix
// before those pages must still be cached (ErrNode otherwise: it was evicted while
// the prefetch ran, and the pages have nothing to hang from). Pages the tree has
// meanwhile cached are not taken: their host pages are returned for the caller to
// free, with the new node (nil when nothing was new). Nothing counts as a hit.
func (t *Tree[E]) InsertHost(ns pagekey.Key, key []E, host []pageid.ID, pageKeys []pagekey.Key) (*Node[E], []pageid.ID, error) {
	ps := t.cfg.PageSize
	pages := len(key) / ps
	from := pages - len(host)
	if from < 0 {
		return nil, nil, fmt.Errorf("insert of %d host pages for a key of %d whole pages: %w", len(host), pages, ErrPages)
	}
	if pageKeys != nil && len(pageKeys) != pages {
		return nil, nil, fmt.Errorf("insert of %d whole pages with %d page keys: %w", pages, len(pageKeys), ErrPages)
	}
	cached := t.Peek(ns, key)
	if cached < from {
		return nil, nil, fmt.Errorf("the %d-page prefix below the new pages is no longer cached (%d are): %w", from, cached, ErrNode)
	}
	if cached == pages {
		return nil, host, nil
	}
	if need := pages - cached; need > t.cfg.MaxPages-t.tokens.used() {
		return nil, nil, fmt.Errorf("insert of %d new pages with %d of %d free: %w", need, t.cfg.MaxPages-t.tokens.used(), t.cfg.MaxPages, ErrFull)
	}
	parent := t.descend(t.nsRoot(ns, true), key[:cached*ps])
	var newKeys []pagekey.Key
	if pageKeys != nil {
		newKeys = pageKeys[cached:]
	}
	keys, _ := t.tokens.store(key[cached*ps:pages*ps], newKeys)
	leaf := &Node[E]{
		parent:     parent,
		keys:       keys,
		host:       append([]pageid.ID(nil), host[cached-from:]...),
		lastAccess: t.tick(),
		heapIdx:    [2]int32{-1, -1},
	}
	t.addChild(parent, leaf)
	t.nodes++
	t.hostPages += len(leaf.host)
	t.refresh(leaf)
	t.refresh(parent)
	return leaf, host[:cached-from], nil
}

// descend walks from n along key, which must be cached in whole, splitting the node
// where it ends, and returns the node that ends it.
func (t *Tree[E]) descend(n *Node[E], key []E) *Node[E] {
	ps := t.cfg.PageSize
	for pos := 0; pos < len(key); {
		c := t.child(n, key[pos:pos+ps])
		k := t.matchPages(c, key[pos:])
		if k < len(c.keys) {
			c = t.split(c, k)
		}
		pos += k * ps
		n = c
	}
	return n
}
