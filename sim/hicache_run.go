package sim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/stratakv/strata/hicache"
	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/kvlayout"
	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/storage"
	"github.com/stratakv/strata/storage/file"
	"github.com/stratakv/strata/storage/nodeclient"
)

// hicacheRun serves the trace through a hicache.Cache over stand-in device pools
// (L1) and, for strata, host pools (L2) and an L3 backend.
type hicacheRun struct {
	cache    *hicache.Cache
	match    func(context.Context, *active, hicache.MatchOptions) (*hicache.Request, error)
	kv       *kvModel
	dev      pool.DeviceGroup
	closeDev func() error
	host     *pool.Group
	backend  storage.Backend
	cleanup  func() error // removes a temporary L3 directory
	warmup   *Warmup      // the embedded node service's start, waited out
	ps       int
	l1Pages  int
	l3       string
	// mu guards what follows, which a concurrent replay's goroutines share.
	mu       sync.Mutex
	computed map[uint64]struct{} // pages (by prefix digest) this engine computed, when tracked
	l3Hits   []uint64            // every L3 hit page's prefix digest, when tracked
	cross    int64               // L3 hit tokens of pages another engine computed
	// held counts the running requests' L1 pages by prefix digest (their whole
	// pages are shared, their partial last pages their own), for roomFor.
	held map[uint64]int
}

var _ concurrentRun = (*hicacheRun)(nil)

// trackComputed makes the run record which pages it computed and which it had
// from L3, and count L3 hits of pages it never computed itself.
func (h *hicacheRun) trackComputed() { h.computed = map[uint64]struct{}{} }

type hicacheState struct {
	r        *hicache.Request
	pages    []pool.PageID
	prefetch *hicache.Prefetch
}

func newHicacheRun(cfg Config, withL2, withL3 bool) (h *hicacheRun, err error) {
	h = &hicacheRun{ps: cfg.PageSize, closeDev: func() error { return nil }, held: map[uint64]int{}}
	defer func() {
		if err != nil {
			err = errors.Join(err, h.closeAll())
		}
	}()
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if withL3 && cfg.L3 != L3None {
		if h.backend, h.cleanup, h.warmup, err = newBackend(cfg, log); err != nil {
			return h, err
		}
		h.l3 = cfg.L3
	}
	alloc, err := hostmem.New(hostmem.DefaultConfig(hostmem.Mmap))
	if err != nil {
		return h, err
	}
	specs := cfg.poolSpecs()
	l1Pages := int(cfg.L1Tokens / int64(cfg.PageSize))
	h.l1Pages = l1Pages
	if h.dev, h.closeDev, err = pool.NewMemDeviceGroup(pool.GroupSpec{Pools: specs, Layout: kvlayout.LayerFirst, PageSize: cfg.PageSize, Pages: l1Pages}, alloc); err != nil {
		return h, fmt.Errorf("L1 stand-in pools: %w", err)
	}
	if withL2 {
		// The host group takes the backend's allocator, for every pool.
		hostAlloc, err := storage.HostAllocator(h.backend, hostmem.DefaultConfig(hostmem.Mmap))
		if err != nil {
			return h, err
		}
		if h.host, err = pool.BuildGroup(pool.GroupSpec{Pools: specs, Layout: kvlayout.PageFirst, PageSize: cfg.PageSize, Pages: cfg.l2Pages()}, hostAlloc); err != nil {
			return h, fmt.Errorf("L2 host pools: %w", err)
		}
	}
	hc := hicache.DefaultConfig()
	hc.PageSize = cfg.PageSize
	hc.Bigram = cfg.Bigram
	hc.WritePolicy = cfg.WritePolicy
	hc.Eviction = cfg.Eviction
	hc.L3.PrefetchPolicy = cfg.PrefetchPolicy
	hc.L3.DraftPolicy = cfg.DraftPolicy
	hc.L3.Names = pagekey.Names{ModelPrefix: cfg.Model.Name}
	if cfg.L3Namespace != "" {
		hc.L3.Names.ModelPrefix += "-" + cfg.L3Namespace // file names allow no "/"
	}
	if h.cache, err = hicache.New(hc, h.dev, h.host, hicache.Options{Storage: h.backend, Logger: log}); err != nil {
		return h, err
	}
	h.kv = newKVModel(h.dev, 1)
	h.match = func(ctx context.Context, a *active, opts hicache.MatchOptions) (*hicache.Request, error) {
		return h.cache.Match(ctx, a.req.Prompt, opts)
	}
	if cfg.overlongServed != nil {
		h.match = newOverlongMatch(h.cache, h.kv, h.ps, cfg.overlongServed).match
	}
	return h, nil
}

