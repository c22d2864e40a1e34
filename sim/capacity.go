package sim

import (
	"fmt"
	"math"
	"time"

	"github.com/stratakv/strata/workload"
)

// DefaultLoad is the offered load `strata bench` runs at unless told otherwise: a
// busy engine that keeps up, as serving deployments are run.
const DefaultLoad = 0.7

// Capacity is what the simulated engine can serve without a cache, taken over the
// busiest stretch of the trace. A request holds its place in the engine for the
// modelled prefill of its whole prompt and the decode of its output, and its
// pages in L1 as long; at most MaxRunning requests run at once, and fewer when L1
// cannot hold that many of them. A cache only shortens the prefill, so the
// l1-only, ceiling and strata runs all keep up below it.
type Capacity struct {
	// RequestsPerSecond is the most requests per second the engine can serve on
	// the busiest stretch: Running requests at once, each for HoldSeconds.
	RequestsPerSecond float64 `json:"requests_per_second"`
	// Running is how many of the stretch's requests run at once: MaxRunning, or
	// the whole requests of its mean size that L1 holds, when that is fewer
	// (L1Bound).
	Running float64 `json:"running"`
	L1Bound bool    `json:"l1_bound"`
	// HoldSeconds is the mean time a request of the stretch holds the engine.
	HoldSeconds float64 `json:"hold_seconds"`
	// PromptTokens and OutputTokens are the stretch's mean request lengths.
	PromptTokens float64 `json:"prompt_tokens"`
	OutputTokens float64 `json:"output_tokens"`
	// Window is the stretch's length in requests (a quarter of the trace), First
	// its first request.
	Window int `json:"window"`
	First  int `json:"first"`
}

// capacityOf is the engine's capacity over the busiest quarter of the trace (in
// requests, in arrival order): multiturn's later rounds hold longer prompts than
// its first, so a capacity taken over the whole trace would overload its end.
// It depends on the requests' lengths, the model's costs, MaxRunning and L1, not
// on the arrival times, so a rate can be derived from it.
func (c Config) capacityOf(trace workload.Trace) Capacity {
	n := len(trace.Requests)
	if n == 0 {
		return Capacity{}
	}
	ps := int64(c.PageSize)
	l1 := float64(c.L1Tokens / ps * ps)
	hold := make([]float64, n)   // seconds a request holds the engine
	weight := make([]float64, n) // L1 token-seconds it holds
	prompt := make([]float64, n)
	output := make([]float64, n)
	for i, r := range trace.Requests {
		p, o := len(r.Prompt), len(r.Output)
		h := (time.Duration(p)*c.Model.PrefillPerToken + time.Duration(o)*c.Model.DecodeStep).Seconds()
		pages := (int64(p+o) + ps - 1) / ps
		hold[i], weight[i] = h, h*float64(pages*ps)
		prompt[i], output[i] = float64(p), float64(o)
	}
	k := max(1, (n+3)/4)
	var sumHold, sumWeight, sumPrompt, sumOutput float64
	best := Capacity{}
	for i := range n {
		sumHold += hold[i]
		sumWeight += weight[i]
		sumPrompt += prompt[i]
		sumOutput += output[i]
		if i >= k {
			sumHold -= hold[i-k]
			sumWeight -= weight[i-k]
			sumPrompt -= prompt[i-k]
			sumOutput -= output[i-k]
		}
		if i < k-1 {
			continue
		}
		// The engine-seconds the window needs: its hold time spread over
		// MaxRunning places, or its L1 token-seconds over L1, whichever binds.
		// What L1 holds is whole requests: two of 37 pages do not fit 60, however
		// the average reads.
		running, l1Bound := float64(c.MaxRunning), false
		if fit := max(1, math.Floor(l1*sumHold/sumWeight)); sumWeight > 0 && fit < running {
			running, l1Bound = fit, true
		}
		if sumHold <= 0 || running <= 0 {
			continue
		}
		perSecond := float64(k) * running / sumHold
		if best.Window == 0 || perSecond < best.RequestsPerSecond {
			best = Capacity{RequestsPerSecond: perSecond, Running: running, L1Bound: l1Bound,
				HoldSeconds: sumHold / float64(k), PromptTokens: sumPrompt / float64(k), OutputTokens: sumOutput / float64(k),
				Window: k, First: i - k + 1}
		}
	}
	return best
}

// describe says how the capacity comes about, in one line.
func (c Capacity) describe(maxRunning int, prefill, decode time.Duration) string {
	running := fmt.Sprintf("%.1f requests at once (--max-running %d)", c.Running, maxRunning)
	if c.L1Bound {
		running = fmt.Sprintf("%.1f requests at once (what L1 holds of them; --max-running %d)", c.Running, maxRunning)
	}
	return fmt.Sprintf("%.2f requests/s without a cache, over the busiest quarter of the trace: %s of %.3g s each (%s prompt tokens x %v + %.0f decode steps x %v)",
		c.RequestsPerSecond, running, c.HoldSeconds, groupDigits(int64(math.Round(c.PromptTokens))), prefill, c.OutputTokens, decode)
}

// Backlog is a run whose queue grew over the trace: the requests of its last
// quarter waited, on average, more than ten times as long as they held the
// engine, and more than twice as long as the first quarter's. At a load below 1
// a queue waits a few hold times at most (an M/G/1 queue at 0.7 about 1.2), so
// this is arrivals outrunning the engine, and TTFT measures the backlog. A short
// trace can end before a backlog shows: the offered load against the modelled
// capacity (Report.Load) says it first.
type Backlog struct {
	FirstQuarterWaitSeconds float64 `json:"first_quarter_wait_seconds"`
	LastQuarterWaitSeconds  float64 `json:"last_quarter_wait_seconds"`
	HoldSeconds             float64 `json:"hold_seconds"`
}

// backlogOf reports whether the waits (in admission order) grew: see Backlog.
// holds are the same requests' times in the engine.
func backlogOf(waits, holds []time.Duration) *Backlog {
	n := len(waits)
	if n < 4 {
		return nil
	}
	q := n / 4
	mean := func(d []time.Duration) float64 {
		var s time.Duration
		for _, v := range d {
			s += v
		}
		return s.Seconds() / float64(len(d))
	}
	first, last, hold := mean(waits[:q]), mean(waits[n-q:]), mean(holds[n-q:])
	if last > 10*hold && last > 2*first {
		return &Backlog{FirstQuarterWaitSeconds: first, LastQuarterWaitSeconds: last, HoldSeconds: hold}
	}
	return nil
}
