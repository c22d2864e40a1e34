package workload

// Multiturn is a chat workload modelled on SGLang's bench_multiturn: Clients
// conversations of Rounds rounds each. Every round resends the whole conversation so
// far and adds RequestTokens new tokens; the engine decodes OutputTokens. All
// clients' round 0 come first, in a shuffled order, then all clients' round 1,
// shuffled again, and so on, so a client's consecutive rounds are about Clients
// requests apart: a round hits the cache only if the conversation's pages survived
// every other client's round in between.
type Multiturn struct {
	// Clients is the number of concurrent conversations. The cache needs about
	// Clients * Rounds * (RequestTokens + OutputTokens) tokens to keep them all;
	// size it against the cache's capacity to choose between hits and evictions.
	// SGLang's benchmark uses 256; the default, 48, suits a 2-core machine.
	Clients int `json:"clients"`
	// Rounds is the number of rounds per conversation. Prompt lengths grow linearly
	// with the round, prompt tokens quadratically with Rounds.
	Rounds int `json:"rounds"`
	// RequestTokens is the number of new tokens each round adds to the conversation
	// (the user's message). Whole pages of reuse need it and OutputTokens to be
	// comparable to the page size or larger.
	RequestTokens int `json:"requestTokens"`
	// OutputTokens is the number of tokens the engine decodes per round; they become
	// part of the next round's prompt.
	OutputTokens int `json:"outputTokens"`
	// RequestRate is the mean requests per second of the Poisson arrival process.
	// Raise it until the simulated engine saturates to measure throughput.
	RequestRate float64 `json:"requestRate"`
	// Vocab bounds the token ids: they are uniform in [0, Vocab). At least Clients,
	// because every conversation starts with a different token.
	Vocab int `json:"vocab"`
}

// DefaultMultiturn returns SGLang's bench_multiturn shape (5 rounds of 512-token
// requests, 64-token outputs, 16 requests/s) scaled from 256 to 48 clients: 240
// requests, 399,360 prompt tokens.
func DefaultMultiturn() Multiturn {
	return Multiturn{Clients: 48, Rounds: 5, RequestTokens: 512, OutputTokens: 64, RequestRate: 16, Vocab: DefaultVocab}
}

var _ Generator = Multiturn{}

// Name is "multiturn".
func (m Multiturn) Name() string { return multiturnName }

// Validate reports every field that cannot produce a trace, each error wrapping
// ErrConfig.
func (m Multiturn) Validate() error {
	c := check{workload: multiturnName}
	c.positive("Clients", m.Clients, "the number of concurrent conversations; SGLang's benchmark uses 256")
	c.positive("Rounds", m.Rounds, "rounds per conversation; SGLang's benchmark uses 5")
	c.positive("RequestTokens", m.RequestTokens, "new tokens per round; SGLang's benchmark uses 512")
	c.positive("OutputTokens", m.OutputTokens, "decoded tokens per round; SGLang's benchmark uses 64")
	c.rate(m.RequestRate)
	c.vocab(m.Vocab)
	c.siblings("Clients", m.Clients, m.Vocab, "conversations")
	if len(c.errs) == 0 {
		c.size(mul(int64(m.Clients), int64(m.Rounds)), m.tokens())
	}
	return c.err()
}

// tokens is the trace's prompt and output tokens: round r of a client holds r+1
// turns of RequestTokens+OutputTokens, so a client holds Rounds(Rounds+1)/2 turns.
func (m Multiturn) tokens() int64 {
	r := int64(m.Rounds)
	turns := mul(r, add(r, 1)) / 2
	return mul(mul(int64(m.Clients), turns), add(int64(m.RequestTokens), int64(m.OutputTokens)))
}

// Generate builds the trace: Clients*Rounds requests, round by round.
func (m Multiturn) Generate(seed int64) (Trace, error) {
	if err := m.Validate(); err != nil {
		return Trace{}, err
	}
	// A conversation is one history that every round is a view of: round r's prompt
	// is history[:r*turn+RequestTokens], and the next round's prompt extends it with
	// this round's output.
	turn := m.RequestTokens + m.OutputTokens
	tokens := newTokenSource(seed, multiturnName, m.Vocab)
	used := make(map[uint32]struct{}, m.Clients)
	histories := make([][]uint32, m.Clients)
	for c := range histories {
		histories[c] = make([]uint32, m.Rounds*turn)
		tokens.fillFresh(histories[c], used)
	}

	order := newRand(seed, multiturnName, streamOrder)
	reqs := make([]Request, 0, m.Clients*m.Rounds)
	for round := range m.Rounds {
		end := round*turn + m.RequestTokens
		for _, c := range shuffled(order, m.Clients) {
			h := histories[c]
			reqs = append(reqs, Request{
				ID:      len(reqs),
				Session: c,
				Round:   round,
				Prompt:  h[:end:end],
				Output:  h[end : end+m.OutputTokens : end+m.OutputTokens],
			})
		}
	}
	arrive(reqs, seed, multiturnName, m.RequestRate)
	return Trace{Name: multiturnName, Seed: seed, Requests: reqs}, nil
}
