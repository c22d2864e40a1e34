package hicache

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/kvlayout"
	"github.com/stratakv/strata/pool"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testPS = 4

var (
	targetGeom = kvlayout.Geometry{Layers: 3, KVHeads: 2, HeadDim: 4, DTypeBytes: 2}
	draftGeom  = kvlayout.Geometry{Layers: 1, KVHeads: 2, HeadDim: 4, DTypeBytes: 2}
)

// env is a cache over small stand-in pools with a KV function to fill and verify.
// Its device pools copy through gate, which a test closes to hold copies in flight.
type env struct {
	cache *Cache
	dev   pool.DeviceGroup
	mems  []*pool.MemDevicePool // the device pools' memory, in group order
	host  *pool.Group
	gate  *gate
}

// gate holds the copies of one direction in flight until the test opens it again.
type gate struct {
	mu        sync.Mutex
	loads     chan struct{} // nil while loads pass
	backups   chan struct{}
	failLoads bool // loads fail once through the gate
}

// errInjected is the failure of a copy the test made fail.
var errInjected = errors.New("injected copy failure")

// hold makes the copies of dir that start from now on wait for open.
func (g *gate) hold(dir pool.Direction) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if dir == pool.Load {
		g.loads = make(chan struct{})
	} else {
		g.backups = make(chan struct{})
	}
}

// open lets the held copies of dir run, and the later ones pass.
func (g *gate) open(dir pool.Direction) {
	g.mu.Lock()
	defer g.mu.Unlock()
	ch := &g.backups
	if dir == pool.Load {
		ch = &g.loads
	}
	if *ch != nil {
		close(*ch)
		*ch = nil
	}
}

// wait holds a copy of dir while the gate is closed, then says whether it fails.
func (g *gate) wait(dir pool.Direction) error {
	g.mu.Lock()
	ch := g.backups
	if dir == pool.Load {
		ch = g.loads
	}
	g.mu.Unlock()
	if ch != nil {
		<-ch
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if dir == pool.Load && g.failLoads {
		return errInjected
	}
	return nil
}

// gatedPool is a stand-in device pool whose copies pass its gate first.
type gatedPool struct {
	*pool.MemDevicePool
	gate *gate
}

func (p gatedPool) LoadLayer(layer int, host *pool.HostPool, moves []pool.PageMove) error {
	if err := p.gate.wait(pool.Load); err != nil {
		return err
	}
	return p.MemDevicePool.LoadLayer(layer, host, moves)
}

func (p gatedPool) BackupLayer(layer int, host *pool.HostPool, moves []pool.PageMove) error {
	if err := p.gate.wait(pool.Backup); err != nil {
		return err
	}
	return p.MemDevicePool.BackupLayer(layer, host, moves)
}

func newEnv(t testing.TB, cfg Config, devPages, hostPages int) *env {
	t.Helper()
	return newEnvWith(t, cfg, devPages, hostPages, Options{}, hostmem.Mmap)
}

// newEnvWith builds an env whose host pools come from an allocator of kind and whose
// cache has opts (a storage backend).
func newEnvWith(t testing.TB, cfg Config, devPages, hostPages int, opts Options, kind hostmem.Kind) *env {
	t.Helper()
	acfg := hostmem.DefaultConfig(hostmem.Mmap)
	acfg.ReserveBytes = 0
	acfg.Logger = slog.New(slog.DiscardHandler)
	alloc, err := hostmem.New(acfg)
	if err != nil {
		t.Fatal(err)
	}
	pools := []pool.PoolSpec{{Name: "kv", Geometry: targetGeom}, {Name: "draft", Geometry: draftGeom}}
	dev, closeDev, err := pool.NewMemDeviceGroup(pool.GroupSpec{Pools: pools, Layout: kvlayout.LayerFirst, PageSize: testPS, Pages: devPages}, alloc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeDev() })
	e := &env{gate: &gate{}}
	e.dev.Pages = dev.Pages
	for _, p := range dev.Pools {
		m := p.(*pool.MemDevicePool)
		e.mems = append(e.mems, m)
		e.dev.Pools = append(e.dev.Pools, gatedPool{MemDevicePool: m, gate: e.gate})
	}
	dev = e.dev
	if hostPages > 0 {
		hcfg := acfg
		hcfg.Kind = kind
		halloc, err := hostmem.New(hcfg)
		if err != nil {
			t.Fatal(err)
		}
		host, err := pool.BuildGroup(pool.GroupSpec{Pools: pools, Layout: kvlayout.PageFirst, PageSize: testPS, Pages: hostPages}, halloc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { host.Close() })
		e.host = host
	}
	cfg.PageSize = testPS
	cfg.Copy = pool.CopyConfig{Workers: 2, MinPagesPerJob: 1}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	c, err := New(cfg, dev, e.host, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Copies a failed test left held must run for Close to finish.
		e.gate.open(pool.Load)
		e.gate.open(pool.Backup)
		c.Close()
	})
	e.cache = c
	return e
}

