package hicache

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/storage"
)

// canceled is a context that is already done: Wait with it reports whether the
// request still has copies in flight without blocking.
func canceled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// evictToL2 serves fillers until first's pages have left L1 (kept in L2).
func (e *env) evictToL2(t *testing.T, first []uint32, fillers ...[]uint32) {
	t.Helper()
	for _, f := range fillers {
		e.serve(t, f)
		if err := e.cache.Sync(waitCtx(t)); err != nil {
			t.Fatal(err)
		}
	}
	c := e.cache.impl.(*core[uint32])
	e.cache.mu.Lock()
	m := c.tree.Match(c.hasher.Seed(pagekey.Namespace{}), first)
	e.cache.mu.Unlock()
	if m.Pages != c.cfg.pages(len(first)) || m.DevicePages() != 0 {
		t.Fatalf("the first prompt has %d of %d pages cached, %d in L1; want all, none in L1", m.Pages, c.cfg.pages(len(first)), m.DevicePages())
	}
}

// A load from L2 is held in flight while other requests split the node it loads:
// one by matching a shorter prefix (Match splits), one by inserting a prompt that
// diverges inside it (Insert splits). Both are served pages of the load, and both
// must wait for it; none may see its prefix as ready before the copy ran.
func TestSplitOfANodeBeingLoadedWaitsForTheLoad(t *testing.T) {
	e := newEnv(t, DefaultConfig(), 30, 96)
	a := seq(1, 8*testPS)
	// x shares a's first 4 pages. It is computed before a is cached, so its
	// Insert meets a's node mid-load and splits it.
	x := append(append([]uint32(nil), a[:4*testPS]...), seq(10, 2*testPS)...)
	rx, err := e.cache.Match(context.Background(), x, MatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	xPages, err := e.cache.AllocDevice(6)
	if err != nil {
		t.Fatal(err)
	}
	e.fill(x, xPages, 0, len(x))

	e.serve(t, a)
	e.evictToL2(t, a, seq(2, 8*testPS), seq(3, 8*testPS), seq(4, 8*testPS))

	e.gate.hold(pool.Load)
	r1, err := e.cache.Match(context.Background(), a, MatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r1.L2Tokens != len(a) || !r1.Loading() {
		t.Fatalf("the L2 hit is not being loaded: L1 %d L2 %d loading %v", r1.L1Tokens, r1.L2Tokens, r1.Loading())
	}

	// Insert splits a's node 4 pages in: x's page table now starts with pages
	// the held load writes.
	xPrefix, err := e.cache.Insert(rx, x, xPages)
	if err != nil {
		t.Fatal(err)
	}
	if got := rx.Wait(canceled()); got == nil || !rx.Loading() {
		t.Errorf("after an Insert that split a node being loaded, the request's page table uses pages still being loaded without waiting for them (Wait: %v)", got)
	}

	// Match of a's first 2 pages splits the head again.
	y := append(append([]uint32(nil), a[:2*testPS]...), seq(11, 3*testPS)...)
	r2, err := e.cache.Match(context.Background(), y, MatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r2.HitTokens != 2*testPS {
		t.Fatalf("prefix of a shorter match: %d tokens, want %d", r2.HitTokens, 2*testPS)
	}
	if got := r2.Wait(canceled()); got == nil || !r2.Loading() {
		t.Errorf("a match that split a node being loaded was served its pages without waiting for the load (Wait: %v)", got)
	}
	// What Wait would have let the engine read: pages the copy has not written.
	if err := e.check(y, r2.DevicePages, 0, r2.HitTokens); err == nil {
		t.Fatal("the held load's pages already hold the prefix: the test no longer holds the load")
	}

	e.gate.open(pool.Load)
	for _, r := range []*Request{r1, rx, r2} {
		if err := r.Wait(waitCtx(t)); err != nil {
			t.Fatal(err)
		}
	}
	e.verify(t, a, r1.DevicePages, len(a))
	e.verify(t, x, xPrefix, len(x))
	e.verify(t, y, r2.DevicePages, r2.HitTokens)
	if err := errors.Join(e.cache.Release(r1), e.cache.Release(rx), e.cache.Release(r2)); err != nil {
		t.Fatal(err)
	}
	if err := e.cache.Sync(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	e.checkTree(t)
	s := e.cache.Stats()
	if tree := e.cache.impl.(*core[uint32]).tree; s.DevicePagesUsed != tree.DevicePages() {
		t.Fatalf("L1 pages used %d, tree holds %d", s.DevicePagesUsed, tree.DevicePages())
	}
}

// A request released before its load finished leaves the loaded node in the tree;
// the pages the copy still writes must not be handed to anyone until it is done,
// or the late copy overwrites the new owner's KV.
func TestPagesBeingLoadedAreNotReallocated(t *testing.T) {
	e := newEnv(t, DefaultConfig(), 16, 64)
	a := seq(1, 8*testPS)
	e.serve(t, a)
	e.evictToL2(t, a, seq(2, 8*testPS), seq(3, 8*testPS))

	e.gate.hold(pool.Load)
	r, err := e.cache.Match(context.Background(), a, MatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r.L2Tokens != len(a) {
		t.Fatalf("L2 hit of %d tokens, want %d", r.L2Tokens, len(a))
	}
	if err := e.cache.Release(r); err != nil { // preempted before its load finished
		t.Fatal(err)
	}
	b := seq(5, 16*testPS)
	pages, err := e.cache.AllocDevice(16)
	if err == nil {
		e.fill(b, pages, 0, len(b))
	} else if !errors.Is(err, ErrDeviceFull) {
		t.Fatal(err)
	}
	e.gate.open(pool.Load)
	if err := e.cache.Sync(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	if err == nil {
		if err := e.check(b, pages, 0, len(b)); err != nil {
			t.Fatalf("the engine was given L1 pages a load was still writing: %v", err)
		}
		if err := e.cache.FreeDevice(pages); err != nil {
			t.Fatal(err)
		}
	}
	// Either way, the load completed into the tree's pages: a is an L1 hit.
	r, err = e.cache.Match(context.Background(), a, MatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r.L1Tokens != len(a) {
		t.Fatalf("after the load, a hits L1 for %d tokens, want %d", r.L1Tokens, len(a))
	}
	e.verify(t, a, r.DevicePages, len(a))
	if err := e.cache.Release(r); err != nil {
		t.Fatal(err)
	}
	e.checkTree(t)
}

// eventually polls cond until it holds, failing the test when it does not within
// a generous deadline or when one call of cond blocks that long (a call that
// waits for the cache while the cache waits for a copy).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		res := make(chan bool, 1)
		go func() { res <- cond() }()
		select {
		case ok := <-res:
			if ok {
				return
			}
		case <-time.After(time.Until(deadline)):
			t.Fatalf("%s: blocked for 10s", what)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// within receives from ch, failing the test when nothing comes within 10 s.
func within[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not within 10s", what)
		panic("unreachable")
	}
}

// With L1 full of pages whose L1→L2 backup is held in flight, AllocDevice has to
// wait for the backup. It must wait without holding the cache: other requests
// (here a Match and Stats) go on meanwhile, as they would while a real device
// copies.
func TestAllocDeviceWaitsForBackupsWithoutHoldingTheCache(t *testing.T) {
	e := newEnv(t, DefaultConfig(), 8, 32)
	e.gate.hold(pool.Backup)
	e.serve(t, seq(1, 8*testPS)) // write-through: its 8 pages are locked by their backup
	type alloc struct {
		pages []pool.PageID
		err   error
	}
	done := make(chan alloc, 1)
	go func() {
		pages, err := e.cache.AllocDevice(4)
		done <- alloc{pages, err}
	}()
	eventually(t, "Stats while AllocDevice waits for a held backup", func() bool { return e.cache.Stats().CopyWaits > 0 })
	b := seq(2, 3*testPS)
	r, err := e.cache.Match(context.Background(), b, MatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.cache.Release(r); err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-done:
		t.Fatalf("AllocDevice returned (%v, %v) while every L1 page was held by a backup", a.pages, a.err)
	default:
	}
	e.gate.open(pool.Backup)
	a := within(t, "AllocDevice after the backup it waited for", done)
	if a.err != nil || len(a.pages) != 4 {
		t.Fatalf("after the backup: %v, %v", a.pages, a.err)
	}
	if err := e.cache.FreeDevice(a.pages); err != nil {
		t.Fatal(err)
	}
	if err := e.cache.Sync(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	e.checkTree(t)
}

// With write-back, evictions back their victims up first. Those copies run
// without the cache too, and the pages come free once they are done.
func TestWriteBackEvictionWaitsWithoutHoldingTheCache(t *testing.T) {
	cfg := DefaultConfig()
	cfg.WritePolicy = WriteBack
	e := newEnv(t, cfg, 8, 32)
	a := seq(1, 8*testPS)
	e.serve(t, a) // in L1 only
	e.gate.hold(pool.Backup)
	done := make(chan error, 1)
	b := seq(2, 8*testPS)
	go func() { done <- e.serveConcurrent(b) }() // evicts a: its backup is held
	eventually(t, "Stats while a write-back eviction is held", func() bool { return e.cache.Stats().CopyWaits > 0 })
	e.gate.open(pool.Backup)
	if err := within(t, "the request after its write-back eviction", done); err != nil {
		t.Fatal(err)
	}
	if r := e.serve(t, a); r.L2Tokens != len(a) {
		t.Fatalf("a after its write-back eviction: L1 %d L2 %d, want all of it from L2", r.L1Tokens, r.L2Tokens)
	}
	e.checkTree(t)
}

// deafBackend ignores contexts: its Puts block until the test lets them go.
type deafBackend struct {
	*memBackend
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func (b *deafBackend) Put(ctx context.Context, name string, keys []pagekey.Key, pages []pool.PageID) []error {
	b.once.Do(func() { close(b.entered) })
	<-b.release
	// The cache and its pools may be gone: touch nothing.
	return storage.FailAll(len(keys), storage.ErrUnavailable)
}

// Close returns within its guard although a backup to L3 is stuck in a backend
// that ignores its canceled context.
func TestCloseIsBoundedWhenTheBackendIgnoresContexts(t *testing.T) {
	backend := &deafBackend{memBackend: newMemBackend(), entered: make(chan struct{}), release: make(chan struct{})}
	cfg := l3Config()
	cfg.CloseTimeout = 100 * time.Millisecond
	e := newEnvWith(t, cfg, 32, 64, Options{Storage: backend}, hostmem.Mmap)
	t.Cleanup(func() { close(backend.release) })
	e.serve(t, seq(1, 10*testPS))
	// Each call accounts for finished copies: once the L1→L2 backup is, its pages
	// are queued for L3.
	eventually(t, "a backup to L3 reaching the backend", func() bool {
		e.cache.Stats()
		select {
		case <-backend.entered:
			return true
		default:
			return false
		}
	})
	closed := make(chan error, 1)
	go func() { closed <- e.cache.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close blocked for 10s on a backend call that ignores its context; the guard is 100ms")
	}
	if _, err := e.cache.Match(context.Background(), seq(1, 4), MatchOptions{}); !errors.Is(err, ErrClosed) {
		t.Fatalf("match after close: %v", err)
	}
}

// reconnectingBackend reconnects by itself, as the node service client does.
type reconnectingBackend struct {
	*memBackend
	epoch atomic.Uint64
}

func (b *reconnectingBackend) Epoch() uint64 { return b.epoch.Load() }

var _ storage.Reconnector = (*reconnectingBackend)(nil)

// After the backend failed for long enough that the cache skips it for its longest
// backoff, the backend reconnects: the cache uses L3 again at once.
func TestReconnectEndsTheBackoff(t *testing.T) {
	backend := newMemBackend()
	a := seq(1, 10*testPS)
	warm(t, backend, a)
	rb := &reconnectingBackend{memBackend: backend}
	down := error(storage.ErrUnavailable)
	backend.failAll.Store(&down)
	e := newEnvWith(t, l3Config(), 32, 64, Options{Storage: rb}, hostmem.Mmap)
	p := e.cache.Prefetch(a, pagekey.Namespace{})
	if p == nil {
		t.Fatal("no prefetch")
	}
	waitDone(t, p)
	p.Cancel()
	// The service stays down: the backoff grows to its longest, 5 s.
	l3 := e.cache.impl.(*core[uint32]).l3
	for range 8 {
		l3.record(l3.epoch(), storage.ErrUnavailable)
	}
	if s := e.cache.Stats(); !s.L3.Down || s.L3.Faults["unavailable"] == 0 {
		t.Fatalf("L3 is not down after failures: %+v", s.L3)
	}
	if p := e.cache.Prefetch(a, pagekey.Namespace{}); p != nil {
		t.Fatal("prefetch while L3 is down")
	}
	// The service is back and the client has reconnected, pools registered.
	backend.failAll.Store(nil)
	rb.epoch.Add(1)
	if s := e.cache.Stats(); s.L3.Down {
		t.Fatal("L3 still skipped after the backend reconnected")
	}
	if r := e.serveWith(t, a, pagekey.Namespace{}); r.L3Tokens != len(a) {
		t.Fatalf("after the reconnect: L3 hit of %d tokens, want %d", r.L3Tokens, len(a))
	}
	// A failure without a reconnect still backs off.
	backend.failAll.Store(&down)
	l3.record(l3.epoch(), storage.ErrUnavailable)
	if !e.cache.Stats().L3.Down {
		t.Fatal("a failure after the reconnect did not back off")
	}
}

// A request that diverges from a cached prompt in the middle of its node (the
// match splits it) is served exactly the shared pages, none of the other
// continuation, and the cache's accounting stays sound through Finish. (sim's
// overlongMatch serves one page more here, to prove the bench catches it.)
func TestADivergenceInsideANodeIsServedTheSharedPagesOnly(t *testing.T) {
	e := newEnvWith(t, DefaultConfig(), 32, 64, Options{}, hostmem.Mmap)
	a := seq(1, 8*testPS)
	e.serve(t, a)
	if err := e.cache.Sync(waitCtx(t)); err != nil { // a's L2 copy is complete
		t.Fatal(err)
	}
	nodes := e.cache.impl.(*core[uint32]).tree.Nodes()
	b := append(append([]uint32(nil), a[:4*testPS]...), seq(2, 4*testPS+1)...)
	r, err := e.cache.Match(context.Background(), b, MatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Wait(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	if got := e.cache.impl.(*core[uint32]).tree.Nodes(); got != nodes+1 {
		t.Fatalf("the match left %d nodes, want %d: it did not split a's node", got, nodes+1)
	}
	if shared := 4 * testPS; r.HitTokens != shared || len(r.DevicePages) != shared/testPS {
		t.Fatalf("hit %d tokens in %d pages, want %d", r.HitTokens, len(r.DevicePages), shared)
	}
	e.verify(t, b, r.DevicePages, r.HitTokens)
	need := (len(b)+testPS-1)/testPS - len(r.DevicePages)
	fresh, err := e.cache.AllocDevice(need)
	if err != nil {
		t.Fatal(err)
	}
	pages := append(append([]pool.PageID(nil), r.DevicePages...), fresh...)
	e.fill(b, pages, r.HitTokens, len(b))
	if err := e.cache.Finish(r, b, pages); err != nil {
		t.Fatal(err)
	}
	if err := e.cache.Sync(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	e.checkTree(t)
	s := e.cache.Stats()
	if tree := e.cache.impl.(*core[uint32]).tree; s.DevicePagesUsed != tree.DevicePages() || s.HostPagesUsed != tree.HostPages() {
		t.Fatalf("L1 used %d tree %d, L2 used %d tree %d", s.DevicePagesUsed, tree.DevicePages(), s.HostPagesUsed, tree.HostPages())
	}
}

// A request's own pages (here L3 pages whose draft KV is missing, staged for it)
// released while their load still runs are freed only once it is done.
func TestReleasedPagesOfARunningLoadAreFreedAfterIt(t *testing.T) {
	backend := newMemBackend()
	a := seq(1, 10*testPS)
	warm(t, backend, a)
	backend.reject["draft"] = errors.New("refused")
	e := newEnvWith(t, l3Config(), 32, 64, Options{Storage: backend}, hostmem.Mmap)
	e.gate.hold(pool.Load)
	p := e.cache.Prefetch(a, pagekey.Namespace{})
	if p == nil {
		t.Fatal("no prefetch")
	}
	r, err := e.cache.Match(context.Background(), a, MatchOptions{Prefetch: p})
	if err != nil {
		t.Fatal(err)
	}
	if r.L3Tokens != len(a) || r.DraftRecomputeTokens != len(a) || !r.Loading() {
		t.Fatalf("staged L3 hit: L3 %d recompute %d loading %v", r.L3Tokens, r.DraftRecomputeTokens, r.Loading())
	}
	if err := e.cache.Release(r); err != nil { // preempted before its load finished
		t.Fatal(err)
	}
	b := seq(5, 32*testPS)
	pages, err := e.cache.AllocDevice(32)
	if err == nil {
		e.fill(b, pages, 0, len(b))
	} else if !errors.Is(err, ErrDeviceFull) {
		t.Fatal(err)
	}
	e.gate.open(pool.Load)
	if err := e.cache.Sync(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	if err == nil {
		if err := e.check(b, pages, 0, len(b)); err != nil {
			t.Fatalf("the engine was given L1 pages a load was still writing: %v", err)
		}
	} else if pages, err = e.cache.AllocDevice(32); err != nil {
		t.Fatalf("the released pages did not come back after their load: %v", err)
	}
	if err := e.cache.FreeDevice(pages); err != nil {
		t.Fatal(err)
	}
	if s := e.cache.Stats(); s.DevicePagesUsed != 0 || s.L3.ReservedPages != 0 {
		t.Fatalf("L1 pages used %d, reserved host pages %d, want none", s.DevicePagesUsed, s.L3.ReservedPages)
	}
}

// A load that fails leaves garbage in the L1 pages it was to write, wherever
// splits have moved them since it started: every request served those pages is
// told, and once nobody holds them they leave L1, so the next request loads the
// prefix again from L2 instead of being served the garbage.
func TestFailedLoadIsUndoneInEveryNodeSplitFromIt(t *testing.T) {
	e := newEnv(t, DefaultConfig(), 16, 64)
	a := seq(1, 8*testPS)
	e.serve(t, a)
	e.evictToL2(t, a, seq(2, 8*testPS), seq(3, 8*testPS))

	e.gate.hold(pool.Load)
	r1, err := e.cache.Match(context.Background(), a, MatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	y := append(append([]uint32(nil), a[:3*testPS]...), seq(11, 2*testPS)...)
	r2, err := e.cache.Match(context.Background(), y, MatchOptions{}) // splits the node being loaded
	if err != nil {
		t.Fatal(err)
	}
	e.gate.mu.Lock()
	e.gate.failLoads = true
	e.gate.mu.Unlock()
	e.gate.open(pool.Load)
	if err := r1.Wait(waitCtx(t)); !errors.Is(err, errInjected) {
		t.Fatalf("the request whose load failed: %v", err)
	}
	if err := r2.Wait(waitCtx(t)); !errors.Is(err, errInjected) {
		t.Fatalf("a request served pages of a failed load (after a split): Wait %v", err)
	}
	if err := errors.Join(e.cache.Release(r1), e.cache.Release(r2)); err != nil {
		t.Fatal(err)
	}
	e.gate.mu.Lock()
	e.gate.failLoads = false
	e.gate.mu.Unlock()
	r, err := e.cache.Match(context.Background(), a, MatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Wait(waitCtx(t)); err != nil {
		t.Fatalf("the prefix again: %v", err)
	}
	if r.L1Tokens != 0 || r.L2Tokens != len(a) {
		t.Fatalf("after the failed load: L1 %d L2 %d, want it all loaded again from L2", r.L1Tokens, r.L2Tokens)
	}
	e.verify(t, a, r.DevicePages, len(a))
	if err := e.cache.Release(r); err != nil {
		t.Fatal(err)
	}
	if err := e.cache.Sync(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	e.checkTree(t)
}
