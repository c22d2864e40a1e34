package hicache

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
)

// outcome of a prefetch.
type outcome uint8

const (
	outcomeNone outcome = iota
	outcomeCompleted
	outcomeTimedOut
	outcomeCanceled
	outcomeBelowThreshold
	outcomeNoRoom
	outcomeFailed
	outcomeStale
)

var outcomeNames = [...]string{"", "completed", "timed_out", "canceled", "below_threshold", "no_room", "failed", "stale"}

// Prefetch is a request's L3 lookup in flight: started when the request arrives,
// settled when it is matched (pass it in MatchOptions) according to the prefetch
// policy. A Prefetch must be passed to Match or canceled, so that the host pages
// it holds are returned.
type Prefetch struct {
	op    *prefetchOp
	cache *Cache
	// Tokens is the number of uncached tokens the prefetch looks up in L3.
	Tokens  int
	settled bool
}

// Done is closed when the prefetch has finished (with pages or without).
func (p *Prefetch) Done() <-chan struct{} { return p.op.done }

// Outcome names how the prefetch ended ("" while it runs): completed, timed_out,
// canceled, below_threshold, no_room, failed, stale.
func (p *Prefetch) Outcome() string { return outcomeNames[p.op.result.Load()] }

// Elapsed is the prefetch's wall time from start to finish (0 while it runs).
func (p *Prefetch) Elapsed() time.Duration { return time.Duration(p.op.elapsed.Load()) }

// Pages is the number of pages the prefetch brought (0 while it runs).
func (p *Prefetch) Pages() int {
	select {
	case <-p.op.done:
		return p.op.usable
	default:
		return 0
	}
}

// Cancel gives the prefetch up. When no other request shares it, its storage
// calls stop and its host pages are returned.
func (p *Prefetch) Cancel() {
	if p == nil || p.cache == nil {
		return
	}
	p.cache.mu.Lock()
	defer p.cache.mu.Unlock()
	p.giveUp(outcomeCanceled)
}

// giveUp releases this request's interest (under Cache.mu).
func (p *Prefetch) giveUp(why outcome) {
	if p.settled {
		return
	}
	p.settled = true
	op := p.op
	op.waiters--
	if op.waiters > 0 {
		return
	}
	op.unpinIfUnwanted()
	select {
	case <-op.done:
		if op.staged && !op.taken {
			op.abandoned = true
			op.release()
		}
	default:
		op.abandoned = true
		op.setOutcome(why)
		op.cancel()
	}
}

// settle waits for the prefetch as the policy allows (without holding the cache),
// and gives it up when the wait ends before the prefetch does.
func (p *Prefetch) settle(ctx context.Context, policy PrefetchPolicy) {
	op := p.op
	give := outcomeCanceled
	switch policy {
	case WaitComplete:
		select {
		case <-op.done:
		case <-ctx.Done():
		}
	case Timeout:
		timer := time.NewTimer(time.Until(op.deadline))
		select {
		case <-op.done:
		case <-timer.C:
			give = outcomeTimedOut
		case <-ctx.Done():
		}
		timer.Stop()
	}
	select {
	case <-op.done:
		return
	default:
	}
	p.cache.mu.Lock()
	p.giveUp(give)
	p.cache.mu.Unlock()
}

// prefetchOp is one L3 fetch, shared by every request that asked for the same pages.
type prefetchOp struct {
	ns       pagekey.Key
	tokens   []uint32      // the prompt through the last page to fetch
	from     int           // pages cached in L1/L2 when it started
	keys     []pagekey.Key // keys of pages [from, from+len(keys))
	deadline time.Time
	ctx      context.Context
	cancel   context.CancelFunc
	done     chan struct{}
	result   atomic.Uint32 // outcome, set once

	// Set by the worker before done closes.
	host        []pool.PageID // reserved host pages, one per page fetched
	usable      int           // leading pages every required pool has in host
	draftUsable int           // of those, leading pages the other pools have too

	started time.Time
	elapsed atomic.Int64 // wall time from start to done

	// Owned by the cache (under Cache.mu).
	inserted  int // pages the prefetch added to the tree as L2 pages
	waiters   int
	staged    bool // pages kept for the first request to take (draft to recompute)
	taken     bool
	abandoned bool
	accounted bool
	reserve   func(n int) []pool.PageID
	// unpin releases the op's host reference: on the cached prefix the fetched
	// pages extend while they are fetched, then on the pages it put in the tree
	// (or the prefix of its staged pages) until no request waits for them; nil
	// without one.
	unpin   func()
	release func() // frees every host page the op still holds
}

// unpinIfUnwanted releases the op's host reference once it is accounted for and
// no request waits for its pages any more (under Cache.mu).
func (op *prefetchOp) unpinIfUnwanted() {
	if op.unpin != nil && op.accounted && op.waiters == 0 {
		op.unpin()
		op.unpin = nil
	}
}

func (op *prefetchOp) setOutcome(o outcome) { op.result.CompareAndSwap(uint32(outcomeNone), uint32(o)) }

// run is the worker's part: look the pages up in every required pool, reserve
// host pages, fetch, and report how many leading pages arrived.
// The worker closes done after queueing the op for the cache, so a request that
// sees done also finds the op accounted for when it takes the cache.
func (op *prefetchOp) run(l *l3Tier) {
	if op.ctx.Err() != nil {
		op.setOutcome(outcomeCanceled)
		return
	}
	if l.down() {
		op.setOutcome(outcomeFailed)
		return
	}
	pools := l.enabledPools()
	target := l.exists(op.ctx, pools[:1], op.keys)
	others := target
	if len(pools) > 1 {
		others = l.exists(op.ctx, pools[1:], op.keys[:target])
	}
	hit := target
	if l.cfg.DraftPolicy == DraftRequired {
		hit = others
	}
	if op.ctx.Err() != nil {
		op.setOutcome(outcomeCanceled)
		return
	}
	if hit*l.ps < l.cfg.PrefetchThreshold || hit == 0 {
		op.setOutcome(outcomeBelowThreshold)
		return
	}
	op.host = op.reserve(hit)
	if len(op.host)*l.ps < l.cfg.PrefetchThreshold || len(op.host) == 0 {
		op.setOutcome(outcomeNoRoom)
		return
	}
	n := len(op.host)
	got := l.get(op.ctx, pools[0], op.keys[:n], op.host)
	draft := got
	for _, p := range pools[1:] {
		draft = min(draft, l.get(op.ctx, p, op.keys[:min(got, others)], op.host[:min(got, others)]))
	}
	op.usable, op.draftUsable = got, draft
	if l.cfg.DraftPolicy == DraftRequired {
		op.usable = draft
	}
	switch {
	case op.usable > 0:
		op.setOutcome(outcomeCompleted)
	case op.ctx.Err() != nil:
		op.setOutcome(outcomeCanceled)
	default:
		op.setOutcome(outcomeFailed)
	}
}
