package pool

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Direction says which way a transfer copies.
type Direction uint8

const (
	// Load copies host pages into device pages (L2→L1, load-back).
	Load Direction = iota
	// Backup copies device pages into host pages (L1→L2, write-through or write-back).
	Backup
)

// String returns "load" or "backup".
func (d Direction) String() string {
	if d == Load {
		return "load"
	}
	return "backup"
}

// CopyConfig sizes a CopyEngine.
type CopyConfig struct {
	// Workers is the number of copy goroutines. One core copies at about half the
	// machine's memory bandwidth, so use as many as the cores the engine can spare;
	// the default is GOMAXPROCS.
	Workers int `json:"workers"`
	// MinPagesPerJob is the fewest pages of one layer that one worker copies as a
	// unit. Smaller jobs spread a small transfer over more workers but cost
	// scheduling; 4 suits pages of 64 tokens. A layer group of a transfer is split
	// into at most 4 jobs per worker, each a contiguous range of its moves.
	MinPagesPerJob int `json:"minPagesPerJob"`
	// LayersPerJob is how many adjacent layers one backup job copies together (and
	// one load job, when LoadLeadLayers is negative), for device pools that
	// implement LayerGroupPool; others copy layer by layer. A group reads or writes
	// a page_first page's entries of all its layers as one run per token instead of
	// one short strided run per layer, which is what lets a copy run near memory
	// bandwidth rather than at read latency. Backups read the layer_first side as
	// one sequential stream per layer of the group, and a CPU's stream prefetchers
	// follow only so many streams at once, so small groups beat whole pages there
	// (on a 2-core AMD EPYC: 1 layer 0.82x of memcpy, 2 0.87x, 4 0.90x, 8 0.77x, 32
	// 0.50x). 0 means the default, 4.
	LayersPerJob int `json:"layersPerJob,omitempty"`
	// LoadLeadLayers shapes loads, which requests wait on layer by layer: layers 0
	// through LoadLeadLayers-1 are copied first, as one group, and all later layers
	// follow as a second group. The lead group reads a short strided run per token
	// (prefetched by name), the tail reads the rest of each token row of a
	// page_first page, and the lead's few entries too, as one sequential stream; so
	// layer 0 is ready early (after 1/32 of the bytes, copied at about half of
	// memcpy's speed) and the whole load is near the speed of whole-page copies
	// (on a 2-core AMD EPYC: lead 1 0.94x of memcpy, 2 0.96x, 4 0.72x; whole pages
	// 0.97x), faster than groups of equal size, whose every group reads short runs
	// (0.45-0.55x). 0 means the default, 1; a negative value makes loads use groups
	// of LayersPerJob like backups.
	LoadLeadLayers int `json:"loadLeadLayers,omitempty"`
}

const (
	defaultLayersPerJob   = 4
	defaultLoadLeadLayers = 1
	// jobsPerWorker is how many jobs, each a contiguous range of the moves, one
	// layer group of a transfer is split into per worker (never below
	// MinPagesPerJob pages each). More than one, so that a worker the OS takes off
	// its core for a while (a busy machine) holds a small part of the group, which
	// the other workers finish, instead of half of it, which they would wait for.
	jobsPerWorker = 4
)

// DefaultCopyConfig returns GOMAXPROCS workers, 4-page jobs, 4-layer backup groups
// and loads led by layer 0.
func DefaultCopyConfig() CopyConfig {
	return CopyConfig{Workers: runtime.GOMAXPROCS(0), MinPagesPerJob: 4, LayersPerJob: defaultLayersPerJob, LoadLeadLayers: defaultLoadLeadLayers}
}

// layerGroups splits layers 0..L-1 into the groups that the jobs of one direction
// copy, as (first, count) pairs in layer order.
func (c CopyConfig) layerGroups(dir Direction, L int) [][2]int {
	var groups [][2]int
	if dir == Load && c.LoadLeadLayers >= 0 {
		lead := min(c.LoadLeadLayers, L)
		groups = append(groups, [2]int{0, lead})
		if lead < L {
			groups = append(groups, [2]int{lead, L - lead})
		}
		return groups
	}
	for l := 0; l < L; l += c.LayersPerJob {
		groups = append(groups, [2]int{l, min(c.LayersPerJob, L-l)})
	}
	return groups
}

