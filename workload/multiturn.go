package workload

import "math/rand/v2"

// Multiturn is a chat workload modelled on SGLang's bench_multiturn: Clients
// conversations of Rounds requests each. A round normally resends the whole
// conversation so far and adds RequestTokens new tokens; the engine decodes
// OutputTokens. Real chats also go back: some rounds regenerate the last answer
// (the same prompt again, a different answer) and some edit an earlier user message
// at an arbitrary token (the conversation restarts from the edit), so requests
// diverge from what is cached in the middle of cached pages, not only where a
// turn ends. All clients' round 0 come first, in a shuffled order, then all
// clients' round 1, shuffled again, and so on, so a client's consecutive rounds are
// about Clients requests apart: a round hits the cache only if the conversation's
// pages survived every other client's round in between.
type Multiturn struct {
	// Clients is the number of concurrent conversations. The cache needs about
	// Clients * Rounds * (RequestTokens + OutputTokens) tokens to keep them all;
	// size it against the cache's capacity to choose between hits and evictions.
	// SGLang's benchmark uses 256; the default, 48, suits a 2-core machine.
	Clients int `json:"clients"`
	// Rounds is the number of requests per conversation. Prompt lengths grow
	// linearly with the round, prompt tokens quadratically with Rounds.
	Rounds int `json:"rounds"`
	// RequestTokens is the number of new tokens each round adds to the conversation
	// (the user's message). Whole pages of reuse need it and OutputTokens to be
	// comparable to the page size or larger.
	RequestTokens int `json:"requestTokens"`
	// OutputTokens is the number of tokens the engine decodes per round; they become
	// part of the next round's prompt.
	OutputTokens int `json:"outputTokens"`
	// RegenerateRatio is the share of rounds after the first that regenerate the
	// last answer: the previous round's prompt again, with a different answer that
	// replaces the old one in the conversation. The new answer diverges from the
	// cached one at its first token.
	RegenerateRatio float64 `json:"regenerateRatio"`
	// EditRatio is the share of rounds after the first that edit an earlier user
	// message from a uniformly drawn token on (never the conversation's first
	// token): the prompt is the conversation up to the edit, then the edited rest of
	// that message; later turns are dropped. The prompt diverges from the cached
	// conversation at that token, which is usually inside a page, so a cache must
	// split what it holds there. RegenerateRatio + EditRatio is at most 1.
	EditRatio float64 `json:"editRatio"`
	// BranchRatio is the share of rounds after the first that an agent also
	// branches: right after the round's own request it sends another that leaves
	// the conversation as it was before the round at a uniformly drawn token of its
	// last turn, with RequestTokens new tokens, and answers it; the conversation
	// goes on from the round's own request. The two arrive together and share the
	// cached conversation up to a token usually inside a page, so a cache splits
	// what the other request may still be loading. Each branch is a request of its
	// own: the trace has Clients*Rounds requests plus the branches. All three
	// ratios 0 give SGLang's shape exactly.
	BranchRatio float64 `json:"branchRatio"`
	// RequestRate is the mean requests per second of the Poisson arrival process.
	// Raise it until the simulated engine saturates to measure throughput.
	RequestRate float64 `json:"requestRate"`
	// Vocab bounds the token ids: they are uniform in [0, Vocab). At least Clients,
	// because every conversation starts with a different token.
	Vocab int `json:"vocab"`
}

// DefaultMultiturn returns SGLang's bench_multiturn shape (5 rounds of 512-token
// requests, 64-token outputs, 16 requests/s) scaled from 256 to 48 clients, with a
// tenth of the later rounds regenerating the last answer, a tenth editing an
// earlier message and a tenth branching: 240 requests and the branches.
func DefaultMultiturn() Multiturn {
	return Multiturn{Clients: 48, Rounds: 5, RequestTokens: 512, OutputTokens: 64,
		RegenerateRatio: 0.1, EditRatio: 0.1, BranchRatio: 0.1, RequestRate: 16, Vocab: DefaultVocab}
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
	c.share("RegenerateRatio", m.RegenerateRatio)
	c.share("EditRatio", m.EditRatio)
	c.share("BranchRatio", m.BranchRatio)
	if m.RegenerateRatio+m.EditRatio > 1 {
		c.fail("RegenerateRatio %v + EditRatio %v is over 1; they are shares of the same rounds", m.RegenerateRatio, m.EditRatio)
	}
	c.rate(m.RequestRate)
	c.vocab(m.Vocab)
	c.siblings("Clients", m.Clients, m.Vocab, "conversations")
	if len(c.errs) == 0 {
		requests, tokens := mul(int64(m.Clients), int64(m.Rounds)), m.tokens()
		if m.BranchRatio > 0 {
			// A branch is at most as long as its round's own request.
			requests, tokens = mul(requests, 2), mul(tokens, 2)
		}
		c.size(requests, tokens)
	}
	return c.err()
}

// tokens bounds the prompt and output tokens of the rounds' own requests: round r
// of a client holds at most r+1 turns of RequestTokens+OutputTokens
// (regenerations and edits never make a conversation longer), so a client holds
// at most Rounds(Rounds+1)/2 turns.
func (m Multiturn) tokens() int64 {
	r := int64(m.Rounds)
	turns := mul(r, add(r, 1)) / 2
	return mul(mul(int64(m.Clients), turns), add(int64(m.RequestTokens), int64(m.OutputTokens)))
}