// kvByte is the byte i of the KV entry of position pos (whose prefix hashes to h)
// in buf of layer of pool p.
func kvByte(h uint64, p, layer, buf, pos, i int) byte {
	x := h ^ uint64(p)<<56 ^ uint64(layer)<<48 ^ uint64(buf)<<40 ^ uint64(pos)<<8 ^ uint64(i)
	x *= 0x9e3779b97f4a7c15
	return byte(x >> 56)
}

// prefixHashes returns h[i] = hash of tokens[:i+1].
func prefixHashes(tokens []uint32) []uint64 {
	out := make([]uint64, len(tokens))
	h := uint64(1469598103934665603)
	for i, t := range tokens {
		h = (h ^ uint64(t)) * 1099511628211
		h ^= h >> 29
		out[i] = h
	}
	return out
}

// fill writes the KV of tokens' positions [from, to) into their device pages.
func (e *env) fill(tokens []uint32, pages []pool.PageID, from, to int) {
	hs := prefixHashes(tokens)
	for pi, m := range e.mems {
		l := m.Layout()
		tlb := l.Geometry.TokenLayerBytes()
		for pos := from; pos < to; pos++ {
			slot := int(pages[pos/testPS])*testPS + pos%testPS
			for layer := 0; layer < l.Geometry.Layers; layer++ {
				for buf := 0; buf < l.Geometry.Buffers(); buf++ {
					off := l.Offset(buf, layer, slot)
					for i := 0; i < tlb; i++ {
						m.Bytes()[off+int64(i)] = kvByte(hs[pos], pi, layer, buf, pos, i)
					}
				}
			}
		}
	}
}

// fillPool writes pool pi's KV of positions [from, to).
func (e *env) fillPool(pi int, tokens []uint32, pages []pool.PageID, from, to int) {
	hs := prefixHashes(tokens)
	m := e.mems[pi]
	l := m.Layout()
	tlb := l.Geometry.TokenLayerBytes()
	for pos := from; pos < to; pos++ {
		slot := int(pages[pos/testPS])*testPS + pos%testPS
		for layer := 0; layer < l.Geometry.Layers; layer++ {
			for buf := 0; buf < l.Geometry.Buffers(); buf++ {
				off := l.Offset(buf, layer, slot)
				for i := 0; i < tlb; i++ {
					m.Bytes()[off+int64(i)] = kvByte(hs[pos], pi, layer, buf, pos, i)
				}
			}
		}
	}
}

// verifyPool checks pool pi's KV of positions [from, to).
func (e *env) verifyPool(t testing.TB, pi int, tokens []uint32, pages []pool.PageID, from, to int) {
	t.Helper()
	hs := prefixHashes(tokens)
	m := e.mems[pi]
	l := m.Layout()
	tlb := l.Geometry.TokenLayerBytes()
	for pos := from; pos < to; pos++ {
		slot := int(pages[pos/testPS])*testPS + pos%testPS
		for layer := 0; layer < l.Geometry.Layers; layer++ {
			for buf := 0; buf < l.Geometry.Buffers(); buf++ {
				off := l.Offset(buf, layer, slot)
				for i := 0; i < tlb; i++ {
					if got, want := m.Bytes()[off+int64(i)], kvByte(hs[pos], pi, layer, buf, pos, i); got != want {
						t.Fatalf("pool %s position %d layer %d buf %d byte %d: %d, want %d", m.Name(), pos, layer, buf, i, got, want)
					}
				}
			}
		}
	}
}

