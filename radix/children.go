package radix

import (
	"hash/maphash"
	"unsafe"
)

// indexThreshold is the child count above which a node keeps a hash index of its
// children's first pages; at or below it a scan comparing first elements is as fast
// and costs no memory. The index goes away again at indexThreshold/2 children, so a
// node whose fan-out hovers around the threshold does not rebuild it on every change.
const indexThreshold = 8

// minIndexSlots is the size of a new child index: a power of two that holds
// indexThreshold+1 children under the maximum load.
const minIndexSlots = 16

// childIndex finds a node's child by its first page in O(1), hit or miss, at any
// fan-out: an open-addressing table with linear probing, keyed on the hash of the
// child's first page. Children of one node differ in their first page (matching is
// page-granular: two children may share every element but the last of their first
// page), so the whole first page is hashed, as bytes, for tokens and for EAGLE
// bigrams alike; the elements themselves stay in the token arena and a probe reads
// them only when the 32-bit tags are equal. Removals shift the entries after the
// hole back (no tombstones), so a miss stops at the first empty slot however many
// children came and went. Slots cost 12 bytes; the table doubles past 3/4 full and
// halves under 1/4, so an indexed node spends 16 to 48 bytes of Go heap per child
// (about 32 just after growing).
type childIndex[E Elem] struct {
	// tags holds per slot the low 32 bits of the first page's hash, 0 for an empty
	// slot (a hash whose low bits are 0 is stored as 1). A slot's home position is
	// its tag masked to the table size, so entries move without rehashing pages.
	tags  []uint32
	nodes []*Node[E]
	count int
}

// tag is the index tag of a first page: its hash under the tree's seed, never 0.
// The seed is random per tree, so pages chosen to collide (prompts are outside
// input) cannot turn the table into a list on every tree.
func (t *Tree[E]) tag(page []E) uint32 {
	var zero E
	b := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(page))), len(page)*int(unsafe.Sizeof(zero)))
	if h := uint32(maphash.Bytes(t.seed, b)); h != 0 {
		return h
	}
	return 1
}

// firstPage is the elements of n's first page.
func (t *Tree[E]) firstPage(n *Node[E]) []E { return t.tokens.page(n.keys[0]) }

// child returns the child of n whose first page equals page, or nil.
func (t *Tree[E]) child(n *Node[E], page []E) *Node[E] {
	if x := n.index; x != nil {
		tag := t.tag(page)
		mask := uint32(len(x.tags) - 1)
		for i := tag & mask; ; i = (i + 1) & mask {
			switch x.tags[i] {
			case 0:
				return nil
			case tag:
				if c := x.nodes[i]; equalElems(t.firstPage(c), page) {
					return c
				}
			}
		}
	}
	for _, c := range n.children {
		if first := t.firstPage(c); first[0] == page[0] && equalElems(first, page) {
			return c
		}
	}
	return nil
}

// addChild makes c, whose first page no child of n starts with, the last child of n.
func (t *Tree[E]) addChild(n, c *Node[E]) {
	c.childIdx = int32(len(n.children))
	n.children = append(n.children, c)
	switch x := n.index; {
	case x != nil && 4*(x.count+1) > 3*len(x.tags):
		t.reindex(n, 2*len(x.tags))
	case x != nil:
		x.put(t.tag(t.firstPage(c)), c)
	case len(n.children) > indexThreshold:
		t.reindex(n, minIndexSlots)
	}
}

// reindex rebuilds n's index, with slots slots, from its children.
func (t *Tree[E]) reindex(n *Node[E], slots int) {
	x := &childIndex[E]{tags: make([]uint32, slots), nodes: make([]*Node[E], slots)}
	for _, c := range n.children {
		x.put(t.tag(t.firstPage(c)), c)
	}
	n.index = x
}

// put files c under tag in the first free slot from its home; there is always one.
func (x *childIndex[E]) put(tag uint32, c *Node[E]) {
	mask := uint32(len(x.tags) - 1)
	i := tag & mask
	for x.tags[i] != 0 {
		i = (i + 1) & mask
	}
	x.tags[i], x.nodes[i] = tag, c
	x.count++
}

// slot is the position of c, filed under tag; c must be in the index.
func (x *childIndex[E]) slot(tag uint32, c *Node[E]) uint32 {
	mask := uint32(len(x.tags) - 1)
	i := tag & mask
	for x.nodes[i] != c {
		i = (i + 1) & mask
	}
	return i
}

// remove empties slot i and moves back every later entry of its probe run that
// may take the hole: one whose home is not cyclically in (hole, its slot].
func (x *childIndex[E]) remove(i uint32) {
	mask := uint32(len(x.tags) - 1)
	for j := (i + 1) & mask; x.tags[j] != 0; j = (j + 1) & mask {
		home := x.tags[j] & mask
		if (j-home)&mask >= (j-i)&mask {
			x.tags[i], x.nodes[i] = x.tags[j], x.nodes[j]
			i = j
		}
	}
	x.tags[i], x.nodes[i] = 0, nil
	x.count--
}

// replaceChild puts repl where old was under n; repl starts with the page old
// started with (old may have been cut since).
func (t *Tree[E]) replaceChild(n, old, repl *Node[E]) {
	repl.childIdx = old.childIdx
	n.children[old.childIdx] = repl
	if n.index != nil {
		n.index.nodes[n.index.slot(t.tag(t.firstPage(repl)), old)] = repl
	}
}

// removeChild takes old, whose pages are still intact, out of n's children: the last
// child takes its place in the list.
func (t *Tree[E]) removeChild(n, old *Node[E]) {
	i, last := old.childIdx, int32(len(n.children)-1)
	if i != last {
		moved := n.children[last]
		n.children[i] = moved
		moved.childIdx = i
	}
	n.children[last] = nil
	n.children = n.children[:last]
	if x := n.index; x != nil {
		x.remove(x.slot(t.tag(t.firstPage(old)), old))
		switch {
		case len(n.children) <= indexThreshold/2:
			n.index = nil
		case len(x.tags) > minIndexSlots && 4*x.count < len(x.tags):
			t.reindex(n, len(x.tags)/2)
		}
	}
	if len(n.children) == 0 {
		n.children = nil
	}
}
