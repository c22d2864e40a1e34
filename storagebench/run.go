package storagebench

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"time"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/kvlayout"
	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/storage"
)

// Run measures one backend as cfg describes and returns the report. It puts
// cfg.Batches batches of distinct pages, evicts what caches it can, gets every
// batch back into other host pages and checks each page's bytes, and times the
// peers (and Redis, for a target that has it) on the same host memory, the
// batches interleaved and their order rotated so that drift of the device over the
// run falls on every contender alike. Then it times Exists. For a target with a
// Pair peer it then runs the put and get phases again with Config.Engines
// engines at once.
// A page that fails Put or Get fails the run; a page that comes back with other
// bytes is counted in MismatchedPages.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	started := time.Now()
	shape := cfg.shape()
	newTarget := cfg.NewTarget
	name := "custom"
	if newTarget == nil {
		newTarget, _ = targetByName(cfg.Backend)
		name = cfg.Backend
	}
	parent := cfg.Dir
	if parent == "" {
		parent = os.TempDir()
	}
	scratch, err := os.MkdirTemp(parent, "strata-bench-tiers-")
	if err != nil {
		return nil, fmt.Errorf("scratch directory: %w", err)
	}
	r := &run{cfg: cfg, shape: shape, scratch: scratch, seen: map[pagekey.Key]struct{}{}, namespace: cfg.Namespace}
	if r.namespace == "" {
		var b [6]byte
		_, _ = crand.Read(b[:])
		r.namespace = "tiers-" + hex.EncodeToString(b[:])
	}
	r.rep = &Report{
		Backend:       name,
		Shape:         shape.Name,
		Geometry:      shape.Geometry.String() + fmt.Sprintf(", %d tokens", shape.PageSize),
		PageBytes:     shape.PageBytes(),
		PartBytes:     shape.PartBytes(),
		PagesPerBatch: cfg.PagesPerBatch,
		Batches:       cfg.Batches,
		Bytes:         int64(cfg.Batches) * int64(cfg.PagesPerBatch) * shape.PageBytes(),
		Notes:         []string{},
	}
	err = r.run(ctx, newTarget)
	if cerr := r.close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	r.rep.ElapsedSeconds = time.Since(started).Seconds()
	return r.rep, nil
}

// run is one benchmark run's state.
type run struct {
	cfg     Config
	shape   Shape
	scratch string
	rep     *Report

	target      Target
	targetBuilt bool
	backends    []storage.Backend // every backend opened, to close
	groups      []*pool.Group     // every host pool group built, to close
	e           *engine           // the one engine of the main phases
	seen        map[pagekey.Key]struct{}
	peersClosed bool
	namespace   string    // prefixes every object name
	engines     []*engine // every engine made, whose objects Remove takes
}

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

func (r *run) progress(format string, args ...any) {
	if r.cfg.Progress != nil {
		fmt.Fprintf(r.cfg.Progress, "bench tiers: "+format+"\n", args...)
	}
}

// batchProgress reports batch b (0-based) of a phase: every batch of a short run,
// and about every tenth of a long one (a run of 300 small batches printed 1,800
// lines).
func (r *run) batchProgress(phase string, b int) {
	n := r.cfg.Batches
	if step := max(1, n/10); n <= 20 || b == 0 || (b+1)%step == 0 || b+1 == n {
		r.progress("%s batch %d/%d", phase, b+1, n)
	}
}

func (r *run) batchBytes() int64 { return int64(r.cfg.PagesPerBatch) * r.shape.PageBytes() }

func (r *run) available() func() (int64, error) {
	if r.cfg.Available != nil {
		return r.cfg.Available
	}
	return hostmem.AvailableBytes
}

