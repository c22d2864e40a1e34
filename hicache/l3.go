package hicache

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/storage"
)

// l3Tier is the cache's side of a storage backend: which pools are registered,
// the goroutines that call the backend (prefetches ahead of backups), and a
// breaker that turns a dead backend into fast misses. Workers never touch the
// tree: they report finished jobs through done, which the cache drains under its
// lock.
type l3Tier struct {
	backend storage.Backend
	cfg     L3Config
	log     *slog.Logger
	ps      int

	pools   []PoolStatus
	specs   []storage.PoolSpec
	enabled bool // the target pool is registered: L3 serves the group
	partial bool // a pool other than the target runs without L3

	ctx     context.Context
	cancel  context.CancelFunc
	qmu     sync.Mutex
	qcond   *sync.Cond
	preQ    []*prefetchOp
	backQ   []*backupJob
	pending int // jobs queued or running
	closed  bool
	wg      sync.WaitGroup

	dmu  sync.Mutex
	done []any // *prefetchOp or *backupJob, finished

	bmu       sync.Mutex
	downUntil time.Time
	backoff   time.Duration

	faults       storage.FaultCounts
	bytesRead    atomic.Int64
	bytesWritten atomic.Int64

	// Owned by the cache (under Cache.mu).
	inflight      map[pagekey.Key]*prefetchOp
	reserved      int
	backupPending int
	st            L3Stats
}

// newL3Tier registers every host pool with backend, each on its own: a pool the
// backend refuses runs without L3 (its L2 keeps working), with one warning that
// says which pool, why and what to change.
func newL3Tier(cfg L3Config, backend storage.Backend, host *pool.Group, log *slog.Logger) *l3Tier {
	l := &l3Tier{backend: backend, cfg: cfg, log: log, ps: host.PageSize(), inflight: map[pagekey.Key]*prefetchOp{}, backoff: minBackoff}
	l.qcond = sync.NewCond(&l.qmu)
	l.ctx, l.cancel = context.WithCancel(context.Background())
	want := backend.Allocator()
	for i, hp := range host.Pools() {
		spec := storage.SpecOf(hp, cfg.Names)
		st := PoolStatus{Pool: hp.Name(), Enabled: true}
		var err error
		if want != "" && hp.Region().Kind() != want {
			err = fmt.Errorf("pool %q is in %s memory but the %s backend moves pages only from %s memory: build the host group with storage.HostAllocator(backend, ...) so every pool gets the backend's allocator: %w",
				hp.Name(), hp.Region().Kind(), backend.Name(), want, storage.ErrRegistration)
		} else {
			ctx, cancel := context.WithTimeout(l.ctx, cfg.RegisterTimeout)
			err = backend.RegisterPool(ctx, spec)
			cancel()
		}
		if err != nil {
			st.Enabled, st.Reason = false, err.Error()
			l.faults.Add(err)
			log.Warn("L3 disabled for one pool; its L2 keeps working and the other pools keep L3",
				"pool", hp.Name(), "backend", backend.Name(), "err", err)
		}
		l.pools = append(l.pools, st)
		l.specs = append(l.specs, spec)
		if i == 0 {
			l.enabled = st.Enabled
		} else if !st.Enabled {
			l.partial = true
		}
	}
	if !l.enabled {
		log.Warn("L3 disabled for the whole group: the target pool could not register, and a hit needs the target's KV",
			"backend", backend.Name(), "pool", host.Target().Name())
	}
	l.st.Backend, l.st.Enabled = backend.Name(), l.enabled
	for i := 0; i < cfg.Workers; i++ {
		l.wg.Add(1)
		go l.work()
	}
	return l
}

// close stops the workers: queued jobs fail, calls in flight see their context
// canceled. A backend that ignores contexts is given 10 seconds.
func (l *l3Tier) close() {
	l.cancel()
	l.qmu.Lock()
	l.closed = true
	l.qcond.Broadcast()
	l.qmu.Unlock()
	finished := make(chan struct{})
	go func() { l.wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(10 * time.Second):
		l.log.Error("L3 workers did not stop within 10s: the storage backend ignores canceled contexts", "backend", l.backend.Name())
	}
}

const (
	minBackoff = 100 * time.Millisecond
	maxBackoff = 5 * time.Second
)

// down reports whether calls are being skipped after failures.
func (l *l3Tier) down() bool {
	l.bmu.Lock()
	defer l.bmu.Unlock()
	return time.Now().Before(l.downUntil)
}

// record counts a call's faults and moves the breaker: unavailable or timed-out
// backends are skipped for a backoff that doubles up to 5 s; any success resets it.
func (l *l3Tier) record(errs ...error) {
	failed, ok := false, false
	for _, err := range errs {
		kind := storage.FaultKind(err)
		switch {
		case err == nil || kind == "":
			ok = true
		default:
			l.faults.AddKind(kind)
			if kind == "unavailable" || kind == "timeout" {
				failed = true
			}
		}
	}
	l.bmu.Lock()
	defer l.bmu.Unlock()
	switch {
	case failed && !ok:
		l.downUntil = time.Now().Add(l.backoff)
		l.backoff = min(2*l.backoff, maxBackoff)
	case ok:
		l.backoff = minBackoff
		l.downUntil = time.Time{}
	}
}

