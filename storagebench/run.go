package storagebench

import (
	"context"
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
// peers on the same host memory, the batches interleaved and their order rotated
// so that drift of the device over the run falls on every contender alike. Then it
// times Exists. A page that fails Put or Get fails the run; a page that comes back
// with other bytes is counted in MismatchedPages.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	started := time.Now()
	shape, _ := ShapeByName(cfg.Shape)
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
	r := &run{cfg: cfg, shape: shape, scratch: scratch}
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

	target  Target
	backend storage.Backend
	group   *pool.Group
	hp      *pool.HostPool
	holdAll bool            // the host pool has a page for every page of every batch
	keys    [][]pagekey.Key // per batch
	hashes  [][]uint64      // per batch: page*parts+part
}

func (r *run) progress(format string, args ...any) {
	if r.cfg.Progress != nil {
		fmt.Fprintf(r.cfg.Progress, "bench tiers: "+format+"\n", args...)
	}
}

func (r *run) run(ctx context.Context, newTarget TargetFunc) error {
	var err error
	if r.target, err = newTarget(Scratch{Dir: r.scratch, Bytes: r.rep.Bytes}); err != nil {
		return err
	}
	if r.target.Name != "" {
		r.rep.Backend = r.target.Name
	}
	if r.target.New == nil || r.target.Peer == nil {
		return fmt.Errorf("target %s: no backend constructor or no peer: %w", r.rep.Backend, ErrConfig)
	}
	r.rep.BackendSettings = r.target.Describe
	r.rep.Notes = append(r.rep.Notes, r.target.Notes...)
	if r.backend, err = r.target.New(ctx); err != nil {
		return fmt.Errorf("open %s backend: %w", r.rep.Backend, err)
	}
	if err := r.buildPool(); err != nil {
		return err
	}
	spec := storage.SpecOf(r.hp, pagekey.Names{})
	if err := r.backend.RegisterPool(ctx, spec); err != nil {
		return fmt.Errorf("register the host pool with the %s backend: %w", r.rep.Backend, err)
	}
	if err := r.makeKeys(); err != nil {
		return err
	}
	if r.holdAll {
		r.progress("filling %s of pages", formatBytes(r.rep.Bytes))
		for b := range r.cfg.Batches {
			r.fill(b)
		}
	}
	if err := r.putPhase(ctx); err != nil {
		return err
	}
	if r.target.DropCache != nil {
		if err := r.target.DropCache(ctx); err != nil {
			return fmt.Errorf("evict the %s backend's pages from the page cache: %w", r.rep.Backend, err)
		}
	}
	if err := r.getPhase(ctx); err != nil {
		return err
	}
	if err := r.existsPhase(ctx); err != nil {
		return err
	}
	r.finishReport()
	return nil
}

// buildPool allocates the host pool from the backend's allocator: every batch's
// source pages plus one batch of destinations when that fits in half the
// available memory, else one batch of each.
func (r *run) buildPool() error {
	kind := r.backend.Allocator()
	if kind == "" {
		kind = hostmem.Mmap
	}
	acfg := hostmem.DefaultConfig(kind)
	acfg.Available = r.cfg.Available
	alloc, err := hostmem.New(acfg)
	if err != nil {
		return fmt.Errorf("host memory: %w", err)
	}
	avail := r.cfg.Available
	if avail == nil {
		avail = hostmem.AvailableBytes
	}
	ppb := r.cfg.PagesPerBatch
	pages := (r.cfg.Batches + 1) * ppb
	r.holdAll = true
	if a, err := avail(); err == nil && int64(pages)*r.shape.PageBytes() > (a-acfg.ReserveBytes)/2 {
		pages, r.holdAll = 2*ppb, false
	}
	if r.cfg.Batches == 1 {
		r.holdAll = true
	}
	if !r.holdAll {
		r.rep.Notes = append(r.rep.Notes, fmt.Sprintf("the host pool holds one batch of sources (%d batches do not fit in half the available memory); "+
			"its pages are refilled before each batch, keys stay distinct", r.cfg.Batches))
	}
	spec := pool.GroupSpec{
		Pools:    []pool.PoolSpec{{Name: pagekey.TargetPool, Geometry: r.shape.Geometry}},
		Layout:   kvlayout.PageFirst,
		PageSize: r.shape.PageSize,
		Pages:    pages,
	}
	r.progress("allocating a %s host pool (%s)", formatBytes(spec.Bytes()), kind)
	if r.group, err = pool.BuildGroup(spec, alloc); err != nil {
		return fmt.Errorf("host pool: %w; lower --pages-per-batch or pick a smaller page shape", err)
	}
	r.hp = r.group.Target()
	r.rep.HostAllocator = string(r.group.AllocatorKind())
	r.rep.HostPoolBytes = r.hp.Region().Size()
	return nil
}

