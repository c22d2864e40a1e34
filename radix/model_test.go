package radix

import (
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/stratakv/strata/pageid"
	"github.com/stratakv/strata/pagekey"
)

// pageState is the reference model of one cached page, keyed by its full prefix.
type pageState struct {
	device, host pageid.ID // -1 when absent
}

// allocator hands out page ids and checks that each comes back once.
type allocator struct {
	next pageid.ID
	live map[pageid.ID]bool
}

func newAllocator() *allocator { return &allocator{live: map[pageid.ID]bool{}} }

func (a *allocator) alloc() pageid.ID {
	a.next++
	a.live[a.next] = true
	return a.next
}

func (a *allocator) free(t *rapid.T, what string, pages []pageid.ID) {
	for _, p := range pages {
		if !a.live[p] {
			t.Fatalf("%s page %d freed but not allocated (double free or foreign)", what, p)
		}
		delete(a.live, p)
	}
}

type machine[E Elem] struct {
	tree   *Tree[E]
	ps     int
	model  map[string]pageState
	dev    *allocator
	host   *allocator
	bases  [][]E
	spaces []pagekey.Key
	locks  []*Node[E]
	refs   []*Node[E]
	// lift makes a key element of a drawn token; for bigram trees it puts the token
	// in the high half, so that keying on anything less than whole elements shows.
	lift func(uint32) E
	// maxEvict bounds the pages one eviction action asks for.
	maxEvict int
	// wide, when set, adds keys of many branches under a shared stem.
	wide *wideKeys
}

func prefixKey[E Elem](ns pagekey.Key, key []E) string { return ns.String() + fmt.Sprint(key) }

func (m *machine[E]) drawKey(t *rapid.T) (pagekey.Key, []E) {
	ns := rapid.SampledFrom(m.spaces).Draw(t, "ns")
	if m.wide != nil && rapid.Bool().Draw(t, "wide") {
		return ns, m.drawWide(t)
	}
	base := rapid.SampledFrom(m.bases).Draw(t, "base")
	n := rapid.IntRange(0, len(base)).Draw(t, "len")
	key := slices.Clone(base[:n])
	if rapid.Bool().Draw(t, "branch") && n > 0 {
		i := rapid.IntRange(0, n-1).Draw(t, "at")
		key[i] = m.lift(uint32(rapid.IntRange(0, 3).Draw(t, "tok")))
	}
	return ns, key
}

// wideKeys draws keys that share a stem of whole pages and then branch on a first
// page from a large set: the shape that gives one node (the stem's, or the root for
// an empty stem) hundreds of children, found through its child index. Branch pages
// mostly share their first element and differ in their last, so that children are
// told apart by whole pages; later pages come from a small alphabet, so that branches
// share first pages and split.
type wideKeys struct {
	stem     []uint32
	branches int // distinct last elements of a branch page
}

// drawWide draws a key of the stem, a branch page, up to three more pages and up to
// a page less one element more.
func (m *machine[E]) drawWide(t *rapid.T) []E {
	var key []E
	for _, x := range m.wide.stem {
		key = append(key, m.lift(x))
	}
	for i := 0; i < m.ps-1; i++ {
		key = append(key, m.lift(uint32(rapid.IntRange(0, 1).Draw(t, "branchTok"))))
	}
	key = append(key, m.lift(uint32(rapid.IntRange(0, m.wide.branches-1).Draw(t, "branchLast"))))
	more := rapid.IntRange(0, 4*m.ps-1).Draw(t, "more")
	for i := 0; i < more; i++ {
		key = append(key, m.lift(uint32(rapid.IntRange(0, 3).Draw(t, "tok"))))
	}
	return key
}

// modelMatch is the number of leading whole pages of key the model holds.
func (m *machine[E]) modelMatch(ns pagekey.Key, key []E) int {
	p := 0
	for (p+1)*m.ps <= len(key) {
		if _, ok := m.model[prefixKey(ns, key[:(p+1)*m.ps])]; !ok {
			break
		}
		p++
	}
	return p
}

func (m *machine[E]) insert(t *rapid.T) {
	ns, key := m.drawKey(t)
	m.insertKey(t, ns, key)
}

// insertBranches inserts a burst of wide keys in one namespace: up to hundreds of
// new children under one node, that grow its child index.
func (m *machine[E]) insertBranches(t *rapid.T) {
	ns := rapid.SampledFrom(m.spaces).Draw(t, "ns")
	n := rapid.IntRange(1, 200).Draw(t, "keys")
	for i := 0; i < n; i++ {
		m.insertKey(t, ns, m.drawWide(t))
	}
}

