package workload

import (
	"encoding/binary"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// referenceDistinct is the definition of DistinctPrefixTokens, spelled out with
// whole prefixes as map keys.
func referenceDistinct(tr Trace, pageSize int) int64 {
	if pageSize < 1 {
		return 0
	}
	seen := make(map[string]bool)
	for _, r := range tr.Requests {
		for _, seq := range [][]uint32{r.Prompt, slices.Concat(r.Prompt, r.Output)} {
			var key []byte
			for i, tok := range seq {
				key = binary.LittleEndian.AppendUint32(key, tok)
				if (i+1)%pageSize == 0 {
					seen[string(key)] = true
				}
			}
		}
	}
	return int64(len(seen)) * int64(pageSize)
}

func req(prompt, output []uint32) Request { return Request{Prompt: prompt, Output: output} }

func TestDistinctPrefixTokensByHand(t *testing.T) {
	tests := []struct {
		name     string
		reqs     []Request
		pageSize int
		want     int64
	}{
		{"empty trace", nil, 4, 0},
		{"page size 0", []Request{req([]uint32{1, 2}, nil)}, 0, 0},
		{"negative page size", []Request{req([]uint32{1, 2}, nil)}, -3, 0},
		{"page longer than any sequence", []Request{req([]uint32{1, 2}, []uint32{3})}, 4, 0},
		{"huge page size", []Request{req([]uint32{1, 2}, []uint32{3})}, 1 << 62, 0},
		{"prompt page and prompt+output page", []Request{req([]uint32{1, 2, 3}, []uint32{4})}, 2, 4},
		{"partial last page is not counted", []Request{req([]uint32{1, 2, 3}, []uint32{4})}, 3, 3},
		{"page size 1 counts distinct prefixes", []Request{req([]uint32{1, 2, 3}, []uint32{4})}, 1, 4},
		{"shared first page, different second", []Request{
			req([]uint32{1, 2, 3, 4}, []uint32{5}),
			req([]uint32{1, 2, 9, 9}, nil),
		}, 2, 6},
		{"split between prompt and output does not matter", []Request{
			req([]uint32{1, 2}, []uint32{3, 4}),
			req([]uint32{1, 2, 3, 4}, nil),
			req([]uint32{1}, []uint32{2, 3, 4}),
		}, 2, 4},
		{"equal pages after different prefixes are distinct", []Request{
			req([]uint32{7, 7, 1, 1}, nil),
			req([]uint32{1, 1}, nil),
		}, 2, 6},
		{"identical requests count once", []Request{
			req([]uint32{5, 6, 7, 8}, []uint32{9, 10}),
			req([]uint32{5, 6, 7, 8}, []uint32{9, 10}),
		}, 3, 6},
		{"page spanning prompt and output", []Request{
			req([]uint32{1, 2, 3, 4, 5}, []uint32{6, 7, 8}),
			req([]uint32{1, 2, 3, 4, 5}, []uint32{6, 0, 8}),
		}, 4, 12},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := Trace{Requests: tt.reqs}
			if got := tr.DistinctPrefixTokens(tt.pageSize); got != tt.want {
				t.Errorf("DistinctPrefixTokens(%d) = %d, want %d", tt.pageSize, got, tt.want)
			}
			if tt.pageSize < 1<<20 {
				if ref := referenceDistinct(tr, tt.pageSize); ref != tt.want {
					t.Errorf("reference gives %d, want %d: the case is wrong", ref, tt.want)
				}
			}
		})
	}
}

// Arbitrary traces over a 3-token vocabulary: prefixes collide everywhere, across
// requests and across the prompt/output boundary.
func TestDistinctPrefixTokensMatchesReference(t *testing.T) {
	tokens := rapid.SliceOfN(rapid.Uint32Range(0, 2), 0, 14)
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(0, 8).Draw(t, "requests")
		tr := Trace{}
		for i := range n {
			tr.Requests = append(tr.Requests, Request{ID: i, Prompt: tokens.Draw(t, "prompt"), Output: tokens.Draw(t, "output")})
		}
		pageSize := rapid.IntRange(1, 6).Draw(t, "pageSize")
		if got, want := tr.DistinctPrefixTokens(pageSize), referenceDistinct(tr, pageSize); got != want {
			t.Fatalf("DistinctPrefixTokens(%d) = %d, reference %d", pageSize, got, want)
		}
	})
}

func TestDistinctPrefixTokensOfGeneratedTraces(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		g := genGenerator(t)
		tr := mustGenerate(t, g, rapid.Int64().Draw(t, "seed"))
		pageSize := rapid.IntRange(1, 30).Draw(t, "pageSize")
		got := tr.DistinctPrefixTokens(pageSize)
		if want := referenceDistinct(tr, pageSize); got != want {
			t.Fatalf("DistinctPrefixTokens(%d) = %d, reference %d", pageSize, got, want)
		}
		// Sessions share exactly their designed prefixes, so the working set has a
		// closed form.
		if want := designedDistinct(g, pageSize); want >= 0 && got != want {
			t.Fatalf("DistinctPrefixTokens(%d) = %d, the workload's design gives %d", pageSize, got, want)
		}
	})
}