// CopyEngine moves pages between device and host pools on worker goroutines, in
// layer order, closing each layer as it completes, so a consumer can start on layer
// 0 while later layers copy. Jobs copy one layer or a group of layers (see
// CopyConfig.LoadLeadLayers and LayersPerJob): by default a load copies layer 0
// first and then every other layer in one pass over each page.
// Loads go ahead of backups waiting in the queue: a request waits on a load, nobody
// waits on a backup. It is safe for concurrent use; Close stops the workers.
type CopyEngine struct {
	cfg CopyConfig

	mu      sync.Mutex
	cond    *sync.Cond
	loads   jobQueue
	backups jobQueue
	closed  bool
	wg      sync.WaitGroup

	copiedBytes atomic.Int64
	transfers   atomic.Int64
}

// CopyStats counts what a CopyEngine has done.
type CopyStats struct {
	Transfers   int64 `json:"transfers"`
	CopiedBytes int64 `json:"copiedBytes"`
}

// NewCopyEngine starts cfg.Workers copy goroutines.
func NewCopyEngine(cfg CopyConfig) (*CopyEngine, error) {
	if cfg.Workers < 1 || cfg.Workers > 1024 {
		return nil, fmt.Errorf("copy engine: %d workers, want 1 to 1024: %w", cfg.Workers, ErrConfig)
	}
	if cfg.MinPagesPerJob < 1 {
		return nil, fmt.Errorf("copy engine: %d pages per job, want at least 1: %w", cfg.MinPagesPerJob, ErrConfig)
	}
	if cfg.LayersPerJob < 0 {
		return nil, fmt.Errorf("copy engine: %d layers per job, want at least 1 (or 0 for the default): %w", cfg.LayersPerJob, ErrConfig)
	}
	if cfg.LayersPerJob == 0 {
		cfg.LayersPerJob = defaultLayersPerJob
	}
	if cfg.LoadLeadLayers == 0 {
		cfg.LoadLeadLayers = defaultLoadLeadLayers
	}
	e := &CopyEngine{cfg: cfg}
	e.cond = sync.NewCond(&e.mu)
	e.wg.Add(cfg.Workers)
	for i := 0; i < cfg.Workers; i++ {
		go e.work()
	}
	return e, nil
}

// Stats returns the engine's counters.
func (e *CopyEngine) Stats() CopyStats {
	return CopyStats{Transfers: e.transfers.Load(), CopiedBytes: e.copiedBytes.Load()}
}

// Close stops the workers after the job running on each finishes. Transfers still
// queued fail with ErrClosed, so nobody waits forever.
func (e *CopyEngine) Close() {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return
	}
	e.closed = true
	e.cond.Broadcast()
	e.mu.Unlock()
	e.wg.Wait()
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, q := range []*jobQueue{&e.loads, &e.backups} {
		for j, ok := q.pop(); ok; j, ok = q.pop() {
			for l := j.layer; l < j.layer+j.layers; l++ {
				j.t.finish(j.pool, l, fmt.Errorf("copy engine closed before %s of layer %d: %w", j.t.dir, l, ErrClosed))
			}
		}
	}
}

// Load starts copying moves from host into device, for every pool of the group.
// Bad input (mismatched groups, pages outside a pool) is reported here and nothing
// is copied.
func (e *CopyEngine) Load(dev DeviceGroup, host *Group, moves []PageMove) (*Transfer, error) {
	return e.start(Load, dev, host, moves)
}

// Backup starts copying moves from device into host, for every pool of the group.
func (e *CopyEngine) Backup(dev DeviceGroup, host *Group, moves []PageMove) (*Transfer, error) {
	return e.start(Backup, dev, host, moves)
}