func (m *machine[E]) insertKey(t *rapid.T, ns pagekey.Key, key []E) {
	pages := len(key) / m.ps
	device := make([]pageid.ID, pages)
	var wantDup []pageid.ID
	for p := 0; p < pages; p++ {
		st, ok := m.model[prefixKey(ns, key[:(p+1)*m.ps])]
		if ok && st.device >= 0 && rapid.Bool().Draw(t, "reuse") {
			device[p] = st.device // the caller matched this page
			continue
		}
		device[p] = m.dev.alloc()
		if ok && st.device >= 0 {
			wantDup = append(wantDup, device[p])
		}
	}
	res, err := m.tree.Insert(ns, key, device, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Duplicate, wantDup) {
		t.Fatalf("duplicates %v, want %v", res.Duplicate, wantDup)
	}
	m.dev.free(t, "duplicate", res.Duplicate)
	for p := 0; p < pages; p++ {
		k := prefixKey(ns, key[:(p+1)*m.ps])
		st, ok := m.model[k]
		switch {
		case !ok:
			m.model[k] = pageState{device: device[p], host: -1}
		case st.device < 0:
			st.device = device[p]
			m.model[k] = st
		}
	}
}

func (m *machine[E]) match(t *rapid.T) {
	ns, key := m.drawKey(t)
	want := m.modelMatch(ns, key)
	if got := m.tree.Peek(ns, key); got != want {
		t.Fatalf("Peek = %d pages, model %d", got, want)
	}
	res := m.tree.Match(ns, key)
	if res.Pages != want {
		t.Fatalf("Match = %d pages, model %d", res.Pages, want)
	}
	p := 0
	for _, s := range res.Spans() {
		for i := 0; i < s.Pages; i++ {
			st := m.model[prefixKey(ns, key[:(p+1)*m.ps])]
			dev, host := pageid.ID(-1), pageid.ID(-1)
			if s.Device != nil {
				dev = s.Device[i]
			}
			if s.Host != nil {
				host = s.Host[i]
			}
			if dev != st.device || host != st.host {
				t.Fatalf("page %d: tree (%d,%d), model (%d,%d)", p, dev, host, st.device, st.host)
			}
			p++
		}
	}
	if p != res.Pages {
		t.Fatalf("spans hold %d pages, the match %d", p, res.Pages)
	}
	var wantDev []pageid.ID
	for _, s := range res.Spans() {
		if s.Device == nil {
			break
		}
		wantDev = append(wantDev, s.Device...)
	}
	if got := res.AppendDevice([]pageid.ID{-7}); len(got) != 1+len(wantDev) || got[0] != -7 ||
		!slices.Equal(got[1:], wantDev) || res.DevicePages() != len(wantDev) {
		t.Fatalf("leading L1 pages %v (%d counted), spans say %v", got[1:], res.DevicePages(), wantDev)
	}
	if rapid.IntRange(0, 2).Draw(t, "lock") == 0 && res.Pages > 0 {
		if err := m.tree.Lock(res.Last); err != nil {
			t.Fatal(err)
		}
		m.locks = append(m.locks, res.Last)
	}
}

// splitHeld matches a key that ends inside a node the machine holds a lock or a
// host reference on: the split's new head must take the node's counts, which
// check compares with the machine's. Plain matches and inserts reach such splits
// too, but seldom.
func (m *machine[E]) splitHeld(t *rapid.T) {
	var cand []*Node[E]
	for _, n := range append(slices.Clone(m.locks), m.refs...) {
		if n.Pages() > 1 {
			cand = append(cand, n)
		}
	}
	if len(cand) == 0 {
		t.Skip("no held node of several pages")
	}
	n := rapid.SampledFrom(cand).Draw(t, "held")
	var ns pagekey.Key
	var key []E
	m.tree.Walk(func(s pagekey.Key, prefix []E, x *Node[E]) bool {
		if x == n {
			ns, key = s, slices.Clone(prefix)
			return false
		}
		return true
	})
	if key == nil {
		t.Fatalf("held node of %d pages is not in the tree", n.Pages())
	}
	key = key[:len(key)-rapid.IntRange(1, n.Pages()-1).Draw(t, "cut")*m.ps]
	want := m.modelMatch(ns, key)
	if res := m.tree.Match(ns, key); res.Pages != want || res.Last != n.parent {
		t.Fatalf("match inside a held node: %d pages, model %d; split head is the node's parent: %v", res.Pages, want, res.Last == n.parent)
	}
}

