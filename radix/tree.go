// Package radix is the paged radix tree of the KV cache: token sequences cut into
// pages, shared prefixes stored once, and for every node where its pages live: in
// device (L1) pages, host (L2) pages, or both. It matches the longest cached prefix
// of a request, inserts new pages, splits nodes at page boundaries, counts lock
// references (a node a running request uses is never evicted) and host references
// (a node whose host pages are being copied is never freed), and picks eviction
// victims for each tier in O(log n) with an LRU or LFU policy.
//
// A Tree is not safe for concurrent use: its owner (hicache.Cache) serialises calls.
// Keys are plain tokens (Tree[uint32]) or EAGLE bigrams packed as
// uint64(t[i])<<32|t[i+1] (Tree[uint64]).
//
// Errors and panics follow the project's rule: what a caller can get wrong is an
// error, an invariant of the tree's own is a panic. A method asked to do what the
// node's state does not allow (lock a node that left the tree, drop a tier it is
// not in, release a count it does not hold, insert past MaxPages) returns an error
// wrapping ErrNode, ErrPages, ErrLocked or ErrFull and changes nothing: the
// caller's bookkeeping is wrong, and the caller decides what that means. The
// eviction loops (EvictDevice, EvictHost) pick their victims from the tree's own
// heaps, so a victim that cannot be dropped means the heaps and the nodes
// disagree, which no caller can cause or repair: they panic, naming the victim's
// state, instead of returning the error or offering the same victim forever.
package radix

import (
	"fmt"
	"hash/maphash"
	"strings"

	"github.com/stratakv/strata/pageid"
	"github.com/stratakv/strata/pagekey"
)

// Elem is a key element: a token id or a packed bigram.
type Elem interface{ ~uint32 | ~uint64 }

// Policy orders eviction victims.
type Policy uint8

const (
	// LRU evicts the least recently matched or inserted leaf first.
	LRU Policy = iota
	// LFU evicts the least often hit leaf first, the least recent among equals.
	LFU
)

// ParsePolicy accepts "lru" and "lfu".
func ParsePolicy(s string) (Policy, error) {
	switch strings.ToLower(s) {
	case "lru":
		return LRU, nil
	case "lfu":
		return LFU, nil
	}
	return 0, fmt.Errorf("eviction policy %q: want lru or lfu: %w", s, ErrConfig)
}

// String returns "lru" or "lfu".
func (p Policy) String() string {
	if p == LFU {
		return "lfu"
	}
	return "lru"
}

// Config shapes a Tree.
type Config struct {
	// PageSize is key elements per page; every node holds whole pages.
	PageSize int `json:"pageSize"`
	// Policy orders eviction victims in both tiers.
	Policy Policy `json:"policy"`
	// MaxPages is the most pages the tree can hold; its key elements live in an
	// arena of this many pages (PageSize*4 bytes each for tokens, *8 for bigrams),
	// mapped at New. Every cached page holds a device or a host page, so the sum of
	// the device and host pool pages is always enough.
	MaxPages int `json:"maxPages"`
	// PageKeys keeps each page's pagekey.Key (33 bytes a page, in the same mapped
	// arena) so that pages can be named in L3 without rehashing their prefix.
	PageKeys bool `json:"pageKeys"`
}

// Tree is a paged radix tree. See the package comment.
type Tree[E Elem] struct {
	cfg   Config
	root  *Node[E]
	clock uint64

	devicePages int
	hostPages   int
	nodes       int

	deviceHeap victimHeap[E]
	hostHeap   victimHeap[E]
	tokens     *tokenArena[E]
	// seed keys the child indexes' page hashes, random per tree.
	seed maphash.Seed
	// namespaces holds one page-less subtree root per namespace (tenant, LoRA
	// adapter, cache salt), keyed by the namespace's chain seed: requests of one
	// namespace never match another's pages. The zero Key is the root itself.
	namespaces map[pagekey.Key]*Node[E]
}

// Node is one edge of the tree: a run of whole pages that share every ancestor.
// Its fields change only through Tree methods.
type Node[E Elem] struct {
	parent   *Node[E]
	children []*Node[E]
	index    *childIndex[E] // first page -> child, once a node has many children

	keys   []int32     // token pages in the tree's arena, one per page
	device []pageid.ID // nil when not in L1
	host   []pageid.ID // nil when not in L2

	lockRef        int32
	hostRef        int32
	deviceChildren int32 // children with device pages
	hits           uint32
	lastAccess     uint64

	heapIdx  [2]int32 // position in the device and host victim heaps, -1 when absent
	removed  bool
	childIdx int32        // position in the parent's children
	ns       *pagekey.Key // set on a namespace's subtree root
}

