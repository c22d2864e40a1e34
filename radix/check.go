package radix

import (
	"errors"
	"fmt"
	"slices"

	"github.com/stratakv/strata/pageid"
	"github.com/stratakv/strata/pagekey"
)

// Walk calls fn for every node holding pages, parents before children, with its
// namespace and its full key from the namespace's root (valid only during the
// call). It stops when fn returns false.
func (t *Tree[E]) Walk(fn func(ns pagekey.Key, prefix []E, n *Node[E]) bool) {
	type frame struct {
		n     *Node[E]
		ns    pagekey.Key
		depth int
	}
	var prefix []E
	stack := make([]frame, 0, len(t.root.children))
	for _, c := range t.root.children {
		stack = append(stack, frame{c, pagekey.Key{}, 0})
	}
	for key, ns := range t.namespaces {
		for _, c := range ns.children {
			stack = append(stack, frame{c, key, 0})
		}
	}
	for len(stack) > 0 {
		f := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		prefix = t.AppendKey(prefix[:f.depth], f.n)
		if !fn(f.ns, prefix, f.n) {
			return
		}
		for _, c := range f.n.children {
			stack = append(stack, frame{c, f.ns, len(prefix)})
		}
	}
}

// Check verifies the tree's invariants and returns every violation found: node
// shapes, tier residency (every node cached somewhere, L1 nodes below L1 nodes),
// reference counts, counters, page uniqueness, child indexes and victim heaps. It
// walks the whole tree; tests and debugging use it.
func (t *Tree[E]) Check() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	devSeen := map[pageid.ID]bool{}
	tokSeen := map[int32]bool{}
	hostSeen := map[pageid.ID]bool{}
	nodes, devPages, hostPages := 0, 0, 0
	var visit func(n *Node[E])
	visit = func(n *Node[E]) {
		var lockSum, refSum, devChildren int32
		firsts := map[string]bool{}
		t.checkIndex(n, bad)
		for i, c := range n.children {
			if c.parent != n {
				bad("child's parent pointer is wrong")
			}
			if int(c.childIdx) != i {
				bad("child %d records position %d", i, c.childIdx)
			}
			if c.removed {
				bad("removed node still linked")
			}
			if len(c.keys) == 0 {
				bad("node with no pages")
				continue
			}
			for _, k := range c.keys {
				if k < 0 || int(k) >= t.cfg.MaxPages || tokSeen[k] {
					bad("token page %d out of range or held twice", k)
				}
				tokSeen[k] = true
			}
			first := fmt.Sprint(t.firstPage(c))
			if firsts[first] {
				bad("two children start with the same page")
			}
			firsts[first] = true
			if t.child(n, t.firstPage(c)) != c {
				bad("child lookup does not find its child")
			}
			lockSum += c.lockRef
			refSum += c.hostRef
			if c.device != nil {
				devChildren++
			}
			nodes++
			pages := len(c.keys)
			if c.device != nil && len(c.device) != pages || c.host != nil && len(c.host) != pages {
				bad("node of %d pages has %d device and %d host pages", pages, len(c.device), len(c.host))
			}
			if c.device == nil && c.host == nil {
				bad("node of %d pages is cached in no tier", pages)
			}
			if c.device != nil && !n.IsRoot() && n.device == nil {
				bad("node in L1 below a node that is not")
			}
			for _, p := range c.device {
				if devSeen[p] {
					bad("device page %d held twice", p)
				}
				devSeen[p] = true
			}
			for _, p := range c.host {
				if hostSeen[p] {
					bad("host page %d held twice", p)
				}
				hostSeen[p] = true
			}
			devPages += len(c.device)
			hostPages += len(c.host)
			if inHeap := c.heapIdx[deviceTier] >= 0; inHeap != t.deviceCandidate(c) {
				bad("device heap membership %v, candidacy %v", inHeap, t.deviceCandidate(c))
			}
			if inHeap := c.heapIdx[hostTier] >= 0; inHeap != t.hostCandidate(c) {
				bad("host heap membership %v, candidacy %v", inHeap, t.hostCandidate(c))
			}
			visit(c)
		}
		if n.deviceChildren != devChildren {
			bad("node counts %d children in L1, has %d", n.deviceChildren, devChildren)
		}
		if n.parent != nil && (n.lockRef < lockSum || n.hostRef < refSum) {
			bad("references below children's: lock %d < %d or host %d < %d", n.lockRef, lockSum, n.hostRef, refSum)
		}
		if n.lockRef < 0 || n.hostRef < 0 {
			bad("negative reference count")
		}
	}
	visit(t.root)
	for key, ns := range t.namespaces {
		if ns.ns == nil || *ns.ns != key || ns.parent != t.root || ns.removed {
			bad("namespace root is malformed")
		}
		if len(ns.children) == 0 && ns.lockRef == 0 && ns.hostRef == 0 {
			bad("empty, unheld namespace root kept")
		}
		visit(ns)
	}
	if len(tokSeen) != t.tokens.used() {
		bad("token arena has %d pages in use, nodes hold %d", t.tokens.used(), len(tokSeen))
	}
	if nodes != t.nodes || devPages != t.devicePages || hostPages != t.hostPages {
		bad("counters nodes %d/%d device %d/%d host %d/%d", t.nodes, nodes, t.devicePages, devPages, t.hostPages, hostPages)
	}
	for _, h := range []*victimHeap[E]{&t.deviceHeap, &t.hostHeap} {
		for i, n := range h.nodes {
			if int(n.heapIdx[h.tier]) != i {
				bad("heap index of a node is stale")
			}
			if i > 0 && h.less(n, h.nodes[(i-1)/2]) {
				bad("heap order violated")
			}
			if n.removed {
				bad("removed node in a victim heap")
			}
		}
	}
	if len(errs) > 8 {
		errs = slices.Clip(errs[:8])
	}
	return errors.Join(errs...)
}

// checkIndex verifies n's child index: present exactly when the fan-out calls for
// it, sized and loaded as its growth rules keep it, every slot holding a child of n
// under its first page's tag, every child in one slot. Lookups through it are
// checked by Check for every child.
func (t *Tree[E]) checkIndex(n *Node[E], bad func(string, ...any)) {
	x := n.index
	if x == nil {
		if len(n.children) > indexThreshold {
			bad("node of %d children has no index", len(n.children))
		}
		return
	}
	slots := len(x.tags)
	if len(n.children) <= indexThreshold/2 || x.count != len(n.children) {
		bad("index of %d entries on a node of %d children", x.count, len(n.children))
	}
	if slots < minIndexSlots || slots&(slots-1) != 0 || len(x.nodes) != slots || 4*x.count > 3*slots {
		bad("index of %d slots holds %d children", slots, x.count)
	}
	filed := 0
	for i, tag := range x.tags {
		c := x.nodes[i]
		if (tag == 0) != (c == nil) {
			bad("index slot %d: tag %#x, node %p", i, tag, c)
			continue
		}
		if c == nil {
			continue
		}
		filed++
		if c.parent != n || c.removed || len(c.keys) == 0 || int(c.childIdx) >= len(n.children) || n.children[c.childIdx] != c {
			bad("index slot %d holds a node that is not a child", i)
		} else if tag != t.tag(t.firstPage(c)) {
			bad("index slot %d: tag %#x is not its first page's", i, tag)
		}
	}
	if filed != x.count {
		bad("index counts %d entries, holds %d", x.count, filed)
	}
}
