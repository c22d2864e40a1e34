package radix

import (
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
)

// pageState is the reference model of one cached page, keyed by its full prefix.
type pageState struct {
	device, host pool.PageID // -1 when absent
}

// allocator hands out page ids and checks that each comes back once.
type allocator struct {
	next pool.PageID
	live map[pool.PageID]bool
}

func newAllocator() *allocator { return &allocator{live: map[pool.PageID]bool{}} }

func (a *allocator) alloc() pool.PageID {
	a.next++
	a.live[a.next] = true
	return a.next
}

func (a *allocator) free(t *rapid.T, what string, pages []pool.PageID) {
	for _, p := range pages {
		if !a.live[p] {
			t.Fatalf("%s page %d freed but not allocated (double free or foreign)", what, p)
		}
		delete(a.live, p)
	}
}

type machine struct {
	tree   *Tree[uint32]
	ps     int
	model  map[string]pageState
	dev    *allocator
	host   *allocator
	bases  [][]uint32
	spaces []pagekey.Key
	locks  []*Node[uint32]
	refs   []*Node[uint32]
}

func prefixKey(ns pagekey.Key, key []uint32) string { return ns.String() + fmt.Sprint(key) }

func (m *machine) drawKey(t *rapid.T) (pagekey.Key, []uint32) {
	ns := rapid.SampledFrom(m.spaces).Draw(t, "ns")
	base := rapid.SampledFrom(m.bases).Draw(t, "base")
	n := rapid.IntRange(0, len(base)).Draw(t, "len")
	key := slices.Clone(base[:n])
	if rapid.Bool().Draw(t, "branch") && n > 0 {
		i := rapid.IntRange(0, n-1).Draw(t, "at")
		key[i] = uint32(rapid.IntRange(0, 3).Draw(t, "tok"))
	}
	return ns, key
}

// modelMatch is the number of leading whole pages of key the model holds.
func (m *machine) modelMatch(ns pagekey.Key, key []uint32) int {
	p := 0
	for (p+1)*m.ps <= len(key) {
		if _, ok := m.model[prefixKey(ns, key[:(p+1)*m.ps])]; !ok {
			break
		}
		p++
	}
	return p
}