func (m *machine[E]) unlock(t *rapid.T) {
	if len(m.locks) == 0 {
		t.Skip("no locks")
	}
	i := rapid.IntRange(0, len(m.locks)-1).Draw(t, "lock")
	if err := m.tree.Unlock(m.locks[i]); err != nil {
		t.Fatal(err)
	}
	m.locks = append(m.locks[:i], m.locks[i+1:]...)
}

// nodes lists the tree's nodes with their namespaced prefixes (as model keys of
// their first page's prefix without the node, and the node's own pages).
func (m *machine[E]) nodes() (list []*Node[E], prefixes []nsPrefix[E]) {
	m.tree.Walk(func(ns pagekey.Key, prefix []E, n *Node[E]) bool {
		list = append(list, n)
		prefixes = append(prefixes, nsPrefix[E]{ns, slices.Clone(prefix)})
		return true
	})
	return list, prefixes
}

type nsPrefix[E Elem] struct {
	ns  pagekey.Key
	key []E
}

func (m *machine[E]) backup(t *rapid.T) {
	list, prefixes := m.nodes()
	var cand []int
	for i, n := range list {
		if n.device != nil && n.host == nil {
			cand = append(cand, i)
		}
	}
	if len(cand) == 0 {
		t.Skip("nothing to back up")
	}
	i := rapid.SampledFrom(cand).Draw(t, "node")
	n, prefix := list[i], prefixes[i]
	host := make([]pageid.ID, len(n.keys))
	for j := range host {
		host[j] = m.host.alloc()
	}
	if err := m.tree.SetHost(n, host); err != nil {
		t.Fatal(err)
	}
	m.setTier(prefix, len(host), func(st *pageState, j int) { st.host = host[j] })
}

func (m *machine[E]) load(t *rapid.T) {
	list, prefixes := m.nodes()
	var cand []int
	for i, n := range list {
		if n.device == nil && (n.parent.parent == nil || n.parent.device != nil) {
			cand = append(cand, i)
		}
	}
	if len(cand) == 0 {
		t.Skip("nothing to load")
	}
	i := rapid.SampledFrom(cand).Draw(t, "node")
	n, prefix := list[i], prefixes[i]
	dev := make([]pageid.ID, len(n.keys))
	for j := range dev {
		dev[j] = m.dev.alloc()
	}
	if err := m.tree.SetDevice(n, dev); err != nil {
		t.Fatal(err)
	}
	m.setTier(prefix, len(dev), func(st *pageState, j int) { st.device = dev[j] })
}

// setTier updates the model for the last pages pages of prefix.
func (m *machine[E]) setTier(prefix nsPrefix[E], pages int, set func(*pageState, int)) {
	total := len(prefix.key) / m.ps
	for j := 0; j < pages; j++ {
		k := prefixKey(prefix.ns, prefix.key[:(total-pages+j+1)*m.ps])
		st := m.model[k]
		set(&st, j)
		m.model[k] = st
	}
}

func (m *machine[E]) hostRef(t *rapid.T) {
	list, _ := m.nodes()
	if len(list) == 0 {
		t.Skip("empty")
	}
	if len(m.refs) > 0 && rapid.Bool().Draw(t, "unref") {
		i := rapid.IntRange(0, len(m.refs)-1).Draw(t, "ref")
		if err := m.tree.HostUnref(m.refs[i]); err != nil {
			t.Fatal(err)
		}
		m.refs = append(m.refs[:i], m.refs[i+1:]...)
		return
	}
	n := rapid.SampledFrom(list).Draw(t, "node")
	if err := m.tree.HostRef(n); err != nil {
		t.Fatal(err)
	}
	m.refs = append(m.refs, n)
}

// applyFrees removes freed pages from the model: a page that lost its device page
// stays if it has a host page; a page that lost everything leaves.
func (m *machine[E]) applyFrees(t *rapid.T, device, host []pageid.ID) {
	devSet := map[pageid.ID]bool{}
	for _, p := range device {
		devSet[p] = true
	}
	hostSet := map[pageid.ID]bool{}
	for _, p := range host {
		hostSet[p] = true
	}
	for k, st := range m.model {
		if devSet[st.device] {
			st.device = -1
		}
		if hostSet[st.host] {
			st.host = -1
		}
		if st.device < 0 && st.host < 0 {
			delete(m.model, k)
		} else {
			m.model[k] = st
		}
	}
	m.dev.free(t, "evicted device", device)
	m.host.free(t, "evicted host", host)
}

