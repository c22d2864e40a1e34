package radix

import (
	"testing"

	"github.com/stratakv/strata/pageid"
)

// collidingTokens returns two tokens whose one-token pages get the same index tag
// in tree, found by brute force (a 32-bit tag collides after about 2^16 tries).
func collidingTokens(t *testing.T, tree *Tree[uint32], skip uint32) (uint32, uint32) {
	t.Helper()
	seen := map[uint32]uint32{}
	for x := skip; x < skip+1<<24; x++ {
		tag := tree.tag([]uint32{x})
		if y, ok := seen[tag]; ok {
			return y, x
		}
		seen[tag] = x
	}
	t.Fatal("no tag collision in 2^24 pages")
	return 0, 0
}

// Two children whose first pages share a tag (and so a home slot) are both found,
// a page with that tag that is not cached misses, and removing either leaves the
// other findable: the index compares whole pages, not tags.
func TestIndexTagCollision(t *testing.T) {
	tree := newTree(t, 1, LRU)
	const fillers = 2 * indexThreshold
	a, b := collidingTokens(t, tree, fillers)
	for i := range uint32(fillers) {
		mustInsert(t, tree, []uint32{i}, pages(int(i)))
	}
	mustInsert(t, tree, []uint32{a}, pages(100))
	if tree.Root().index == nil {
		t.Fatal("no index")
	}
	if got := tree.Peek(noNS, []uint32{b}); got != 0 {
		t.Fatalf("uncached page with a cached page's tag matched %d pages", got)
	}
	mustInsert(t, tree, []uint32{b}, pages(101))
	for _, x := range []uint32{a, b} {
		if got := tree.Peek(noNS, []uint32{x}); got != 1 {
			t.Fatalf("token %d: %d pages", x, got)
		}
	}
	for i, gone := range []uint32{a, b} {
		m := tree.Match(noNS, []uint32{gone})
		if _, _, err := tree.Remove(m.Last); err != nil {
			t.Fatal(err)
		}
		if err := tree.Check(); err != nil {
			t.Fatal(err)
		}
		if got := tree.Peek(noNS, []uint32{gone}); got != 0 {
			t.Fatalf("removed token %d still matches", gone)
		}
		mustInsert(t, tree, []uint32{gone}, pages(102+i))
	}
}

// A node's children come and go by the thousand: the index grows, shrinks and goes
// away, every child stays findable through it, and each removal and split keeps
// the children's positions right (Check verifies both).
func TestIndexGrowsAndShrinks(t *testing.T) {
	tree, err := New[uint64](Config{PageSize: 2, MaxPages: 1 << 14})
	if err != nil {
		t.Fatal(err)
	}
	defer tree.Close()
	const n = 3000
	// Branch pages that differ only in the high half of their second bigram.
	key := func(i int) []uint64 { return []uint64{7, uint64(i) << 32, 1, 2} }
	for i := range n {
		if _, err := tree.Insert(noNS, key(i), []pageid.ID{pageid.ID(2 * i), pageid.ID(2*i + 1)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	stem := tree.Root()
	if tree.Nodes() != n || len(stem.children) != n {
		t.Fatalf("%d nodes, %d children of the root", tree.Nodes(), len(stem.children))
	}
	grown := len(stem.index.tags)
	if err := tree.Check(); err != nil {
		t.Fatal(err)
	}
	// Split every third child (a match that ends inside it), remove the others.
	for i := range n {
		if i%3 == 0 {
			if m := tree.Match(noNS, key(i)[:2]); m.Pages != 1 || m.Last.Pages() != 1 {
				t.Fatalf("match of child %d: %d pages", i, m.Pages)
			}
			continue
		}
		if _, _, err := tree.Remove(tree.Match(noNS, key(i)).Last); err != nil {
			t.Fatal(err)
		}
	}
	if err := tree.Check(); err != nil {
		t.Fatal(err)
	}
	if len(stem.index.tags) >= grown {
		t.Fatalf("index of %d slots for %d children did not shrink from %d", len(stem.index.tags), len(stem.children), grown)
	}
	for i := range n {
		want := 0
		if i%3 == 0 {
			want = 2
		}
		if got := tree.Peek(noNS, key(i)); got != want {
			t.Fatalf("child %d: %d pages, want %d", i, got, want)
		}
	}
	for i := 0; i < n; i += 3 {
		if _, _, err := tree.Remove(tree.Match(noNS, key(i)).Last.Parent()); err != nil {
			t.Fatal(err)
		}
	}
	if err := tree.Check(); err != nil {
		t.Fatal(err)
	}
	if stem.index != nil || stem.children != nil || tree.Pages() != 0 {
		t.Fatalf("empty root keeps an index (%v) or children (%d), %d pages", stem.index != nil, len(stem.children), tree.Pages())
	}
}
