package radix

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stratakv/strata/pageid"
	"github.com/stratakv/strata/pagekey"
)

// noNS is the default namespace.
var noNS = pagekey.Key{}

func newTree(t *testing.T, ps int, policy Policy) *Tree[uint32] {
	t.Helper()
	tree, err := New[uint32](Config{PageSize: ps, Policy: policy, MaxPages: 1024})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tree.Close() })
	return tree
}

func pages(ids ...int) []pageid.ID {
	out := make([]pageid.ID, len(ids))
	for i, id := range ids {
		out[i] = pageid.ID(id)
	}
	return out
}

func mustInsert(t *testing.T, tree *Tree[uint32], key []uint32, dev []pageid.ID) Inserted[uint32] {
	t.Helper()
	res, err := tree.Insert(noNS, key, dev, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := tree.Check(); err != nil {
		t.Fatal(err)
	}
	return res
}

func TestMatchInsertSplit(t *testing.T) {
	tree := newTree(t, 2, LRU)
	res := mustInsert(t, tree, []uint32{1, 2, 3, 4, 5, 6, 7}, pages(10, 11, 12))
	if len(res.New) != 1 || res.NewPages != 3 || len(res.Duplicate) != 0 {
		t.Fatalf("first insert: %+v", res)
	}
	// A shared prefix of 2 pages, then a branch: the node splits.
	res = mustInsert(t, tree, []uint32{1, 2, 3, 4, 9, 9}, pages(10, 11, 20))
	if res.NewPages != 1 || len(res.Duplicate) != 0 || tree.Nodes() != 3 {
		t.Fatalf("branching insert: %+v, %d nodes", res, tree.Nodes())
	}
	m := tree.Match(noNS, []uint32{1, 2, 3, 4, 5, 6, 0})
	if m.Pages != 3 || m.DevicePages() != 3 || !slices.Equal(m.AppendDevice(nil), pages(10, 11, 12)) {
		t.Fatalf("match: %+v", m)
	}
	// A match that ends inside a node splits it there.
	m = tree.Match(noNS, []uint32{1, 2, 7, 7})
	if m.Pages != 1 || tree.Nodes() != 4 || !slices.Equal(m.Last.Device(), pages(10)) {
		t.Fatalf("partial match: pages %d nodes %d", m.Pages, tree.Nodes())
	}
	if got := tree.Peek(noNS, []uint32{1, 2, 3, 4, 9, 9, 9}); got != 3 {
		t.Fatalf("Peek = %d", got)
	}
	if got := tree.Peek(noNS, []uint32{1}); got != 0 {
		t.Fatalf("Peek of less than a page = %d", got)
	}
	// Inserting the same prefix with other device pages reports them as duplicates.
	res = mustInsert(t, tree, []uint32{1, 2, 3, 4}, pages(30, 31))
	if !slices.Equal(res.Duplicate, pages(30, 31)) || res.NewPages != 0 {
		t.Fatalf("duplicate insert: %+v", res)
	}
	if _, err := tree.Insert(noNS, []uint32{1, 2, 3, 4}, pages(1), nil); !errors.Is(err, ErrPages) {
		t.Fatalf("insert with too few pages: %v", err)
	}
	if err := tree.Check(); err != nil {
		t.Fatal(err)
	}
}

func TestLRUAndLFUVictimOrder(t *testing.T) {
	for _, policy := range []Policy{LRU, LFU} {
		tree := newTree(t, 1, policy)
		mustInsert(t, tree, []uint32{1}, pages(1))
		mustInsert(t, tree, []uint32{2}, pages(2))
		mustInsert(t, tree, []uint32{3}, pages(3))
		// Hit 1 three times, 2 once; then touch 3 last.
		for i := 0; i < 3; i++ {
			tree.Match(noNS, []uint32{1})
		}
		tree.Match(noNS, []uint32{2})
		tree.Match(noNS, []uint32{3})
		var order []pageid.ID
		for {
			dev, _ := tree.EvictDevice(1)
			if len(dev) == 0 {
				break
			}
			order = append(order, dev...)
		}
		want := pages(1, 2, 3) // LRU: 1 was touched first
		if policy == LFU {
			want = pages(2, 3, 1) // LFU: 2 and 3 tie at one hit, 2 is older; 1 has three
		}
		if !slices.Equal(order, want) {
			t.Errorf("%v evicted %v, want %v", policy, order, want)
		}
	}
}

func TestLocksAndHostRefsProtectNodes(t *testing.T) {
	tree := newTree(t, 1, LRU)
	mustInsert(t, tree, []uint32{1, 2, 3}, pages(1, 2, 3))
	mustInsert(t, tree, []uint32{1, 5}, pages(1, 5))
	m := tree.Match(noNS, []uint32{1, 2, 3})
	if err := tree.Lock(m.Last); err != nil {
		t.Fatal(err)
	}
	dev, _ := tree.EvictDevice(10)
	if !slices.Equal(dev, pages(5)) {
		t.Fatalf("evicted %v under a lock on [1 2 3]", dev)
	}
	if err := tree.Unlock(m.Last); err != nil {
		t.Fatal(err)
	}
	if err := tree.Unlock(m.Last); !errors.Is(err, ErrLocked) {
		t.Fatalf("second unlock: %v", err)
	}
	// Back up the tail, reference it, and drop the rest from L1.
	tail := tree.Match(noNS, []uint32{1, 2, 3}).Last
	if err := tree.SetHost(tail, pages(100, 101)); err != nil {
		t.Fatal(err)
	}
	if err := tree.HostRef(tail); err != nil {
		t.Fatal(err)
	}
	dev, host := tree.EvictDevice(10)
	if len(host) != 0 || !slices.Contains(dev, 3) {
		t.Fatalf("evict with the tail referenced: dev %v host %v", dev, host)
	}
	// The tail is in L2 only and referenced: not a host victim. Its parent has no
	// host copy, but the reference keeps it too: removing it would free the tail.
	if tree.HostVictim() != nil {
		t.Fatal("referenced node offered as host victim")
	}
	if err := tree.Check(); err != nil {
		t.Fatal(err)
	}
	if err := tree.HostUnref(tail); err != nil {
		t.Fatal(err)
	}
	if err := tree.HostUnref(tail); !errors.Is(err, ErrLocked) {
		t.Fatalf("second unref: %v", err)
	}
	dev, host = tree.EvictDevice(10)
	host = append(host, tree.EvictHost(10)...)
	if tree.Nodes() != 0 || tree.DevicePages() != 0 || tree.HostPages() != 0 || !slices.Contains(host, 100) {
		t.Fatalf("after releasing everything: nodes %d dev %d host %d (freed %v %v)", tree.Nodes(), tree.DevicePages(), tree.HostPages(), dev, host)
	}
	if err := tree.Lock(tail); !errors.Is(err, ErrNode) {
		t.Fatalf("lock a removed node: %v", err)
	}
}

func TestLoadBackAndRevive(t *testing.T) {
	tree := newTree(t, 2, LRU)
	mustInsert(t, tree, []uint32{1, 2, 3, 4}, pages(1, 2))
	n := tree.Match(noNS, []uint32{1, 2, 3, 4}).Last
	if err := tree.SetHost(n, pages(50, 51)); err != nil {
		t.Fatal(err)
	}
	if err := tree.SetHost(n, pages(52, 53)); !errors.Is(err, ErrNode) {
		t.Fatalf("second SetHost: %v", err)
	}
	if dev, _ := tree.EvictDevice(2); !slices.Equal(dev, pages(1, 2)) {
		t.Fatalf("evicted %v", dev)
	}
	m := tree.Match(noNS, []uint32{1, 2, 3, 4})
	if m.Pages != 2 || m.DevicePages() != 0 || !slices.Equal(m.Spans()[0].Host, pages(50, 51)) {
		t.Fatalf("L2-only match: %+v", m)
	}
	if err := tree.SetDevice(m.Last, pages(7)); !errors.Is(err, ErrPages) {
		t.Fatalf("SetDevice with too few pages: %v", err)
	}
	if err := tree.SetDevice(m.Last, pages(7, 8)); err != nil {
		t.Fatal(err)
	}
	if tree.Match(noNS, []uint32{1, 2, 3, 4}).DevicePages() != 2 {
		t.Fatal("loaded node not in L1")
	}
	// Evict again, then insert the prefix with fresh pages: the node is revived.
	tree.EvictDevice(2)
	res := mustInsert(t, tree, []uint32{1, 2, 3, 4, 5, 6}, pages(9, 10, 11))
	if len(res.Revived) != 1 || res.NewPages != 1 || len(res.Duplicate) != 0 {
		t.Fatalf("revive: %+v", res)
	}
	if got := tree.Match(noNS, []uint32{1, 2, 3, 4, 5, 6}).AppendDevice(nil); !slices.Equal(got, pages(9, 10, 11)) {
		t.Fatalf("device pages after revive %v", got)
	}
}

func TestManyChildrenUseTheIndex(t *testing.T) {
	tree := newTree(t, 2, LRU)
	for i := 0; i < 100; i++ {
		mustInsert(t, tree, []uint32{7, uint32(i), 1, 1}, pages(2*i, 2*i+1))
	}
	if tree.Root().index == nil {
		t.Fatal("a node with 100 children has no index")
	}
	if tree.Root().children[0].Pages() != 2 {
		t.Fatal("pages per node")
	}
	for i := 0; i < 100; i++ {
		if got := tree.Peek(noNS, []uint32{7, uint32(i), 1, 1}); got != 2 {
			t.Fatalf("child %d: %d pages", i, got)
		}
	}
	// Remove most of them: the index goes away and lookups keep working.
	tree.EvictDevice(194)
	if err := tree.Check(); err != nil {
		t.Fatal(err)
	}
	if tree.Root().index != nil {
		t.Fatal("index kept for 3 children")
	}
	if tree.Nodes() != 3 {
		t.Fatalf("%d nodes left", tree.Nodes())
	}
	left := 0
	for i := 0; i < 100; i++ {
		left += tree.Peek(noNS, []uint32{7, uint32(i), 1, 1})
	}
	if left != 6 {
		t.Fatalf("%d pages findable after eviction", left)
	}
}

func TestBigramKeys(t *testing.T) {
	tree, err := New[uint64](Config{PageSize: 2, MaxPages: 16})
	if err != nil {
		t.Fatal(err)
	}
	pack := func(tokens ...uint32) []uint64 {
		var out []uint64
		for i := 0; i+1 < len(tokens); i++ {
			out = append(out, uint64(tokens[i])<<32|uint64(tokens[i+1]))
		}
		return out
	}
	if _, err := tree.Insert(noNS, pack(1, 2, 3, 4, 5), pages(1, 2), nil); err != nil {
		t.Fatal(err)
	}
	// Same tokens up to 4, different 5th: the second bigram page differs.
	if got := tree.Peek(noNS, pack(1, 2, 3, 4, 6)); got != 1 {
		t.Fatalf("bigram match = %d pages, want 1", got)
	}
	if got := tree.Peek(noNS, pack(1, 2, 3, 4, 5, 6)); got != 2 {
		t.Fatalf("bigram match = %d pages, want 2", got)
	}
}

func TestConfigAndBadOperations(t *testing.T) {
	if _, err := New[uint32](Config{PageSize: 1}); !errors.Is(err, ErrConfig) {
		t.Fatalf("max pages 0: %v", err)
	}
	if _, err := New[uint32](Config{PageSize: 0, MaxPages: 1}); !errors.Is(err, ErrConfig) {
		t.Fatalf("page size 0: %v", err)
	}
	if _, err := New[uint32](Config{PageSize: 1, Policy: 9, MaxPages: 1}); !errors.Is(err, ErrConfig) {
		t.Fatalf("policy 9: %v", err)
	}
	if _, err := ParsePolicy("fifo"); !errors.Is(err, ErrConfig) {
		t.Fatalf("fifo: %v", err)
	}
	tree := newTree(t, 1, LRU)
	if _, _, err := tree.Remove(tree.Root()); !errors.Is(err, ErrNode) {
		t.Fatalf("remove root: %v", err)
	}
	mustInsert(t, tree, []uint32{1}, pages(1))
	n := tree.Match(noNS, []uint32{1}).Last
	if _, err := tree.DropDevice(n); !errors.Is(err, ErrNode) {
		t.Fatalf("drop device without a host copy: %v", err)
	}
	if _, err := tree.DropHost(n); !errors.Is(err, ErrNode) {
		t.Fatalf("drop host of a node not in L2: %v", err)
	}
	if err := tree.SetDevice(n, pages(2)); !errors.Is(err, ErrNode) {
		t.Fatalf("SetDevice of an L1 node: %v", err)
	}
	tree.Lock(n)
	if _, _, err := tree.Remove(n); !errors.Is(err, ErrNode) {
		t.Fatalf("remove a locked node: %v", err)
	}
}

func TestInsertBeyondCapacityChangesNothing(t *testing.T) {
	tree, err := New[uint32](Config{PageSize: 1, MaxPages: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer tree.Close()
	mustInsert(t, tree, []uint32{1, 2, 3}, pages(1, 2, 3))
	// Sharing [1 2], then 3 new pages: one more than fits.
	if _, err := tree.Insert(noNS, []uint32{1, 2, 7, 8, 9}, pages(1, 2, 7, 8, 9), nil); !errors.Is(err, ErrFull) {
		t.Fatalf("insert past capacity: %v", err)
	}
	if tree.Nodes() != 1 || tree.DevicePages() != 3 {
		t.Fatalf("failed insert changed the tree: %d nodes, %d pages", tree.Nodes(), tree.DevicePages())
	}
	if err := tree.Check(); err != nil {
		t.Fatal(err)
	}
	mustInsert(t, tree, []uint32{1, 2, 7}, pages(1, 2, 7))
}

func TestNamespacesNeverShareAPage(t *testing.T) {
	tree := newTree(t, 2, LRU)
	h, _ := pagekey.New(pagekey.DefaultConfig())
	a := h.Seed(pagekey.Namespace{}.WithCacheSalt("tenant-a"))
	b := h.Seed(pagekey.Namespace{}.WithCacheSalt("tenant-b"))
	key := []uint32{1, 2, 3, 4}
	if _, err := tree.Insert(a, key, pages(1, 2), nil); err != nil {
		t.Fatal(err)
	}
	if got := tree.Peek(b, key); got != 0 {
		t.Fatalf("tenant b sees %d pages of tenant a", got)
	}
	if got := tree.Peek(noNS, key); got != 0 {
		t.Fatalf("the default namespace sees %d pages of tenant a", got)
	}
	if m := tree.Match(b, key); m.Pages != 0 || m.Last != tree.Root() {
		t.Fatalf("match in an unknown namespace: %+v", m)
	}
	if got := tree.Peek(a, key); got != 2 {
		t.Fatalf("tenant a sees %d of its pages", got)
	}
	if _, err := tree.Insert(b, key, pages(3, 4), nil); err != nil {
		t.Fatal(err)
	}
	if tree.Namespaces() != 2 || tree.DevicePages() != 4 {
		t.Fatalf("%d namespaces, %d pages", tree.Namespaces(), tree.DevicePages())
	}
	// A lock taken through a namespace keeps its root until released.
	m := tree.Match(a, key)
	if err := tree.Lock(m.Last); err != nil {
		t.Fatal(err)
	}
	tree.EvictDevice(100)
	if tree.Peek(a, key) != 2 || tree.Peek(b, key) != 0 {
		t.Fatal("eviction took a locked namespace's pages or spared an unlocked one")
	}
	if tree.Namespaces() != 1 {
		t.Fatalf("emptied namespace kept: %d", tree.Namespaces())
	}
	if err := tree.Unlock(m.Last); err != nil {
		t.Fatal(err)
	}
	tree.EvictDevice(100)
	if tree.Namespaces() != 0 || tree.Nodes() != 0 {
		t.Fatalf("after evicting everything: %d namespaces, %d nodes", tree.Namespaces(), tree.Nodes())
	}
	if err := tree.Check(); err != nil {
		t.Fatal(err)
	}
}

func TestPageKeysFollowSplitsAndInsertHost(t *testing.T) {
	tree, err := New[uint32](Config{PageSize: 2, MaxPages: 64, PageKeys: true})
	if err != nil {
		t.Fatal(err)
	}
	defer tree.Close()
	h, _ := pagekey.New(pagekey.Config{PageSize: 2})
	key := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	keys := h.Keys(pagekey.Key{}, key)
	if _, err := tree.Insert(noNS, key[:4], pages(1, 2), keys[:2]); err != nil {
		t.Fatal(err)
	}
	if n, last := tree.PeekKey(noNS, key); n != 2 || last != keys[1] {
		t.Fatalf("PeekKey = %d, %v", n, last)
	}
	// The rest arrives from L3 as L2-only pages, fetched for the 1-page prefix
	// (page 1 has been cached meanwhile: its host page comes back).
	leaf, dup, err := tree.InsertHost(noNS, key, pages(51, 52, 53), keys)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(dup, pages(51)) || leaf.Pages() != 2 || leaf.Device() != nil || !slices.Equal(leaf.Host(), pages(52, 53)) {
		t.Fatalf("InsertHost: leaf %+v dup %v", leaf, dup)
	}
	// Pages fetched below a prefix that is gone cannot be hung.
	if _, _, err := tree.InsertHost(noNS, []uint32{9, 9, 9, 9}, pages(60), nil); !errors.Is(err, ErrNode) {
		t.Fatalf("InsertHost below a missing prefix: %v", err)
	}
	// Split the first node by matching one page; every page keeps its key.
	tree.Match(noNS, key[:2])
	m := tree.Match(noNS, key)
	var got []pagekey.Key
	for _, s := range m.Spans() {
		got = tree.AppendPageKeys(got, s.Node)
	}
	if len(m.Spans()) != 3 || !slices.Equal(got, keys) {
		t.Fatalf("page keys after split: %d spans, %v", len(m.Spans()), got)
	}
	if tree.PageKey(m.Last, 1) != keys[3] {
		t.Fatal("PageKey")
	}
	if _, _, err := tree.InsertHost(noNS, key[:2], pages(1, 2), nil); !errors.Is(err, ErrPages) {
		t.Fatalf("InsertHost with too few pages: %v", err)
	}
	if err := tree.Check(); err != nil {
		t.Fatal(err)
	}
}

// A split gives the new head the lock and host references of the node it cuts:
// every reference on the tail holds its ancestors, the head now among them. Until
// they are released neither half is evicted from either tier; after, Unlock and
// HostUnref succeed and both halves become victims. Match, Insert and InsertHost
// each split.
func TestSplitKeepsLockAndHostCounts(t *testing.T) {
	splits := []struct {
		name  string
		split func(*Tree[uint32]) error
	}{
		{"match", func(tree *Tree[uint32]) error { tree.Match(noNS, []uint32{1, 2}); return nil }},
		{"insert", func(tree *Tree[uint32]) error {
			_, err := tree.Insert(noNS, []uint32{1, 2, 9}, pages(1, 2, 9), nil)
			return err
		}},
		{"insertHost", func(tree *Tree[uint32]) error {
			_, _, err := tree.InsertHost(noNS, []uint32{1, 2, 8}, pages(20), nil)
			return err
		}},
	}
	for _, s := range splits {
		t.Run(s.name, func(t *testing.T) {
			tree := newTree(t, 1, LRU)
			mustInsert(t, tree, []uint32{1, 2, 3, 4}, pages(1, 2, 3, 4))
			tail := tree.Match(noNS, []uint32{1, 2, 3, 4}).Last
			if err := tree.SetHost(tail, pages(11, 12, 13, 14)); err != nil {
				t.Fatal(err)
			}
			for range 2 {
				if err := errors.Join(tree.Lock(tail), tree.HostRef(tail)); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.split(tree); err != nil {
				t.Fatal(err)
			}
			head := tail.Parent()
			if head.IsRoot() || head.Pages() != 2 || tail.Pages() != 2 {
				t.Fatalf("no split at page 2: head of %d pages, tail of %d", head.Pages(), tail.Pages())
			}
			for _, h := range []struct {
				what string
				n    *Node[uint32]
			}{{"head", head}, {"tail", tail}} {
				if h.n.lockRef != 2 || h.n.hostRef != 2 {
					t.Fatalf("%s after the split: lock count %d, host references %d; want 2 and 2", h.what, h.n.lockRef, h.n.hostRef)
				}
			}
			if err := tree.Check(); err != nil {
				t.Fatal(err)
			}
			dev, host := tree.EvictDevice(100)
			host = append(host, tree.EvictHost(100)...)
			for _, p := range append(dev, host...) {
				if p <= 4 || p >= 11 && p <= 14 {
					t.Fatalf("evicted page %d of the locked, referenced prefix (freed %v and %v)", p, dev, host)
				}
			}
			for range 2 {
				if err := errors.Join(tree.Unlock(tail), tree.HostUnref(tail)); err != nil {
					t.Fatalf("release after the split: %v", err)
				}
			}
			if head.Locked() || tail.Locked() || head.HostRef() != 0 || tail.HostRef() != 0 {
				t.Fatalf("released: head lock %d refs %d, tail lock %d refs %d", head.lockRef, head.hostRef, tail.lockRef, tail.hostRef)
			}
			if err := tree.Unlock(tail); !errors.Is(err, ErrLocked) {
				t.Fatalf("unlock with no lock held: %v", err)
			}
			if err := tree.Check(); err != nil {
				t.Fatal(err)
			}
			dev, _ = tree.EvictDevice(100)
			host = tree.EvictHost(100)
			slices.Sort(dev)
			slices.Sort(host)
			if !slices.Equal(dev, pages(1, 2, 3, 4)) || !slices.Equal(host, pages(11, 12, 13, 14)) || tree.Nodes() != 0 {
				t.Fatalf("after release evicted device %v, host %v, %d nodes left; want all of the prefix", dev, host, tree.Nodes())
			}
		})
	}
}

// evictPanic runs evict and returns what it panicked with (nil if it returned). An
// eviction loop that keeps retrying a victim it cannot drop fails the test after
// 10 s instead of hanging it; its goroutine spins on until the test binary exits.
func evictPanic(t *testing.T, what string, evict func()) any {
	t.Helper()
	res := make(chan any, 1)
	go func() {
		defer func() { res <- recover() }()
		evict()
	}()
	select {
	case p := <-res:
		return p
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not return within 10s: it offers the same victim forever", what)
		return nil
	}
}

// A victim the heaps offer that cannot be dropped is the tree's own invariant
// broken (here: a count set behind the heaps' back). The eviction loops panic
// with the victim's state instead of retrying it forever.
func TestEvictionOfAVictimThatCannotGoPanics(t *testing.T) {
	for _, c := range []struct {
		name  string
		setup func(*testing.T, *Tree[uint32]) *Node[uint32]
		evict func(*Tree[uint32])
		want  []string
	}{
		{"EvictDevice of a victim in L2", func(t *testing.T, tree *Tree[uint32]) *Node[uint32] {
			n := mustInsert(t, tree, []uint32{1}, pages(1)).Last
			if err := tree.SetHost(n, pages(11)); err != nil {
				t.Fatal(err)
			}
			n.lockRef = 1
			return n
		}, func(tree *Tree[uint32]) { tree.EvictDevice(1) }, []string{"radix: EvictDevice: cannot drop from L1", "lock count 1", ErrNode.Error()}},
		{"EvictDevice of a victim in L1 only", func(t *testing.T, tree *Tree[uint32]) *Node[uint32] {
			n := mustInsert(t, tree, []uint32{2}, pages(2)).Last
			n.lockRef = 1
			return n
		}, func(tree *Tree[uint32]) { tree.EvictDevice(1) }, []string{"radix: EvictDevice: cannot remove", "lock count 1", ErrNode.Error()}},
		{"EvictHost", func(t *testing.T, tree *Tree[uint32]) *Node[uint32] {
			n := mustInsert(t, tree, []uint32{3}, pages(3)).Last
			if err := tree.SetHost(n, pages(13)); err != nil {
				t.Fatal(err)
			}
			if _, err := tree.DropDevice(n); err != nil {
				t.Fatal(err)
			}
			n.hostRef = 1
			return n
		}, func(tree *Tree[uint32]) { tree.EvictHost(1) }, []string{"radix: EvictHost: cannot remove", "host references 1", ErrNode.Error()}},
	} {
		t.Run(c.name, func(t *testing.T) {
			tree := newTree(t, 1, LRU)
			c.setup(t, tree)
			if err := tree.Check(); err == nil {
				t.Fatal("Check finds nothing wrong with a victim whose count changed behind the heaps")
			}
			p := evictPanic(t, c.name, func() { c.evict(tree) })
			msg, _ := p.(string)
			for _, w := range c.want {
				if !strings.Contains(msg, w) {
					t.Fatalf("%s panicked with %v; want a message with %q", c.name, p, w)
				}
			}
		})
	}
}

// PeekNode finds the node that holds a key's last cached page, changing nothing:
// no split, no hit, no access.
func TestPeekNode(t *testing.T) {
	tree := newTree(t, 2, LRU)
	mustInsert(t, tree, []uint32{1, 2, 3, 4, 5, 6}, pages(10, 11, 12))
	mustInsert(t, tree, []uint32{1, 2, 7, 7}, pages(10, 20))
	nodes := tree.Nodes()
	for _, c := range []struct {
		key   []uint32
		pages int
		last  []pageid.ID // the node's device pages
	}{
		{[]uint32{1, 2, 3, 4, 5, 6, 9}, 3, pages(11, 12)},
		{[]uint32{1, 2, 3, 4, 9, 9}, 2, pages(11, 12)}, // ends inside the node
		{[]uint32{1, 2, 7, 7}, 2, pages(20)},
		{[]uint32{1, 2}, 1, pages(10)},
	} {
		n, last := tree.PeekNode(noNS, c.key)
		if n != c.pages || last == nil || !slices.Equal(last.Device(), c.last) || n != tree.Peek(noNS, c.key) {
			t.Errorf("PeekNode(%v) = %d pages, node %v; want %d, a node of %v", c.key, n, last, c.pages, c.last)
		}
	}
	if n, last := tree.PeekNode(noNS, []uint32{9, 9}); n != 0 || last != nil {
		t.Errorf("PeekNode of an uncached key: %d pages, node %v", n, last)
	}
	h, _ := pagekey.New(pagekey.DefaultConfig())
	other := h.Seed(pagekey.Namespace{}.WithCacheSalt("other"))
	if n, last := tree.PeekNode(other, []uint32{1, 2}); n != 0 || last != nil {
		t.Errorf("PeekNode in an empty namespace: %d pages, node %v", n, last)
	}
	if tree.Nodes() != nodes {
		t.Errorf("PeekNode changed the tree: %d nodes, was %d", tree.Nodes(), nodes)
	}
	if err := tree.Check(); err != nil {
		t.Fatal(err)
	}
}
