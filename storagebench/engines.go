package storagebench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/stratakv/strata/pagekey"
)

// ManyEngines is the phase in which several engines (Config.Engines clients of
// the backend, each with its own host pool and keys) put and then get their
// batches at once, as the engines of one node do. Bandwidths are every engine's
// bytes over the time from the start of a round (one batch of each engine) to
// the end of the slowest engine's call.
type ManyEngines struct {
	// Engines is how many engines ran at once.
	Engines int `json:"engines"`
	// Peer moves every engine's bytes at once: the limit of the phase.
	Peer string `json:"peer"`
	// PutGBps and GetGBps are the aggregate, PutBatchGBps and GetBatchGBps each
	// round's.
	PutGBps      float64   `json:"put_gbps"`
	GetGBps      float64   `json:"get_gbps"`
	PutBatchGBps []float64 `json:"put_batch_gbps"`
	GetBatchGBps []float64 `json:"get_batch_gbps"`
	// EnginePutGBps and EngineGetGBps are each engine's own bytes over its own calls.
	EnginePutGBps []float64 `json:"engine_put_gbps"`
	EngineGetGBps []float64 `json:"engine_get_gbps"`
	// PeerPutGBps and PeerGetGBps are the peer's.
	PeerPutGBps float64 `json:"peer_put_gbps"`
	PeerGetGBps float64 `json:"peer_get_gbps"`
	// PutRatio and GetRatio are over the peer: the median of the rounds'
	// ratios in PutRatioBatches and GetRatioBatches (median and min-max).
	PutRatio        float64      `json:"put_ratio"`
	GetRatio        float64      `json:"get_ratio"`
	PutRatioBatches *RatioSpread `json:"put_ratio_batches,omitempty"`
	GetRatioBatches *RatioSpread `json:"get_ratio_batches,omitempty"`
	// MismatchedPages counts the phase's pages read back with other bytes (they
	// are in the report's MismatchedPages too).
	MismatchedPages int64 `json:"mismatched_pages"`
}

// enginesPhase runs the phase of several engines at once: engine 1 is the main
// engine's backend and host pool with new keys, each other engine a backend of
// its own from the target with a host pool of its own.
func (r *run) enginesPhase(ctx context.Context) error {
	n := r.cfg.engines()
	r.progress("%d engines: opening %d more clients", n, n-1)
	e1, err := r.newEngine(ctx, r.e.backend, r.e.group, 1, "engine 1")
	if err != nil {
		return err
	}
	engines := []*engine{e1}
	for i := 2; i <= n; i++ {
		b, err := r.open(ctx)
		if err != nil {
			return err
		}
		e, err := r.newEngine(ctx, b, nil, i, fmt.Sprintf("engine %d", i))
		if err != nil {
			return err
		}
		if r.target.Warm {
			// Engine 1's pool is the main engine's, warm already.
			if _, _, err := e.warmUp(ctx); err != nil {
				return err
			}
		}
		engines = append(engines, e)
	}
	for _, e := range engines {
		if e.holdAll {
			r.progress("%d engines: filling %s of %s's pages", n, formatBytes(r.rep.Bytes), e.label)
			for b := range r.cfg.Batches {
				e.fill(b)
			}
		}
	}
	t := &ManyEngines{Engines: n, Peer: r.target.Pair.Name()}
	r.rep.Engines = t
	round := float64(int64(n) * r.batchBytes())
	label := fmt.Sprintf("%d engines", n)

	putTimes := make([][]time.Duration, n)
	backend := &contender{name: label, do: func(ctx context.Context, b int) (time.Duration, error) {
		return all(engines, putTimes, func(e *engine) error {
			return batchError(e.label+" put", b, e.backend.Put(ctx, pagekey.TargetPool, e.keys[b], e.srcPages(b)))
		})
	}}
	peer := &contender{name: "peer", do: func(ctx context.Context, b int) (time.Duration, error) {
		var src [][]byte
		for _, e := range engines {
			src = append(src, e.chunks(e.srcPages(b))...)
		}
		d, err := r.target.Pair.Write(ctx, src)
		if err != nil {
			return 0, fmt.Errorf("peer %s: batch %d: %w", r.target.Pair.Name(), b, err)
		}
		return d, nil
	}}
	cs := []*contender{backend, peer}
	for b := range r.cfg.Batches {
		for _, e := range engines {
			if !e.holdAll {
				e.fill(b)
			}
		}
		r.batchProgress(label+": put", b)
		if err := rotate(ctx, cs, b); err != nil {
			return err
		}
	}
	t.PutGBps, t.PutBatchGBps = gbpsOf(round, backend.times)
	t.PeerPutGBps, _ = gbpsOf(round, peer.times)
	t.PutRatioBatches = pairedRatios(backend.times, peer.times)
	for i := range engines {
		g, _ := r.gbps(putTimes[i])
		t.EnginePutGBps = append(t.EnginePutGBps, g)
	}

	dsts := make([][][]byte, n)
	var peerDst [][]byte
	for i, e := range engines {
		dsts[i] = e.chunks(e.dstPages())
		peerDst = append(peerDst, dsts[i]...)
	}
	verify := func(b int) int64 {
		var bad int64
		for i, e := range engines {
			bad += e.verify(b, dsts[i])
		}
		return bad
	}
	getTimes := make([][]time.Duration, n)
	backend = &contender{name: label, do: func(ctx context.Context, b int) (time.Duration, error) {
		clearAll(peerDst)
		d, err := all(engines, getTimes, func(e *engine) error {
			return batchError(e.label+" get", b, e.backend.Get(ctx, pagekey.TargetPool, e.keys[b], e.dstPages()))
		})
		if err != nil {
			return 0, err
		}
		bad := verify(b)
		t.MismatchedPages += bad
		r.rep.MismatchedPages += bad
		return d, nil
	}}
	var peerBad int64
	peer = &contender{name: "peer", do: func(ctx context.Context, b int) (time.Duration, error) {
		clearAll(peerDst)
		d, err := r.target.Pair.Read(ctx, peerDst)
		if err != nil {
			return 0, fmt.Errorf("peer %s: batch %d: %w", r.target.Pair.Name(), b, err)
		}
		peerBad += verify(b)
		return d, nil
	}}
	cs = []*contender{backend, peer}
	for b := range r.cfg.Batches {
		r.batchProgress(label+": get", b)
		if err := rotate(ctx, cs, b); err != nil {
			return err
		}
	}
	if peerBad > 0 {
		r.rep.Notes = append(r.rep.Notes, fmt.Sprintf("the %d-engine peer read back %d pages with wrong bytes: its ratios mean nothing", n, peerBad))
	}
	t.GetGBps, t.GetBatchGBps = gbpsOf(round, backend.times)
	t.PeerGetGBps, _ = gbpsOf(round, peer.times)
	t.GetRatioBatches = pairedRatios(backend.times, peer.times)
	for i := range engines {
		g, _ := r.gbps(getTimes[i])
		t.EngineGetGBps = append(t.EngineGetGBps, g)
	}
	return nil
}

// all runs call for every engine at once and returns the time until all are
// done; each engine's own time is appended to times[i].
func all(engines []*engine, times [][]time.Duration, call func(e *engine) error) (time.Duration, error) {
	var wg sync.WaitGroup
	errs := make([]error, len(engines))
	own := make([]time.Duration, len(engines))
	start := time.Now()
	for i, e := range engines {
		wg.Go(func() {
			s := time.Now()
			errs[i] = call(e)
			own[i] = time.Since(s)
		})
	}
	wg.Wait()
	d := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	for i := range own {
		times[i] = append(times[i], own[i])
	}
	return d, nil
}