// makeKeys hashes random tokens into one chain of distinct keys, split in batches.
func (r *run) makeKeys() error {
	h, err := pagekey.New(pagekey.Config{PageSize: r.shape.PageSize, Algorithm: pagekey.SHA256})
	if err != nil {
		return err
	}
	n := r.cfg.Batches * r.cfg.PagesPerBatch
	rng := rand.New(rand.NewPCG(r.cfg.Seed, 0x5eed))
	tokens := make([]uint32, n*r.shape.PageSize)
	for i := range tokens {
		tokens[i] = rng.Uint32N(128256) // Llama-3's vocabulary
	}
	all := h.Keys(pagekey.Key{}, tokens)
	seen := make(map[pagekey.Key]struct{}, len(all))
	for _, k := range all {
		if _, dup := seen[k]; dup {
			return fmt.Errorf("page keys: %s repeats", k)
		}
		seen[k] = struct{}{}
	}
	ppb := r.cfg.PagesPerBatch
	r.keys = make([][]pagekey.Key, r.cfg.Batches)
	r.hashes = make([][]uint64, r.cfg.Batches)
	for b := range r.keys {
		r.keys[b] = all[b*ppb : (b+1)*ppb : (b+1)*ppb]
		r.hashes[b] = make([]uint64, ppb*r.parts())
	}
	return nil
}

func (r *run) parts() int { return r.shape.Geometry.Buffers() }

// srcPages are the host pages batch b is put from.
func (r *run) srcPages(b int) []pool.PageID {
	first := 0
	if r.holdAll {
		first = b * r.cfg.PagesPerBatch
	}
	return pageRange(first, r.cfg.PagesPerBatch)
}

// dstPages are the host pages every batch is read back into: the pool's last batch.
func (r *run) dstPages() []pool.PageID {
	return pageRange(r.group.Pages()-r.cfg.PagesPerBatch, r.cfg.PagesPerBatch)
}

func pageRange(first, n int) []pool.PageID {
	out := make([]pool.PageID, n)
	for i := range out {
		out[i] = pool.PageID(first + i)
	}
	return out
}

// chunks returns the object parts of pages in host memory, page by page, K before V.
func (r *run) chunks(pages []pool.PageID) [][]byte {
	out := make([][]byte, 0, len(pages)*r.parts())
	for _, p := range pages {
		for part := range r.parts() {
			b, ok := r.hp.PageBuffer(part, p)
			if !ok {
				panic(fmt.Sprintf("storagebench: page %d part %d of a page_first pool is not contiguous", p, part))
			}
			out = append(out, b)
		}
	}
	return out
}

// fill writes batch b's contents into its source pages and records their hashes.
func (r *run) fill(b int) {
	chunks := r.chunks(r.srcPages(b))
	parts := r.parts()
	_ = parallel(context.Background(), runtime.GOMAXPROCS(0), len(chunks), func(i int) error {
		fillChunk(chunks[i], chunkSeed(r.cfg.Seed, b, i/parts, i%parts))
		r.hashes[b][i] = hashChunk(chunks[i])
		return nil
	})
}

