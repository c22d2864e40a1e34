package hicache

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/storage"
)

// memBackend is a test backend: objects copied into a map, with faults to inject.
// Several caches can share one to stand for engines sharing L3.
type memBackend struct {
	mu        sync.Mutex
	objects   map[string][]byte
	specs     map[string]storage.PoolSpec
	reject    map[string]error // pool name -> registration error
	allocator hostmem.Kind
	failAll   atomic.Pointer[error]
	hang      atomic.Bool
	held      atomic.Pointer[chan struct{}] // calls wait until it is closed (or their context ends)
	gets      atomic.Int64
}

var _ storage.Backend = (*memBackend)(nil)

func newMemBackend() *memBackend {
	return &memBackend{objects: map[string][]byte{}, specs: map[string]storage.PoolSpec{}, reject: map[string]error{}}
}

func (b *memBackend) Name() string            { return "mem" }
func (b *memBackend) Allocator() hostmem.Kind { return b.allocator }
func (b *memBackend) Close() error            { return nil }

func (b *memBackend) RegisterPool(ctx context.Context, spec storage.PoolSpec) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.reject[spec.Name]; err != nil {
		return err
	}
	b.specs[spec.Name] = spec
	return nil
}

// fault blocks while hang is set (until ctx ends) or held is open, and returns
// the injected error.
func (b *memBackend) fault(ctx context.Context) error {
	if ch := b.held.Load(); ch != nil {
		select {
		case <-*ch:
		case <-ctx.Done():
			return errors.Join(ctx.Err(), storage.ErrTimeout)
		}
	}
	if b.hang.Load() {
		<-ctx.Done()
		return errors.Join(ctx.Err(), storage.ErrTimeout)
	}
	if e := b.failAll.Load(); e != nil {
		return *e
	}
	return nil
}

func (b *memBackend) spec(name string) (storage.PoolSpec, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, ok := b.specs[name]
	return s, ok
}

func objKey(spec storage.PoolSpec, k pagekey.Key, part int) string {
	return storage.ObjectNames(spec, k)[part] + "/" + spec.Layout.String()
}