// newBackend opens the configured L3 backend; cleanup removes what the bench
// made. A node service it starts is ready when it returns (warmup says how
// its start went).
func newBackend(cfg Config, log *slog.Logger) (storage.Backend, func() error, *Warmup, error) {
	switch cfg.L3 {
	case L3File:
		dir, cleanup := cfg.L3Dir, func() error { return nil }
		if dir == "" {
			tmp, err := os.MkdirTemp("", "strata-bench-l3-")
			if err != nil {
				return nil, nil, nil, fmt.Errorf("L3 directory: %w", err)
			}
			dir, cleanup = tmp, func() error { return cfg.cleanup.remove(tmp) }
		}
		fc := file.DefaultConfig(dir)
		fc.Logger = log
		if cfg.L3CapacityBytes > 0 {
			fc.CapacityBytes = cfg.L3CapacityBytes
		}
		b, err := file.New(fc)
		if err != nil {
			return nil, nil, nil, errors.Join(err, cleanup())
		}
		return b, cleanup, nil, nil
	case L3Node:
		socket, cleanup := cfg.NodeSocket, func() error { return nil }
		var warmup *Warmup
		if socket == "" {
			started := time.Now()
			srv, dir, err := startEmbeddedNode(cfg, log)
			if err != nil {
				return nil, nil, nil, err
			}
			socket = srv.Socket()
			cleanup = func() error { return errors.Join(srv.Close(), cfg.cleanup.remove(dir)) }
			if warmup, err = cfg.awaitEmbedded(context.Background(), started, srv); err != nil {
				return nil, nil, nil, errors.Join(err, cleanup())
			}
		}
		nc := nodeclient.DefaultConfig(socket)
		nc.ClientName = fmt.Sprintf("strata-bench-%d", os.Getpid())
		nc.Logger = log
		b, err := nodeclient.New(nc)
		if err != nil {
			return nil, nil, nil, errors.Join(err, cleanup())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := b.WaitConnected(ctx); err != nil {
			return nil, nil, nil, errors.Join(fmt.Errorf("node service at %s: %w", socket, err), b.Close(), cleanup())
		}
		return b, func() error { return cleanup() }, warmup, nil
	case L3Redis:
		b, err := openRedis(cfg, log)
		if err != nil {
			return nil, nil, nil, err
		}
		return b, func() error { return nil }, nil, nil
	}
	return nil, nil, nil, fmt.Errorf("L3 backend %q: %w", cfg.L3, ErrConfig)
}

// arrive starts the request's L3 prefetch, unless one is under way. Called again
// while the request waits (the event loop does, for the request next in line), it
// starts one when pages it found in L1 or L2 before have been evicted since.
func (h *hicacheRun) arrive(a *active) {
	if h.backend == nil {
		return
	}
	if st, ok := a.state.(*hicacheState); ok && st.prefetch != nil {
		return
	}
	a.state = &hicacheState{prefetch: h.cache.Prefetch(a.req.Prompt, pagekey.Namespace{})}
}

func (h *hicacheRun) settle() error {
	if h.backend == nil {
		return nil
	}
	return h.cache.Sync(context.Background())
}

// pageDigests calls fn with the prefix digest of each L1 page a holds while it
// runs: its whole pages and its partial last page, prompt and output.
func (h *hicacheRun) pageDigests(a *active, fn func(d uint64) bool) {
	for end := h.ps; ; end += h.ps {
		last := min(end, len(a.tokens))
		if last == 0 || !fn(a.hs[last-1]) || last == len(a.tokens) {
			return
		}
	}
}

// roomFor reports whether L1 holds a's pages beside the running requests' (the
// pages it shares with them counted once), as a scheduler checks before it
// takes a request. A request that does not fit waits unmatched, its L3 prefetch
// holding the host pages it brought; matched and released to wait (as the loop
// once did), those became ordinary L2 pages that the running requests' backups
// evicted before it got room.
func (h *hicacheRun) roomFor(a *active) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	need, shared := 0, true
	h.pageDigests(a, func(d uint64) bool {
		if shared && h.held[d] > 0 {
			return true
		}
		shared = false
		need++
		return true
	})
	return len(h.held)+need <= h.l1Pages
}

