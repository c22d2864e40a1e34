package workload

// LongContext is many questions about a few long documents: each prompt is a whole
// document followed by a short question, in a shuffled order. A hit saves a whole
// document's prefill; a miss, after the document was evicted, pays it again, so the
// workload measures how well a cache keeps a few large prefixes.
type LongContext struct {
	// Documents is the number of distinct documents. The working set is about
	// Documents * DocumentTokens; compare it with the device and host pool sizes.
	Documents int `json:"documents"`
	// DocumentTokens is the length of each document, the reusable part. Use a
	// multiple of the page size so the whole document is reusable.
	DocumentTokens int `json:"documentTokens"`
	// QuestionsPerDocument is the number of prompts about each document.
	QuestionsPerDocument int `json:"questionsPerDocument"`
	// QuestionTokens is the length of each prompt's question, which never hits.
	QuestionTokens int `json:"questionTokens"`
	// OutputTokens is the number of tokens the engine decodes per request.
	OutputTokens int `json:"outputTokens"`
	// RequestRate is the mean requests per second of the Poisson arrival process.
	// Long prompts take long to prefill, so it defaults lower than the others.
	RequestRate float64 `json:"requestRate"`
	// Vocab bounds the token ids: they are uniform in [0, Vocab). At least Documents
	// and QuestionsPerDocument, because documents, and the questions about one
	// document, start with different tokens.
	Vocab int `json:"vocab"`
}

// DefaultLongContext returns 4 documents of 16384 tokens with 12 questions of 128
// tokens each, 64-token outputs and 4 requests/s: 48 requests, 792,576 prompt tokens.
func DefaultLongContext() LongContext {
	return LongContext{Documents: 4, DocumentTokens: 16384, QuestionsPerDocument: 12, QuestionTokens: 128,
		OutputTokens: 64, RequestRate: 4, Vocab: DefaultVocab}
}

var _ Generator = LongContext{}

// Name is "long-context".
func (l LongContext) Name() string { return longContextName }

// Validate reports every field that cannot produce a trace, each error wrapping
// ErrConfig.
func (l LongContext) Validate() error {
	c := check{workload: longContextName}
	c.positive("Documents", l.Documents, "the number of distinct documents")
	c.positive("DocumentTokens", l.DocumentTokens, "length of each document")
	c.positive("QuestionsPerDocument", l.QuestionsPerDocument, "prompts about each document")
	c.positive("QuestionTokens", l.QuestionTokens, "length of each question")
	c.positive("OutputTokens", l.OutputTokens, "decoded tokens per request")
	c.rate(l.RequestRate)
	c.vocab(l.Vocab)
	c.siblings("Documents", l.Documents, l.Vocab, "documents")
	c.siblings("QuestionsPerDocument", l.QuestionsPerDocument, l.Vocab, "the questions about a document")
	if len(c.errs) == 0 {
		perRequest := add(add(int64(l.DocumentTokens), int64(l.QuestionTokens)), int64(l.OutputTokens))
		requests := mul(int64(l.Documents), int64(l.QuestionsPerDocument))
		c.size(requests, mul(requests, perRequest))
	}
	return c.err()
}

// Generate builds the trace: Documents*QuestionsPerDocument requests in a shuffled
// order.
func (l LongContext) Generate(seed int64) (Trace, error) {
	if err := l.Validate(); err != nil {
		return Trace{}, err
	}
	reqs := prefixed(seed, longContextName, l.Vocab, l.Documents, l.QuestionsPerDocument, l.DocumentTokens, l.QuestionTokens, l.OutputTokens)
	arrive(reqs, seed, longContextName, l.RequestRate)
	return Trace{Name: longContextName, Seed: seed, Requests: reqs}, nil
}