func (m *machine[E]) evictDevice(t *rapid.T) {
	before := m.pinned()
	n := rapid.IntRange(1, m.maxEvict).Draw(t, "n")
	dev, host := m.tree.EvictDevice(n)
	if len(dev) < n && m.tree.DeviceVictim() != nil {
		t.Fatalf("evicted %d of %d device pages with victims left", len(dev), n)
	}
	m.applyFrees(t, dev, host)
	m.checkPinned(t, before)
}

func (m *machine[E]) evictHost(t *rapid.T) {
	before := m.pinned()
	n := rapid.IntRange(1, m.maxEvict).Draw(t, "n")
	host := m.tree.EvictHost(n)
	if len(host) < n && m.tree.HostVictim() != nil {
		t.Fatalf("evicted %d of %d host pages with victims left", len(host), n)
	}
	m.applyFrees(t, nil, host)
	m.checkPinned(t, before)
}

func (m *machine[E]) dropHost(t *rapid.T) {
	list, prefixes := m.nodes()
	var cand []int
	for i, n := range list {
		if n.device != nil && n.host != nil && n.hostRef == 0 {
			cand = append(cand, i)
		}
	}
	if len(cand) == 0 {
		t.Skip("nothing to drop")
	}
	i := rapid.SampledFrom(cand).Draw(t, "node")
	host, err := m.tree.DropHost(list[i])
	if err != nil {
		t.Fatal(err)
	}
	m.setTier(prefixes[i], len(host), func(st *pageState, j int) { st.host = -1 })
	m.host.free(t, "dropped host", host)
}

// pinned records the pages that locks and host references must protect: device
// pages of locked paths, host pages of referenced paths.
func (m *machine[E]) pinned() map[string]pageState {
	out := map[string]pageState{}
	list, prefixes := m.nodes()
	for i, n := range list {
		if n.lockRef == 0 && n.hostRef == 0 {
			continue
		}
		for j := 0; j < len(n.keys); j++ {
			pk := prefixes[i].key
			k := prefixKey(prefixes[i].ns, pk[:len(pk)-len(n.keys)*m.ps+(j+1)*m.ps])
			st := m.model[k]
			if n.lockRef == 0 {
				st.device = -2 // unprotected tier
			}
			if n.hostRef == 0 {
				st.host = -2
			}
			out[k] = st
		}
	}
	return out
}

func (m *machine[E]) checkPinned(t *rapid.T, before map[string]pageState) {
	for k, was := range before {
		now, ok := m.model[k]
		if !ok {
			t.Fatalf("page %s was locked or referenced and got evicted", k)
		}
		if was.device != -2 && now.device != was.device || was.host != -2 && now.host != was.host {
			t.Fatalf("page %s changed from %+v to %+v under a lock or reference", k, was, now)
		}
	}
}

func (m *machine[E]) check(t *rapid.T) {
	if err := m.tree.Check(); err != nil {
		t.Fatal(err)
	}
	seen := 0
	var devHeld, hostHeld []pageid.ID
	m.tree.Walk(func(ns pagekey.Key, prefix []E, n *Node[E]) bool {
		pages := len(n.keys)
		for j := 0; j < pages; j++ {
			k := prefixKey(ns, prefix[:len(prefix)-len(n.keys)*m.ps+(j+1)*m.ps])
			st, ok := m.model[k]
			if !ok {
				t.Fatalf("tree holds page %s the model does not", k)
			}
			dev, host := pageid.ID(-1), pageid.ID(-1)
			if n.device != nil {
				dev = n.device[j]
				devHeld = append(devHeld, dev)
			}
			if n.host != nil {
				host = n.host[j]
				hostHeld = append(hostHeld, host)
			}
			if dev != st.device || host != st.host {
				t.Fatalf("page %s: tree (%d,%d), model (%d,%d)", k, dev, host, st.device, st.host)
			}
			seen++
		}
		return true
	})
	if seen != len(m.model) {
		t.Fatalf("tree holds %d pages, model %d", seen, len(m.model))
	}
	m.checkRefs(t)
	// No page leaks: every allocated page is held by the tree, exactly once.
	if len(devHeld) != len(m.dev.live) || len(hostHeld) != len(m.host.live) {
		t.Fatalf("allocated %d device/%d host pages, tree holds %d/%d", len(m.dev.live), len(m.host.live), len(devHeld), len(hostHeld))
	}
	for _, p := range devHeld {
		if !m.dev.live[p] {
			t.Fatalf("tree holds device page %d that is not allocated", p)
		}
	}
	for _, p := range hostHeld {
		if !m.host.live[p] {
			t.Fatalf("tree holds host page %d that is not allocated", p)
		}
	}
}

