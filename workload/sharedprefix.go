package workload

// SharedPrefix is the workload prefix caching was built for: Groups system prompts,
// each followed by PromptsPerGroup different questions. Prompts of one group share
// exactly their SystemTokens leading tokens; prompts of different groups share
// nothing. All Groups*PromptsPerGroup prompts arrive in a shuffled order.
type SharedPrefix struct {
	// Groups is the number of distinct system prompts. The shared working set is
	// Groups * SystemTokens; make it exceed the cache to test eviction of hot
	// prefixes.
	Groups int `json:"groups"`
	// PromptsPerGroup is the number of questions asked behind each system prompt.
	// Hit rate approaches 1 - 1/PromptsPerGroup of the system tokens when every
	// system prompt fits.
	PromptsPerGroup int `json:"promptsPerGroup"`
	// SystemTokens is the length of each group's system prompt, the reusable part.
	// Use a multiple of the page size so the whole prefix is reusable.
	SystemTokens int `json:"systemTokens"`
	// QuestionTokens is the length of each prompt's own question, which never hits.
	QuestionTokens int `json:"questionTokens"`
	// OutputTokens is the number of tokens the engine decodes per request.
	OutputTokens int `json:"outputTokens"`
	// RequestRate is the mean requests per second of the Poisson arrival process.
	RequestRate float64 `json:"requestRate"`
	// Vocab bounds the token ids: they are uniform in [0, Vocab). At least Groups and
	// PromptsPerGroup, because system prompts, and the questions of one group, start
	// with different tokens.
	Vocab int `json:"vocab"`
}

// DefaultSharedPrefix returns 16 groups of 24 prompts behind 2048-token system
// prompts, with 256-token questions, 64-token outputs and 16 requests/s: 384
// requests, 884,736 prompt tokens.
func DefaultSharedPrefix() SharedPrefix {
	return SharedPrefix{Groups: 16, PromptsPerGroup: 24, SystemTokens: 2048, QuestionTokens: 256,
		OutputTokens: 64, RequestRate: 16, Vocab: DefaultVocab}
}

var _ Generator = SharedPrefix{}

// Name is "shared-prefix".
func (s SharedPrefix) Name() string { return sharedPrefixName }

// Validate reports every field that cannot produce a trace, each error wrapping
// ErrConfig.
func (s SharedPrefix) Validate() error { return s.shape().validate() }

// Generate builds the trace: Groups*PromptsPerGroup requests in a shuffled order.
func (s SharedPrefix) Generate(seed int64) (Trace, error) { return s.shape().generate(seed) }

func (s SharedPrefix) shape() prefixedShape {
	return prefixedShape{
		workload: sharedPrefixName,
		positive: []namedField{
			{"Groups", s.Groups, "the number of distinct system prompts"},
			{"PromptsPerGroup", s.PromptsPerGroup, "prompts behind each system prompt"},
			{"SystemTokens", s.SystemTokens, "length of the shared system prompt"},
			{"QuestionTokens", s.QuestionTokens, "length of each prompt's own question"},
		},
		groups:    namedField{"Groups", s.Groups, "system prompts"},
		perGroup:  namedField{"PromptsPerGroup", s.PromptsPerGroup, "the questions of a group"},
		prefixLen: s.SystemTokens, questionLen: s.QuestionTokens, outputLen: s.OutputTokens,
		rate: s.RequestRate, vocab: s.Vocab,
	}
}

// prefixedShape is a trace of groups whose prompts share a prefix and go on
// with a question of their own: SharedPrefix and LongContext, which differ
// only in their proportions and in the names of their fields, which errors use.
type prefixedShape struct {
	workload string
	// positive are the fields that must be positive, in the workload's order
	// (OutputTokens comes after them).
	positive []namedField
	// groups and perGroup must leave their first tokens distinct (what names
	// the siblings in an error).
	groups, perGroup                  namedField
	prefixLen, questionLen, outputLen int
	rate                              float64
	vocab                             int
}

// namedField is a field's name in the workload's terms, its value, and what
// an error says about it.
type namedField struct {
	name string
	v    int
	what string
}

func (p prefixedShape) validate() error {
	c := check{workload: p.workload}
	for _, f := range p.positive {
		c.positive(f.name, f.v, f.what)
	}
	c.positive("OutputTokens", p.outputLen, "decoded tokens per request")
	c.rate(p.rate)
	c.vocab(p.vocab)
	c.siblings(p.groups.name, p.groups.v, p.vocab, p.groups.what)
	c.siblings(p.perGroup.name, p.perGroup.v, p.vocab, p.perGroup.what)
	if len(c.errs) == 0 {
		perRequest := add(add(int64(p.prefixLen), int64(p.questionLen)), int64(p.outputLen))
		requests := mul(int64(p.groups.v), int64(p.perGroup.v))
		c.size(requests, mul(requests, perRequest))
	}
	return c.err()
}

func (p prefixedShape) generate(seed int64) (Trace, error) {
	if err := p.validate(); err != nil {
		return Trace{}, err
	}
	reqs := prefixed(seed, p.workload, p.vocab, p.groups.v, p.perGroup.v, p.prefixLen, p.questionLen, p.outputLen)
	arrive(reqs, seed, p.workload, p.rate)
	return Trace{Name: p.workload, Seed: seed, Requests: reqs}, nil
}

// prefixed builds groups*perGroup requests whose prompts are their group's shared
// prefix followed by a question, in a seeded shuffled order. Shared-prefix and
// long-context traces differ only in their proportions.
func prefixed(seed int64, workload string, vocab, groups, perGroup, prefixLen, questionLen, outputLen int) []Request {
	tokens := newTokenSource(seed, workload, vocab)
	prefixes := make([][]uint32, groups)
	used := make(map[uint32]struct{}, max(groups, perGroup))
	for g := range prefixes {
		prefixes[g] = make([]uint32, prefixLen)
		tokens.fillFresh(prefixes[g], used)
	}

	// Requests are built in group order, then reordered; each owns one buffer that
	// holds its prompt and output.
	promptLen := prefixLen + questionLen
	built := make([]Request, 0, groups*perGroup)
	for g, prefix := range prefixes {
		clear(used)
		for range perGroup {
			buf := make([]uint32, promptLen+outputLen)
			copy(buf, prefix)
			tokens.fillFresh(buf[prefixLen:promptLen], used)
			tokens.fill(buf[promptLen:])
			built = append(built, Request{Session: g, Prompt: buf[:promptLen:promptLen], Output: buf[promptLen:]})
		}
	}

	reqs := make([]Request, len(built))
	for i, j := range shuffled(newRand(seed, workload, streamOrder), len(built)) {
		reqs[i] = built[j]
		reqs[i].ID = i
	}
	return reqs
}