func (r *run) run(ctx context.Context, newTarget TargetFunc) error {
	var err error
	r.target, err = newTarget(Scratch{Dir: r.scratch, Bytes: r.rep.Bytes, BatchBytes: r.batchBytes(), ObjectBytes: r.shape.PartBytes(), Engines: r.cfg.engines(), Socket: r.cfg.Socket,
		NoRedis: r.cfg.NoRedis, Redis: r.cfg.Redis, RedisCluster: r.cfg.RedisCluster, Keep: r.cfg.Keep,
		Available: r.available(), Progress: r.progress})
	if err != nil {
		return err
	}
	r.targetBuilt = true
	if r.target.Name != "" {
		r.rep.Backend = r.target.Name
	}
	if r.target.New == nil || r.target.Peer == nil {
		return fmt.Errorf("target %s: no backend constructor or no peer: %w", r.rep.Backend, ErrConfig)
	}
	r.rep.BackendSettings = r.target.Describe
	r.rep.Notes = append(r.rep.Notes, r.target.Notes...)
	if r.cfg.ObjectBytes != 0 && r.cfg.ObjectBytes < 1<<20 {
		r.rep.Notes = append(r.rep.Notes, fmt.Sprintf("objects of %s: the work per object (lookups, leases, framing), not the copy, sets the pace, "+
			"so the memcpy ratio is low by nature; the Redis columns (and the redis-benchmark line) are the comparison that matters", formatBytes(int64(r.cfg.ObjectBytes))))
	}
	backend, err := r.open(ctx)
	if err != nil {
		return err
	}
	if r.e, err = r.newEngine(ctx, backend, nil, 0, ""); err != nil {
		return err
	}
	r.rep.HostAllocator = string(r.e.group.AllocatorKind())
	r.rep.HostPoolBytes = r.e.hp.Region().Size()
	if r.target.Warm {
		if r.rep.ColdPutGBps, r.rep.ColdGetGBps, err = r.e.warmUp(ctx); err != nil {
			return err
		}
		r.rep.Notes = append(r.rep.Notes, "each engine's host pool holds one batch of sources, refilled before each batch as an engine reuses its pool, "+
			"and one of destinations; one untimed batch went through it first, so the figures are those of a pool in use "+
			"(that cold batch's figures are reported apart; the service maps a pool's pages when it is registered, so they are close)")
	}
	if r.e.holdAll {
		r.progress("filling %s of pages", formatBytes(r.rep.Bytes))
		for b := range r.cfg.Batches {
			r.e.fill(b)
		}
	}
	if err := r.putGetPhases(ctx); err != nil {
		return err
	}
	if err := r.existsPhase(ctx); err != nil {
		return err
	}
	if err := r.redisBenchmarkPhase(ctx); err != nil {
		return err
	}
	r.describePeers()
	// The one-engine peers (and Redis) give their memory back before the engines
	// need theirs.
	if err := r.closePeers(); err != nil {
		return err
	}
	if r.target.Pair != nil {
		if err := r.enginesPhase(ctx); err != nil {
			return err
		}
	}
	r.finishReport()
	return nil
}

// open opens one backend from the target and keeps it to close.
func (r *run) open(ctx context.Context) (storage.Backend, error) {
	b, err := r.target.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("open %s backend: %w", r.rep.Backend, err)
	}
	r.backends = append(r.backends, b)
	return b, nil
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

