package sim

import (
	"fmt"
	"math"
	"math/bits"

	"github.com/stratakv/strata/workload"
)

// Budget bounds what a scaled bench moves (Config.ScaleTrace). The figures are in
// KV bytes of every pool of the group, so a model with 20 times the KV per token
// gets a trace with a twentieth of the tokens: the same page size, geometry,
// tier ratios and load, on a smaller trace.
type Budget struct {
	// PromptKVBytes bounds the KV of the trace's prompts: what the l1-only and
	// strata runs each compute or verify, which sets the bench's time (about a
	// second per GiB on two cores).
	PromptKVBytes int64 `json:"prompt_kv_bytes"`
	// WorkingSetBytes bounds the KV of the trace's working set: what the strata
	// run writes to L3, and so at most what the node service spills to the
	// temporary directory.
	WorkingSetBytes int64 `json:"working_set_bytes"`
}

// DefaultBudget is `strata bench`'s: a run within a minute on two cores and 4 GiB
// of temporary disk. It leaves the default model's traces unscaled.
func DefaultBudget() Budget { return Budget{PromptKVBytes: 12 << 30, WorkingSetBytes: 4 << 30} }

func (b Budget) orDefault() Budget {
	d := DefaultBudget()
	if b.PromptKVBytes <= 0 {
		b.PromptKVBytes = d.PromptKVBytes
	}
	if b.WorkingSetBytes <= 0 {
		b.WorkingSetBytes = d.WorkingSetBytes
	}
	return b
}

// Scaling says how a trace was scaled down to the budget.
type Scaling struct {
	// Changed is what changed, in words ("clients 48 → 5").
	Changed string `json:"changed"`
	// Budget is what the trace was scaled to.
	Budget Budget `json:"budget"`
	// FullPromptKVBytes and FullWorkingSetBytes are the unscaled trace's, what
	// --full moves.
	FullPromptKVBytes   int64 `json:"full_prompt_kv_bytes"`
	FullWorkingSetBytes int64 `json:"full_working_set_bytes"`
	// OverBudget is set when the workload reached its smallest shape before the
	// budget.
	OverBudget bool `json:"over_budget,omitempty"`
}

// scaleWorkload scales gen down until its trace's KV fits the budget, and says
// how; a trace within it is returned as it is, with nil.
func (c Config) scaleWorkload(gen workload.Scalable) (workload.Scalable, *Scaling, error) {
	budget := c.Budget.orDefault()
	tb := c.tokenBytes()
	sizes := func(g workload.Scalable) (prompt, ws int64, err error) {
		tr, err := g.Generate(c.Seed)
		if err != nil {
			return 0, 0, err
		}
		return tr.PromptTokens() * tb, tr.DistinctPrefixTokens(c.PageSize) * tb, nil
	}
	fullPrompt, fullWS, err := sizes(gen)
	if err != nil {
		return nil, nil, err
	}
	over := func(prompt, ws int64) float64 {
		return max(float64(prompt)/float64(budget.PromptKVBytes), float64(ws)/float64(budget.WorkingSetBytes))
	}
	if over(fullPrompt, fullWS) <= 1 {
		return gen, nil, nil
	}
	// The trace's sizes are about proportional to f; the lengths that do not
	// scale (multiturn's rounds, long-context's questions) make them a little
	// larger, which a few steps correct.
	f, scaled, changed := 1/over(fullPrompt, fullWS), gen, ""
	floor := changedAtFloor(gen, c.PageSize)
	for range 12 {
		next, desc := gen.Scaled(f, c.PageSize)
		prompt, ws, err := sizes(next)
		if err != nil {
			return nil, nil, err
		}
		scaled, changed = next, desc
		o := over(prompt, ws)
		if o <= 1 || desc == floor {
			break
		}
		f /= o * 1.02
	}
	s := &Scaling{Changed: changed, Budget: budget, FullPromptKVBytes: fullPrompt, FullWorkingSetBytes: fullWS}
	if prompt, ws, err := sizes(scaled); err != nil {
		return nil, nil, err
	} else if over(prompt, ws) > 1 {
		s.OverBudget = true
	}
	if changed == "" {
		return gen, s, nil
	}
	return scaled, s, nil
}

// changedAtFloor is what Scaled says at the workload's smallest shape.
func changedAtFloor(gen workload.Scalable, unit int) string {
	_, desc := gen.Scaled(math.SmallestNonzeroFloat64, unit)
	return desc
}

func (s *Scaling) describe() string {
	out := fmt.Sprintf("%s, so that the prompts' KV fits %s and the working set's %s (unscaled: %s and %s; --full runs it)",
		s.Changed, formatBytes(s.Budget.PromptKVBytes), formatBytes(s.Budget.WorkingSetBytes),
		formatBytes(s.FullPromptKVBytes), formatBytes(s.FullWorkingSetBytes))
	if s.OverBudget {
		out += "; at its smallest shape the trace is still over that"
	}
	return out
}

// tierShare is the most of the trace's reused working set that L1 and L2 hold
// together when the bench sizes them: a deployment has an L3 because its host
// memory runs out, so on defaults some pages that are hit again have left L2,
// and L3 serves them.
const tierShare = 0.9

// maxDefaultL2Ratio is the L2 ratio the bench sizes with, unless the reused working
// set calls for less (SGLang uses 2 to 4).
const maxDefaultL2Ratio = 4

// sizeTiers chooses what SizeL1 and SizeL2 leave to the bench: L1 and L2 together
// hold tierShare of the trace's reused working set, L2 maxDefaultL2Ratio times L1
// (less when L1 must hold the longest request and the working set is small), and
// L1 at least the longest request. It returns a note when L3 can have nothing
// to serve.
func (c *Config) sizeTiers(trace workload.Trace) string {
	ps := int64(c.PageSize)
	longest := int64(0)
	for _, r := range trace.Requests {
		longest = max(longest, int64(len(r.Prompt)+len(r.Output)))
	}
	floor := max((longest+ps-1)/ps*ps, ps)
	reused := trace.ReusedPrefixTokens(c.PageSize)
	target := tierShare * float64(reused)
	if c.SizeL1 {
		ratio := c.L2Ratio
		if c.SizeL2 {
			ratio = maxDefaultL2Ratio
		}
		c.L1Tokens = max(floor, roundSize(int64(target/(1+ratio)), ps))
	}
	if c.SizeL2 {
		// One decimal, rounded down, so that L1 + L2 stays under the target.
		ratio := math.Floor((target/float64(c.L1Tokens/ps*ps)-1)*10) / 10
		c.L2Ratio = min(maxDefaultL2Ratio, max(1, ratio))
	}
	l1 := c.L1Tokens / ps * ps
	if float64(l1)+float64(c.l2Pages())*float64(ps) >= float64(reused) {
		return fmt.Sprintf("L1 and L2 (%s + %s tokens) hold all of the %s tokens of the trace that are hit again, so L3 has nothing to serve: give a larger workload (more --clients, --groups or --documents) or a smaller --l2-ratio",
			groupDigits(l1), groupDigits(int64(c.l2Pages())*ps), groupDigits(reused))
	}
	return ""
}

// roundSize rounds n down to a multiple of the page size with three significant
// bits (16384, 14336, 5632), which reads better than 16448 and gives up at most
// an eighth.
func roundSize(n, ps int64) int64 {
	step := int64(1) << max(0, bits.Len64(uint64(max(n, 1)))-4)
	step = max(ps, step/ps*ps)
	return n / step * step
}