// verify checks the KV of the first n positions of tokens in their device pages.
func (e *env) verify(t testing.TB, tokens []uint32, pages []pool.PageID, n int) {
	t.Helper()
	if err := e.check(tokens, pages, 0, n); err != nil {
		t.Fatal(err)
	}
}

// check is verify of positions [from, to) that returns the first wrong byte as an
// error, for goroutines other than the test's.
func (e *env) check(tokens []uint32, pages []pool.PageID, from, to int) error {
	hs := prefixHashes(tokens)
	for pi, m := range e.mems {
		l := m.Layout()
		tlb := l.Geometry.TokenLayerBytes()
		for pos := from; pos < to; pos++ {
			slot := int(pages[pos/testPS])*testPS + pos%testPS
			for layer := 0; layer < l.Geometry.Layers; layer++ {
				for buf := 0; buf < l.Geometry.Buffers(); buf++ {
					off := l.Offset(buf, layer, slot)
					for i := 0; i < tlb; i++ {
						if got, want := m.Bytes()[off+int64(i)], kvByte(hs[pos], pi, layer, buf, pos, i); got != want {
							return fmt.Errorf("pool %s position %d layer %d buf %d byte %d: %d, want %d", m.Name(), pos, layer, buf, i, got, want)
						}
					}
				}
			}
		}
	}
	return nil
}

// waitTimeout bounds each wait of a test for the cache's copies (Request.Wait,
// Cache.Sync): a copy that never ends fails the test with the context's error
// instead of hanging it until the test binary's timeout.
const waitTimeout = 10 * time.Second

// waitCtx is a context for one bounded wait of t.
func waitCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	t.Cleanup(cancel)
	return ctx
}

