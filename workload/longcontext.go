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
func (l LongContext) Validate() error { return l.shape().validate() }

// Generate builds the trace: Documents*QuestionsPerDocument requests in a shuffled
// order.
func (l LongContext) Generate(seed int64) (Trace, error) { return l.shape().generate(seed) }

// shape is the trace in the terms it shares with SharedPrefix: a document is a
// group's prefix, the questions about it its prompts.
func (l LongContext) shape() prefixedShape {
	return prefixedShape{
		workload: longContextName,
		positive: []namedField{
			{"Documents", l.Documents, "the number of distinct documents"},
			{"DocumentTokens", l.DocumentTokens, "length of each document"},
			{"QuestionsPerDocument", l.QuestionsPerDocument, "prompts about each document"},
			{"QuestionTokens", l.QuestionTokens, "length of each question"},
		},
		groups:    namedField{"Documents", l.Documents, "documents"},
		perGroup:  namedField{"QuestionsPerDocument", l.QuestionsPerDocument, "the questions about a document"},
		prefixLen: l.DocumentTokens, questionLen: l.QuestionTokens, outputLen: l.OutputTokens,
		rate: l.RequestRate, vocab: l.Vocab,
	}
}