// checkRefs compares every node's lock and host reference counts with the
// model's: each lock and host reference the machine holds counts on its node and
// on every ancestor, whatever splits have cut the path since it was taken.
func (m *machine[E]) checkRefs(t *rapid.T) {
	want := map[*Node[E]][2]int32{}
	for i, held := range [][]*Node[E]{m.locks, m.refs} {
		for _, n := range held {
			for x := n; x.parent != nil; x = x.parent {
				c := want[x]
				c[i]++
				want[x] = c
			}
		}
	}
	m.tree.Walk(func(ns pagekey.Key, prefix []E, n *Node[E]) bool {
		if w := want[n]; n.lockRef != w[0] || n.hostRef != w[1] {
			t.Fatalf("node %v (%d pages): lock count %d, host references %d; the machine holds %d and %d on it and below",
				prefix, n.Pages(), n.lockRef, n.hostRef, w[0], w[1])
		}
		return true
	})
}

func newMachine[E Elem](t *rapid.T, cfg Config, lift func(uint32) E) *machine[E] {
	tree, err := New[E](cfg)
	if err != nil {
		t.Fatal(err)
	}
	m := &machine[E]{tree: tree, ps: cfg.PageSize, model: map[string]pageState{}, dev: newAllocator(), host: newAllocator(),
		lift: lift, maxEvict: 8}
	h, _ := pagekey.New(pagekey.DefaultConfig())
	m.spaces = []pagekey.Key{{}, h.Seed(pagekey.Namespace{}.WithCacheSalt("a")), h.Seed(pagekey.Namespace{}.WithExtraKey("a"))}
	for i := 0; i < 3; i++ {
		var base []E
		for _, x := range rapid.SliceOfN(rapid.Uint32Range(0, 3), 0, 6*cfg.PageSize).Draw(t, "base") {
			base = append(base, lift(x))
		}
		m.bases = append(m.bases, base)
	}
	return m
}

func (m *machine[E]) actions() map[string]func(*rapid.T) {
	return map[string]func(*rapid.T){
		"insert":      m.insert,
		"match":       m.match,
		"unlock":      m.unlock,
		"splitHeld":   m.splitHeld,
		"backup":      m.backup,
		"load":        m.load,
		"hostRef":     m.hostRef,
		"evictDevice": m.evictDevice,
		"evictHost":   m.evictHost,
		"dropHost":    m.dropHost,
		"":            m.check,
	}
}

func liftToken(x uint32) uint32 { return x }

// liftBigram puts the token in the high half of a bigram, so that keying on the low
// 32 bits of an element would lose it.
func liftBigram(x uint32) uint64 { return uint64(x) << 32 }

func TestTreeMatchesReferenceModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ps := rapid.IntRange(1, 3).Draw(t, "pageSize")
		policy := rapid.SampledFrom([]Policy{LRU, LFU}).Draw(t, "policy")
		m := newMachine(t, Config{PageSize: ps, Policy: policy, MaxPages: 1 << 12}, liftToken)
		defer m.tree.Close()
		t.Repeat(m.actions())
	})
}

// TestWideFanoutMatchesReferenceModel runs the reference model on trees where one
// node (under a shared stem, or the root) has up to hundreds of children: bursts of
// new branches grow its child index, matches and inserts miss it on new branches
// and split the children it indexes, and large evictions take children out of it
// until it shrinks and goes away; Check verifies the index after every step. Token
// and bigram trees both run.
func TestWideFanoutMatchesReferenceModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		if rapid.Bool().Draw(t, "bigrams") {
			runWide(t, liftBigram)
		} else {
			runWide(t, liftToken)
		}
	})
}

func runWide[E Elem](t *rapid.T, lift func(uint32) E) {
	ps := rapid.IntRange(1, 3).Draw(t, "pageSize")
	policy := rapid.SampledFrom([]Policy{LRU, LFU}).Draw(t, "policy")
	m := newMachine(t, Config{PageSize: ps, Policy: policy, MaxPages: 1 << 16}, lift)
	defer m.tree.Close()
	m.maxEvict = 128
	m.wide = &wideKeys{
		stem:     rapid.SliceOfN(rapid.Uint32Range(0, 3), 0, 2*ps).Draw(t, "stem"),
		branches: rapid.IntRange(8, 400).Draw(t, "branches"),
	}
	m.wide.stem = m.wide.stem[:len(m.wide.stem)/ps*ps]
	actions := m.actions()
	actions["insertBranches"] = m.insertBranches
	t.Repeat(actions)
}
