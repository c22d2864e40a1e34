package workload

import (
	"math"
	"slices"
	"strings"
	"testing"
)

// Scaled keeps a workload's shape and takes about the fraction asked of its
// prompt tokens and working set, down to its floor.
func TestScaledKeepsTheShape(t *testing.T) {
	for _, g := range []Scalable{DefaultMultiturn(), DefaultSharedPrefix(), DefaultLongContext()} {
		full := mustGenerate(t, g, 1)
		for _, f := range []float64{0.5, 0.25, 0.1} {
			s, desc := g.Scaled(f, 64)
			if desc == "" || s.Name() != g.Name() || s.Rate() != g.Rate() {
				t.Fatalf("%s scaled by %v: %q, %s at %v/s", g.Name(), f, desc, s.Name(), s.Rate())
			}
			tr := mustGenerate(t, s, 1)
			checkCommon(t, tr, g.Name(), 1, DefaultVocab)
			// Rounding counts and the lengths that do not scale (long-context's
			// questions and answers) move them.
			got := float64(tr.PromptTokens()) / float64(full.PromptTokens())
			if got > 1.6*f || got < 0.5*f {
				t.Errorf("%s scaled by %v (%s): %.3f of the prompt tokens", g.Name(), f, desc, got)
			}
			if ws := float64(tr.DistinctPrefixTokens(64)) / float64(full.DistinctPrefixTokens(64)); ws > 2.5*f || ws < 0.5*f {
				t.Errorf("%s scaled by %v (%s): %.3f of the working set", g.Name(), f, desc, ws)
			}
		}
		if s, desc := g.Scaled(1, 64); desc != "" || !equalConfig(s, g) {
			t.Errorf("%s scaled by 1: %q", g.Name(), desc)
		}
	}
	// The floors: a few conversations, groups of prompts.
	m, _ := DefaultMultiturn().Scaled(1e-9, 64)
	if m.(Multiturn).Clients != minScaledClients {
		t.Errorf("multiturn at its floor: %+v", m)
	}
	sp, _ := DefaultSharedPrefix().Scaled(1e-9, 64)
	if s := sp.(SharedPrefix); s.Groups != minScaledGroups || s.PromptsPerGroup != minScaledPerGroup {
		t.Errorf("shared-prefix at its floor: %+v", s)
	}
	lc, desc := DefaultLongContext().Scaled(1e-9, 64)
	if l := lc.(LongContext); l.DocumentTokens != 64 || !strings.Contains(desc, "16384 → 64") {
		t.Errorf("long-context at its floor: %+v (%s)", l, desc)
	}
	// Lengths that are not multiples of the unit scale as they are.
	odd := DefaultLongContext()
	odd.DocumentTokens = 1000
	if l, _ := odd.Scaled(0.5, 64); l.(LongContext).DocumentTokens != 500 {
		t.Errorf("1000-token documents scaled by half: %+v", l)
	}
}

func equalConfig(a, b Scalable) bool { return a == b }

// WithRate moves the arrivals and nothing else.
func TestWithRateMovesOnlyArrivals(t *testing.T) {
	for _, g := range []Scalable{DefaultMultiturn(), DefaultSharedPrefix(), DefaultLongContext()} {
		fast := g.WithRate(4 * g.Rate())
		if fast.Rate() != 4*g.Rate() {
			t.Fatalf("%s: rate %v, want %v", g.Name(), fast.Rate(), 4*g.Rate())
		}
		a, b := mustGenerate(t, g, 3), mustGenerate(t, fast, 3)
		for i := range a.Requests {
			ra, rb := a.Requests[i], b.Requests[i]
			if !slices.Equal(ra.Prompt, rb.Prompt) || !slices.Equal(ra.Output, rb.Output) {
				t.Fatalf("%s request %d differs beyond its arrival", g.Name(), i)
			}
			if d := math.Abs(float64(ra.Arrival - 4*rb.Arrival)); d > 8 {
				t.Fatalf("%s request %d arrives at %v, at 4x the rate at %v", g.Name(), i, ra.Arrival, rb.Arrival)
			}
		}
	}
}