// hold adds (n 1) or removes (n -1) a's pages from held.
func (h *hicacheRun) hold(a *active, n int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pageDigests(a, func(d uint64) bool {
		if h.held[d] += n; h.held[d] <= 0 {
			delete(h.held, d)
		}
		return true
	})
}

func (h *hicacheRun) admit(a *active) (bool, error) {
	var prefetch *hicache.Prefetch
	if st, ok := a.state.(*hicacheState); ok && st.prefetch != nil {
		prefetch, st.prefetch = st.prefetch, nil // a Prefetch serves one Match
		<-prefetch.Done()
		a.fetchWall = prefetch.Elapsed()
	}
	r, err := h.match(context.Background(), a, hicache.MatchOptions{Prefetch: prefetch})
	if err != nil {
		return false, err
	}
	need := (len(a.tokens)+h.ps-1)/h.ps - len(r.DevicePages)
	fresh, err := h.cache.AllocDevice(need)
	if errors.Is(err, hicache.ErrDeviceFull) {
		if err := r.Wait(context.Background()); err != nil {
			return false, err
		}
		return true, h.cache.Release(r)
	}
	if err != nil {
		return false, err
	}
	if r.L2Tokens+r.L3Tokens > 0 || r.Loading() {
		start := time.Now()
		if err := r.Wait(context.Background()); err != nil {
			return false, fmt.Errorf("load of a %d-token hit: %w", r.HitTokens, err)
		}
		a.loadWall = time.Since(start)
	}
	a.hitL1, a.hitL2, a.hitL3 = r.L1Tokens, r.L2Tokens, r.L3Tokens
	if h.computed != nil {
		h.mu.Lock()
		for p := (r.L1Tokens + r.L2Tokens) / h.ps; p < r.HitTokens/h.ps; p++ {
			d := a.hs[(p+1)*h.ps-1]
			h.l3Hits = append(h.l3Hits, d)
			if _, mine := h.computed[d]; !mine {
				h.cross += int64(h.ps)
			}
		}
		h.mu.Unlock()
	}
	pages := append(append(make([]pool.PageID, 0, len(r.DevicePages)+len(fresh)), r.DevicePages...), fresh...)
	a.state = &hicacheState{r: r, pages: pages}
	h.hold(a, 1)
	h.verify(a, r, pages)
	return false, nil
}

// verify checks every hit page of every pool against the KV function (the draft
// pools' pages that the engine must recompute excepted), then recomputes those.
func (h *hicacheRun) verify(a *active, r *hicache.Request, table []pool.PageID) {
	pages := r.HitTokens / h.ps
	if pages == 0 {
		return
	}
	bad := make([]bool, pages)
	recomputeFrom := r.DraftRecomputeFrom / h.ps
	for i := range h.kv.pools {
		p := &h.kv.pools[i]
		n := pages
		if p.draft && r.DraftRecomputeTokens > 0 {
			n = recomputeFrom
		}
		h.kv.verify(p, a.hs, table, n, bad)
	}
	a.verified += int64(pages)
	for _, b := range bad {
		if b {
			a.corrupt++
		}
	}
	if r.DraftRecomputeTokens > 0 {
		a.draftRecompute += int64(r.DraftRecomputeTokens / h.ps)
		for i := range h.kv.pools {
			if p := &h.kv.pools[i]; p.draft {
				h.kv.fill(p, a.hs, table, r.DraftRecomputeFrom, r.DraftRecomputeFrom+r.DraftRecomputeTokens)
			}
		}
	}
}

func (h *hicacheRun) prefill(a *active) {
	st := a.state.(*hicacheState)
	for i := range h.kv.pools {
		h.kv.fill(&h.kv.pools[i], a.hs, st.pages, a.hit(), len(a.req.Prompt))
	}
}

func (h *hicacheRun) finish(a *active) error {
	st := a.state.(*hicacheState)
	if h.computed != nil {
		// The hit's pages came from the cache; the rest this engine prefilled or
		// decoded.
		h.mu.Lock()
		for p := a.hit() / h.ps; (p+1)*h.ps <= len(a.tokens); p++ {
			h.computed[a.hs[(p+1)*h.ps-1]] = struct{}{}
		}
		h.mu.Unlock()
	}
	for i := range h.kv.pools {
		h.kv.fill(&h.kv.pools[i], a.hs, st.pages, len(a.req.Prompt), len(a.tokens))
	}
	h.hold(a, -1)
	return h.cache.Finish(st.r, a.tokens, st.pages)
}