func (m *machine) insert(t *rapid.T) {
	ns, key := m.drawKey(t)
	pages := len(key) / m.ps
	device := make([]pool.PageID, pages)
	var wantDup []pool.PageID
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

func (m *machine) match(t *rapid.T) {
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
	for _, s := range res.Spans {
		for i := 0; i < s.Pages; i++ {
			st := m.model[prefixKey(ns, key[:(p+1)*m.ps])]
			dev, host := pool.PageID(-1), pool.PageID(-1)
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
	if res.DevicePages() > 0 && res.Spans[0].Device == nil {
		t.Fatal("device pages counted past an L2-only span")
	}
	if rapid.IntRange(0, 2).Draw(t, "lock") == 0 && res.Pages > 0 {
		if err := m.tree.Lock(res.Last); err != nil {
			t.Fatal(err)
		}
		m.locks = append(m.locks, res.Last)
	}
}

func (m *machine) unlock(t *rapid.T) {
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
func (m *machine) nodes() (list []*Node[uint32], prefixes []nsPrefix) {
	m.tree.Walk(func(ns pagekey.Key, prefix []uint32, n *Node[uint32]) bool {
		list = append(list, n)
		prefixes = append(prefixes, nsPrefix{ns, slices.Clone(prefix)})
		return true
	})
	return list, prefixes
}

type nsPrefix struct {
	ns  pagekey.Key
	key []uint32
}

func (m *machine) backup(t *rapid.T) {
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
	host := make([]pool.PageID, len(n.keys))
	for j := range host {
		host[j] = m.host.alloc()
	}
	if err := m.tree.SetHost(n, host); err != nil {
		t.Fatal(err)
	}
	m.setTier(prefix, len(host), func(st *pageState, j int) { st.host = host[j] })
}

func (m *machine) load(t *rapid.T) {
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
	dev := make([]pool.PageID, len(n.keys))
	for j := range dev {
		dev[j] = m.dev.alloc()
	}
	if err := m.tree.SetDevice(n, dev); err != nil {
		t.Fatal(err)
	}
	m.setTier(prefix, len(dev), func(st *pageState, j int) { st.device = dev[j] })
}

// setTier updates the model for the last pages pages of prefix.
func (m *machine) setTier(prefix nsPrefix, pages int, set func(*pageState, int)) {
	total := len(prefix.key) / m.ps
	for j := 0; j < pages; j++ {
		k := prefixKey(prefix.ns, prefix.key[:(total-pages+j+1)*m.ps])
		st := m.model[k]
		set(&st, j)
		m.model[k] = st
	}
}

func (m *machine) hostRef(t *rapid.T) {
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
func (m *machine) applyFrees(t *rapid.T, device, host []pool.PageID) {
	devSet := map[pool.PageID]bool{}
	for _, p := range device {
		devSet[p] = true
	}
	hostSet := map[pool.PageID]bool{}
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

func (m *machine) evictDevice(t *rapid.T) {
	before := m.pinned()
	n := rapid.IntRange(1, 8).Draw(t, "n")
	dev, host := m.tree.EvictDevice(n)
	if len(dev) < n && m.tree.DeviceVictim() != nil {
		t.Fatalf("evicted %d of %d device pages with victims left", len(dev), n)
	}
	m.applyFrees(t, dev, host)
	m.checkPinned(t, before)
}

func (m *machine) evictHost(t *rapid.T) {
	before := m.pinned()
	n := rapid.IntRange(1, 8).Draw(t, "n")
	host := m.tree.EvictHost(n)
	if len(host) < n && m.tree.HostVictim() != nil {
		t.Fatalf("evicted %d of %d host pages with victims left", len(host), n)
	}
	m.applyFrees(t, nil, host)
	m.checkPinned(t, before)
}

func (m *machine) dropHost(t *rapid.T) {
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
func (m *machine) pinned() map[string]pageState {
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

func (m *machine) checkPinned(t *rapid.T, before map[string]pageState) {
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

func (m *machine) check(t *rapid.T) {
	if err := m.tree.Check(); err != nil {
		t.Fatal(err)
	}
	seen := 0
	var devHeld, hostHeld []pool.PageID
	m.tree.Walk(func(ns pagekey.Key, prefix []uint32, n *Node[uint32]) bool {
		pages := len(n.keys)
		for j := 0; j < pages; j++ {
			k := prefixKey(ns, prefix[:len(prefix)-len(n.keys)*m.ps+(j+1)*m.ps])
			st, ok := m.model[k]
			if !ok {
				t.Fatalf("tree holds page %s the model does not", k)
			}
			dev, host := pool.PageID(-1), pool.PageID(-1)
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

func TestTreeMatchesReferenceModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ps := rapid.IntRange(1, 3).Draw(t, "pageSize")
		policy := rapid.SampledFrom([]Policy{LRU, LFU}).Draw(t, "policy")
		tree, err := New[uint32](Config{PageSize: ps, Policy: policy, MaxPages: 1 << 12})
		if err != nil {
			t.Fatal(err)
		}
		defer tree.Close()
		m := &machine{tree: tree, ps: ps, model: map[string]pageState{}, dev: newAllocator(), host: newAllocator()}
		h, _ := pagekey.New(pagekey.DefaultConfig())
		m.spaces = []pagekey.Key{{}, h.Seed(pagekey.Namespace{}.WithCacheSalt("a")), h.Seed(pagekey.Namespace{}.WithExtraKey("a"))}
		for i := 0; i < 3; i++ {
			m.bases = append(m.bases, rapid.SliceOfN(rapid.Uint32Range(0, 3), 0, 6*ps).Draw(t, "base"))
		}
		t.Repeat(map[string]func(*rapid.T){
			"insert":      m.insert,
			"match":       m.match,
			"unlock":      m.unlock,
			"backup":      m.backup,
			"load":        m.load,
			"hostRef":     m.hostRef,
			"evictDevice": m.evictDevice,
			"evictHost":   m.evictHost,
			"dropHost":    m.dropHost,
			"":            m.check,
		})
	})
}
