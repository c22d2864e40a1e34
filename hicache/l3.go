package hicache

import (
	"context"
	"errors"
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
	// downEpoch is the backend's storage.EpochOf before the call that failed: a
	// backend that reconnects by itself (storage.Reconnector) and shows another
	// epoch has connected again, pools registered, since then.
	downEpoch uint64

	faults       storage.FaultCounts
	bytesRead    atomic.Int64
	bytesWritten atomic.Int64

	// Owned by the cache (under Cache.mu).
	// contentEpoch is the backend's storage.ContentEpochOf when the cache last
	// looked; refillQ, the nodes still to back up again since it moved.
	contentEpoch  uint64
	refillQ       []any // *radix.Node of the cache's element type
	inflight      map[pagekey.Key]*prefetchOp
	reserved      int
	backupPending int
	st            L3Stats
}

// newL3Tier registers every host pool with backend, each on its own: a pool the
// backend refuses runs without L3 (its L2 keeps working), with one warning that
// says which pool, why and what to change.
func newL3Tier(cfg L3Config, backend storage.Backend, host *pool.Group, log *slog.Logger) *l3Tier {
	l := &l3Tier{backend: backend, cfg: cfg, log: log, ps: host.PageSize(), inflight: map[pagekey.Key]*prefetchOp{}, backoff: minBackoff,
		contentEpoch: storage.ContentEpochOf(backend)}
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
// canceled. It waits for them until deadline: a worker still in a backend call
// then (a backend that ignores contexts) is left to finish on its own; it reports
// to nobody who touches the tree.
func (l *l3Tier) close(deadline time.Time) {
	l.cancel()
	l.qmu.Lock()
	l.closed = true
	l.qcond.Broadcast()
	l.qmu.Unlock()
	finished := make(chan struct{})
	go func() { l.wg.Wait(); close(finished) }()
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case <-finished:
	case <-timer.C:
		l.log.Error("L3 workers still in storage calls at close, abandoned: the backend ignores canceled contexts or is slower than the close timeout",
			"backend", l.backend.Name())
	}
}

const (
	minBackoff = 100 * time.Millisecond
	maxBackoff = 5 * time.Second
)

// down reports whether calls are being skipped after failures. A backend that
// has reconnected since the failure (its epoch moved) ends the backoff at once.
func (l *l3Tier) down() bool {
	epoch := storage.EpochOf(l.backend)
	l.bmu.Lock()
	defer l.bmu.Unlock()
	if !time.Now().Before(l.downUntil) {
		return false
	}
	if epoch != l.downEpoch {
		l.downUntil, l.backoff = time.Time{}, minBackoff
		return false
	}
	return true
}

// epoch is the backend's epoch, to take before a call and give to record.
func (l *l3Tier) epoch() uint64 { return storage.EpochOf(l.backend) }

// record counts a call's faults and moves the breaker: unavailable or timed-out
// backends are skipped for a backoff that doubles up to 5 s, or until the backend
// shows an epoch other than epoch, the one before the call (it reconnected); any
// success resets it.
func (l *l3Tier) record(epoch uint64, errs ...error) {
	failed, ok := false, false
	for _, err := range errs {
		switch {
		case l.faults.Add(err) == "": // nil or a miss
			ok = true
		case errors.Is(err, storage.ErrUnavailable), errors.Is(err, storage.ErrTimeout):
			failed = true
		}
	}
	l.bmu.Lock()
	defer l.bmu.Unlock()
	switch {
	case failed && !ok:
		l.downUntil = time.Now().Add(l.backoff)
		l.backoff = min(2*l.backoff, maxBackoff)
		l.downEpoch = epoch
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
			epoch := l.epoch()
			got, err := l.backend.Exists(cctx, l.specs[p].Name, keys[n:end])
			cancel()
			l.record(epoch, err)
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
		epoch := l.epoch()
		errs := l.backend.Get(cctx, l.specs[p].Name, keys[n:end], host[n:end])
		cancel()
		l.record(epoch, errs...)
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
		epoch := l.epoch()
		have, err := l.backend.Exists(cctx, l.specs[p].Name, keys[n:end])
		if err != nil {
			cancel()
			l.record(epoch, err)
			return written, false
		}
		errs := l.backend.Put(cctx, l.specs[p].Name, keys[n+have:end], host[n+have:end])
		cancel()
		l.record(epoch, errs...)
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
