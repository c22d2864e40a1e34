package sim

import (
	"container/heap"
	"context"
	"sort"
	"time"

	"github.com/stratakv/strata/workload"
)

// cacheRun is one cache configuration behind the simulated engine.
type cacheRun interface {
	// arrive sees a request as it arrives (and starts its L3 prefetch); an
	// l1Gate run sees it when it is next in line.
	arrive(a *active)
	// settle waits for the cache's background work, so that what a request finds
	// depends on the trace alone, not on how fast this machine's disk is.
	settle() error
	// admit matches a request, loads and verifies its hit, and takes L1 pages for
	// the rest. wait=true means L1 is full of running requests: try again after one
	// finishes.
	admit(a *active) (wait bool, err error)
	// prefill computes the prompt's missing KV.
	prefill(a *active)
	// finish computes the decoded tokens' KV and caches the request.
	finish(a *active) error
	// report fills in what the run measured.
	report(r *RunReport)
	close() error
}

// l1Gate is a cache run whose L1 the event loop checks for room before it
// admits a request, as an engine's scheduler does (the hicache runs).
type l1Gate interface {
	// roomFor reports whether L1 holds a beside the running requests.
	roomFor(a *active) bool
}

// active is a request inside the simulated engine.
type active struct {
	req       *workload.Request
	tokens    []uint32 // prompt + output
	hs        []uint64 // prefix digests of tokens
	hitL1     int
	hitL2     int
	hitL3     int
	loadWall  time.Duration // measured wall time of loading the hit
	fetchWall time.Duration // measured wall time of the L3 prefetch
	doneAt    time.Duration // simulated completion time
	seen      bool          // the run has been shown it (cacheRun.arrive)
	seenAt    time.Duration // simulated time it first was: arrival, or first in line
	state     any           // the cache run's per-request state
	verified  int64
	corrupt   int64
	// draftRecompute counts hit pages whose draft KV the engine recomputed.
	draftRecompute int64
}

func (a *active) hit() int { return a.hitL1 + a.hitL2 + a.hitL3 }

// engineSim replays a trace through one cache run: requests arrive at their trace
// time, at most maxRunning run at once, each holds its L1 pages from admission to
// completion (prefill, then its output decoded step by step). Simulated time
// follows the modelled compute only, so the schedule, and with it every hit, is
// the same on every machine; measured load time is added to TTFT alone.
type engineSim struct {
	model      Model
	maxRunning int
	run        cacheRun
	progress   *Progress
	ttfts      []float64 // every admitted request's modelled TTFT, in ms
	// waits and holds are every admitted request's queueing and time in the
	// engine, in admission order (the event loop only).
	waits, holds []time.Duration
	// trackL3 records in l3Hits when each request with L3 hits was admitted.
	trackL3 bool
	l3Hits  []L3HitAt
	// paced replays the trace in real time (Config.paced).
	paced bool
}

// pace waits, in a paced replay, until the wall time since start reaches the
// simulated time now: requests then arrive at their trace times, and an
// outage of the L3 meets the requests that arrive while it lasts, as in a
// deployment, not however many the replay gets through meanwhile. A replay
// that falls behind goes on at once.
func (e *engineSim) pace(start time.Time, now time.Duration) {
	if e.paced {
		if d := time.Until(start.Add(now)); d > 0 {
			time.Sleep(d)
		}
	}
}

// noteL3 records a's L3 hits, with trackL3; the caller serialises it.
func (e *engineSim) noteL3(a *active) {
	if e.trackL3 && a.hitL3 > 0 {
		e.l3Hits = append(e.l3Hits, L3HitAt{UnixNano: time.Now().UnixNano(), Tokens: int64(a.hitL3)})
	}
}

type finishQueue []*active

func (q finishQueue) Len() int           { return len(q) }
func (q finishQueue) Less(i, j int) bool { return q[i].doneAt < q[j].doneAt }
func (q finishQueue) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *finishQueue) Push(x any)        { *q = append(*q, x.(*active)) }
func (q *finishQueue) Pop() any {
	old := *q
	a := old[len(old)-1]
	*q = old[:len(old)-1]
	return a
}

