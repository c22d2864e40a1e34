package radix

import (
	"bytes"
	"slices"
	"unsafe"

	"github.com/stratakv/strata/pageid"
	"github.com/stratakv/strata/pagekey"
)

// Span is one node's part of a match, with where its pages live.
type Span[E Elem] struct {
	// Node holds the span's pages.
	Node *Node[E]
	// Pages is the number of pages of the span (all of Node's pages).
	Pages int
	// Device is the span's device pages, nil when it is not in L1.
	Device []pageid.ID
	// Host is the span's host pages, nil when it is not in L2.
	Host []pageid.ID
}

// Match is the longest cached prefix of a key. It names the deepest matched node
// only: the matched nodes are the path from there up, and listing them (Spans) is
// left to the callers that want it, so that a match of a long prefix builds no
// list (a slice of 64-byte spans per match was a tenth of its time at 64 nodes).
type Match[E Elem] struct {
	// Pages is the number of whole pages matched.
	Pages int
	// Last is the deepest matched node, the root (of the namespace, when it exists)
	// when nothing matched. Lock it to keep the whole prefix from eviction.
	Last *Node[E]
}

// Spans lists the matched nodes from the root down, with where their pages live
// now. Device-resident spans come first: a node is in L1 only if its parent is.
// Call it while Last is in the tree (a locked Last stays); nodes split since the
// match show as their parts.
func (m Match[E]) Spans() []Span[E] {
	n := 0
	for x := m.Last; x != nil && !x.IsRoot(); x = x.parent {
		n++
	}
	if n == 0 {
		return nil
	}
	out := make([]Span[E], n)
	for x := m.Last; n > 0; x = x.parent {
		n--
		out[n] = Span[E]{Node: x, Pages: len(x.keys), Device: x.device, Host: x.host}
	}
	return out
}

// DevicePages is the number of leading matched pages that are in L1.
func (m Match[E]) DevicePages() int {
	n := 0
	for x := m.Last; x != nil && !x.IsRoot(); x = x.parent {
		if x.device != nil {
			n += len(x.device)
		}
	}
	return n
}

// AppendDevice appends the device pages of the leading L1 spans to dst.
func (m Match[E]) AppendDevice(dst []pageid.ID) []pageid.ID {
	start := len(dst)
	end := start + m.DevicePages()
	dst = slices.Grow(dst, end-start)[:end]
	// The L1 nodes are the top of the path: fill their pages from the bottom up.
	for x := m.Last; x != nil && !x.IsRoot(); x = x.parent {
		if x.device != nil {
			end -= len(x.device)
			copy(dst[end:], x.device)
		}
	}
	return dst
}

// Match finds the longest cached prefix of key in namespace ns (the zero Key for
// none), in whole pages (a partial last page is ignored). It splits the node where
// the match ends, so the match covers whole nodes, and it counts a hit and an
// access on every matched node.
func (t *Tree[E]) Match(ns pagekey.Key, key []E) Match[E] {
	ps := t.cfg.PageSize
	key = key[:len(key)/ps*ps]
	now := t.tick()
	var m Match[E]
	n := t.nsRoot(ns, false)
	if n == nil {
		m.Last = t.root
		return m
	}
	for pos := 0; pos < len(key); {
		c := t.child(n, key[pos:pos+ps])
		if c == nil {
			break
		}
		k := t.matchPages(c, key[pos:])
		full := k == len(c.keys)
		if !full {
			c = t.split(c, k)
		}
		c.lastAccess = now
		c.hits++
		t.refresh(c)
		m.Pages += k
		pos += k * ps
		n = c
		if !full {
			break
		}
	}
	m.Last = n
	return m
}

// Peek returns how many whole pages of key are cached in namespace ns, changing
// nothing.
func (t *Tree[E]) Peek(ns pagekey.Key, key []E) int {
	ps := t.cfg.PageSize
	key = key[:len(key)/ps*ps]
	pages := 0
	n := t.nsRoot(ns, false)
	if n == nil {
		return 0
	}
	for pos := 0; pos < len(key); {
		c := t.child(n, key[pos:pos+ps])
		if c == nil {
			break
		}
		k := t.matchPages(c, key[pos:])
		pages += k
		if k < len(c.keys) {
			break
		}
		pos += k * ps
		n = c
	}
	return pages
}