// New returns an empty tree.
func New[E Elem](cfg Config) (*Tree[E], error) {
	if cfg.PageSize < 1 || cfg.PageSize > 1<<20 {
		return nil, fmt.Errorf("page size %d: want 1 to %d: %w", cfg.PageSize, 1<<20, ErrConfig)
	}
	if cfg.Policy != LRU && cfg.Policy != LFU {
		return nil, fmt.Errorf("policy %d: %w", cfg.Policy, ErrConfig)
	}
	if cfg.MaxPages < 1 || cfg.MaxPages > 1<<31-1 {
		return nil, fmt.Errorf("max pages %d: want 1 to %d: %w", cfg.MaxPages, 1<<31-1, ErrConfig)
	}
	tokens, err := newTokenArena[E](cfg.PageSize, cfg.MaxPages, cfg.PageKeys)
	if err != nil {
		return nil, err
	}
	t := &Tree[E]{cfg: cfg, tokens: tokens, namespaces: map[pagekey.Key]*Node[E]{}, seed: maphash.MakeSeed()}
	t.root = &Node[E]{heapIdx: [2]int32{-1, -1}}
	t.deviceHeap = victimHeap[E]{tier: deviceTier, policy: cfg.Policy}
	t.hostHeap = victimHeap[E]{tier: hostTier, policy: cfg.Policy}
	return t, nil
}

// Close releases the token arena. The tree must not be used afterwards.
func (t *Tree[E]) Close() error { return t.tokens.close() }

// Config returns the tree's configuration.
func (t *Tree[E]) Config() Config { return t.cfg }

// Root is the tree's root; it holds no pages.
func (t *Tree[E]) Root() *Node[E] { return t.root }

// DevicePages is the number of device pages the tree holds.
func (t *Tree[E]) DevicePages() int { return t.devicePages }

// HostPages is the number of host pages the tree holds.
func (t *Tree[E]) HostPages() int { return t.hostPages }

// Pages is the number of distinct pages the tree caches, in any tier.
func (t *Tree[E]) Pages() int { return t.tokens.used() }

// Nodes is the number of nodes, the root excluded.
func (t *Tree[E]) Nodes() int { return t.nodes }

// tick advances the logical clock that orders accesses; a counter instead of wall
// time keeps eviction deterministic and immune to clock steps.
func (t *Tree[E]) tick() uint64 {
	t.clock++
	return t.clock
}

// Pages is the number of pages the node holds.
func (n *Node[E]) Pages() int { return len(n.keys) }

// AppendKey appends the node's key elements (whole pages) to dst.
func (t *Tree[E]) AppendKey(dst []E, n *Node[E]) []E {
	for _, p := range n.keys {
		dst = append(dst, t.tokens.page(p)...)
	}
	return dst
}

// Device is the node's device pages, nil when it is not in L1. Do not modify it.
func (n *Node[E]) Device() []pageid.ID { return n.device }

// Host is the node's host pages, nil when it is not in L2. Do not modify it.
func (n *Node[E]) Host() []pageid.ID { return n.host }

// Parent is the node's parent, nil for the root.
func (n *Node[E]) Parent() *Node[E] { return n.parent }

// Locked reports whether a running request holds the node (or a descendant).
func (n *Node[E]) Locked() bool { return n.lockRef > 0 }

// DeviceChildren is the number of the node's children that are in L1: a node is
// an L1 eviction candidate only when it is 0. O(1) at any fan-out.
func (n *Node[E]) DeviceChildren() int { return int(n.deviceChildren) }

// HostRef is the number of copies in flight that read or write the host pages of
// the node or a descendant.
func (n *Node[E]) HostRef() int { return int(n.hostRef) }

// Hits is how many times the node has been matched.
func (n *Node[E]) Hits() int { return int(n.hits) }

// InTree reports whether the node is still part of the tree.
func (n *Node[E]) InTree() bool { return !n.removed }

// IsRoot reports whether n is the root of the tree or of a namespace: a node that
// holds no pages.
func (n *Node[E]) IsRoot() bool { return n.parent == nil || n.ns != nil }

// nsRoot returns the subtree root of namespace ns, creating it when create is set;
// nil when it does not exist.
func (t *Tree[E]) nsRoot(ns pagekey.Key, create bool) *Node[E] {
	if ns.IsZero() {
		return t.root
	}
	if n := t.namespaces[ns]; n != nil || !create {
		return n
	}
	key := ns
	n := &Node[E]{parent: t.root, ns: &key, heapIdx: [2]int32{-1, -1}}
	t.namespaces[ns] = n
	return n
}

// dropNamespace forgets a namespace root that holds nothing and nobody holds.
func (t *Tree[E]) dropNamespace(n *Node[E]) {
	if n.ns == nil || n.removed || len(n.children) > 0 || n.lockRef > 0 || n.hostRef > 0 {
		return
	}
	delete(t.namespaces, *n.ns)
	n.removed = true
}

// Namespaces is the number of namespaces with cached pages.
func (t *Tree[E]) Namespaces() int { return len(t.namespaces) }

// PageKey is the pagekey.Key of page i of n (the zero Key when the tree keeps no
// page keys or none was given).
func (t *Tree[E]) PageKey(n *Node[E], i int) pagekey.Key { return t.tokens.key(n.keys[i]) }

// AppendPageKeys appends the page keys of n's pages to dst.
func (t *Tree[E]) AppendPageKeys(dst []pagekey.Key, n *Node[E]) []pagekey.Key {
	for _, p := range n.keys {
		dst = append(dst, t.tokens.key(p))
	}
	return dst
}

// Children lists the node's children. Do not modify the slice.
func (n *Node[E]) Children() []*Node[E] { return n.children }

// Depth is the number of pages from the root to the end of n.
func (n *Node[E]) Depth() int {
	d := 0
	for x := n; x != nil; x = x.parent {
		d += len(x.keys)
	}
	return d
}
