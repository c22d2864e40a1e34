package radix

// indexThreshold is the child count above which a node keeps a hash index of its
// children's first pages; below it a scan comparing first elements is faster and
// costs no memory.
const indexThreshold = 8

// hashPage mixes a page's elements into 64 bits for the child index.
func hashPage[E Elem](page []E) uint64 {
	h := uint64(0x9e3779b97f4a7c15)
	for _, e := range page {
		h ^= uint64(e)
		h *= 0xff51afd7ed558ccd
		h ^= h >> 32
	}
	return h
}

// firstPage is the elements of n's first page.
func (t *Tree[E]) firstPage(n *Node[E]) []E { return t.tokens.page(n.keys[0]) }

// child returns the child of n whose first page equals page, or nil.
func (t *Tree[E]) child(n *Node[E], page []E) *Node[E] {
	if n.index != nil {
		if c := n.index[hashPage(page)]; c != nil && equalElems(t.firstPage(c), page) {
			return c
		}
		// A hash collision leaves one of the colliding children out of the index.
	}
	for _, c := range n.children {
		if first := t.firstPage(c); first[0] == page[0] && equalElems(first, page) {
			return c
		}
	}
	return nil
}

func (t *Tree[E]) addChild(n, c *Node[E]) {
	n.children = append(n.children, c)
	if n.index != nil {
		h := hashPage(t.firstPage(c))
		if _, taken := n.index[h]; !taken {
			n.index[h] = c
		}
		return
	}
	if len(n.children) > indexThreshold {
		n.index = make(map[uint64]*Node[E], len(n.children))
		for _, x := range n.children {
			h := hashPage(t.firstPage(x))
			if _, taken := n.index[h]; !taken {
				n.index[h] = x
			}
		}
	}
}

// replaceChild puts repl where old was under n; both start with the same page.
func (t *Tree[E]) replaceChild(n, old, repl *Node[E]) {
	for i, c := range n.children {
		if c == old {
			n.children[i] = repl
			break
		}
	}
	if n.index != nil {
		h := hashPage(t.firstPage(repl))
		if n.index[h] == old {
			n.index[h] = repl
		}
	}
}

func (t *Tree[E]) removeChild(n, old *Node[E]) {
	for i, c := range n.children {
		if c == old {
			last := len(n.children) - 1
			n.children[i] = n.children[last]
			n.children[last] = nil
			n.children = n.children[:last]
			break
		}
	}
	if n.index != nil {
		h := hashPage(t.firstPage(old))
		if n.index[h] == old {
			delete(n.index, h)
			// Re-admit a colliding sibling that the index had left out.
			for _, c := range n.children {
				if hashPage(t.firstPage(c)) == h {
					n.index[h] = c
					break
				}
			}
		}
		if len(n.children) <= indexThreshold/2 {
			n.index = nil
		}
	}
	if len(n.children) == 0 {
		n.children = nil
	}
}