// removeWritten removes every object the run wrote from a store that outlives it.
func (r *run) removeWritten() error {
	if r.cfg.Keep || !r.targetBuilt || r.target.Remove == nil || len(r.engines) == 0 {
		return nil
	}
	var names []string
	for _, e := range r.engines {
		for b := range e.keys {
			names = append(names, e.names(b)...)
		}
	}
	r.progress("removing the run's %d objects from the %s backend", len(names), r.rep.Backend)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := r.target.Remove(ctx, names); err != nil {
		return fmt.Errorf("remove the run's objects from the %s backend: %w", r.rep.Backend, err)
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

func (e *engine) parts() int { return e.r.shape.Geometry.Buffers() }

// srcPages are the host pages batch b is put from.
func (e *engine) srcPages(b int) []pool.PageID {
	first := 0
	if e.holdAll {
		first = b * e.r.cfg.PagesPerBatch
	}
	return pageRange(first, e.r.cfg.PagesPerBatch)
}

// dstPages are the host pages every batch is read back into: the pool's last batch.
func (e *engine) dstPages() []pool.PageID {
	return pageRange(e.group.Pages()-e.r.cfg.PagesPerBatch, e.r.cfg.PagesPerBatch)
}

func pageRange(first, n int) []pool.PageID {
	out := make([]pool.PageID, n)
	for i := range out {
		out[i] = pool.PageID(first + i)
	}
	return out
}

// chunks returns the object parts of pages in host memory, page by page, K before V.
func (e *engine) chunks(pages []pool.PageID) [][]byte {
	out := make([][]byte, 0, len(pages)*e.parts())
	for _, p := range pages {
		for part := range e.parts() {
			b, ok := e.hp.PageBuffer(part, p)
			if !ok {
				panic(fmt.Sprintf("storagebench: page %d part %d of a page_first pool is not contiguous", p, part))
			}
			out = append(out, b)
		}
	}
	return out
}

// names returns the object names of batch b's chunks, in the order of chunks: the
// names the backend stores them under.
func (e *engine) names(b int) []string {
	out := make([]string, 0, len(e.keys[b])*e.parts())
	for _, k := range e.keys[b] {
		out = append(out, storage.ObjectNames(e.spec, k)...)
	}
	return out
}

// fill writes batch b's contents into its source pages and records their hashes.
func (e *engine) fill(b int) {
	chunks := e.chunks(e.srcPages(b))
	parts := e.parts()
	_ = parallel(context.Background(), runtime.GOMAXPROCS(0), len(chunks), func(i int) error {
		fillChunk(chunks[i], chunkSeed(e.seed, b, i/parts, i%parts))
		e.hashes[b][i] = hashChunk(chunks[i])
		return nil
	})
}

// verify counts the pages of batch b whose bytes in dst differ from what was put.
func (e *engine) verify(b int, dst [][]byte) int64 {
	parts := e.parts()
	bad := make([]bool, len(dst))
	_ = parallel(context.Background(), runtime.GOMAXPROCS(0), len(dst), func(i int) error {
		bad[i] = hashChunk(dst[i]) != e.hashes[b][i]
		return nil
	})
	var pages int64
	for p := 0; p < len(dst)/parts; p++ {
		if slices.Contains(bad[p*parts:(p+1)*parts], true) {
			pages++
		}
	}
	return pages
}

// warmUp puts and gets the untimed batch after the timed ones through e's host
// pool, checks it, and returns its bandwidths.
func (e *engine) warmUp(ctx context.Context) (put, get float64, err error) {
	r := e.r
	b := r.cfg.Batches
	r.progress("%swarm-up batch (untimed)", e.of())
	e.fill(b)
	start := time.Now()
	errs := e.backend.Put(ctx, pagekey.TargetPool, e.keys[b], e.srcPages(b))
	put = rate(float64(r.batchBytes()), time.Since(start))
	if err := batchError(e.of()+"warm-up put", b, errs); err != nil {
		return 0, 0, err
	}
	dst := e.chunks(e.dstPages())
	clearAll(dst)
	start = time.Now()
	errs = e.backend.Get(ctx, pagekey.TargetPool, e.keys[b], e.dstPages())
	get = rate(float64(r.batchBytes()), time.Since(start))
	if err := batchError(e.of()+"warm-up get", b, errs); err != nil {
		return 0, 0, err
	}
	r.rep.MismatchedPages += e.verify(b, dst)
	return put, get, nil
}

// clearAll zeroes the chunks, so that a get that writes nothing is caught.
func clearAll(chunks [][]byte) {
	_ = parallel(context.Background(), runtime.GOMAXPROCS(0), len(chunks), func(i int) error {
		clear(chunks[i])
		return nil
	})
}

// contender is one of the things timed on each batch.
type contender struct {
	name  string
	times []time.Duration
	do    func(ctx context.Context, b int) (time.Duration, error)
}

// rotate runs the contenders on batch b in an order that shifts by one each batch.
func rotate(ctx context.Context, cs []*contender, b int) error {
	for i := range cs {
		c := cs[(b+i)%len(cs)]
		if err := ctx.Err(); err != nil {
			return err
		}
		d, err := c.do(ctx, b)
		if err != nil {
			return err
		}
		c.times = append(c.times, d)
	}
	return nil
}

// peerWrite times peer p storing engine e's batch b, under the backend's names
// when p keeps names.
func peerWrite(e *engine, p Peer) func(context.Context, int) (time.Duration, error) {
	return func(ctx context.Context, b int) (time.Duration, error) {
		src := e.chunks(e.srcPages(b))
		var d time.Duration
		var err error
		if np, ok := p.(NamedPeer); ok {
			d, err = np.WriteNamed(ctx, e.names(b), src)
		} else {
			d, err = p.Write(ctx, src)
		}
		if err != nil {
			return 0, fmt.Errorf("peer %s: batch %d: %w", p.Name(), b, err)
		}
		return d, nil
	}
}

// peerRead times peer p reading engine e's batch b back into dst, and adds the
// pages that came back wrong to *bad.
func peerRead(e *engine, p Peer, dst [][]byte, bad *int64) func(context.Context, int) (time.Duration, error) {
	return func(ctx context.Context, b int) (time.Duration, error) {
		clearAll(dst)
		var d time.Duration
		var err error
		if np, ok := p.(NamedPeer); ok {
			d, err = np.ReadNamed(ctx, e.names(b), dst)
		} else {
			d, err = p.Read(ctx, dst)
		}
		if err != nil {
			return 0, fmt.Errorf("peer %s: batch %d: %w", p.Name(), b, err)
		}
		*bad += e.verify(b, dst)
		return d, nil
	}
}

// phase is the contenders timed on each batch in one direction, and how their
// times go into the report once every batch has run.
type phase struct {
	cs     []*contender
	report func()
}

func (r *run) putContenders() phase {
	e := r.e
	backend := &contender{name: "backend", do: func(ctx context.Context, b int) (time.Duration, error) {
		start := time.Now()
		errs := e.backend.Put(ctx, pagekey.TargetPool, e.keys[b], e.srcPages(b))
		d := time.Since(start)
		return d, batchError("put", b, errs)
	}}
	peer := &contender{name: "peer", do: peerWrite(e, r.target.Peer)}
	cs := []*contender{backend, peer}
	var stream, redis *contender
	if r.target.Stream != nil {
		stream = &contender{name: "stream", do: peerWrite(e, r.target.Stream)}
		cs = append(cs, stream)
	}
	if r.target.Redis != nil {
		redis = &contender{name: "redis", do: peerWrite(e, r.target.Redis)}
		cs = append(cs, redis)
	}
	return phase{cs: cs, report: func() {
		r.rep.PutGBps, r.rep.PutBatchGBps = r.gbps(backend.times)
		r.rep.PeerPutGBps, _ = r.gbps(peer.times)
		r.rep.PutRatioBatches = pairedRatios(backend.times, peer.times)
		if stream != nil {
			r.rep.StreamPutGBps, _ = r.gbps(stream.times)
			// A store's put is held to the better of the two ways the disk can take
			// the same bytes: many files at once, or one stream.
			r.rep.PutRatioBatches = pairedRatios(backend.times, peer.times, stream.times)
			r.rep.Notes = append(r.rep.Notes, "the put ratio is against the faster of the peer and the one stream on each batch")
		}
		if redis != nil {
			r.rep.RedisPutGBps, r.rep.RedisPutBatchGBps = r.gbps(redis.times)
			r.rep.PutVsRedisBatches = pairedRatios(backend.times, redis.times)
		}
	}}
}

func (r *run) getContenders() phase {
	e := r.e
	dstPages := e.dstPages()
	dst := e.chunks(dstPages)
	backend := &contender{name: "backend", do: func(ctx context.Context, b int) (time.Duration, error) {
		clearAll(dst)
		start := time.Now()
		errs := e.backend.Get(ctx, pagekey.TargetPool, e.keys[b], dstPages)
		d := time.Since(start)
		if err := batchError("get", b, errs); err != nil {
			return 0, err
		}
		r.rep.MismatchedPages += e.verify(b, dst)
		return d, nil
	}}
	var peerBad, redisBad int64
	peer := &contender{name: "peer", do: peerRead(e, r.target.Peer, dst, &peerBad)}
	cs := []*contender{backend, peer}
	var stream, redis *contender
	if r.target.Stream != nil {
		stream = &contender{name: "stream", do: peerRead(e, r.target.Stream, dst, &peerBad)}
		cs = append(cs, stream)
	}
	if r.target.Redis != nil {
		redis = &contender{name: "redis", do: peerRead(e, r.target.Redis, dst, &redisBad)}
		cs = append(cs, redis)
	}
	return phase{cs: cs, report: func() {
		if peerBad > 0 {
			r.rep.Notes = append(r.rep.Notes, fmt.Sprintf("the peers read back %d pages with wrong bytes: the disk or the peer is broken, the ratios mean nothing", peerBad))
		}
		if redisBad > 0 {
			r.rep.Notes = append(r.rep.Notes, fmt.Sprintf("redis read back %d pages with wrong bytes: its figures mean nothing", redisBad))
		}
		r.rep.GetGBps, r.rep.GetBatchGBps = r.gbps(backend.times)
		r.rep.PeerGetGBps, _ = r.gbps(peer.times)
		r.rep.GetRatioBatches = pairedRatios(backend.times, peer.times)
		if stream != nil {
			r.rep.StreamGetGBps, _ = r.gbps(stream.times)
		}
		if redis != nil {
			r.rep.RedisGetGBps, r.rep.RedisGetBatchGBps = r.gbps(redis.times)
			r.rep.GetVsRedisBatches = pairedRatios(backend.times, redis.times)
		}
	}}
}

// putGetPhases times every batch's puts, then (after the target's DropCache)
// every batch's gets; for a PerBatch target, each batch's gets right after its
// puts, and the batch forgotten before the next (but the last, kept for Exists).
func (r *run) putGetPhases(ctx context.Context) error {
	e := r.e
	put, get := r.putContenders(), r.getContenders()
	for b := range r.cfg.Batches {
		if !e.holdAll {
			e.fill(b)
		}
		r.batchProgress("put", b)
		if err := rotate(ctx, put.cs, b); err != nil {
			return err
		}
		if !r.target.PerBatch {
			continue
		}
		r.batchProgress("get", b)
		if err := rotate(ctx, get.cs, b); err != nil {
			return err
		}
		// The last batch stays for the exists calls.
		if r.target.Forget != nil && b < r.cfg.Batches-1 {
			if err := r.target.Forget(ctx, e.names(b)); err != nil {
				return fmt.Errorf("remove batch %d from the %s backend: %w", b+1, r.rep.Backend, err)
			}
		}
	}
	put.report()
	if !r.target.PerBatch {
		if r.target.DropCache != nil {
			if err := r.target.DropCache(ctx); err != nil {
				return fmt.Errorf("evict the %s backend's pages from the page cache: %w", r.rep.Backend, err)
			}
		}
		for b := range r.cfg.Batches {
			r.batchProgress("get", b)
			if err := rotate(ctx, get.cs, b); err != nil {
				return err
			}
		}
	}
	get.report()
	return nil
}

// batchError turns a batch's per-key results into one error naming how many pages
// failed and the first failure.
func batchError(op string, b int, errs []error) error {
	failed, first := 0, -1
	for i, err := range errs {
		if err != nil {
			failed++
			if first < 0 {
				first = i
			}
		}
	}
	if failed == 0 {
		return nil
	}
	return fmt.Errorf("%s batch %d: %d of %d pages failed; page %d: %w", op, b, failed, len(errs), first, errs[first])
}

// gbps is the bandwidth over every batch and of each batch.
func (r *run) gbps(times []time.Duration) (float64, []float64) {
	return gbpsOf(float64(r.batchBytes()), times)
}

// gbpsOf is the bandwidth over every batch and of each batch, batch bytes each.
func gbpsOf(batch float64, times []time.Duration) (float64, []float64) {
	var sum time.Duration
	per := make([]float64, len(times))
	for i, d := range times {
		sum += d
		per[i] = rate(batch, d)
	}
	return rate(batch*float64(len(times)), sum), per
}

func rate(bytes float64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return bytes / d.Seconds() / 1e9
}

func (r *run) existsPhase(ctx context.Context) error {
	n := r.cfg.ExistsCalls
	if n == 0 {
		return nil
	}
	e := r.e
	r.progress("%d exists calls", n)
	times := make([]time.Duration, 0, n)
	short := 0
	for c := range n {
		b := c % r.cfg.Batches
		if r.target.PerBatch {
			b = r.cfg.Batches - 1 // the others were forgotten
		}
		keys := e.keys[b]
		start := time.Now()
		got, err := e.backend.Exists(ctx, pagekey.TargetPool, keys)
		times = append(times, time.Since(start))
		if err != nil {
			return fmt.Errorf("exists call %d: %w", c, err)
		}
		if got != len(keys) {
			short++
		}
	}
	if short > 0 {
		r.rep.Notes = append(r.rep.Notes, fmt.Sprintf("%d of %d exists calls found fewer keys than were put", short, n))
	}
	slices.Sort(times)
	r.rep.ExistsCalls, r.rep.ExistsKeys = n, r.cfg.PagesPerBatch
	r.rep.ExistsP50us = percentile(times, 0.50).Seconds() * 1e6
	r.rep.ExistsP99us = percentile(times, 0.99).Seconds() * 1e6
	return nil
}

// percentile is the nearest-rank percentile of sorted durations.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// describePeers names the peers in the report and takes their notes, while they
// are still open.
func (r *run) describePeers() {
	rep := r.rep
	rep.Peer = r.target.Peer.Name()
	if r.target.Stream != nil {
		rep.Stream = r.target.Stream.Name()
	}
	if r.target.Redis != nil {
		rep.Redis = r.target.Redis.Name()
	}
	for _, p := range []Peer{r.target.Peer, r.target.Stream, r.target.Redis} {
		if n, ok := p.(interface{ Notes() []string }); ok {
			for _, note := range n.Notes() {
				if !slices.Contains(rep.Notes, note) {
					rep.Notes = append(rep.Notes, note)
				}
			}
		}
	}
}

// finishReport takes the ratios: the median of the batches' ratios, each batch's
// backend and peer having run one right after the other.
func (r *run) finishReport() {
	rep := r.rep
	rep.PutRatio = medianOr(rep.PutRatioBatches, ratio(rep.PutGBps, rep.PeerPutGBps))
	rep.GetRatio = medianOr(rep.GetRatioBatches, ratio(rep.GetGBps, rep.PeerGetGBps))
	rep.PutVsRedis = medianOr(rep.PutVsRedisBatches, ratio(rep.PutGBps, rep.RedisPutGBps))
	rep.GetVsRedis = medianOr(rep.GetVsRedisBatches, ratio(rep.GetGBps, rep.RedisGetGBps))
	if t := rep.Engines; t != nil {
		t.PutRatio = medianOr(t.PutRatioBatches, ratio(t.PutGBps, t.PeerPutGBps))
		t.GetRatio = medianOr(t.GetRatioBatches, ratio(t.GetGBps, t.PeerGetGBps))
	}
	if r.cfg.Keep {
		rep.Dir = r.scratch
	}
}

// ratio is a over b, 0 when b is not measured.
func ratio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}

// closePeers closes the one-engine peers: the stored chunks of the memcpy and
// disk peers, and the Redis server. It may be called more than once.
func (r *run) closePeers() error {
	if r.peersClosed {
		return nil
	}
	r.peersClosed = true
	var errs []error
	for _, p := range []Peer{r.target.Peer, r.target.Stream, r.target.Redis} {
		if p != nil {
			if err := p.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close peer: %w", err))
			}
		}
	}
	return errors.Join(errs...)
}

// close releases everything the run opened and removes the scratch directory
// unless it is to be kept.
func (r *run) close() error {
	errs := []error{r.removeWritten()}
	if r.targetBuilt {
		errs = append(errs, r.closePeers())
		if r.target.Pair != nil {
			if err := r.target.Pair.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close peer: %w", err))
			}
		}
	}
	for _, b := range r.backends {
		if err := b.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close %s backend: %w", r.rep.Backend, err))
		}
	}
	for _, g := range r.groups {
		if err := g.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if r.targetBuilt && r.target.Close != nil {
		if err := r.target.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close the %s target: %w", r.rep.Backend, err))
		}
	}
	if !r.cfg.Keep {
		if err := os.RemoveAll(r.scratch); err != nil {
			errs = append(errs, fmt.Errorf("remove scratch directory: %w", err))
		}
	}
	return errors.Join(errs...)
}
