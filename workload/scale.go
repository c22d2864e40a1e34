package workload

import (
	"fmt"
	"math"
)

// Scalable is a workload whose arrival rate and size can be set from outside: the
// bench offers each model a load relative to what its simulated engine can serve,
// and scales a large model's trace down so that its run fits a time and disk
// budget. The three workloads implement it.
type Scalable interface {
	Generator
	// Rate is the mean request arrival rate in requests per second.
	Rate() float64
	// WithRate is the same workload arriving at rate requests per second: the
	// same requests in the same order, every arrival time scaled by Rate()/rate
	// (the arrivals have a stream of their own).
	WithRate(rate float64) Scalable
	// Scaled is a smaller workload of the same shape whose traces hold about f of
	// this one's prompt tokens and working set (0 < f < 1; more where lengths
	// that do not scale weigh, as long-context's questions do in a small trace),
	// and what changed, in words ("clients 48 → 5"). Lengths that were multiples of unit (the page
	// size) stay multiples of it. A workload keeps a floor of its structure (a
	// few conversations, groups or documents, so that a cache holding the longest
	// request still cannot hold them all), so the result can be larger than f
	// asks; with f >= 1, or at the floor already, it is the workload itself and "".
	Scaled(f float64, unit int) (Scalable, string)
}

var (
	_ Scalable = Multiturn{}
	_ Scalable = SharedPrefix{}
	_ Scalable = LongContext{}
)

// The floors of Scaled: fewer would leave a workload without the reuse across
// sessions that makes a cache hierarchy matter.
const (
	minScaledClients  = 4
	minScaledGroups   = 4
	minScaledPerGroup = 2
)

// Rate is RequestRate.
func (m Multiturn) Rate() float64 { return m.RequestRate }

// WithRate sets RequestRate.
func (m Multiturn) WithRate(rate float64) Scalable { m.RequestRate = rate; return m }

// Scaled keeps every conversation's shape (rounds, message and answer lengths,
// regenerations, edits and branches) and has fewer of them: prompt tokens and
// working set grow with Clients.
func (m Multiturn) Scaled(f float64, _ int) (Scalable, string) {
	c := scaleCount(m.Clients, f, minScaledClients)
	if c == m.Clients {
		return m, ""
	}
	desc := fmt.Sprintf("clients %d → %d", m.Clients, c)
	m.Clients = c
	return m, desc
}

// Rate is RequestRate.
func (s SharedPrefix) Rate() float64 { return s.RequestRate }

// WithRate sets RequestRate.
func (s SharedPrefix) WithRate(rate float64) Scalable { s.RequestRate = rate; return s }

// Scaled keeps the lengths and has fewer groups and fewer prompts per group, each
// by about the square root of f, so that both the shared working set (Groups *
// SystemTokens) and the number of prompts each system prompt serves shrink
// alike.
func (s SharedPrefix) Scaled(f float64, _ int) (Scalable, string) {
	if !(f < 1) || f <= 0 {
		return s, ""
	}
	g := scaleCount(s.Groups, math.Sqrt(f), minScaledGroups)
	want := f * float64(s.Groups) * float64(s.PromptsPerGroup) / float64(g)
	per := min(s.PromptsPerGroup, max(min(minScaledPerGroup, s.PromptsPerGroup), int(math.Round(want))))
	if g == s.Groups && per == s.PromptsPerGroup {
		return s, ""
	}
	desc := fmt.Sprintf("groups %d → %d, prompts per group %d → %d", s.Groups, g, s.PromptsPerGroup, per)
	s.Groups, s.PromptsPerGroup = g, per
	return s, desc
}

// Rate is RequestRate.
func (l LongContext) Rate() float64 { return l.RequestRate }

// WithRate sets RequestRate.
func (l LongContext) WithRate(rate float64) Scalable { l.RequestRate = rate; return l }

// Scaled keeps the documents, the questions about each and the question and
// output lengths, and shortens the documents: the working set and prompt tokens
// are nearly all document tokens.
func (l LongContext) Scaled(f float64, unit int) (Scalable, string) {
	if !(f < 1) || f <= 0 {
		return l, ""
	}
	doc := l.DocumentTokens
	n := int(math.Round(float64(doc) * f))
	if unit > 0 && doc%unit == 0 {
		n = max(unit, int(math.Round(float64(doc)*f/float64(unit)))*unit)
	}
	n = min(doc, max(n, 1))
	if n == doc {
		return l, ""
	}
	desc := fmt.Sprintf("document tokens %d → %d", doc, n)
	l.DocumentTokens = n
	return l, desc
}

// scaleCount is n scaled by f and rounded, at least floor (or n, when n is below
// it) and at most n.
func scaleCount(n int, f float64, floor int) int {
	if !(f < 1) || f <= 0 {
		return n
	}
	return min(n, max(min(floor, n), int(math.Round(float64(n)*f))))
}