func (e *CopyEngine) start(dir Direction, dev DeviceGroup, host *Group, moves []PageMove) (*Transfer, error) {
	if err := dev.Validate(host); err != nil {
		return nil, err
	}
	if err := checkMoves(moves, dev.Pages.Pages(), host.Pages()); err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	moves = append([]PageMove(nil), moves...) // the caller may reuse its slice
	t := newTransfer(dir, dev, host, len(moves))
	chunks := (len(moves) + e.cfg.MinPagesPerJob - 1) / e.cfg.MinPagesPerJob
	chunks = max(1, min(chunks, jobsPerWorker*e.cfg.Workers))
	var jobs []job
	for p, dp := range dev.Pools {
		L := dp.Layout().Geometry.Layers
		groups := CopyConfig{LayersPerJob: 1, LoadLeadLayers: -1}.layerGroups(dir, L) // layer by layer
		if gp, ok := dp.(LayerGroupPool); ok && gp.GroupsLayers(dp) {
			groups = e.cfg.layerGroups(dir, L)
		}
		for l := 0; l < L; l++ {
			t.pending[p][l].Store(int32(chunks))
		}
		for _, g := range groups {
			for c := 0; c < chunks; c++ {
				lo, hi := c*len(moves)/chunks, (c+1)*len(moves)/chunks
				jobs = append(jobs, job{t: t, pool: p, layer: g[0], layers: g[1], moves: moves[lo:hi]})
			}
		}
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil, fmt.Errorf("%s: %w", dir, ErrClosed)
	}
	q := &e.backups
	if dir == Load {
		q = &e.loads
	}
	for _, j := range jobs {
		q.push(j)
	}
	e.cond.Broadcast()
	e.mu.Unlock()
	e.transfers.Add(1)
	return t, nil
}

func (e *CopyEngine) work() {
	defer e.wg.Done()
	for {
		e.mu.Lock()
		for e.loads.empty() && e.backups.empty() && !e.closed {
			e.cond.Wait()
		}
		if e.closed {
			e.mu.Unlock()
			return
		}
		j, ok := e.loads.pop()
		if !ok {
			j, _ = e.backups.pop()
		}
		e.mu.Unlock()
		e.run(j)
	}
}

func (e *CopyEngine) run(j job) {
	t := j.t
	end := j.layer + j.layers
	if t.canceled.Load() {
		for l := j.layer; l < end; l++ {
			t.finish(j.pool, l, context.Canceled)
		}
		return
	}
	dp, hp := t.dev.Pools[j.pool], t.host.pools[j.pool]
	layout := dp.Layout()
	layerBytes := int64(len(j.moves)) * int64(layout.Geometry.Buffers()) * int64(layout.PageSize) * int64(layout.Geometry.TokenLayerBytes())
	if gp, ok := dp.(LayerGroupPool); ok && j.layers > 1 { // start groups only where GroupsLayers
		var err error
		if t.dir == Load {
			err = gp.LoadLayers(j.layer, j.layers, hp, j.moves)
		} else {
			err = gp.BackupLayers(j.layer, j.layers, hp, j.moves)
		}
		if err == nil {
			e.copiedBytes.Add(int64(j.layers) * layerBytes)
		}
		for l := j.layer; l < end; l++ {
			t.finish(j.pool, l, err)
		}
		return
	}
	for l := j.layer; l < end; l++ {
		var err error
		if t.dir == Load {
			err = dp.LoadLayer(l, hp, j.moves)
		} else {
			err = dp.BackupLayer(l, hp, j.moves)
		}
		if err == nil {
			e.copiedBytes.Add(layerBytes)
		}
		t.finish(j.pool, l, err)
	}
}

type job struct {
	t      *Transfer
	pool   int
	layer  int // the first layer of the job
	layers int // how many layers from layer on
	moves  []PageMove
}

// jobQueue is a FIFO that reuses its backing array.
type jobQueue struct {
	items []job
	head  int
}

func (q *jobQueue) empty() bool { return q.head == len(q.items) }