// serve runs one request through the cache as an engine would: match, wait for
// loads and verify the prefix, allocate and compute the rest, finish.
func (e *env) serve(t testing.TB, tokens []uint32) *Request {
	t.Helper()
	r, err := e.cache.Match(context.Background(), tokens, MatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Wait(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	e.verify(t, tokens, r.DevicePages, r.HitTokens)
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

func seq(seed uint64, n int) []uint32 {
	r := rand.New(rand.NewPCG(seed, 7))
	out := make([]uint32, n)
	for i := range out {
		out[i] = r.Uint32N(1000)
	}
	return out
}

func (e *env) checkTree(t testing.TB) {
	t.Helper()
	switch c := e.cache.impl.(type) {
	case *core[uint32]:
		if err := c.tree.Check(); err != nil {
			t.Fatal(err)
		}
	case *core[uint64]:
		if err := c.tree.Check(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestL1HitAfterInsert(t *testing.T) {
	e := newEnv(t, DefaultConfig(), 16, 32)
	tokens := seq(1, 4*testPS+2)
	r := e.serve(t, tokens)
	if r.HitTokens != 0 {
		t.Fatalf("first request hit %d tokens", r.HitTokens)
	}
	r = e.serve(t, tokens)
	if r.L1Tokens != 4*testPS || r.L2Tokens != 0 {
		t.Fatalf("second request: L1 %d L2 %d, want 16 and 0", r.L1Tokens, r.L2Tokens)
	}
	// A longer request sharing the prefix hits it too.
	longer := append(append([]uint32(nil), tokens...), seq(2, 10)...)
	if r = e.serve(t, longer); r.HitTokens != 4*testPS {
		t.Fatalf("extension hit %d tokens", r.HitTokens)
	}
	if err := e.cache.Sync(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	e.checkTree(t)
	s := e.cache.Stats()
	if s.Requests != 3 || s.HitTokensL1 != 32 || s.Backup.Pages == 0 {
		t.Fatalf("stats %+v", s)
	}
	// No running request: every used L1 page is the tree's.
	if s.DevicePagesUsed != e.cache.impl.(*core[uint32]).tree.DevicePages() {
		t.Fatalf("L1 pages used %d, tree holds %d", s.DevicePagesUsed, e.cache.impl.(*core[uint32]).tree.DevicePages())
	}
}

// Fill L1 past capacity so the first prefix survives only in L2, then hit it: the
// L2 part is loaded back, and every byte of target and draft KV is right.
func TestL2HitLoadsBackTargetAndDraft(t *testing.T) {
	e := newEnv(t, DefaultConfig(), 8, 64)
	first := seq(1, 6*testPS)
	e.serve(t, first)
	if err := e.cache.Sync(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	for i := uint64(2); i < 6; i++ {
		e.serve(t, seq(i, 6*testPS))
		if err := e.cache.Sync(waitCtx(t)); err != nil {
			t.Fatal(err)
		}
	}
	r := e.serve(t, first)
	if r.L2Tokens == 0 || r.HitTokens != 6*testPS {
		t.Fatalf("L2 hit: L1 %d L2 %d", r.L1Tokens, r.L2Tokens)
	}
	s := e.cache.Stats()
	if s.LoadBack.Pages == 0 || s.EvictedTokensL1 == 0 || s.HitTokensL2 != int64(r.L2Tokens) {
		t.Fatalf("stats %+v", s)
	}
	e.checkTree(t)
}

func TestWriteBackBacksUpOnEviction(t *testing.T) {
	cfg := DefaultConfig()
	cfg.WritePolicy = WriteBack
	e := newEnv(t, cfg, 8, 64)
	first := seq(1, 6*testPS)
	e.serve(t, first)
	if s := e.cache.Stats(); s.Backup.Pages != 0 {
		t.Fatalf("write-back backed up at insert: %+v", s.Backup)
	}
	e.serve(t, seq(2, 6*testPS)) // evicts first, which is backed up on the way out
	if s := e.cache.Stats(); s.Backup.Pages == 0 {
		t.Fatal("eviction did not back up")
	}
	if r := e.serve(t, first); r.L2Tokens == 0 {
		t.Fatalf("write-back page not found in L2: %+v", r)
	}
	e.checkTree(t)
}

func TestWriteThroughSelectiveWaitsForHits(t *testing.T) {
	cfg := DefaultConfig()
	cfg.WritePolicy = WriteThroughSelective
	cfg.WriteThroughThreshold = 2
	e := newEnv(t, cfg, 8, 64)
	hot, cold := seq(1, 4*testPS), seq(2, 4*testPS)
	e.serve(t, hot)
	e.serve(t, hot)
	e.serve(t, hot) // second hit: backed up now
	e.serve(t, cold)
	if err := e.cache.Sync(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	e.serve(t, seq(3, 6*testPS))
	e.serve(t, seq(4, 6*testPS))
	if r := e.serve(t, hot); r.HitTokens != 4*testPS {
		t.Fatalf("hot prefix: hit %d", r.HitTokens)
	}
	if r := e.serve(t, cold); r.HitTokens != 0 {
		t.Fatalf("cold prefix survived without a backup: hit %d", r.HitTokens)
	}
}

func TestL1OnlyCacheDropsEvictedPages(t *testing.T) {
	e := newEnv(t, DefaultConfig(), 8, 0)
	first := seq(1, 6*testPS)
	e.serve(t, first)
	e.serve(t, seq(2, 6*testPS))
	if r := e.serve(t, first); r.HitTokens != 0 {
		t.Fatalf("evicted prefix hit %d tokens without L2", r.HitTokens)
	}
	if s := e.cache.Stats(); s.HostPages != 0 || s.Backup.Pages != 0 {
		t.Fatalf("L1-only cache stats %+v", s)
	}
}

func TestLockedPrefixIsNeverEvicted(t *testing.T) {
	e := newEnv(t, DefaultConfig(), 8, 16)
	tokens := seq(1, 4*testPS)
	e.serve(t, tokens)
	r, err := e.cache.Match(context.Background(), tokens, MatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Four pages are locked by r; the other four can be taken, no more.
	got, err := e.cache.AllocDevice(4)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.cache.AllocDevice(1); !errors.Is(err, ErrDeviceFull) {
		t.Fatalf("allocation past the locked pages: %v", err)
	}
	e.verify(t, tokens, r.DevicePages, r.HitTokens)
	if err := e.cache.FreeDevice(got); err != nil {
		t.Fatal(err)
	}
	if err := e.cache.Release(r); err != nil {
		t.Fatal(err)
	}
	if err := e.cache.Release(r); !errors.Is(err, ErrRequest) {
		t.Fatalf("second release: %v", err)
	}
	if _, err := e.cache.AllocDevice(8); err != nil {
		t.Fatalf("after release: %v", err)
	}
}

func TestBigramKeys(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Bigram = true
	e := newEnv(t, cfg, 16, 32)
	tokens := seq(1, 4*testPS+1) // 16 bigram positions: 4 pages
	e.serve(t, tokens)
	r := e.serve(t, tokens)
	if r.HitTokens != 4*testPS {
		t.Fatalf("bigram hit %d", r.HitTokens)
	}
	// The same tokens but a different last one change the last bigram page.
	other := append([]uint32(nil), tokens...)
	other[len(other)-1]++
	if r := e.serve(t, other); r.HitTokens != 3*testPS {
		t.Fatalf("bigram hit with a changed last token: %d", r.HitTokens)
	}
	e.checkTree(t)
}

func TestBadInput(t *testing.T) {
	e := newEnv(t, DefaultConfig(), 8, 16)
	r, err := e.cache.Match(context.Background(), []uint32{1, 2}, MatchOptions{})
	if err != nil || r.HitTokens != 0 {
		t.Fatalf("shorter than a page: %v %+v", err, r)
	}
	if err := e.cache.Finish(r, []uint32{1, 2}, nil); err != nil {
		t.Fatalf("finish of a sub-page request: %v", err)
	}
	if err := e.cache.Finish(r, []uint32{1, 2}, nil); !errors.Is(err, ErrRequest) {
		t.Fatalf("finish twice: %v", err)
	}
	tokens := seq(1, 2*testPS)
	e.serve(t, tokens)
	r, _ = e.cache.Match(context.Background(), tokens, MatchOptions{})
	if _, err := e.cache.Insert(r, tokens, []pool.PageID{7, 7}); !errors.Is(err, ErrRequest) {
		t.Fatalf("page table that disagrees with the prefix: %v", err)
	}
	if _, err := e.cache.Insert(r, append(tokens, seq(2, 8)...), r.DevicePages); !errors.Is(err, ErrRequest) {
		t.Fatalf("page table too short: %v", err)
	}
	if _, err := e.cache.AllocDevice(-1); !errors.Is(err, ErrRequest) {
		t.Fatalf("negative allocation: %v", err)
	}
	if err := e.cache.FreeDevice([]pool.PageID{99}); !errors.Is(err, ErrRequest) {
		t.Fatalf("free a foreign page: %v", err)
	}
	other := newEnv(t, DefaultConfig(), 8, 16)
	if err := other.cache.Release(r); !errors.Is(err, ErrRequest) {
		t.Fatalf("release on another cache: %v", err)
	}
	if err := e.cache.Release(r); err != nil {
		t.Fatal(err)
	}
}

func TestConstructionErrors(t *testing.T) {
	e := newEnv(t, DefaultConfig(), 8, 16)
	small, err := pool.BuildGroup(pool.GroupSpec{
		Pools:  []pool.PoolSpec{{Name: "kv", Geometry: targetGeom}, {Name: "draft", Geometry: draftGeom}},
		Layout: kvlayout.PageFirst, PageSize: testPS, Pages: 4,
	}, mustAlloc(t))
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	cfg := DefaultConfig()
	cfg.PageSize = testPS
	if _, err := New(cfg, e.dev, small, Options{}); !errors.Is(err, ErrConfig) {
		t.Fatalf("L2 smaller than L1: %v", err)
	}
	bad := cfg
	bad.PageSize = 8
	if _, err := New(bad, e.dev, e.host, Options{}); !errors.Is(err, ErrConfig) {
		t.Fatalf("page size mismatch: %v", err)
	}
	for _, c := range []Config{{PageSize: 0}, {PageSize: 4, WritePolicy: 7}, {PageSize: 4, WritePolicy: WriteThroughSelective}, {PageSize: 4, LoadBackMinTokens: -1}} {
		if err := c.Validate(); !errors.Is(err, ErrConfig) {
			t.Errorf("%+v: %v", c, err)
		}
	}
	if _, err := ParseWritePolicy("write_around"); !errors.Is(err, ErrConfig) {
		t.Fatal("unknown write policy accepted")
	}
	if _, err := New(cfg, pool.DeviceGroup{}, nil, Options{}); !errors.Is(err, ErrConfig) {
		t.Fatalf("empty device group: %v", err)
	}
}

func mustAlloc(t testing.TB) *hostmem.Allocator {
	a, err := hostmem.New(hostmem.Config{Kind: hostmem.Mmap})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// Many engine goroutines serve overlapping prompts at once; every hit is verified
// byte for byte, and afterwards no page is leaked. Goroutines report failures
// through errs; only the test's goroutine fails the test.
func TestConcurrentRequests(t *testing.T) {
	for _, policy := range []WritePolicy{WriteThrough, WriteThroughSelective, WriteBack} {
		cfg := DefaultConfig()
		cfg.WritePolicy = policy
		cfg.WriteThroughThreshold = 1
		e := newEnv(t, cfg, 48, 96)
		bases := [][]uint32{seq(1, 12*testPS), seq(2, 12*testPS), seq(3, 12*testPS), seq(4, 12*testPS)}
		const workers = 4
		errs := make(chan error, workers)
		var wg sync.WaitGroup
		for g := 0; g < workers; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				r := rand.New(rand.NewPCG(uint64(g), 1))
				for i := 0; i < 30; i++ {
					base := bases[r.IntN(len(bases))]
					n := testPS + r.IntN(len(base)-testPS)
					tokens := append([]uint32(nil), base[:n]...)
					tokens = append(tokens, seq(uint64(1000*g+i), r.IntN(6))...)
					if err := e.serveConcurrent(tokens); err != nil {
						errs <- fmt.Errorf("%v: worker %d request %d: %w", policy, g, i, err)
						return
					}
				}
			}(g)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if t.Failed() {
			return
		}
		if err := e.cache.Sync(waitCtx(t)); err != nil {
			t.Fatal(err)
		}
		e.checkTree(t)
		s := e.cache.Stats()
		tree := e.cache.impl.(*core[uint32]).tree
		if s.DevicePagesUsed != tree.DevicePages() || s.HostPagesUsed != tree.HostPages() {
			t.Fatalf("%v: pages leaked: L1 used %d tree %d, L2 used %d tree %d", policy, s.DevicePagesUsed, tree.DevicePages(), s.HostPagesUsed, tree.HostPages())
		}
		if s.HitTokensL1+s.HitTokensL2 == 0 {
			t.Fatalf("%v: no hits", policy)
		}
	}
}

// serveConcurrent is serve for many goroutines: when L1 is full of other requests'
// locked pages it releases its own and starts over, as an engine preempts. It
// returns what went wrong instead of failing the test, and an error when L1 has
// stayed full for preemptTimeout (other requests finish, so only pages that leak
// or stay locked keep it full).
// preemptTimeout bounds how long serveConcurrent retries a request that finds L1
// full: far longer than any request holds its pages here, even under -race on a
// loaded machine.
const preemptTimeout = 10 * time.Second

func (e *env) serveConcurrent(tokens []uint32) error {
	deadline := time.Now().Add(preemptTimeout)
	for attempt := 1; ; attempt++ {
		r, err := e.cache.Match(context.Background(), tokens, MatchOptions{})
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		err = r.Wait(ctx)
		cancel()
		if err != nil {
			return fmt.Errorf("wait for the loads of a %d-token hit: %w", r.HitTokens, err)
		}
		if err := e.check(tokens, r.DevicePages, 0, r.HitTokens); err != nil {
			return fmt.Errorf("served prefix of %d tokens (L1 %d, L2 %d): %w", r.HitTokens, r.L1Tokens, r.L2Tokens, err)
		}
		need := (len(tokens)+testPS-1)/testPS - len(r.DevicePages)
		fresh, err := e.cache.AllocDevice(need)
		if errors.Is(err, ErrDeviceFull) {
			if err := e.cache.Release(r); err != nil {
				return err
			}
			if time.Now().After(deadline) {
				s := e.cache.Stats()
				return fmt.Errorf("request of %d tokens: no room for %d L1 pages after %d attempts in %v (L1 %d of %d pages used): %w",
					len(tokens), need, attempt, preemptTimeout, s.DevicePagesUsed, s.DevicePages, err)
			}
			runtime.Gosched()
			continue
		}
		if err != nil {
			return err
		}
		pages := append(append([]pool.PageID(nil), r.DevicePages...), fresh...)
		e.fill(tokens, pages, r.HitTokens, len(tokens))
		return e.cache.Finish(r, tokens, pages)
	}
}
