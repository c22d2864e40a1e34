package sim

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/stratakv/strata/workload"
)

// maxConcurrent bounds Config.Concurrent: more goroutines than this only queue
// on the cache's mutex.
const maxConcurrent = 1024

// concurrentRun is a cache run that requests can be served from many goroutines
// at once (the hicache runs; the ceiling's tree is not safe for that).
type concurrentRun interface {
	cacheRun
	// insert caches the prompt's whole pages right after prefill, as an engine
	// that shares a prompt's KV while the request still decodes; other requests
	// can match them before the request finishes.
	insert(a *active) error
	// drain waits for every copy in flight, so that a request that found L1 full
	// of pages held by copies can tell that apart from one that is larger than L1.
	drain() error
	// pageGeometry is the tokens per page and the pages of L1.
	pageGeometry() (pageSize, l1Pages int)
}

// serve replays the trace through the run: in the event loop (concurrent 0) or
// from concurrent goroutines (see Config.Concurrent).
func (e *engineSim) serve(ctx context.Context, trace workload.Trace, out *RunReport, concurrent int) error {
	if concurrent == 0 {
		return e.replay(ctx, trace, out)
	}
	run, ok := e.run.(concurrentRun)
	if !ok {
		return fmt.Errorf("run %s cannot serve requests concurrently: %w", out.Name, ErrConfig)
	}
	return e.replayConcurrent(ctx, trace, out, run, concurrent)
}

// dispatcher hands a trace's requests to the goroutines of a concurrent replay,
// in trace order, and keeps the counts they share.
type dispatcher struct {
	e       *engineSim
	run     concurrentRun
	trace   workload.Trace
	l1Pages int
	ps      int
	out     *RunReport

	mu   sync.Mutex
	cond *sync.Cond
	next int
	// held counts requests holding the cache, from the start of their Match to
	// their Finish or Release; maxHeld is its peak.
	held, maxHeld int
	// finished counts Finish calls: the event a request that found L1 full waits
	// for, since only a finished request gives pages back for good.
	finished int
	// epoch counts admissions begun and requests finished: anything that can take
	// L1 pages or start copies.
	epoch int
	done  int
	ttfts []float64
	err   error
}

// replayConcurrent serves the trace from n goroutines, each taking the next
// request and serving it end to end with no wait for copies in between.
func (e *engineSim) replayConcurrent(ctx context.Context, trace workload.Trace, out *RunReport, run concurrentRun, n int) error {
	ps, l1Pages := run.pageGeometry()
	d := &dispatcher{e: e, run: run, trace: trace, l1Pages: l1Pages, ps: ps, out: out}
	d.cond = sync.NewCond(&d.mu)
	start := time.Now()
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for {
				r := d.take()
				if r == nil {
					return
				}
				if err := d.serveOne(ctx, r); err != nil {
					d.fail(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if d.err != nil {
		return d.err
	}
	if out.PromptTokens > 0 {
		out.HitRatio = float64(out.HitTokens.Total()) / float64(out.PromptTokens)
	}
	e.ttfts = d.ttfts
	out.TTFTms = quantiles(append([]float64(nil), d.ttfts...))
	out.Concurrency, out.MaxInFlight = n, d.maxHeld
	out.Elapsed = Duration(time.Since(start))
	run.report(out)
	return nil
}

// take returns the next request to serve, or nil when there is none left or a
// goroutine failed.
func (d *dispatcher) take() *workload.Request {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.err != nil || d.next >= len(d.trace.Requests) {
		return nil
	}
	d.next++
	return &d.trace.Requests[d.next-1]
}

// fail stops the replay with err and wakes every goroutine waiting for L1.
func (d *dispatcher) fail(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.err == nil {
		d.err = err
	}
	d.cond.Broadcast()
}

// serveOne serves one request: admits it (waiting for L1 as long as other
// requests hold it), prefills, inserts, finishes, and counts what it saw.
func (d *dispatcher) serveOne(ctx context.Context, r *workload.Request) error {
	tokens := make([]uint32, 0, len(r.Prompt)+len(r.Output))
	tokens = append(append(tokens, r.Prompt...), r.Output...)
	a := &active{req: r, tokens: tokens}
	if (len(tokens)+d.ps-1)/d.ps > d.l1Pages {
		// Even an empty L1 cannot hold it.
		d.mu.Lock()
		d.out.Failed++
		d.step()
		d.mu.Unlock()
		return nil
	}
	a.hs = prefixHashes(tokens)
	d.run.arrive(a)
	// drainedAt is the epoch at which this request saw no request holding the
	// cache and waited for every copy; -1 before.
	drainedAt := -1
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		d.mu.Lock()
		if d.err != nil {
			d.mu.Unlock()
			return nil
		}
		d.held++
		d.maxHeld = max(d.maxHeld, d.held)
		d.epoch++
		finished := d.finished
		d.mu.Unlock()
		wait, err := d.run.admit(a)
		if err != nil {
			return err
		}
		if !wait {
			break
		}
		// L1 is full of pages other requests hold: wait until one finishes, or
		// until no request holds the cache (the pages may be held by copies then:
		// wait for those and try again).
		d.mu.Lock()
		d.held--
		if drainedAt >= 0 && d.epoch == drainedAt+1 {
			// Since the drain nothing but this request held L1 or started a copy,
			// and it still did not fit.
			d.out.Failed++
			d.step()
			d.cond.Broadcast()
			d.mu.Unlock()
			return nil
		}
		d.cond.Broadcast() // a waiter may be waiting for held to reach 0
		for d.finished == finished && d.held > 0 && d.err == nil {
			d.cond.Wait()
		}
		drainedAt = -1
		if d.held == 0 {
			drainedAt = d.epoch
		}
		d.mu.Unlock()
		if drainedAt >= 0 {
			if err := d.run.drain(); err != nil {
				return err
			}
		}
	}
	d.run.prefill(a)
	if err := d.run.insert(a); err != nil {
		return err
	}
	// The decode steps: let other requests run, and match the pages just
	// inserted, while this one still holds them.
	runtime.Gosched()
	err := d.run.finish(a)
	m := d.e.model
	miss := len(r.Prompt) - a.hit()
	ttft := time.Duration(miss)*m.PrefillPerToken + a.loadWall + a.fetchWall
	d.mu.Lock()
	defer d.mu.Unlock()
	d.held--
	d.finished++
	d.epoch++
	d.cond.Broadcast()
	if err != nil {
		return err
	}
	out := d.out
	out.VerifiedPages += a.verified
	out.CorruptPages += a.corrupt
	out.DraftRecomputePages += a.draftRecompute
	out.HitTokens.L1 += int64(a.hitL1)
	out.HitTokens.L2 += int64(a.hitL2)
	out.HitTokens.L3 += int64(a.hitL3)
	d.e.noteL3(a)
	out.PromptTokens += int64(len(r.Prompt))
	d.ttfts = append(d.ttfts, float64(ttft)/float64(time.Millisecond))
	d.step()
	return nil
}

// step counts a request done; the caller holds d.mu, which also serialises the
// Progress.
func (d *dispatcher) step() {
	d.done++
	d.e.progress.Step(d.done)
}
