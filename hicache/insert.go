package hicache

import (
	"fmt"

	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/radix"
)

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