// PeekKey is Peek that also returns the page key of the last cached page of key
// (the zero Key when nothing is cached or the tree keeps no page keys): the prior
// a caller chains the keys of the uncached rest from.
func (t *Tree[E]) PeekKey(ns pagekey.Key, key []E) (int, pagekey.Key) {
	ps := t.cfg.PageSize
	key = key[:len(key)/ps*ps]
	pages := 0
	var last pagekey.Key
	n := t.nsRoot(ns, false)
	if n == nil {
		return 0, last
	}
	for pos := 0; pos < len(key); {
		c := t.child(n, key[pos:pos+ps])
		if c == nil {
			break
		}
		k := t.matchPages(c, key[pos:])
		pages += k
		last = t.tokens.key(c.keys[k-1])
		if k < len(c.keys) {
			break
		}
		pos += k * ps
		n = c
	}
	return pages, last
}

// PeekNode is Peek that also returns the node holding the last cached page of key
// (nil when nothing is cached), for a caller that must keep that prefix cached
// (HostRef, Lock) while it works on the pages after it.
func (t *Tree[E]) PeekNode(ns pagekey.Key, key []E) (int, *Node[E]) {
	ps := t.cfg.PageSize
	key = key[:len(key)/ps*ps]
	pages := 0
	var last *Node[E]
	n := t.nsRoot(ns, false)
	if n == nil {
		return 0, nil
	}
	for pos := 0; pos < len(key); {
		c := t.child(n, key[pos:pos+ps])
		if c == nil {
			break
		}
		k := t.matchPages(c, key[pos:])
		pages += k
		last = c
		if k < len(c.keys) {
			break
		}
		pos += k * ps
		n = c
	}
	return pages, last
}

// matchPages counts the whole pages at the start of key that equal n's pages; the
// first is known to (child found n by it) and is not compared again. The arena
// hands out consecutive token pages for a node when it can, so the node's pages are
// compared run by run, each run one vectorised memory comparison.
func (t *Tree[E]) matchPages(n *Node[E], key []E) int {
	ps := t.cfg.PageSize
	limit := min(len(n.keys), len(key)/ps)
	for i := 1; i < limit; {
		j := i + 1
		for j < limit && n.keys[j] == n.keys[j-1]+1 {
			j++
		}
		if equalElems(t.tokens.run(n.keys[i], j-i), key[i*ps:j*ps]) {
			i = j
			continue
		}
		for ; i < j; i++ {
			if !equalElems(t.tokens.page(n.keys[i]), key[i*ps:(i+1)*ps]) {
				return i
			}
		}
	}
	return limit
}

// equalElems compares two equal-length element slices as bytes: slices.Equal on
// integer elements compiles to a scalar loop, bytes.Equal to the runtime's
// vectorised memequal.
func equalElems[E Elem](a, b []E) bool {
	if len(a) != len(b) {
		return false
	}
	if len(a) == 0 {
		return true
	}
	size := int(unsafe.Sizeof(a[0]))
	return bytes.Equal(unsafe.Slice((*byte)(unsafe.Pointer(&a[0])), len(a)*size),
		unsafe.Slice((*byte)(unsafe.Pointer(&b[0])), len(b)*size))
}

// split cuts c after k pages and returns the new head node, which takes c's place
// under c's parent; c keeps the tail. The head inherits c's reference counts,
// because every lock or host reference held on c also holds its ancestors.
func (t *Tree[E]) split(c *Node[E], k int) *Node[E] {
	head := &Node[E]{
		parent:     c.parent,
		keys:       c.keys[:k:k],
		lockRef:    c.lockRef,
		hostRef:    c.hostRef,
		hits:       c.hits,
		lastAccess: c.lastAccess,
		heapIdx:    [2]int32{-1, -1},
	}
	c.keys = c.keys[k:]
	if c.device != nil {
		head.device = c.device[:k:k]
		c.device = c.device[k:]
		head.deviceChildren = 1
	}
	if c.host != nil {
		head.host = c.host[:k:k]
		c.host = c.host[k:]
	}
	t.replaceChild(c.parent, c, head)
	head.children = []*Node[E]{c}
	c.parent, c.childIdx = head, 0
	t.nodes++
	// The head has a child, so it is no victim; c's candidacy did not change.
	t.refresh(head)
	return head
}