// exists returns how many of keys, from the start, every pool in pools has.
func (l *l3Tier) exists(ctx context.Context, pools []int, keys []pagekey.Key) int {
	have := len(keys)
	for _, p := range pools {
		n := 0
		for n < have {
			end := min(have, n+storage.MaxBatch)
			cctx, cancel := context.WithTimeout(ctx, l.cfg.CallTimeout)
			got, err := l.backend.Exists(cctx, l.specs[p].Name, keys[n:end])
			cancel()
			l.record(err)
			if err != nil {
				return 0
			}
			n += got
			if n < end {
				break
			}
		}
		have = min(have, n)
	}
	return have
}

// get reads keys into host pages for pool p and returns how many leading pages
// arrived intact.
func (l *l3Tier) get(ctx context.Context, p int, keys []pagekey.Key, host []pool.PageID) int {
	n := 0
	for n < len(keys) {
		end := min(len(keys), n+storage.MaxBatch)
		cctx, cancel := context.WithTimeout(ctx, l.cfg.CallTimeout)
		errs := l.backend.Get(cctx, l.specs[p].Name, keys[n:end], host[n:end])
		cancel()
		l.record(errs...)
		for _, err := range errs {
			if err != nil {
				return n
			}
			n++
			l.bytesRead.Add(l.specs[p].Layout.PageBytes())
		}
	}
	return n
}

// put writes the pages L3 lacks for pool p and returns how many it wrote.
func (l *l3Tier) put(ctx context.Context, p int, keys []pagekey.Key, host []pool.PageID) (written int, ok bool) {
	for n := 0; n < len(keys); n += storage.MaxBatch {
		end := min(len(keys), n+storage.MaxBatch)
		cctx, cancel := context.WithTimeout(ctx, l.cfg.CallTimeout)
		have, err := l.backend.Exists(cctx, l.specs[p].Name, keys[n:end])
		if err != nil {
			cancel()
			l.record(err)
			return written, false
		}
		errs := l.backend.Put(cctx, l.specs[p].Name, keys[n+have:end], host[n+have:end])
		cancel()
		l.record(errs...)
		for _, err := range errs {
			if err != nil {
				return written, false
			}
			written++
			l.bytesWritten.Add(l.specs[p].Layout.PageBytes())
		}
	}
	return written, true
}

// enabledPools lists the indexes of pools with L3.
func (l *l3Tier) enabledPools() []int {
	var out []int
	for i, p := range l.pools {
		if p.Enabled {
			out = append(out, i)
		}
	}
	return out
}

// enqueue queues a *prefetchOp or *backupJob; false once the tier is closed.
func (l *l3Tier) enqueue(job any) bool {
	l.qmu.Lock()
	defer l.qmu.Unlock()
	if l.closed {
		return false
	}
	switch j := job.(type) {
	case *prefetchOp:
		l.preQ = append(l.preQ, j)
	case *backupJob:
		l.backQ = append(l.backQ, j)
	}
	l.pending++
	l.qcond.Signal()
	return true
}

// idle reports whether no job is queued or running.
func (l *l3Tier) idle() bool {
	l.qmu.Lock()
	defer l.qmu.Unlock()
	return l.pending == 0
}

func (l *l3Tier) work() {
	defer l.wg.Done()
	for {
		l.qmu.Lock()
		for len(l.preQ) == 0 && len(l.backQ) == 0 && !l.closed {
			l.qcond.Wait()
		}
		var job any
		switch {
		case len(l.preQ) > 0:
			job, l.preQ = l.preQ[0], l.preQ[1:]
		case len(l.backQ) > 0:
			job, l.backQ = l.backQ[0], l.backQ[1:]
		default: // closed and drained
			l.qmu.Unlock()
			return
		}
		if l.closed { // closed with jobs left: they fail without a call
			l.qmu.Unlock()
			if op, ok := job.(*prefetchOp); ok {
				op.setOutcome(outcomeCanceled)
			} else {
				job.(*backupJob).failed = true
			}
			l.report(job)
			continue
		}
		l.qmu.Unlock()
		switch j := job.(type) {
		case *prefetchOp:
			j.run(l)
		case *backupJob:
			j.run(l)
		}
		l.report(job)
	}
}

// report hands a finished job to the cache, then wakes whoever waits on it.
func (l *l3Tier) report(job any) {
	l.dmu.Lock()
	l.done = append(l.done, job)
	l.dmu.Unlock()
	if op, ok := job.(*prefetchOp); ok {
		op.elapsed.Store(int64(time.Since(op.started)))
		close(op.done)
	}
	l.qmu.Lock()
	l.pending--
	l.qmu.Unlock()
}

// finished takes the jobs that finished since the last call.
func (l *l3Tier) finished() []any {
	l.dmu.Lock()
	defer l.dmu.Unlock()
	out := l.done
	l.done = nil
	return out
}

// backupJob writes one node's L2 pages to L3, for every pool with L3.
type backupJob struct {
	node    any // the radix node, host-referenced while the job runs
	keys    []pagekey.Key
	host    []pool.PageID
	written int
	failed  bool
}

func (j *backupJob) run(l *l3Tier) {
	if l.ctx.Err() != nil || l.down() {
		j.failed = true
		return
	}
	for _, p := range l.enabledPools() {
		n, ok := l.put(l.ctx, p, j.keys, j.host)
		if p == 0 {
			j.written = n
		}
		if !ok {
			j.failed = true
			return
		}
	}
}

// stats returns the tier's counters (call under Cache.mu).
func (l *l3Tier) stats() L3Stats {
	s := l.st
	s.Pools = append([]PoolStatus(nil), l.pools...)
	s.BytesRead, s.BytesWritten = l.bytesRead.Load(), l.bytesWritten.Load()
	s.ReservedPages = l.reserved
	s.Down = l.down()
	s.Faults = l.faults.NonZero()
	return s
}
