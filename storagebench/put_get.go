package storagebench

import (
	"context"
	"fmt"
	"time"

	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
)

// phase is the contenders timed on each batch in one direction, and how their
// times go into the report once every batch has run.
type phase struct {
	cs     []*contender
	report func()
}

func (r *run) putContenders() phase {
	e := r.e
	backend := &contender{name: "backend", do: func(ctx context.Context, b int) (time.Duration, error) {
		return e.timedPut(ctx, "put", b)
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
		return e.timedGet(ctx, "get", b, dstPages, dst)
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

// warmUp puts and gets the untimed batch after the timed ones through e's host
// pool, checks it, and returns its bandwidths.
func (e *engine) warmUp(ctx context.Context) (put, get float64, err error) {
	r := e.r
	b := r.cfg.Batches
	r.progress("%swarm-up batch (untimed)", e.of())
	e.fill(b)
	d, err := e.timedPut(ctx, e.of()+"warm-up put", b)
	if err != nil {
		return 0, 0, err
	}
	put = rate(float64(r.batchBytes()), d)
	dstPages := e.dstPages()
	if d, err = e.timedGet(ctx, e.of()+"warm-up get", b, dstPages, e.chunks(dstPages)); err != nil {
		return 0, 0, err
	}
	get = rate(float64(r.batchBytes()), d)
	return put, get, nil
}

// timedPut puts engine e's batch b from its source pages and returns the time of
// the Put call alone, so that every put the run times is timed the same way.
// op names the call in the error.
func (e *engine) timedPut(ctx context.Context, op string, b int) (time.Duration, error) {
	start := time.Now()
	errs := e.backend.Put(ctx, pagekey.TargetPool, e.keys[b], e.srcPages(b))
	d := time.Since(start)
	return d, batchError(op, b, errs)
}

// timedGet gets engine e's batch b into pages, whose chunks are dst, and returns
// the time of the Get call alone. It zeroes dst first, so that a get that writes
// nothing is caught, and counts the pages that came back with other bytes in the
// report's MismatchedPages. op names the call in the error.
func (e *engine) timedGet(ctx context.Context, op string, b int, pages []pool.PageID, dst [][]byte) (time.Duration, error) {
	clearAll(dst)
	start := time.Now()
	errs := e.backend.Get(ctx, pagekey.TargetPool, e.keys[b], pages)
	d := time.Since(start)
	if err := batchError(op, b, errs); err != nil {
		return 0, err
	}
	e.r.rep.MismatchedPages += e.verify(b, dst)
	return d, nil
}
