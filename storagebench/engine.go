package storagebench

import (
	"context"
	"fmt"
	"math/rand/v2"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/kvlayout"
	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/storage"
)

// engine is one client of the backend: its host pool, its keys and the hashes of
// what it put.
type engine struct {
	r       *run
	label   string // "" for the one engine of the main phases
	backend storage.Backend
	group   *pool.Group
	hp      *pool.HostPool
	spec    storage.PoolSpec
	holdAll bool            // the host pool has a page for every page of every batch
	seed    uint64          // of the page contents
	keys    [][]pagekey.Key // per batch
	hashes  [][]uint64      // per batch: page*parts+part
}

// newEngine makes an engine of backend: over group when it is given (already
// registered with backend), else over a host pool of its own, with keys and page
// contents of key set set, distinct from every other set's.
func (r *run) newEngine(ctx context.Context, backend storage.Backend, group *pool.Group, set int, label string) (*engine, error) {
	e := &engine{r: r, label: label, backend: backend, group: group, holdAll: true, seed: r.cfg.Seed}
	if set > 0 {
		e.seed = mix(r.cfg.Seed ^ uint64(set)<<56 ^ 0x7e57)
	}
	if group == nil {
		if err := e.buildPool(); err != nil {
			return nil, err
		}
	} else {
		e.hp = group.Target()
		e.holdAll = r.e.holdAll
	}
	e.spec = storage.SpecOf(e.hp, pagekey.Names{ModelPrefix: r.namespace})
	if group == nil {
		if err := backend.RegisterPool(ctx, e.spec); err != nil {
			return nil, fmt.Errorf("register %s with the %s backend: %w", e.pool(), r.rep.Backend, err)
		}
	}
	r.engines = append(r.engines, e)
	if err := e.makeKeys(set); err != nil {
		return nil, err
	}
	if err := e.checkAbsent(ctx); err != nil {
		return nil, err
	}
	return e, nil
}

// checkAbsent refuses to measure puts that would be skipped: the store is
// write-once, so a put of an object that exists moves no data and would report
// a bandwidth (and a ratio to memcpy) of nothing. The objects go in whole
// batches, so the first key of each tells.
func (e *engine) checkAbsent(ctx context.Context) error {
	present := 0
	for _, keys := range e.keys {
		n, err := e.backend.Exists(ctx, pagekey.TargetPool, keys[:1])
		if err != nil {
			return fmt.Errorf("check that the %s backend does not hold this run's objects yet: %w", e.r.rep.Backend, err)
		}
		present += n
	}
	if present > 0 {
		return fmt.Errorf("%d of %d batches of this run's objects already exist in the %s backend (namespace %q): their puts would be skipped and measure nothing, so no put figure or ratio is reported; use another namespace, or remove them: %w",
			present, len(e.keys), e.r.rep.Backend, e.r.namespace, ErrPutsSkipped)
	}
	return nil
}

// of is "engine 2's " for a labelled engine, "" for the main one.
func (e *engine) of() string {
	if e.label == "" {
		return ""
	}
	return e.label + "'s "
}

// pool names the engine's host pool: "the host pool", "engine 2's host pool".
func (e *engine) pool() string {
	if e.label == "" {
		return "the host pool"
	}
	return e.of() + "host pool"
}

// buildPool allocates the host pool from the backend's allocator: every batch's
// source pages plus one batch of destinations when that fits in half the
// available memory, else one batch of each.
func (e *engine) buildPool() error {
	r := e.r
	base := hostmem.DefaultConfig(hostmem.Mmap)
	base.Available = r.cfg.Available
	alloc, err := storage.HostAllocator(e.backend, base)
	if err != nil {
		return fmt.Errorf("host memory: %w", err)
	}
	ppb := r.cfg.PagesPerBatch
	pages := (r.cfg.Batches + 1) * ppb
	switch {
	case r.target.Warm:
		pages, e.holdAll = 2*ppb, false
	case r.cfg.Batches == 1:
	default:
		if a, err := r.available()(); err == nil && int64(pages)*r.shape.PageBytes() > (a-base.ReserveBytes)/2 {
			pages, e.holdAll = 2*ppb, false
		}
	}
	if !e.holdAll && !r.target.Warm {
		r.rep.Notes = append(r.rep.Notes, fmt.Sprintf("%s holds one batch of sources (%d batches do not fit in half the available memory); "+
			"its pages are refilled before each batch, keys stay distinct", e.pool(), r.cfg.Batches))
	}
	spec := pool.GroupSpec{
		Pools:    []pool.PoolSpec{{Name: pagekey.TargetPool, Geometry: r.shape.Geometry}},
		Layout:   kvlayout.PageFirst,
		PageSize: r.shape.PageSize,
		Pages:    pages,
	}
	r.progress("allocating %s: %s (%s)", e.pool(), formatBytes(spec.Bytes()), alloc.Kind())
	if e.group, err = pool.BuildGroup(spec, alloc); err != nil {
		return fmt.Errorf("%s: %w; lower --pages-per-batch or pick a smaller page shape", e.pool(), err)
	}
	r.groups = append(r.groups, e.group)
	e.hp = e.group.Target()
	return nil
}

// batches is the number of batches an engine has keys for: the timed ones and,
// for a Warm target, the untimed one after them.
func (r *run) batches() int {
	if r.target.Warm {
		return r.cfg.Batches + 1
	}
	return r.cfg.Batches
}

// makeKeys hashes random tokens into one chain of distinct keys, split in batches.
func (e *engine) makeKeys(set int) error {
	r := e.r
	h, err := pagekey.New(pagekey.Config{PageSize: r.shape.PageSize, Algorithm: pagekey.SHA256})
	if err != nil {
		return err
	}
	n := r.batches() * r.cfg.PagesPerBatch
	rng := rand.New(rand.NewPCG(r.cfg.Seed, 0x5eed+uint64(set)))
	tokens := make([]uint32, n*r.shape.PageSize)
	for i := range tokens {
		tokens[i] = rng.Uint32N(128256) // Llama-3's vocabulary
	}
	all := h.Keys(pagekey.Key{}, tokens)
	for _, k := range all {
		if _, dup := r.seen[k]; dup {
			return fmt.Errorf("page keys: %s repeats", k)
		}
		r.seen[k] = struct{}{}
	}
	ppb := r.cfg.PagesPerBatch
	e.keys = make([][]pagekey.Key, r.batches())
	e.hashes = make([][]uint64, r.batches())
	for b := range e.keys {
		e.keys[b] = all[b*ppb : (b+1)*ppb : (b+1)*ppb]
		e.hashes[b] = make([]uint64, ppb*e.parts())
	}
	return nil
}
