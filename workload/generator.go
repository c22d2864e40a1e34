package workload

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"strings"
	"time"
)

// Generator produces a trace from a seed. The same configuration and seed give the
// same trace, token for token, on every run.
type Generator interface {
	// Name is the workload's name, as ByName accepts it.
	Name() string
	// Generate validates the configuration and builds the trace for seed.
	Generate(seed int64) (Trace, error)
}

// DefaultVocab is Qwen's vocabulary size, the default range of token ids. The ids are
// random either way; the vocabulary only matters to code that embeds or detokenizes
// them.
const DefaultVocab = 151936

// MaxTokens bounds the tokens of one trace, prompts and outputs together. A trace
// holds at most this many tokens in memory (256 MiB of ids) and takes a simulator
// minutes to replay; bigger configurations are almost certainly a typo.
const MaxTokens = 64 << 20

// MaxRequests bounds the requests of one trace. Tiny requests could otherwise pass
// MaxTokens in numbers no simulator replays in reasonable time.
const MaxRequests = 1 << 20

const (
	multiturnName    = "multiturn"
	sharedPrefixName = "shared-prefix"
	longContextName  = "long-context"
)

// Names lists the workloads ByName knows, in a stable order.
func Names() []string { return []string{multiturnName, sharedPrefixName, longContextName} }

// ByName returns the named workload with its default configuration: a *Multiturn,
// *SharedPrefix or *LongContext, so a caller can type-switch on it to change fields
// before generating.
func ByName(name string) (Generator, error) {
	switch name {
	case multiturnName:
		g := DefaultMultiturn()
		return &g, nil
	case sharedPrefixName:
		g := DefaultSharedPrefix()
		return &g, nil
	case longContextName:
		g := DefaultLongContext()
		return &g, nil
	}
	return nil, fmt.Errorf("workload %q: want one of %s: %w", name, strings.Join(Names(), ", "), ErrConfig)
}

// The PCG stream of each use of randomness. Separate streams keep tokens, order and
// arrivals independent: a different rate gives the same tokens in the same order.
// Each workload salts them with its name, so that two workloads run with one seed
// against a persistent store share no pages.
const (
	streamTokens   = 0x7374726174612d74 // "strata-t"
	streamOrder    = 0x7374726174612d6f // "strata-o"
	streamArrivals = 0x7374726174612d61 // "strata-a"
	// Multiturn's regenerations and edits: which rounds go back, and their tokens.
	streamBranch       = 0x7374726174612d62 // "strata-b"
	streamBranchTokens = 0x7374726174612d65 // "strata-e"
)

func newRand(seed int64, workload string, stream uint64) *rand.Rand {
	h := fnv.New64a()
	h.Write([]byte(workload))
	return rand.New(rand.NewPCG(uint64(seed), stream^h.Sum64()))
}

// tokenSource draws token ids uniformly from [0, vocab).
type tokenSource struct {
	r     *rand.Rand
	vocab uint64
}

func newTokenSource(seed int64, workload string, vocab int) *tokenSource {
	return &tokenSource{r: newRand(seed, workload, streamTokens), vocab: uint64(vocab)}
}

func (s *tokenSource) fill(dst []uint32) {
	for i := range dst {
		dst[i] = uint32(s.r.Uint64N(s.vocab))
	}
}

// fillFresh fills dst (not empty) with random tokens whose first token is not in
// used, and adds it to used. Sibling sequences drawn this way never share a prefix,
// however short. Validation keeps the siblings at most vocab, so a fresh token
// always exists.
func (s *tokenSource) fillFresh(dst []uint32, used map[uint32]struct{}) {
	for {
		first := uint32(s.r.Uint64N(s.vocab))
		if _, dup := used[first]; !dup {
			used[first] = struct{}{}
			dst[0] = first
			break
		}
	}
	s.fill(dst[1:])
}

// shuffled returns a seeded random permutation of 0..n-1.
func shuffled(r *rand.Rand, n int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = i
	}
	r.Shuffle(n, func(i, j int) { p[i], p[j] = p[j], p[i] })
	return p
}

// arrive sets Poisson arrival times: the first request at 0, then exponential gaps
// of mean 1/rate seconds.
func arrive(reqs []Request, seed int64, workload string, rate float64) {
	r := newRand(seed, workload, streamArrivals)
	t := 0.0
	for i := range reqs {
		if i > 0 {
			t += r.ExpFloat64() / rate
		}
		reqs[i].Arrival = seconds(t)
	}
}

// seconds converts to a Duration, saturating where a tiny rate would overflow it.
func seconds(t float64) time.Duration {
	ns := t * 1e9
	if ns >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(ns)
}

// check gathers a configuration's problems so Validate reports all of them at once.
type check struct {
	workload string
	errs     []error
}

func (c *check) fail(format string, args ...any) {
	c.errs = append(c.errs, fmt.Errorf("%s: %s: %w", c.workload, fmt.Sprintf(format, args...), ErrConfig))
}

// positive requires a count or length of at least 1.
func (c *check) positive(field string, v int, advice string) {
	if v < 1 {
		c.fail("%s is %d; it must be at least 1 (%s)", field, v, advice)
	}
}

func (c *check) vocab(v int) {
	if v < 2 || int64(v) > 1<<32 {
		c.fail("Vocab is %d; it must be in [2, 2^32] because token ids are uint32 (Qwen's is %d)", v, DefaultVocab)
	}
}

func (c *check) rate(r float64) {
	if !(r > 0) || math.IsInf(r, 0) {
		c.fail("RequestRate is %v; it must be a finite number of requests per second above 0", r)
	}
}

// siblings requires at most vocab sequences that must start with different tokens.
func (c *check) siblings(field string, n, vocab int, what string) {
	if n > vocab && vocab >= 2 {
		c.fail("%s is %d but Vocab is %d; %s start with different tokens, so there can be at most Vocab of them", field, n, vocab, what)
	}
}

// size rejects traces over MaxRequests or MaxTokens. Call it only once the fields
// are positive, with saturated products.
func (c *check) size(requests, tokens int64) {
	if requests > MaxRequests {
		c.fail("the trace would hold %s requests, more than the limit of %d (MaxRequests); lower the counts", approx(requests), MaxRequests)
	}
	if tokens > MaxTokens {
		c.fail("the trace would hold %s tokens, more than the limit of %d (MaxTokens); lower the counts or lengths", approx(tokens), MaxTokens)
	}
}

func approx(n int64) string {
	if n == math.MaxInt64 {
		return "over 2^63"
	}
	return fmt.Sprint(n)
}

// err joins the problems, one per line; errors.Is finds ErrConfig in each.
func (c *check) err() error { return errors.Join(c.errs...) }

// mul and add saturate at math.MaxInt64 so absurd sizes compare as too big instead
// of wrapping around. Both take non-negative operands.
func mul(a, b int64) int64 {
	if a != 0 && b > math.MaxInt64/a {
		return math.MaxInt64
	}
	return a * b
}

func add(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
