package storagebench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/stratakv/strata/pagekey"
)

// TwoEngines is the phase in which two engines (two clients of the backend, each
// with its own host pool and keys) put and then get their batches at once.
// Bandwidths are both engines' bytes over the time from the start of a batch pair
// to the end of the slower engine's call.
type TwoEngines struct {
	// Peer moves both engines' bytes at once: the limit of the phase.
	Peer string `json:"peer"`
	// PutGBps and GetGBps are the aggregate, PutBatchGBps and GetBatchGBps each
	// batch pair's.
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
	// PutRatio and GetRatio are over the peer: the median of the batch pairs'
	// ratios in PutRatioBatches and GetRatioBatches (median and min-max).
	PutRatio        float64      `json:"put_ratio"`
	GetRatio        float64      `json:"get_ratio"`
	PutRatioBatches *RatioSpread `json:"put_ratio_batches,omitempty"`
	GetRatioBatches *RatioSpread `json:"get_ratio_batches,omitempty"`
	// MismatchedPages counts the phase's pages read back with other bytes (they
	// are in the report's MismatchedPages too).
	MismatchedPages int64 `json:"mismatched_pages"`
}

// pairPhase runs the two-engine phase: engine 1 is the main engine's backend and
// host pool with new keys, engine 2 a second backend from the target with a host
// pool of its own.
func (r *run) pairPhase(ctx context.Context) error {
	r.progress("two engines: opening a second client")
	b2, err := r.open(ctx)
	if err != nil {
		return err
	}
	e1, err := r.newEngine(ctx, r.e.backend, r.e.group, 1, "engine 1")
	if err != nil {
		return err
	}
	e2, err := r.newEngine(ctx, b2, nil, 2, "engine 2")
	if err != nil {
		return err
	}
	engines := []*engine{e1, e2}
	if r.target.Warm {
		// Engine 1's pool is the main engine's, warm already.
		if _, _, err := e2.warmUp(ctx); err != nil {
			return err
		}
	}
	for _, e := range engines {
		if e.holdAll {
			r.progress("two engines: filling %s of %s's pages", formatBytes(r.rep.Bytes), e.label)
			for b := range r.cfg.Batches {
				e.fill(b)
			}
		}
	}
	t := &TwoEngines{Peer: r.target.Pair.Name()}
	r.rep.TwoEngines = t
	pair := float64(2 * r.batchBytes())

	var putTimes [2][]time.Duration
	backend := &contender{name: "two engines", do: func(ctx context.Context, b int) (time.Duration, error) {
		return both(engines, &putTimes, func(e *engine) error {
			return batchError(e.label+" put", b, e.backend.Put(ctx, pagekey.TargetPool, e.keys[b], e.srcPages(b)))
		})
	}}
	peer := &contender{name: "peer", do: func(ctx context.Context, b int) (time.Duration, error) {
		src := append(e1.chunks(e1.srcPages(b)), e2.chunks(e2.srcPages(b))...)
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
		r.batchProgress("two engines: put", b)
		if err := rotate(ctx, cs, b); err != nil {
			return err
		}
	}
	t.PutGBps, t.PutBatchGBps = gbpsOf(pair, backend.times)
	t.PeerPutGBps, _ = gbpsOf(pair, peer.times)
	t.PutRatioBatches = pairedRatios(backend.times, peer.times)
	for i := range engines {
		g, _ := r.gbps(putTimes[i])
		t.EnginePutGBps = append(t.EnginePutGBps, g)
	}

	dst1, dst2 := e1.chunks(e1.dstPages()), e2.chunks(e2.dstPages())
	var getTimes [2][]time.Duration
	backend = &contender{name: "two engines", do: func(ctx context.Context, b int) (time.Duration, error) {
		clearAll(dst1)
		clearAll(dst2)
		d, err := both(engines, &getTimes, func(e *engine) error {
			return batchError(e.label+" get", b, e.backend.Get(ctx, pagekey.TargetPool, e.keys[b], e.dstPages()))
		})
		if err != nil {
			return 0, err
		}
		bad := e1.verify(b, dst1) + e2.verify(b, dst2)
		t.MismatchedPages += bad
		r.rep.MismatchedPages += bad
		return d, nil
	}}
	var peerBad int64
	peer = &contender{name: "peer", do: func(ctx context.Context, b int) (time.Duration, error) {
		clearAll(dst1)
		clearAll(dst2)
		d, err := r.target.Pair.Read(ctx, append(append([][]byte{}, dst1...), dst2...))
		if err != nil {
			return 0, fmt.Errorf("peer %s: batch %d: %w", r.target.Pair.Name(), b, err)
		}
		peerBad += e1.verify(b, dst1) + e2.verify(b, dst2)
		return d, nil
	}}
	cs = []*contender{backend, peer}
	for b := range r.cfg.Batches {
		r.batchProgress("two engines: get", b)
		if err := rotate(ctx, cs, b); err != nil {
			return err
		}
	}
	if peerBad > 0 {
		r.rep.Notes = append(r.rep.Notes, fmt.Sprintf("the two-engine peer read back %d pages with wrong bytes: its ratios mean nothing", peerBad))
	}
	t.GetGBps, t.GetBatchGBps = gbpsOf(pair, backend.times)
	t.PeerGetGBps, _ = gbpsOf(pair, peer.times)
	t.GetRatioBatches = pairedRatios(backend.times, peer.times)
	for i := range engines {
		g, _ := r.gbps(getTimes[i])
		t.EngineGetGBps = append(t.EngineGetGBps, g)
	}
	return nil
}

// both runs call for the two engines at once and returns the time until both are
// done; each engine's own time is appended to times.
func both(engines []*engine, times *[2][]time.Duration, call func(e *engine) error) (time.Duration, error) {
	var wg sync.WaitGroup
	var errs [2]error
	var own [2]time.Duration
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
	if err := errors.Join(errs[:]...); err != nil {
		return 0, err
	}
	for i := range own {
		times[i] = append(times[i], own[i])
	}
	return d, nil
}