func (e *engineSim) replay(ctx context.Context, trace workload.Trace, out *RunReport) error {
	var (
		running finishQueue
		waiting []*active
		next    int
		now     time.Duration
		done    int
	)
	prefillPer, decodeStep := e.model.PrefillPerToken, e.model.DecodeStep
	gate, gated := e.run.(l1Gate)
	start := time.Now()
	for next < len(trace.Requests) || len(waiting) > 0 || len(running) > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := e.run.settle(); err != nil {
			return err
		}
		// Take the earlier of the next arrival and the next completion.
		arrival := time.Duration(1<<63 - 1)
		if next < len(trace.Requests) {
			arrival = trace.Requests[next].Arrival
		}
		if len(running) > 0 && running[0].doneAt <= arrival {
			a := heap.Pop(&running).(*active)
			now = a.doneAt
			e.pace(start, now)
			if err := e.run.finish(a); err != nil {
				return err
			}
			out.VerifiedPages += a.verified
			out.CorruptPages += a.corrupt
			out.DraftRecomputePages += a.draftRecompute
			done++
			e.progress.Step(done)
		} else if next < len(trace.Requests) {
			now = arrival
			e.pace(start, now)
			r := &trace.Requests[next]
			next++
			tokens := make([]uint32, 0, len(r.Prompt)+len(r.Output))
			tokens = append(append(tokens, r.Prompt...), r.Output...)
			a := &active{req: r, tokens: tokens, hs: prefixHashes(tokens)}
			if !gated {
				e.run.arrive(a)
				a.seenAt = now
			}
			waiting = append(waiting, a)
		} else if len(waiting) > 0 {
			// Nothing runs and nothing arrives, yet requests wait: the head is
			// larger than L1 itself.
			waiting = waiting[1:]
			out.Failed++
			done++
			e.progress.Step(done)
			continue
		}
		// Admit waiting requests in arrival order while there is room.
		for len(waiting) > 0 && len(running) < e.maxRunning {
			a := waiting[0]
			if gated {
				// Its L3 prefetch starts when it is next in line, so that it
				// fetches what left L1 and L2 while it queued, and again while it
				// waits there when what it found in L2 left too. The request that
				// just finished may still be backing up to L2 and L3: what the
				// prefetch and the match find must not depend on how fast.
				if err := e.run.settle(); err != nil {
					return err
				}
				e.run.arrive(a)
				if !a.seen {
					a.seen, a.seenAt = true, now
				}
				if len(running) > 0 && !gate.roomFor(a) {
					break // it waits for a running request to finish
				}
			}
			wait, err := e.run.admit(a)
			if err != nil {
				return err
			}
			if wait {
				if len(running) == 0 {
					// Even an empty engine cannot hold it.
					waiting = waiting[1:]
					out.Failed++
					done++
					e.progress.Step(done)
					continue
				}
				break
			}
			waiting = waiting[1:]
			e.run.prefill(a)
			miss := len(a.req.Prompt) - a.hit()
			compute := time.Duration(miss) * prefillPer
			queued := now - a.req.Arrival
			// The prefetch runs while the request queues; only what outlasts the
			// queueing delays the first token.
			ttft := queued + compute + a.loadWall + max(0, a.fetchWall-(now-a.seenAt))
			e.ttfts = append(e.ttfts, float64(ttft)/float64(time.Millisecond))
			out.HitTokens.L1 += int64(a.hitL1)
			out.HitTokens.L2 += int64(a.hitL2)
			out.HitTokens.L3 += int64(a.hitL3)
			e.noteL3(a)
			out.PromptTokens += int64(len(a.req.Prompt))
			a.doneAt = now + compute + time.Duration(len(a.req.Output))*decodeStep
			e.waits = append(e.waits, queued)
			e.holds = append(e.holds, a.doneAt-now)
			heap.Push(&running, a)
		}
	}
	if out.PromptTokens > 0 {
		out.HitRatio = float64(out.HitTokens.Total()) / float64(out.PromptTokens)
	}
	out.TTFTms = quantiles(append([]float64(nil), e.ttfts...))
	waits := make([]float64, len(e.waits))
	for i, w := range e.waits {
		waits[i] = float64(w) / float64(time.Millisecond)
	}
	out.QueueMs = quantiles(waits)
	out.Backlog = backlogOf(e.waits, e.holds)
	out.Elapsed = Duration(time.Since(start))
	e.run.report(out)
	return nil
}

func quantiles(ms []float64) Quantiles {
	if len(ms) == 0 {
		return Quantiles{}
	}
	sort.Float64s(ms)
	at := func(q float64) float64 { return ms[min(len(ms)-1, int(q*float64(len(ms))))] }
	sum := 0.0
	for _, v := range ms {
		sum += v
	}
	return Quantiles{P50: at(0.50), P90: at(0.90), P99: at(0.99), Mean: sum / float64(len(ms))}
}