// designedDistinct is the working set each workload is built to have: pages of one
// conversation history per client (-1 for conversations that go back), or each group's shared prefix pages plus every
// request's own pages past them.
func designedDistinct(g Generator, ps int) int64 {
	grouped := func(groups, perGroup, prefix, rest int) int64 {
		shared := prefix / ps
		own := (prefix+rest)/ps - shared
		return int64(groups*(shared+perGroup*own)) * int64(ps)
	}
	switch g := g.(type) {
	case Multiturn:
		if g.RegenerateRatio > 0 || g.EditRatio > 0 || g.BranchRatio > 0 {
			return -1 // every branch adds pages of its own
		}
		return int64(g.Clients*(g.Rounds*(g.RequestTokens+g.OutputTokens)/ps)) * int64(ps)
	case SharedPrefix:
		return grouped(g.Groups, g.PromptsPerGroup, g.SystemTokens, g.QuestionTokens+g.OutputTokens)
	case LongContext:
		return grouped(g.Documents, g.QuestionsPerDocument, g.DocumentTokens, g.QuestionTokens+g.OutputTokens)
	}
	return -1
}

func TestTraceTotals(t *testing.T) {
	tr := Trace{Requests: []Request{
		req([]uint32{1, 2, 3}, []uint32{4}),
		req([]uint32{1}, []uint32{2, 3}),
	}}
	tr.Requests[1].Arrival = 1500
	if tr.PromptTokens() != 4 || tr.OutputTokens() != 3 || tr.Duration() != 1500 {
		t.Errorf("totals %d prompt, %d output, %v duration; want 4, 3, 1.5µs", tr.PromptTokens(), tr.OutputTokens(), tr.Duration())
	}
	if (Trace{}).Duration() != 0 {
		t.Error("empty trace has a duration")
	}
}

// referenceReused is the definition of ReusedPrefixTokens, spelled out with whole
// prefixes as map keys.
func referenceReused(tr Trace, pageSize int) int64 {
	if pageSize < 1 {
		return 0
	}
	seen := make(map[string]bool)
	reused := make(map[string]bool)
	for _, r := range tr.Requests {
		var key []byte
		for i, tok := range r.Prompt {
			key = binary.LittleEndian.AppendUint32(key, tok)
			if (i+1)%pageSize == 0 && seen[string(key)] {
				reused[string(key)] = true
			}
		}
		key = key[:0]
		for i, tok := range slices.Concat(r.Prompt, r.Output) {
			key = binary.LittleEndian.AppendUint32(key, tok)
			if (i+1)%pageSize == 0 {
				seen[string(key)] = true
			}
		}
	}
	return int64(len(reused)) * int64(pageSize)
}

func TestReusedPrefixTokensByHand(t *testing.T) {
	tests := []struct {
		name     string
		reqs     []Request
		pageSize int
		want     int64
	}{
		{"empty trace", nil, 4, 0},
		{"page size 0", []Request{req([]uint32{1, 2}, nil)}, 0, 0},
		{"one request reuses nothing", []Request{req([]uint32{1, 2, 3, 4}, []uint32{5, 6})}, 2, 0},
		{"a later prompt hits the earlier prompt's pages", []Request{
			req([]uint32{1, 2, 3, 4}, nil),
			req([]uint32{1, 2, 3, 4, 5, 6}, nil),
		}, 2, 4},
		{"and its output's", []Request{
			req([]uint32{1, 2}, []uint32{3, 4}),
			req([]uint32{1, 2, 3, 4, 5}, nil),
		}, 2, 4},
		{"a page hit twice counts once", []Request{
			req([]uint32{7, 8}, nil),
			req([]uint32{7, 8, 1}, nil),
			req([]uint32{7, 8, 2}, nil),
		}, 2, 2},
		{"the output a later prompt does not repeat is not reused", []Request{
			req([]uint32{1, 2}, []uint32{3, 4}),
			req([]uint32{1, 2, 9, 9}, nil),
		}, 2, 2},
		{"within one request nothing is reused", []Request{req([]uint32{1, 1, 1, 1}, []uint32{1, 1})}, 1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := Trace{Requests: tt.reqs}
			if got := tr.ReusedPrefixTokens(tt.pageSize); got != tt.want {
				t.Errorf("ReusedPrefixTokens(%d) = %d, want %d", tt.pageSize, got, tt.want)
			}
			if ref := referenceReused(tr, tt.pageSize); ref != tt.want {
				t.Errorf("reference gives %d, want %d: the case is wrong", ref, tt.want)
			}
		})
	}
}

func TestReusedPrefixTokensMatchesReference(t *testing.T) {
	tokens := rapid.SliceOfN(rapid.Uint32Range(0, 2), 0, 14)
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(0, 8).Draw(t, "requests")
		tr := Trace{}
		for i := range n {
			tr.Requests = append(tr.Requests, Request{ID: i, Prompt: tokens.Draw(t, "prompt"), Output: tokens.Draw(t, "output")})
		}
		pageSize := rapid.IntRange(1, 6).Draw(t, "pageSize")
		got, want := tr.ReusedPrefixTokens(pageSize), referenceReused(tr, pageSize)
		if got != want {
			t.Fatalf("ReusedPrefixTokens(%d) = %d, reference %d", pageSize, got, want)
		}
		if d := tr.DistinctPrefixTokens(pageSize); got > d {
			t.Fatalf("reused %d tokens of a working set of %d", got, d)
		}
	})
}