func (b *memBackend) Exists(ctx context.Context, pool string, keys []pagekey.Key) (int, error) {
	if err := b.fault(ctx); err != nil {
		return 0, err
	}
	spec, ok := b.spec(pool)
	if !ok {
		return 0, storage.ErrNotRegistered
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, k := range keys {
		for part := 0; part < spec.Layout.Geometry.Buffers(); part++ {
			if _, ok := b.objects[objKey(spec, k, part)]; !ok {
				return i, nil
			}
		}
	}
	return len(keys), nil
}

func (b *memBackend) Get(ctx context.Context, name string, keys []pagekey.Key, pages []pool.PageID) []error {
	b.gets.Add(1)
	if err := b.fault(ctx); err != nil {
		return storage.FailAll(len(keys), err)
	}
	spec, ok := b.spec(name)
	if !ok {
		return storage.FailAll(len(keys), storage.ErrNotRegistered)
	}
	out := make([]error, len(keys))
	b.mu.Lock()
	defer b.mu.Unlock()
	mem := spec.Region.Bytes()
	for i, k := range keys {
		for part, span := range storage.Parts(spec, pages[i]) {
			obj, ok := b.objects[objKey(spec, k, part)]
			if !ok {
				out[i] = storage.ErrNotFound
				break
			}
			copy(mem[span.Offset:span.Offset+span.Bytes()], obj)
		}
	}
	return out
}

func (b *memBackend) Put(ctx context.Context, name string, keys []pagekey.Key, pages []pool.PageID) []error {
	if err := b.fault(ctx); err != nil {
		return storage.FailAll(len(keys), err)
	}
	spec, ok := b.spec(name)
	if !ok {
		return storage.FailAll(len(keys), storage.ErrNotRegistered)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	mem := spec.Region.Bytes()
	for i, k := range keys {
		for part, span := range storage.Parts(spec, pages[i]) {
			if _, ok := b.objects[objKey(spec, k, part)]; !ok {
				b.objects[objKey(spec, k, part)] = append([]byte(nil), mem[span.Offset:span.Offset+span.Bytes()]...)
			}
		}
	}
	return make([]error, len(keys))
}

func l3Config() Config {
	cfg := DefaultConfig()
	cfg.L3.PrefetchThreshold = testPS
	// Generous: a call that times out backs L3 off and skips backups, and a
	// file store under -race on a busy machine can take a while. A test that
	// needs a call to time out sets its own.
	cfg.L3.CallTimeout = 30 * time.Second
	cfg.L3.Workers = 2
	return cfg
}

// warm serves seqs through a cache over backend and waits until L3 has them.
func warm(t *testing.T, backend storage.Backend, seqs ...[]uint32) {
	t.Helper()
	warmWith(t, backend, 32, 64, seqs...)
}

// warmWith is warm through a cache of devPages and hostPages (the test backend
// names objects by the host pool's layout, so caches that share them have one).
func warmWith(t *testing.T, backend storage.Backend, devPages, hostPages int, seqs ...[]uint32) {
	t.Helper()
	e := newEnvWith(t, l3Config(), devPages, hostPages, Options{Storage: backend}, hostmem.Mmap)
	for _, s := range seqs {
		e.serve(t, s)
	}
	if err := e.cache.Sync(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	if s := e.cache.Stats(); s.L3.BackedUpTokens == 0 {
		t.Fatalf("nothing backed up to L3: %+v", s.L3)
	}
}

// serveWith is serve with a prefetch and the draft recompute an engine does.
func (e *env) serveWith(t *testing.T, tokens []uint32, ns pagekey.Namespace) *Request {
	t.Helper()
	p := e.cache.Prefetch(tokens, ns)
	r, err := e.cache.Match(context.Background(), tokens, MatchOptions{Namespace: ns, Prefetch: p})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Wait(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	verified := r.HitTokens - r.DraftRecomputeTokens
	if r.DraftRecomputeTokens > 0 && r.DraftRecomputeFrom+r.DraftRecomputeTokens != r.HitTokens {
		t.Fatalf("draft recompute [%d,+%d) does not end the hit of %d", r.DraftRecomputeFrom, r.DraftRecomputeTokens, r.HitTokens)
	}
	e.verify(t, tokens, r.DevicePages, verified)
	if r.DraftRecomputeTokens > 0 {
		e.verifyPool(t, 0, tokens, r.DevicePages, r.DraftRecomputeFrom, r.HitTokens)
		e.fillPool(1, tokens, r.DevicePages, r.DraftRecomputeFrom, r.HitTokens) // the engine's recompute
	}
	need := (len(tokens)+testPS-1)/testPS - len(r.DevicePages)
	fresh, err := e.cache.AllocDevice(need)
	if err != nil {
		t.Fatal(err)
	}
	pages := append(append([]pool.PageID(nil), r.DevicePages...), fresh...)
	e.fill(tokens, pages, r.HitTokens, len(tokens))
	if err := e.cache.Finish(r, tokens, pages); err != nil {
		t.Fatal(err)
	}
	return r
}

func TestL3HitsAcrossCaches(t *testing.T) {
	backend := newMemBackend()
	a, b := seq(1, 10*testPS), seq(2, 10*testPS)
	warm(t, backend, a, b)
	// A second engine with empty L1 and L2 finds the pages in L3.
	e := newEnvWith(t, l3Config(), 32, 64, Options{Storage: backend}, hostmem.Mmap)
	r := e.serveWith(t, a, pagekey.Namespace{})
	if r.L3Tokens != 10*testPS || r.L2Tokens != 0 || r.DraftRecomputeTokens != 0 {
		t.Fatalf("L3 hit through L2: L1 %d L2 %d L3 %d recompute %d", r.L1Tokens, r.L2Tokens, r.L3Tokens, r.DraftRecomputeTokens)
	}
	if err := e.cache.Sync(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	s := e.cache.Stats()
	if s.L3.Prefetch.Completed != 1 || s.L3.PrefetchedTokens != 10*testPS || s.L3.BytesRead == 0 || s.L3.ReservedPages != 0 {
		t.Fatalf("L3 stats %+v", s.L3)
	}
	// Another namespace never sees them.
	r = e.serveWith(t, b, pagekey.Namespace{}.WithCacheSalt("other"))
	if r.HitTokens != 0 {
		t.Fatalf("a different namespace hit %d tokens of another's L3 pages", r.HitTokens)
	}
	e.checkTree(t)
}

func TestDraftPoolRefusedServesTargetHitsWithRecompute(t *testing.T) {
	backend := newMemBackend()
	a := seq(1, 10*testPS)
	warm(t, backend, a)
	backend.reject["draft"] = errors.New("segment not registered by this client: use the shm allocator")
	e := newEnvWith(t, l3Config(), 32, 64, Options{Storage: backend}, hostmem.Mmap)
	s := e.cache.Stats()
	if !s.L3.Enabled || len(s.L3.Pools) != 2 || !s.L3.Pools[0].Enabled || s.L3.Pools[1].Enabled || !strings.Contains(s.L3.Pools[1].Reason, "shm allocator") {
		t.Fatalf("pool status %+v", s.L3.Pools)
	}
	r := e.serveWith(t, a, pagekey.Namespace{})
	if r.L3Tokens != 10*testPS || r.DraftRecomputeTokens != 10*testPS || r.DraftRecomputeFrom != 0 {
		t.Fatalf("target-only L3 hit: %+v", r)
	}
	// The pages, draft recomputed, are cached at Finish: the next request hits L1
	// with every pool right.
	r = e.serveWith(t, a, pagekey.Namespace{})
	if r.L1Tokens != 10*testPS {
		t.Fatalf("after finish: %+v", r)
	}
	if err := e.cache.Sync(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	s = e.cache.Stats()
	if s.L3.ReservedPages != 0 || s.DraftRecomputeTokens != 10*testPS || s.HitTokensL3 != 10*testPS {
		t.Fatalf("stats %+v / %+v", s, s.L3)
	}
	e.checkTree(t)
}

func TestTargetPoolRefusedDisablesL3(t *testing.T) {
	backend := newMemBackend()
	backend.reject["kv"] = storage.ErrRegistration
	e := newEnvWith(t, l3Config(), 8, 32, Options{Storage: backend}, hostmem.Mmap)
	if s := e.cache.Stats(); s.L3.Enabled || s.L3.Pools[0].Enabled || !s.L3.Pools[1].Enabled {
		t.Fatalf("status %+v", s.L3)
	}
	a := seq(1, 6*testPS)
	e.serve(t, a)
	if p := e.cache.Prefetch(a, pagekey.Namespace{}); p != nil {
		t.Fatal("prefetch with L3 disabled")
	}
	// L2 keeps working.
	e.serve(t, seq(2, 6*testPS))
	if r := e.serve(t, a); r.L2Tokens == 0 {
		t.Fatalf("L2 without L3: %+v", r)
	}
}

func TestAllocatorMismatchDisablesThePool(t *testing.T) {
	backend := newMemBackend()
	backend.allocator = hostmem.Shm
	e := newEnvWith(t, l3Config(), 8, 32, Options{Storage: backend}, hostmem.Mmap)
	s := e.cache.Stats()
	if s.L3.Enabled || !strings.Contains(s.L3.Pools[0].Reason, "HostAllocator") {
		t.Fatalf("status %+v", s.L3.Pools)
	}
	// Built with the backend's allocator, every pool registers.
	e = newEnvWith(t, l3Config(), 8, 32, Options{Storage: backend}, hostmem.Shm)
	if s := e.cache.Stats(); !s.L3.Enabled || !s.L3.Pools[1].Enabled {
		t.Fatalf("shm pools: %+v", s.L3.Pools)
	}
}

func TestFailingBackendGivesMissesAndCountsFaults(t *testing.T) {
	backend := newMemBackend()
	a := seq(1, 10*testPS)
	warm(t, backend, a)
	fail := error(storage.ErrUnavailable)
	backend.failAll.Store(&fail)
	e := newEnvWith(t, l3Config(), 32, 64, Options{Storage: backend}, hostmem.Mmap)
	r := e.serveWith(t, a, pagekey.Namespace{})
	if r.HitTokens != 0 {
		t.Fatalf("hit from a failing backend: %+v", r)
	}
	e.serve(t, seq(5, 6*testPS)) // L1/L2 serve on
	if err := e.cache.Sync(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	s := e.cache.Stats()
	if s.L3.Faults["unavailable"] == 0 || s.L3.ReservedPages != 0 {
		t.Fatalf("faults %+v", s.L3)
	}
}

func TestHangingBackendNeverBlocksPastTheDeadline(t *testing.T) {
	backend := newMemBackend()
	a := seq(1, 10*testPS)
	warm(t, backend, a)
	backend.hang.Store(true)
	cfg := l3Config()
	cfg.L3.PrefetchPolicy = Timeout
	cfg.L3.PrefetchTimeoutBase = 50 * time.Millisecond
	cfg.L3.PrefetchTimeoutMax = 50 * time.Millisecond
	// The call hangs until the prefetch is given up, however slow this machine:
	// only the prefetch deadline can end the wait.
	cfg.L3.CallTimeout = time.Minute
	e := newEnvWith(t, cfg, 32, 64, Options{Storage: backend}, hostmem.Mmap)
	start := time.Now()
	r := e.serveWith(t, a, pagekey.Namespace{})
	if took := time.Since(start); took > 2*time.Second || r.HitTokens != 0 {
		t.Fatalf("hanging backend: %v, hit %d", took, r.HitTokens)
	}
	if err := e.cache.Sync(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	s := e.cache.Stats()
	if s.L3.Prefetch.TimedOut != 1 || s.L3.ReservedPages != 0 {
		t.Fatalf("prefetch %+v reserved %d", s.L3.Prefetch, s.L3.ReservedPages)
	}
}

func TestCanceledPrefetchReturnsItsPages(t *testing.T) {
	backend := newMemBackend()
	seqs := [][]uint32{seq(1, 10*testPS), seq(2, 10*testPS), seq(3, 10*testPS)}
	warm(t, backend, seqs...)
	e := newEnvWith(t, l3Config(), 32, 64, Options{Storage: backend}, hostmem.Mmap)
	for i, s := range seqs {
		p := e.cache.Prefetch(s, pagekey.Namespace{})
		if p == nil {
			t.Fatal("no prefetch")
		}
		if i == 1 {
			waitDone(t, p) // cancel after it finished, before any Match took it
		}
		p.Cancel()
		p.Cancel()
	}
	if err := e.cache.Sync(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	s := e.cache.Stats()
	if s.L3.ReservedPages != 0 {
		t.Fatalf("%d host pages still reserved after canceling every prefetch", s.L3.ReservedPages)
	}
	if used := s.HostPagesUsed; used != e.cache.impl.(*core[uint32]).tree.HostPages() {
		t.Fatalf("host pages used %d, tree holds %d", used, e.cache.impl.(*core[uint32]).tree.HostPages())
	}
}

func TestConcurrentPrefetchesOfOnePrefixFetchOnce(t *testing.T) {
	backend := newMemBackend()
	a := seq(1, 10*testPS)
	warm(t, backend, a)
	backend.gets.Store(0)
	e := newEnvWith(t, l3Config(), 32, 64, Options{Storage: backend}, hostmem.Mmap)
	// The first fetch is held in the backend while the second prefetch asks, as
	// two requests arriving together find it.
	held := make(chan struct{})
	backend.held.Store(&held)
	p1 := e.cache.Prefetch(a, pagekey.Namespace{})
	p2 := e.cache.Prefetch(a, pagekey.Namespace{})
	close(held)
	if p1 == nil || p2 == nil || p1.op != p2.op {
		t.Fatal("second prefetch of the same pages did not join the first")
	}
	r1, err := e.cache.Match(context.Background(), a, MatchOptions{Prefetch: p1})
	if err != nil {
		t.Fatal(err)
	}
	r2, err := e.cache.Match(context.Background(), a, MatchOptions{Prefetch: p2})
	if err != nil {
		t.Fatal(err)
	}
	if r1.HitTokens != 10*testPS || r2.HitTokens != 10*testPS {
		t.Fatalf("hits %d and %d", r1.HitTokens, r2.HitTokens)
	}
	for _, r := range []*Request{r1, r2} {
		if err := r.Wait(waitCtx(t)); err != nil {
			t.Fatal(err)
		}
		e.verify(t, a, r.DevicePages, r.HitTokens)
		if err := e.cache.Release(r); err != nil {
			t.Fatal(err)
		}
	}
	// One Get per pool (target and draft), for a single batch.
	if got := backend.gets.Load(); got != 2 {
		t.Fatalf("%d Get calls, want 2", got)
	}
	if s := e.cache.Stats(); s.L3.Prefetch.Joined != 1 {
		t.Fatalf("prefetch stats %+v", s.L3.Prefetch)
	}
	if _, err := e.cache.Match(context.Background(), a, MatchOptions{Prefetch: p1}); !errors.Is(err, ErrRequest) {
		t.Fatalf("prefetch used twice: %v", err)
	}
}

// waitDone waits for p to finish, failing the test after 10 s.
func waitDone(t *testing.T, p *Prefetch) {
	t.Helper()
	select {
	case <-p.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("prefetch of %d tokens not done within 10s (outcome %q)", p.Tokens, p.Outcome())
	}
}

// warmShortDraft leaves L3 with all 10 pages of a in the target pool and only the
// first 6 in the draft pool: a draft pool that was refused L3 while the last 4
// were backed up.
func warmShortDraft(t *testing.T, backend *memBackend, a []uint32) {
	t.Helper()
	warm(t, backend, a[:6*testPS])
	backend.reject["draft"] = errors.New("draft pool refused for this test")
	warm(t, backend, a)
	delete(backend.reject, "draft")
	spec, ok := backend.spec("draft")
	if !ok {
		t.Fatal("draft pool never registered")
	}
	h, err := pagekey.New(pagekey.Config{PageSize: testPS})
	if err != nil {
		t.Fatal(err)
	}
	keys := h.Keys(h.Seed(pagekey.Namespace{}), a)
	backend.mu.Lock()
	defer backend.mu.Unlock()
	for i, k := range keys {
		_, has := backend.objects[objKey(spec, k, 0)]
		if has != (i < 6) {
			t.Fatalf("draft page %d in L3: %v, want it only for pages 0-5", i, has)
		}
	}
}

// When the draft pool's L3 holds fewer pages of a prefix than the target's, the
// draft policy decides the hit: required serves as L3 hits only the pages every
// pool has; best_effort serves every target page and names the pages whose draft
// KV the engine recomputes. Either way no page whose draft KV is missing enters
// the tree, where a later hit would serve it as complete.
func TestDraftPoolWithFewerL3PagesLimitsTheHit(t *testing.T) {
	a := seq(1, 10*testPS)
	for _, c := range []struct {
		policy                DraftPolicy
		l3, recomputeFrom, rc int // tokens
		untaken               int // L2 hit tokens an untaken prefetch leaves
	}{
		// The 6 pages every pool has become L2 pages of the tree.
		{DraftRequired, 6 * testPS, 0, 0, 6 * testPS},
		// Pages with draft KV missing are kept for the request that prefetched
		// them, and returned when it does not take them.
		{DraftBestEffort, 10 * testPS, 6 * testPS, 4 * testPS, 0},
	} {
		t.Run(c.policy.String(), func(t *testing.T) {
			backend := newMemBackend()
			warmShortDraft(t, backend, a)
			cfg := l3Config()
			cfg.L3.DraftPolicy = c.policy
			cfg.L3.PrefetchPolicy = WaitComplete

			// A request that takes its prefetch: serveWith verifies every pool's
			// KV of the pages not marked for recompute, and the target's of the rest.
			e := newEnvWith(t, cfg, 32, 64, Options{Storage: backend}, hostmem.Mmap)
			r := e.serveWith(t, a, pagekey.Namespace{})
			if r.L3Tokens != c.l3 || r.L1Tokens != 0 || r.L2Tokens != 0 ||
				r.DraftRecomputeFrom != c.recomputeFrom || r.DraftRecomputeTokens != c.rc {
				t.Fatalf("L3 hit of a prefix whose draft pages stop at page 6: L1 %d L2 %d L3 %d, draft recompute [%d,+%d); want L3 %d, recompute [%d,+%d)",
					r.L1Tokens, r.L2Tokens, r.L3Tokens, r.DraftRecomputeFrom, r.DraftRecomputeTokens, c.l3, c.recomputeFrom, c.rc)
			}
			if err := e.cache.Sync(waitCtx(t)); err != nil {
				t.Fatal(err)
			}
			if s := e.cache.Stats(); s.HitTokensL3 != int64(c.l3) || s.DraftRecomputeTokens != int64(c.rc) || s.L3.ReservedPages != 0 {
				t.Fatalf("stats: L3 hits %d, draft recompute %d, reserved %d; want %d, %d, 0",
					s.HitTokensL3, s.DraftRecomputeTokens, s.L3.ReservedPages, c.l3, c.rc)
			}
			e.checkTree(t)

			// A prefetch nobody takes: what it leaves in the tree is what a later
			// request without a prefetch finds in L2, and serve verifies every pool.
			// (A fresh L3: the request above backed up the draft KV it recomputed.)
			backend = newMemBackend()
			warmShortDraft(t, backend, a)
			e = newEnvWith(t, cfg, 32, 64, Options{Storage: backend}, hostmem.Mmap)
			p := e.cache.Prefetch(a, pagekey.Namespace{})
			if p == nil {
				t.Fatal("no prefetch of a prefix L3 holds")
			}
			waitDone(t, p)
			if got := p.Pages(); got*testPS != c.l3 {
				t.Fatalf("prefetch brought %d pages, want %d", got, c.l3/testPS)
			}
			p.Cancel()
			if err := e.cache.Sync(waitCtx(t)); err != nil {
				t.Fatal(err)
			}
			if r := e.serve(t, a); r.L2Tokens != c.untaken || r.L1Tokens != 0 {
				t.Fatalf("after an untaken prefetch: L1 %d L2 %d hit tokens; want L2 %d", r.L1Tokens, r.L2Tokens, c.untaken)
			}
			if s := e.cache.Stats(); s.L3.ReservedPages != 0 {
				t.Fatalf("%d host pages still reserved", s.L3.ReservedPages)
			}
			e.checkTree(t)
		})
	}
}

// A prefetch that extends a prefix cached in L2 only keeps that prefix while it
// fetches: in a full L2 the prefix is the least recently used leaf, and reserving
// host pages for the fetch evicted it, so the fetched pages had nothing to hang
// from and were dropped as stale, and the request hit nothing.
func TestPrefetchKeepsThePrefixItExtends(t *testing.T) {
	backend := newMemBackend()
	a := seq(1, 10*testPS)
	warmWith(t, backend, 10, 16, a)
	e := newEnvWith(t, l3Config(), 10, 16, Options{Storage: backend}, hostmem.Mmap)
	e.serve(t, a[:4*testPS])     // L1 and L2
	e.serve(t, seq(2, 6*testPS)) // L1 full
	e.serve(t, seq(3, 6*testPS)) // evicts both from L1; L2 full, a's first 4 pages its oldest
	if err := e.cache.Sync(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	r := e.serveWith(t, a, pagekey.Namespace{})
	if r.L2Tokens != 4*testPS || r.L3Tokens != 6*testPS {
		t.Fatalf("a's first 4 pages in L2, the other 6 in L3: L1 %d L2 %d L3 %d tokens", r.L1Tokens, r.L2Tokens, r.L3Tokens)
	}
	if err := e.cache.Sync(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	if s := e.cache.Stats(); s.L3.Prefetch.Stale != 0 || s.L3.ReservedPages != 0 {
		t.Fatalf("prefetch %+v, %d host pages still reserved", s.L3.Prefetch, s.L3.ReservedPages)
	}
	e.checkTree(t)
}

// The pages a prefetch brought wait in L2 for the request that fetched them: an
// engine starts the prefetch when the request arrives and matches when it is
// scheduled, and in a full L2 the backups of the requests that ran meanwhile
// evicted them first, so the request fetched from L3 and hit nothing.
func TestPrefetchedPagesWaitForTheirRequest(t *testing.T) {
	backend := newMemBackend()
	b := seq(1, 6*testPS)
	warmWith(t, backend, 10, 16, b)
	e := newEnvWith(t, l3Config(), 10, 16, Options{Storage: backend}, hostmem.Mmap)
	e.serve(t, seq(2, 5*testPS))
	e.serve(t, seq(3, 5*testPS))
	p := e.cache.Prefetch(b, pagekey.Namespace{})
	if p == nil {
		t.Fatal("no prefetch")
	}
	waitDone(t, p)
	if err := e.cache.Sync(waitCtx(t)); err != nil { // b's pages are in the tree, in a full L2
		t.Fatal(err)
	}
	for i := range 3 { // each backup evicts the oldest L2 leaf
		e.serve(t, seq(uint64(4+i), 5*testPS))
	}
	r, err := e.cache.Match(context.Background(), b, MatchOptions{Prefetch: p})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Wait(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	if r.L3Tokens != 6*testPS {
		t.Fatalf("the prefetched pages: L1 %d L2 %d L3 %d tokens, want all %d from L3", r.L1Tokens, r.L2Tokens, r.L3Tokens, 6*testPS)
	}
	e.verify(t, b, r.DevicePages, r.HitTokens)
	if err := e.cache.Release(r); err != nil {
		t.Fatal(err)
	}
	if err := e.cache.Sync(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	if s := e.cache.Stats(); s.L3.ReservedPages != 0 {
		t.Fatalf("%d host pages still reserved after the match", s.L3.ReservedPages)
	}
	e.checkTree(t)
}

// A request that matches part of a node while the node's L1→L2 backup runs
// splits it; the backup then covers two nodes, and both reach L3. Only the tail
// (the node the copy started with) did, so the head's pages, the prefix later
// requests share, were never in L3.
func TestNodeSplitDuringItsBackupReachesL3Whole(t *testing.T) {
	backend := newMemBackend()
	a := seq(1, 10*testPS)
	e := newEnvWith(t, l3Config(), 32, 64, Options{Storage: backend}, hostmem.Mmap)
	e.gate.hold(pool.Backup)
	e.serve(t, a) // its backup to L2 waits in the gate
	b := append(append([]uint32(nil), a[:6*testPS]...), seq(2, 2*testPS)...)
	r, err := e.cache.Match(context.Background(), b, MatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r.L1Tokens != 6*testPS {
		t.Fatalf("b's match: L1 %d tokens, want a's first 6 pages", r.L1Tokens)
	}
	if err := e.cache.Release(r); err != nil {
		t.Fatal(err)
	}
	e.gate.open(pool.Backup)
	if err := e.cache.Sync(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	if s := e.cache.Stats(); s.L3.BackedUpTokens != 10*testPS {
		t.Fatalf("%d tokens backed up to L3, want all %d of a", s.L3.BackedUpTokens, 10*testPS)
	}
	// Another engine finds all of a in L3.
	other := newEnvWith(t, l3Config(), 32, 64, Options{Storage: backend}, hostmem.Mmap)
	if r := other.serveWith(t, a, pagekey.Namespace{}); r.L3Tokens != 10*testPS {
		t.Fatalf("another engine's L3 hit: %d tokens, want %d", r.L3Tokens, 10*testPS)
	}
	e.checkTree(t)
}
