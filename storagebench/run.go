package storagebench

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"time"

	"github.com/stratakv/strata/hostmem"
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