func (q *jobQueue) push(j job) {
	if q.head > 0 && q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	}
	q.items = append(q.items, j)
}

func (q *jobQueue) pop() (job, bool) {
	if q.empty() {
		return job{}, false
	}
	j := q.items[q.head]
	q.items[q.head] = job{}
	q.head++
	return j, true
}

// Transfer is one copy of a set of pages through every pool of a group. Each
// (pool, layer) completes on its own; WaitLayer waits for one, Wait for all.
type Transfer struct {
	dir      Direction
	dev      DeviceGroup
	host     *Group
	pages    int
	started  time.Time
	canceled atomic.Bool

	pending   [][]atomic.Int32 // jobs left per pool and layer
	layerDone [][]chan struct{}
	left      atomic.Int32 // (pool, layer) pairs not yet complete
	done      chan struct{}
	elapsed   atomic.Int64

	errMu sync.Mutex
	err   error
}

func newTransfer(dir Direction, dev DeviceGroup, host *Group, pages int) *Transfer {
	t := &Transfer{dir: dir, dev: dev, host: host, pages: pages, started: time.Now(), done: make(chan struct{})}
	total := 0
	for _, dp := range dev.Pools {
		L := dp.Layout().Geometry.Layers
		t.pending = append(t.pending, make([]atomic.Int32, L))
		chans := make([]chan struct{}, L)
		for i := range chans {
			chans[i] = make(chan struct{})
		}
		t.layerDone = append(t.layerDone, chans)
		total += L
	}
	t.left.Store(int32(total))
	return t
}

func (t *Transfer) finish(pool, layer int, err error) {
	if err != nil {
		t.errMu.Lock()
		if t.err == nil {
			t.err = fmt.Errorf("%s of pool %q layer %d: %w", t.dir, t.dev.Pools[pool].Name(), layer, err)
		}
		t.errMu.Unlock()
	}
	if t.pending[pool][layer].Add(-1) != 0 {
		return
	}
	close(t.layerDone[pool][layer])
	if t.left.Add(-1) == 0 {
		t.elapsed.Store(int64(time.Since(t.started)))
		close(t.done)
	}
	// Let a goroutine that waited for this layer run now. It was made ready on this
	// worker's processor, and with a worker on every processor (the default) it
	// would otherwise wait for this worker's next job to end or for the scheduler
	// to preempt it, up to 10 ms: as long as copying layer 0 of a 2 GiB load.
	runtime.Gosched()
}

// Direction is which way the transfer copies.
func (t *Transfer) Direction() Direction { return t.dir }

// Pages is the number of pages the transfer moves (in every pool).
func (t *Transfer) Pages() int { return t.pages }

// Done is closed when every layer of every pool has finished.
func (t *Transfer) Done() <-chan struct{} { return t.done }

// Elapsed is how long the transfer took from start to its last layer; zero until Done.
func (t *Transfer) Elapsed() time.Duration { return time.Duration(t.elapsed.Load()) }

// Err is the first error of the transfer, nil while it runs or if it succeeded.
func (t *Transfer) Err() error {
	t.errMu.Lock()
	defer t.errMu.Unlock()
	return t.err
}

// Cancel skips the jobs of the transfer that have not started. Pages whose copy was
// skipped hold undefined bytes; Wait reports context.Canceled.
func (t *Transfer) Cancel() { t.canceled.Store(true) }

// WaitLayer waits until layer of the group's pool-th pool has been copied, and
// returns the transfer's first error so far.
func (t *Transfer) WaitLayer(ctx context.Context, pool, layer int) error {
	if pool < 0 || pool >= len(t.layerDone) || layer < 0 || layer >= len(t.layerDone[pool]) {
		return fmt.Errorf("wait for pool %d layer %d: no such layer: %w", pool, layer, ErrConfig)
	}
	select {
	case <-t.layerDone[pool][layer]:
		return t.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Wait waits for the whole transfer and returns its first error.
func (t *Transfer) Wait(ctx context.Context) error {
	select {
	case <-t.done:
		return t.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}