// insert caches the prompt's whole pages (Cache.Insert) after prefill. Where the
// cache already had a page, another request computed it meanwhile, and the page
// table now names the cache's copy: it is checked as a hit page is, since the
// request reads it from now on.
func (h *hicacheRun) insert(a *active) error {
	st := a.state.(*hicacheState)
	n := (len(a.req.Prompt) + h.ps - 1) / h.ps
	prefix, err := h.cache.Insert(st.r, a.req.Prompt, st.pages[:n])
	if err != nil {
		return err
	}
	own := st.pages[:len(prefix)]
	var swapped []pool.PageID // the cache's pages, in place in a table of the request's own otherwise
	for i, p := range prefix {
		if p != own[i] {
			if swapped == nil {
				swapped = slices.Clone(own)
			}
			swapped[i] = p
		}
	}
	if swapped == nil {
		return nil
	}
	// The cache's pages may still be being written by a load another request
	// started (Insert adds it to the request's loads): an engine waits before it
	// reads them, and so does the check.
	if st.r.Loading() {
		if err := st.r.Wait(context.Background()); err != nil {
			return fmt.Errorf("load of the cache's pages after an insert: %w", err)
		}
	}
	bad := make([]bool, len(prefix))
	for i := range h.kv.pools {
		h.kv.verify(&h.kv.pools[i], a.hs, swapped, len(prefix), bad)
	}
	for i, p := range prefix {
		if p != own[i] {
			a.verified++
			if bad[i] {
				a.corrupt++
			}
		}
	}
	copy(st.pages, prefix)
	return nil
}

// drain waits for the cache's copies, L3 or not.
func (h *hicacheRun) drain() error { return h.cache.Sync(context.Background()) }

func (h *hicacheRun) pageGeometry() (int, int) { return h.ps, h.l1Pages }

func (h *hicacheRun) report(r *RunReport) {
	_ = h.cache.Sync(context.Background())
	s := h.cache.Stats()
	r.LoadBack = Traffic{Pages: s.LoadBack.Pages, Bytes: s.LoadBack.Bytes, Elapsed: Duration(s.LoadBack.Elapsed)}
	r.Backup = Traffic{Pages: s.Backup.Pages, Bytes: s.Backup.Bytes, Elapsed: Duration(s.Backup.Elapsed)}
	r.EvictedTokens = TierTokens{L1: s.EvictedTokensL1, L2: s.EvictedTokensL2}
	if h.backend == nil {
		return
	}
	l3 := &L3Report{
		Backend:          h.l3,
		BytesRead:        s.L3.BytesRead,
		BytesWritten:     s.L3.BytesWritten,
		PrefetchedTokens: s.L3.PrefetchedTokens,
		Prefetch: PrefetchOutcomes{
			Completed:      s.L3.Prefetch.Completed,
			TimedOut:       s.L3.Prefetch.TimedOut,
			BelowThreshold: s.L3.Prefetch.BelowThreshold,
			Canceled:       s.L3.Prefetch.Canceled,
			NoRoom:         s.L3.Prefetch.NoRoom,
			Stale:          s.L3.Prefetch.Stale,
		},
		Faults:      s.L3.Faults,
		Refills:     s.L3.Refills,
		RefillPages: s.L3.RefillPages,
		Outage:      outageOf(h.backend),
	}
	for _, p := range s.L3.Pools {
		l3.Pools = append(l3.Pools, PoolL3Status{Pool: p.Pool, Enabled: p.Enabled, Reason: p.Reason})
	}
	r.L3 = l3
}

func (h *hicacheRun) closeAll() error {
	var errs []error
	if h.cache != nil {
		errs = append(errs, h.cache.Close())
	}
	// The backend goes before the pools it maps: a node client reconnecting must
	// not register memory that is being unmapped.
	if h.backend != nil {
		errs = append(errs, h.backend.Close())
	}
	if h.host != nil {
		errs = append(errs, h.host.Close())
	}
	errs = append(errs, h.closeDev())
	if h.cleanup != nil {
		errs = append(errs, h.cleanup())
	}
	return errors.Join(errs...)
}

func (h *hicacheRun) close() error { return h.closeAll() }
