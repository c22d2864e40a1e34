package sim

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/stratakv/strata/hicache"
	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/kvlayout"
	"github.com/stratakv/strata/pool"
)

// hicacheRun serves the trace through a hicache.Cache over stand-in device pools
// (L1) and, for strata, host pools (L2).
type hicacheRun struct {
	cache    *hicache.Cache
	kv       *kvModel
	dev      pool.DeviceGroup
	closeDev func() error
	host     *pool.Group
	ps       int
}

type hicacheState struct {
	r     *hicache.Request
	pages []pool.PageID
}

func newHicacheRun(cfg Config, withL2 bool) (*hicacheRun, error) {
	alloc, err := hostmem.New(hostmem.DefaultConfig(hostmem.Mmap))
	if err != nil {
		return nil, err
	}
	specs := cfg.poolSpecs()
	l1Pages := int(cfg.L1Tokens / int64(cfg.PageSize))
	dev, closeDev, err := pool.NewMemDeviceGroup(pool.GroupSpec{Pools: specs, Layout: kvlayout.LayerFirst, PageSize: cfg.PageSize, Pages: l1Pages}, alloc)
	if err != nil {
		return nil, fmt.Errorf("L1 stand-in pools: %w", err)
	}
	h := &hicacheRun{dev: dev, closeDev: closeDev, ps: cfg.PageSize}
	if withL2 {
		h.host, err = pool.BuildGroup(pool.GroupSpec{Pools: specs, Layout: kvlayout.PageFirst, PageSize: cfg.PageSize, Pages: cfg.l2Pages()}, alloc)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("L2 host pools: %w", err), closeDev())
		}
	}
	hc := hicache.DefaultConfig()
	hc.PageSize = cfg.PageSize
	hc.Bigram = cfg.Bigram
	hc.WritePolicy = cfg.WritePolicy
	hc.Eviction = cfg.Eviction
	h.cache, err = hicache.New(hc, dev, h.host)
	if err != nil {
		return nil, errors.Join(err, h.closePools())
	}
	h.kv = newKVModel(dev, 1)
	return h, nil
}

func (h *hicacheRun) admit(a *active) (bool, error) {
	r, err := h.cache.Match(a.req.Prompt)
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
	if r.L2Tokens > 0 || r.Loading() {
		start := time.Now()
		if err := r.Wait(context.Background()); err != nil {
			return false, fmt.Errorf("load of a %d-token hit: %w", r.HitTokens, err)
		}
		a.loadWall = time.Since(start)
	}
	a.hitL1, a.hitL2 = r.L1Tokens, r.L2Tokens
	pages := append(append(make([]pool.PageID, 0, len(r.DevicePages)+len(fresh)), r.DevicePages...), fresh...)
	a.state = &hicacheState{r: r, pages: pages}
	h.verify(a, r.HitTokens/h.ps, pages)
	return false, nil
}

// verify checks every hit page of every pool against the KV function.
func (h *hicacheRun) verify(a *active, pages int, table []pool.PageID) {
	if pages == 0 {
		return
	}
	bad := make([]bool, pages)
	for i := range h.kv.pools {
		h.kv.verify(&h.kv.pools[i], a.hs, table, pages, bad)
	}
	a.verified += int64(pages)
	for _, b := range bad {
		if b {
			a.corrupt++
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
	for i := range h.kv.pools {
		h.kv.fill(&h.kv.pools[i], a.hs, st.pages, len(a.req.Prompt), len(a.tokens))
	}
	return h.cache.Finish(st.r, a.tokens, st.pages)
}

func (h *hicacheRun) report(r *RunReport) {
	_ = h.cache.Sync(context.Background())
	s := h.cache.Stats()
	r.LoadBack = Traffic{Pages: s.LoadBack.Pages, Bytes: s.LoadBack.Bytes, Elapsed: Duration(s.LoadBack.Elapsed)}
	r.Backup = Traffic{Pages: s.Backup.Pages, Bytes: s.Backup.Bytes, Elapsed: Duration(s.Backup.Elapsed)}
	r.EvictedTokens = TierTokens{L1: s.EvictedTokensL1, L2: s.EvictedTokensL2}
}

func (h *hicacheRun) closePools() error {
	var errs []error
	if h.host != nil {
		errs = append(errs, h.host.Close())
	}
	errs = append(errs, h.closeDev())
	return errors.Join(errs...)
}

func (h *hicacheRun) close() error {
	return errors.Join(h.cache.Close(), h.closePools())
}