// Generate builds the trace: Clients*Rounds requests and the agents' branches,
// round by round.
func (m Multiturn) Generate(seed int64) (Trace, error) {
	if err := m.Validate(); err != nil {
		return Trace{}, err
	}
	// Every client has a base history that ordinary rounds take their messages
	// from, turn by turn; round r's prompt is history[:r*turn+RequestTokens] until
	// the conversation first goes back. Regenerations, edits and branches draw
	// their tokens and decisions from streams of their own, so with their ratios 0
	// the trace is exactly SGLang's shape, token for token the same as before they
	// existed.
	turn := m.RequestTokens + m.OutputTokens
	tokens := newTokenSource(seed, multiturnName, m.Vocab)
	used := make(map[uint32]struct{}, m.Clients)
	histories := make([][]uint32, m.Clients)
	for c := range histories {
		histories[c] = make([]uint32, m.Rounds*turn)
		tokens.fillFresh(histories[c], used)
	}
	sessions := make([][][]Request, m.Clients)
	branch := &brancher{m: m, turn: turn, decide: newRand(seed, multiturnName, streamBranch),
		tokens: &tokenSource{r: newRand(seed, multiturnName, streamBranchTokens), vocab: uint64(m.Vocab)}}
	for c := range sessions {
		sessions[c] = branch.conversation(histories[c])
	}

	order := newRand(seed, multiturnName, streamOrder)
	reqs := make([]Request, 0, m.Clients*m.Rounds)
	for round := range m.Rounds {
		for _, c := range shuffled(order, m.Clients) {
			for _, r := range sessions[c][round] {
				r.ID, r.Session = len(reqs), c
				reqs = append(reqs, r)
			}
		}
	}
	arrive(reqs, seed, multiturnName, m.RequestRate)
	return Trace{Name: multiturnName, Seed: seed, Requests: reqs}, nil
}

// brancher plays one conversation's rounds: ordinary turns, regenerations, edits
// and branches.
type brancher struct {
	m      Multiturn
	turn   int
	decide *rand.Rand
	tokens *tokenSource
}

// conversation returns a client's requests, round by round (ID and Session
// unset): the round's own request, then its branch if it has one. The
// conversation is kept in one buffer that ordinary rounds extend: a request's
// slices are views of it ending at their lengths, so a later write past them does
// not change them. Going back writes over positions that earlier requests see, so
// it moves the conversation to a fresh buffer.
func (b *brancher) conversation(base []uint32) [][]Request {
	m := b.m
	conv := base[:0] // the conversation so far: user message, answer, user message, ...
	rounds := make([][]Request, m.Rounds)
	for round := range m.Rounds {
		before := conv
		u := b.decide.Float64()
		var promptLen int
		switch {
		case round > 0 && u < m.RegenerateRatio:
			// The same prompt again; the new answer replaces the last one.
			promptLen = len(conv) - m.OutputTokens
			conv = b.rewrite(conv, promptLen)
		case round > 0 && u < m.RegenerateRatio+m.EditRatio && len(conv)/b.turn*m.RequestTokens > 1:
			// Edit a user message from token q on; never the first token of the
			// conversation, which sets it apart from every other client's.
			msgs := len(conv) / b.turn
			p := 1 + b.decide.IntN(msgs*m.RequestTokens-1)
			msg, q := p/m.RequestTokens, p%m.RequestTokens
			promptLen = msg*b.turn + m.RequestTokens
			conv = b.rewrite(conv, msg*b.turn+q)
		default:
			// An ordinary turn: the next message and answer of the base history.
			promptLen = len(conv) + m.RequestTokens
			conv = append(conv, base[round*b.turn:(round+1)*b.turn]...)
		}
		conv = conv[:promptLen+m.OutputTokens]
		rounds[round] = append(rounds[round], view(round, conv, promptLen))
		if round > 0 && b.decide.Float64() < m.BranchRatio {
			// Leave the conversation before this round at a token of its last turn
			// (never its first token), with a new message.
			from := max(1, len(before)-b.turn)
			at := from + b.decide.IntN(len(before)-from)
			alt := make([]uint32, at+m.RequestTokens+m.OutputTokens)
			copy(alt, before[:at])
			b.tokens.fill(alt[at:])
			for alt[at] == before[at] {
				alt[at] = uint32(b.tokens.r.Uint64N(b.tokens.vocab))
			}
			rounds[round] = append(rounds[round], view(round, alt, at+m.RequestTokens))
		}
	}
	return rounds
}

// view is a request of round whose prompt is conv[:promptLen] and whose output is
// the rest of conv, each slice's capacity ending at its length.
func view(round int, conv []uint32, promptLen int) Request {
	return Request{Round: round, Prompt: conv[:promptLen:promptLen], Output: conv[promptLen:len(conv):len(conv)]}
}

// rewrite returns a copy of conv (in a fresh buffer with room for the rest of the
// conversation) whose tokens from at on, up to the next turn's end, are new, the
// first differing from the token it replaces, so the copy diverges exactly at at.
func (b *brancher) rewrite(conv []uint32, at int) []uint32 {
	end := (at/b.turn + 1) * b.turn
	out := make([]uint32, end, b.m.Rounds*b.turn)
	copy(out, conv[:at])
	b.tokens.fill(out[at:end])
	for out[at] == conv[at] {
		out[at] = uint32(b.tokens.r.Uint64N(b.tokens.vocab))
	}
	return out
}

// share requires a fraction in [0, 1].
func (c *check) share(field string, v float64) {
	if !(v >= 0 && v <= 1) { // NaN too
		c.fail("%s is %v; it must be a share of the rounds, from 0 to 1", field, v)
	}
}
