package workload

import (
	"encoding/binary"
	"time"

	"github.com/zeebo/xxh3"
)

// Request is one prompt the simulated engine serves.
//
// Prompt and Output are read-only: requests may share memory (every round of a
// multiturn session is a view of one conversation history). Each slice's capacity
// ends at its length, so appending to one copies instead of overwriting the tokens
// of another request.
type Request struct {
	// ID is the request's index in the trace, 0..n-1.
	ID int `json:"id"`
	// Session is the conversation (multiturn), group (shared-prefix) or document
	// (long-context) the request belongs to; requests of one session share a prefix.
	Session int `json:"session"`
	// Round is the multiturn round, from 0; it is 0 in the other workloads.
	Round int `json:"round"`
	// Arrival is when the request arrives, measured from the start of the trace. It
	// never decreases along the trace and the first request arrives at 0.
	Arrival time.Duration `json:"arrival"`
	// Prompt is the prompt's token ids.
	Prompt []uint32 `json:"prompt"`
	// Output is the token ids the engine decodes after the prompt.
	Output []uint32 `json:"output"`
}

// Trace is a generated workload: the requests a simulated engine serves, in arrival
// order.
type Trace struct {
	// Name is the workload's name, as ByName accepts it.
	Name string `json:"name"`
	// Seed is the seed the trace was generated from.
	Seed int64 `json:"seed"`
	// Requests are the requests in arrival order.
	Requests []Request `json:"requests"`
}

// PromptTokens is the number of prompt tokens in the trace: the prefill work an
// engine without a prefix cache would do.
func (t Trace) PromptTokens() int64 {
	var n int64
	for i := range t.Requests {
		n += int64(len(t.Requests[i].Prompt))
	}
	return n
}

// OutputTokens is the number of decoded tokens in the trace.
func (t Trace) OutputTokens() int64 {
	var n int64
	for i := range t.Requests {
		n += int64(len(t.Requests[i].Output))
	}
	return n
}

// Duration is the arrival time of the last request: how long the trace lasts at its
// request rate, not counting the time to serve the last request.
func (t Trace) Duration() time.Duration {
	if len(t.Requests) == 0 {
		return 0
	}
	return t.Requests[len(t.Requests)-1].Arrival
}

// DistinctPrefixTokens is the working set of a prefix cache with pageSize-token
// pages: the number of distinct whole-page prefixes among every request's Prompt and
// Prompt+Output, times pageSize. Page p of a sequence s is the prefix
// s[0:(p+1)*pageSize], so two requests share a page only if they agree on every
// token up to its end. A cache that holds this many tokens misses only on first
// use. It is 0 for a pageSize below 1.
//
// Pages are identified by a 128-bit hash chain (XXH3 of the previous page's hash and
// the page's tokens), so the cost is linear in the trace's tokens and memory is one
// map entry per distinct page.
func (t Trace) DistinctPrefixTokens(pageSize int) int64 {
	seen := make(map[xxh3.Uint128]struct{})
	t.eachPage(pageSize, func(_ int, page xxh3.Uint128, _ bool) { seen[page] = struct{}{} })
	return int64(len(seen)) * int64(pageSize)
}

// ReusedPrefixTokens is the part of the working set that is ever hit: the number of
// distinct whole-page prefixes of prompts that an earlier request's Prompt+Output
// also holds, times pageSize. Pages no later prompt shares (a question, the last
// round's answer) count in DistinctPrefixTokens but a cache gains nothing by
// keeping them, so this is what a cache must hold to hit everything a cache can:
// a cache smaller than it must evict pages that are hit again. It is 0 for a
// pageSize below 1.
func (t Trace) ReusedPrefixTokens(pageSize int) int64 {
	seen := make(map[xxh3.Uint128]struct{})
	reused := make(map[xxh3.Uint128]struct{})
	var mine []xxh3.Uint128
	current := -1
	t.eachPage(pageSize, func(i int, page xxh3.Uint128, inPrompt bool) {
		if i != current {
			// A request's own pages become visible to the requests after it.
			for _, p := range mine {
				seen[p] = struct{}{}
			}
			mine, current = mine[:0], i
		}
		if _, ok := seen[page]; ok && inPrompt {
			reused[page] = struct{}{}
		}
		mine = append(mine, page)
	})
	return int64(len(reused)) * int64(pageSize)
}

// eachPage calls fn with every whole page of every request's Prompt+Output, in
// order, as the digest of its prefix, and whether the page lies inside the prompt.
func (t Trace) eachPage(pageSize int, fn func(request int, page xxh3.Uint128, inPrompt bool)) {
	if pageSize < 1 {
		return
	}
	longest := 0
	for i := range t.Requests {
		longest = max(longest, len(t.Requests[i].Prompt)+len(t.Requests[i].Output))
	}
	if longest < pageSize {
		// Checked before sizing the page buffer, which a huge pageSize would make huge.
		return
	}
	buf := make([]byte, 16+4*pageSize)
	for i := range t.Requests {
		// Every whole page of the Prompt is also a whole page of Prompt+Output, so
		// the pages of Prompt+Output are the request's whole contribution.
		prompt, output := t.Requests[i].Prompt, t.Requests[i].Output
		np := len(prompt)
		var prev xxh3.Uint128
		for end := pageSize; end <= np+len(output); end += pageSize {
			start := end - pageSize
			digest := prev.Bytes()
			copy(buf, digest[:])
			page := buf[16:]
			if start < np {
				page = putTokens(page, prompt[start:min(end, np)])
			}
			if end > np {
				putTokens(page, output[max(start, np)-np:end-np])
			}
			prev = xxh3.Hash128(buf)
			fn(i, prev, end <= np)
		}
	}
}

// putTokens writes tokens little-endian at the start of dst and returns the rest.
func putTokens(dst []byte, tokens []uint32) []byte {
	for _, tok := range tokens {
		binary.LittleEndian.PutUint32(dst, tok)
		dst = dst[4:]
	}
	return dst
}