// verify counts the pages of batch b whose bytes in dst differ from what was put.
func (r *run) verify(b int, dst [][]byte) int64 {
	parts := r.parts()
	bad := make([]bool, len(dst))
	_ = parallel(context.Background(), runtime.GOMAXPROCS(0), len(dst), func(i int) error {
		bad[i] = hashChunk(dst[i]) != r.hashes[b][i]
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

// contender is one of the three things timed on each batch.
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

func (r *run) putPhase(ctx context.Context) error {
	backend := &contender{name: "backend", do: func(ctx context.Context, b int) (time.Duration, error) {
		start := time.Now()
		errs := r.backend.Put(ctx, pagekey.TargetPool, r.keys[b], r.srcPages(b))
		d := time.Since(start)
		return d, batchError("put", b, errs)
	}}
	peerWrite := func(p Peer) func(context.Context, int) (time.Duration, error) {
		return func(ctx context.Context, b int) (time.Duration, error) {
			d, err := p.Write(ctx, r.chunks(r.srcPages(b)))
			if err != nil {
				return 0, fmt.Errorf("peer %s: batch %d: %w", p.Name(), b, err)
			}
			return d, nil
		}
	}
	cs := []*contender{backend, {name: "peer", do: peerWrite(r.target.Peer)}}
	if r.target.Stream != nil {
		cs = append(cs, &contender{name: "stream", do: peerWrite(r.target.Stream)})
	}
	for b := range r.cfg.Batches {
		if !r.holdAll {
			r.fill(b)
		}
		r.progress("put batch %d/%d", b+1, r.cfg.Batches)
		if err := rotate(ctx, cs, b); err != nil {
			return err
		}
	}
	r.rep.PutGBps, r.rep.PutBatchGBps = r.gbps(cs[0].times)
	r.rep.PeerPutGBps, _ = r.gbps(cs[1].times)
	if len(cs) > 2 {
		r.rep.StreamPutGBps, _ = r.gbps(cs[2].times)
	}
	return nil
}

func (r *run) getPhase(ctx context.Context) error {
	dstPages := r.dstPages()
	dst := r.chunks(dstPages)
	clearDst := func() {
		_ = parallel(context.Background(), runtime.GOMAXPROCS(0), len(dst), func(i int) error {
			clear(dst[i])
			return nil
		})
	}
	backend := &contender{name: "backend", do: func(ctx context.Context, b int) (time.Duration, error) {
		clearDst()
		start := time.Now()
		errs := r.backend.Get(ctx, pagekey.TargetPool, r.keys[b], dstPages)
		d := time.Since(start)
		if err := batchError("get", b, errs); err != nil {
			return 0, err
		}
		r.rep.MismatchedPages += r.verify(b, dst)
		return d, nil
	}}
	var peerBad int64
	peerRead := func(p Peer) func(context.Context, int) (time.Duration, error) {
		return func(ctx context.Context, b int) (time.Duration, error) {
			clearDst()
			d, err := p.Read(ctx, dst)
			if err != nil {
				return 0, fmt.Errorf("peer %s: batch %d: %w", p.Name(), b, err)
			}
			peerBad += r.verify(b, dst)
			return d, nil
		}
	}
	cs := []*contender{backend, {name: "peer", do: peerRead(r.target.Peer)}}
	if r.target.Stream != nil {
		cs = append(cs, &contender{name: "stream", do: peerRead(r.target.Stream)})
	}
	for b := range r.cfg.Batches {
		r.progress("get batch %d/%d", b+1, r.cfg.Batches)
		if err := rotate(ctx, cs, b); err != nil {
			return err
		}
	}
	if peerBad > 0 {
		r.rep.Notes = append(r.rep.Notes, fmt.Sprintf("the peers read back %d pages with wrong bytes: the disk or the peer is broken, the ratios mean nothing", peerBad))
	}
	r.rep.GetGBps, r.rep.GetBatchGBps = r.gbps(cs[0].times)
	r.rep.PeerGetGBps, _ = r.gbps(cs[1].times)
	if len(cs) > 2 {
		r.rep.StreamGetGBps, _ = r.gbps(cs[2].times)
	}
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
	batch := float64(r.cfg.PagesPerBatch) * float64(r.shape.PageBytes())
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
	r.progress("%d exists calls", n)
	times := make([]time.Duration, 0, n)
	short := 0
	for c := range n {
		keys := r.keys[c%r.cfg.Batches]
		start := time.Now()
		got, err := r.backend.Exists(ctx, pagekey.TargetPool, keys)
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

func (r *run) finishReport() {
	rep := r.rep
	rep.Peer = r.target.Peer.Name()
	if rep.PeerPutGBps > 0 {
		rep.PutRatio = rep.PutGBps / rep.PeerPutGBps
	}
	if rep.PeerGetGBps > 0 {
		rep.GetRatio = rep.GetGBps / rep.PeerGetGBps
	}
	if r.target.Stream != nil {
		rep.Stream = r.target.Stream.Name()
	}
	for _, p := range []Peer{r.target.Peer, r.target.Stream} {
		if n, ok := p.(interface{ Notes() []string }); ok {
			for _, note := range n.Notes() {
				if !slices.Contains(rep.Notes, note) {
					rep.Notes = append(rep.Notes, note)
				}
			}
		}
	}
	if r.cfg.Keep {
		rep.Dir = r.scratch
	}
}

// close releases everything the run opened and removes the scratch directory
// unless it is to be kept.
func (r *run) close() error {
	var errs []error
	for _, p := range []Peer{r.target.Peer, r.target.Stream} {
		if p != nil {
			if err := p.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close peer: %w", err))
			}
		}
	}
	if r.backend != nil {
		if err := r.backend.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close %s backend: %w", r.rep.Backend, err))
		}
	}
	if r.group != nil {
		if err := r.group.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if !r.cfg.Keep {
		if err := os.RemoveAll(r.scratch); err != nil {
			errs = append(errs, fmt.Errorf("remove scratch directory: %w", err))
		}
	}
	return errors.Join(errs...)
}
