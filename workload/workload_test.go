package workload

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math"
	"reflect"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// small configurations keep rapid's traces tiny; Vocab is small so that tokens
// collide often and only the generators' construction keeps prefixes apart.
func genMultiturn(t *rapid.T) Multiturn {
	clients := rapid.IntRange(1, 6).Draw(t, "clients")
	m := Multiturn{
		Clients:       clients,
		Rounds:        rapid.IntRange(1, 5).Draw(t, "rounds"),
		RequestTokens: rapid.IntRange(1, 20).Draw(t, "requestTokens"),
		OutputTokens:  rapid.IntRange(1, 10).Draw(t, "outputTokens"),
		RequestRate:   rapid.Float64Range(0.1, 1000).Draw(t, "rate"),
		Vocab:         rapid.IntRange(max(2, clients), 40).Draw(t, "vocab"),
	}
	// Half the configurations keep SGLang's straight conversations, whose working
	// set has a closed form; the others go back.
	if rapid.Bool().Draw(t, "goesBack") {
		m.RegenerateRatio = rapid.Float64Range(0, 1).Draw(t, "regenerateRatio")
		m.EditRatio = rapid.Float64Range(0, 1-m.RegenerateRatio).Draw(t, "editRatio")
		m.BranchRatio = rapid.Float64Range(0, 1).Draw(t, "branchRatio")
	}
	return m
}

func genSharedPrefix(t *rapid.T) SharedPrefix {
	groups := rapid.IntRange(1, 5).Draw(t, "groups")
	per := rapid.IntRange(1, 6).Draw(t, "promptsPerGroup")
	return SharedPrefix{
		Groups:          groups,
		PromptsPerGroup: per,
		SystemTokens:    rapid.IntRange(1, 40).Draw(t, "systemTokens"),
		QuestionTokens:  rapid.IntRange(1, 12).Draw(t, "questionTokens"),
		OutputTokens:    rapid.IntRange(1, 10).Draw(t, "outputTokens"),
		RequestRate:     rapid.Float64Range(0.1, 1000).Draw(t, "rate"),
		Vocab:           rapid.IntRange(max(2, groups, per), 40).Draw(t, "vocab"),
	}
}

func genLongContext(t *rapid.T) LongContext {
	docs := rapid.IntRange(1, 4).Draw(t, "documents")
	per := rapid.IntRange(1, 6).Draw(t, "questionsPerDocument")
	return LongContext{
		Documents:            docs,
		DocumentTokens:       rapid.IntRange(1, 80).Draw(t, "documentTokens"),
		QuestionsPerDocument: per,
		QuestionTokens:       rapid.IntRange(1, 12).Draw(t, "questionTokens"),
		OutputTokens:         rapid.IntRange(1, 10).Draw(t, "outputTokens"),
		RequestRate:          rapid.Float64Range(0.1, 1000).Draw(t, "rate"),
		Vocab:                rapid.IntRange(max(2, docs, per), 40).Draw(t, "vocab"),
	}
}

func genGenerator(t *rapid.T) Generator {
	switch rapid.IntRange(0, 2).Draw(t, "workload") {
	case 0:
		return genMultiturn(t)
	case 1:
		return genSharedPrefix(t)
	}
	return genLongContext(t)
}

// fataler is what the helpers need of *testing.T, *testing.B and *rapid.T.
type fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

func mustGenerate(t fataler, g Generator, seed int64) Trace {
	t.Helper()
	tr, err := g.Generate(seed)
	if err != nil {
		t.Fatalf("%s: %v", g.Name(), err)
	}
	return tr
}

func defaults() []Generator {
	return []Generator{DefaultMultiturn(), DefaultSharedPrefix(), DefaultLongContext()}
}

func commonPrefix(a, b []uint32) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

func allTokens(tr Trace) []uint32 {
	var all []uint32
	for _, r := range tr.Requests {
		all = append(append(all, r.Prompt...), r.Output...)
	}
	return all
}

// checkCommon checks what every trace promises: IDs, arrivals, token range, slices
// whose capacity ends at their length.
func checkCommon(t fataler, tr Trace, name string, seed int64, vocab int) {
	t.Helper()
	if tr.Name != name || tr.Seed != seed {
		t.Fatalf("trace is %q seed %d, want %q seed %d", tr.Name, tr.Seed, name, seed)
	}
	for i, r := range tr.Requests {
		if r.ID != i {
			t.Fatalf("request %d has ID %d", i, r.ID)
		}
		if i == 0 && r.Arrival != 0 {
			t.Fatalf("first request arrives at %v, want 0", r.Arrival)
		}
		if i > 0 && r.Arrival < tr.Requests[i-1].Arrival {
			t.Fatalf("request %d arrives at %v, before request %d at %v", i, r.Arrival, i-1, tr.Requests[i-1].Arrival)
		}
		if cap(r.Prompt) != len(r.Prompt) || cap(r.Output) != len(r.Output) {
			t.Fatalf("request %d: capacities %d/%d beyond lengths %d/%d let appends clobber other requests",
				i, cap(r.Prompt), cap(r.Output), len(r.Prompt), len(r.Output))
		}
		for _, tok := range slices.Concat(r.Prompt, r.Output) {
			if int64(tok) >= int64(vocab) {
				t.Fatalf("request %d: token %d outside vocab %d", i, tok, vocab)
			}
		}
	}
}

func TestSameSeedSameTrace(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		g := genGenerator(t)
		seed := rapid.Int64().Draw(t, "seed")
		a, b := mustGenerate(t, g, seed), mustGenerate(t, g, seed)
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("%s seed %d: two traces differ", g.Name(), seed)
		}
	})
	for _, g := range defaults() {
		if a, b := mustGenerate(t, g, 1), mustGenerate(t, g, 1); !reflect.DeepEqual(a, b) {
			t.Errorf("%s defaults, seed 1: two traces differ", g.Name())
		}
	}
}

func TestDifferentSeedDifferentTokens(t *testing.T) {
	for _, g := range defaults() {
		a, b := mustGenerate(t, g, 1), mustGenerate(t, g, 2)
		if slices.Equal(allTokens(a), allTokens(b)) {
			t.Errorf("%s: seeds 1 and 2 give the same tokens", g.Name())
		}
		if a.Duration() == b.Duration() {
			t.Errorf("%s: seeds 1 and 2 give the same arrivals", g.Name())
		}
	}
}

// A rate sweep must compare the same requests: the rate moves arrivals only.
func TestRateChangesOnlyArrivals(t *testing.T) {
	slow, fast := DefaultSharedPrefix(), DefaultSharedPrefix()
	fast.RequestRate *= 4
	a, b := mustGenerate(t, slow, 7), mustGenerate(t, fast, 7)
	for i := range a.Requests {
		ra, rb := a.Requests[i], b.Requests[i]
		if ra.Session != rb.Session || !slices.Equal(ra.Prompt, rb.Prompt) || !slices.Equal(ra.Output, rb.Output) {
			t.Fatalf("request %d differs beyond its arrival", i)
		}
		// Same exponential draws scaled by 1/4, up to float rounding.
		if d := ra.Arrival - 4*rb.Arrival; d < -4 || d > 4 {
			t.Fatalf("request %d arrives at %v at rate 16 but %v at rate 64", i, ra.Arrival, rb.Arrival)
		}
	}
}

func TestMultiturnShape(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m := genMultiturn(t)
		seed := rapid.Int64().Draw(t, "seed")
		tr := mustGenerate(t, m, seed)
		checkCommon(t, tr, "multiturn", seed, m.Vocab)
		kinds := checkMultiturn(t, m, tr)
		if len(tr.Requests) != m.Clients*m.Rounds+kinds["branch"] {
			t.Fatalf("%d requests, want %d and %d branches", len(tr.Requests), m.Clients*m.Rounds, kinds["branch"])
		}
		if m.RegenerateRatio == 0 && kinds["regenerate"] > 0 || m.EditRatio == 0 && kinds["edit"] > 0 || m.BranchRatio == 0 && kinds["branch"] > 0 {
			t.Fatalf("ratios %v/%v/%v gave %v", m.RegenerateRatio, m.EditRatio, m.BranchRatio, kinds)
		}
	})
}

// checkMultiturn checks a multiturn trace's conversations round by round and
// counts its rounds by kind (see checkRound and checkBranch), and the edits and
// branches that leave a conversation inside a 64-token page as "mid-page".
func checkMultiturn(t fataler, m Multiturn, tr Trace) map[string]int {
	t.Helper()
	kinds := map[string]int{}
	main := map[[2]int]Request{} // each session's own request of each round
	for i, r := range tr.Requests {
		if i > 0 && r.Round < tr.Requests[i-1].Round {
			t.Fatalf("request %d is round %d after a round-%d request, want rounds in order", i, r.Round, tr.Requests[i-1].Round)
		}
		if r.Session < 0 || r.Session >= m.Clients {
			t.Fatalf("request %d: session %d outside [0, %d)", i, r.Session, m.Clients)
		}
		if len(r.Output) != m.OutputTokens || (r.Round == 0 && len(r.Prompt) != m.RequestTokens) {
			t.Fatalf("request %d (round %d): prompt %d, output %d tokens; want output %d (and prompt %d in round 0)",
				i, r.Round, len(r.Prompt), len(r.Output), m.OutputTokens, m.RequestTokens)
		}
		key := [2]int{r.Session, r.Round}
		own, seen := main[key]
		if !seen {
			main[key] = r
			if r.Round > 0 {
				prev, ok := main[[2]int{r.Session, r.Round - 1}]
				if !ok {
					t.Fatalf("request %d: session %d round %d before its round %d", i, r.Session, r.Round, r.Round-1)
				}
				kind, at := checkRound(t, m, prev, r)
				kinds[kind]++
				if kind == "edit" && at%64 != 0 {
					kinds["mid-page"]++
				}
			}
			continue
		}
		// A second request of a session's round is its branch, sent right after
		// the round's own.
		if r.Round == 0 || tr.Requests[i-1].ID != own.ID {
			t.Fatalf("request %d: a second request of session %d round %d that is not a branch right after request %d",
				i, r.Session, r.Round, own.ID)
		}
		prev := main[[2]int{r.Session, r.Round - 1}]
		before := slices.Concat(prev.Prompt, prev.Output)
		at := commonPrefix(r.Prompt, before)
		if at < max(1, len(before)-m.RequestTokens-m.OutputTokens) || at >= len(before) || len(r.Prompt) != at+m.RequestTokens {
			t.Fatalf("request %d, a branch of session %d round %d: a %d-token prompt that leaves the %d-token conversation at token %d, "+
				"want a new message from a token of its last turn", i, r.Session, r.Round, len(r.Prompt), len(before), at)
		}
		kinds["branch"]++
		if at%64 != 0 {
			kinds["mid-page"]++
		}
	}
	for round := range m.Rounds {
		for c := range m.Clients {
			if _, ok := main[[2]int{c, round}]; !ok {
				t.Fatalf("session %d has no round-%d request", c, round)
			}
		}
	}
	for a := range m.Clients {
		for b := range a {
			if n := commonPrefix(main[[2]int{a, 0}].Prompt, main[[2]int{b, 0}].Prompt); n != 0 {
				t.Fatalf("sessions %d and %d share %d leading tokens, want 0", a, b, n)
			}
		}
	}
	return kinds
}

// checkRound checks a conversation's round r against round r-1 and says what kind
// of round it is, and where it leaves the conversation: "turn" (the whole
// conversation so far and a new message), "regenerate" (the same prompt, an
// answer that differs from its first token) or "edit" (the conversation up to a
// token inside an earlier user message, never the first, then a different rest of
// that message).
func checkRound(t fataler, m Multiturn, prev, r Request) (string, int) {
	t.Helper()
	turn := m.RequestTokens + m.OutputTokens
	history := slices.Concat(prev.Prompt, prev.Output)
	n := commonPrefix(r.Prompt, history)
	switch {
	case n == len(history):
		if len(r.Prompt) != len(history)+m.RequestTokens {
			t.Fatalf("session %d round %d: prompt of %d tokens extends a %d-token conversation, want +%d",
				r.Session, r.Round, len(r.Prompt), len(history), m.RequestTokens)
		}
		return "turn", n
	case slices.Equal(r.Prompt, prev.Prompt):
		if r.Output[0] == prev.Output[0] {
			t.Fatalf("session %d round %d regenerates round %d's answer from the same first token", r.Session, r.Round, prev.Round)
		}
		return "regenerate", n
	}
	if n == 0 || n%turn >= m.RequestTokens || len(r.Prompt) != n/turn*turn+m.RequestTokens {
		t.Fatalf("session %d round %d: a %d-token prompt that leaves round %d's %d-token conversation at token %d: "+
			"not a turn, a regeneration or an edit inside a user message", r.Session, r.Round, len(r.Prompt), prev.Round, len(history), n)
	}
	return "edit", n
}

// Regenerations, edits and branches come in the proportions configured, and
// edits and branches leave conversations anywhere, not at page boundaries.
func TestMultiturnGoesBack(t *testing.T) {
	m := Multiturn{Clients: 500, Rounds: 9, RequestTokens: 100, OutputTokens: 20,
		RegenerateRatio: 0.2, EditRatio: 0.3, BranchRatio: 0.4, RequestRate: 10, Vocab: DefaultVocab}
	kinds := checkMultiturn(t, m, mustGenerate(t, m, 3))
	later := float64(m.Clients * (m.Rounds - 1)) // 4000 rounds may go back
	for kind, want := range map[string]float64{"regenerate": m.RegenerateRatio, "edit": m.EditRatio, "branch": m.BranchRatio} {
		// Binomial: the standard deviation of each share is under 0.008; 0.04 is 5 of it.
		if got := float64(kinds[kind]) / later; math.Abs(got-want) > 0.04 {
			t.Errorf("%s share %.3f, want about %.2f (%v)", kind, got, want, kinds)
		}
	}
	if leave := kinds["edit"] + kinds["branch"]; float64(kinds["mid-page"]) < 0.9*float64(leave) {
		t.Errorf("%d of %d edits and branches leave inside a 64-token page, want nearly all", kinds["mid-page"], leave)
	}
	// The default trace goes back too, so a prefix cache must split what it holds
	// inside pages.
	def := DefaultMultiturn()
	kinds = checkMultiturn(t, def, mustGenerate(t, def, 1))
	if kinds["regenerate"] == 0 || kinds["edit"] == 0 || kinds["branch"] == 0 || kinds["mid-page"] == 0 {
		t.Errorf("default multiturn trace: %v; want regenerations, edits and branches, leaving inside pages", kinds)
	}
}

// checkPrefixed checks a shared-prefix or long-context trace: groups*perGroup
// requests whose prompts share exactly prefixLen tokens within a group and none
// across groups.
func checkPrefixed(t fataler, tr Trace, groups, perGroup, prefixLen, questionLen, outputLen int) {
	t.Helper()
	if len(tr.Requests) != groups*perGroup {
		t.Fatalf("%d requests, want %d", len(tr.Requests), groups*perGroup)
	}
	count := make([]int, groups)
	for i, r := range tr.Requests {
		if r.Session < 0 || r.Session >= groups || r.Round != 0 {
			t.Fatalf("request %d: session %d round %d, want session in [0, %d) and round 0", i, r.Session, r.Round, groups)
		}
		count[r.Session]++
		if len(r.Prompt) != prefixLen+questionLen || len(r.Output) != outputLen {
			t.Fatalf("request %d: prompt %d, output %d tokens; want %d, %d",
				i, len(r.Prompt), len(r.Output), prefixLen+questionLen, outputLen)
		}
		for j := range i {
			o := tr.Requests[j]
			want := 0
			if o.Session == r.Session {
				want = prefixLen
			}
			if n := commonPrefix(r.Prompt, o.Prompt); n != want {
				t.Fatalf("requests %d (session %d) and %d (session %d) share %d leading tokens, want %d",
					i, r.Session, j, o.Session, n, want)
			}
		}
	}
	for g, n := range count {
		if n != perGroup {
			t.Fatalf("session %d has %d requests, want %d", g, n, perGroup)
		}
	}
}

func TestSharedPrefixShape(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := genSharedPrefix(t)
		seed := rapid.Int64().Draw(t, "seed")
		tr := mustGenerate(t, s, seed)
		checkCommon(t, tr, "shared-prefix", seed, s.Vocab)
		checkPrefixed(t, tr, s.Groups, s.PromptsPerGroup, s.SystemTokens, s.QuestionTokens, s.OutputTokens)
	})
}

func TestLongContextShape(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		l := genLongContext(t)
		seed := rapid.Int64().Draw(t, "seed")
		tr := mustGenerate(t, l, seed)
		checkCommon(t, tr, "long-context", seed, l.Vocab)
		checkPrefixed(t, tr, l.Documents, l.QuestionsPerDocument, l.DocumentTokens, l.QuestionTokens, l.OutputTokens)
	})
}

// A store that outlives one bench run must not give the next workload hits.
func TestWorkloadsShareNoPages(t *testing.T) {
	var all Trace
	var sum int64
	for _, g := range defaults() {
		tr := mustGenerate(t, g, 1)
		sum += tr.DistinctPrefixTokens(64)
		all.Requests = append(all.Requests, tr.Requests...)
	}
	if got := all.DistinctPrefixTokens(64); got != sum {
		t.Errorf("the default workloads together have %d distinct prefix tokens, %d apart: they share pages", got, sum)
	}
}

func TestShuffledOrder(t *testing.T) {
	// Generation order is group by group; a trace in that order would hand a cache
	// every group's prompts back to back.
	tr := mustGenerate(t, DefaultSharedPrefix(), 1)
	sorted := slices.IsSortedFunc(tr.Requests, func(a, b Request) int { return a.Session - b.Session })
	if sorted {
		t.Fatal("shared-prefix requests are in group order, want shuffled")
	}
	mt := mustGenerate(t, DefaultMultiturn(), 1)
	round0 := mt.Requests[:48]
	if slices.IsSortedFunc(round0, func(a, b Request) int { return a.Session - b.Session }) {
		t.Fatal("multiturn round 0 is in client order, want shuffled")
	}
	if slices.EqualFunc(round0, mt.Requests[48:96], func(a, b Request) bool { return a.Session == b.Session }) {
		t.Fatal("multiturn rounds 0 and 1 have the same client order, want each round shuffled anew")
	}
}

func TestPoissonArrivals(t *testing.T) {
	const rate = 8.0
	m := Multiturn{Clients: 1000, Rounds: 10, RequestTokens: 1, OutputTokens: 1, RequestRate: rate, Vocab: DefaultVocab}
	for seed := int64(1); seed <= 3; seed++ {
		tr := mustGenerate(t, m, seed)
		checkCommon(t, tr, "multiturn", seed, m.Vocab)
		var sum, sumSq float64
		for i := 1; i < len(tr.Requests); i++ {
			gap := (tr.Requests[i].Arrival - tr.Requests[i-1].Arrival).Seconds()
			sum += gap
			sumSq += gap * gap
		}
		n := float64(len(tr.Requests) - 1)
		mean := sum / n
		cv := math.Sqrt(sumSq/n-mean*mean) / mean
		// 9999 exponential gaps: the mean is within 1% of 1/rate one time in three;
		// 5% is a loose bound. An exponential's standard deviation equals its mean.
		if math.Abs(mean*rate-1) > 0.05 {
			t.Errorf("seed %d: mean gap %.4fs, want about %.4fs", seed, mean, 1/rate)
		}
		if cv < 0.9 || cv > 1.1 {
			t.Errorf("seed %d: gaps' coefficient of variation %.3f, want about 1 (exponential)", seed, cv)
		}
	}
}

func TestAppendDoesNotClobber(t *testing.T) {
	tr := mustGenerate(t, Multiturn{Clients: 1, Rounds: 2, RequestTokens: 4, OutputTokens: 2, RequestRate: 1, Vocab: 100}, 1)
	r0, r1 := tr.Requests[0], tr.Requests[1]
	want := slices.Clone(r1.Prompt)
	_ = append(r0.Prompt, 999, 999)
	_ = append(r0.Output, 999)
	if !slices.Equal(r1.Prompt, want) || r0.Output[0] == 999 {
		t.Fatal("appending to round 0's slices changed round 1's prompt")
	}
}

// The default traces are part of strata's benchmark results: a change to them makes
// old and new results incomparable, so it must be deliberate. The digest covers
// everything but the arrival times, whose last bits depend on floating-point
// details of the platform.
func TestDefaultTracesAreStable(t *testing.T) {
	tests := []struct {
		g            Generator
		requests     int
		promptTokens int64
		distinct64   int64
		digest       string
	}{
		{DefaultMultiturn(), 257, 357172, 136128, "915d7da0c0e58c42b28ab4818008ffb27c3691ac86ae5b498fd7b0fc23bdb3a7"},
		// Without going back, SGLang's shape: the trace the default was before
		// regenerations, edits and branches, token for token.
		{straightMultiturn(), 240, 399360, 138240, "a424f7afd380917a9d16173f7ba41fc5c7fbfff1de9099b715a71ae24fa4254d"},
		{DefaultSharedPrefix(), 384, 884736, 155648, "87a521b921828357be74834b06c5ea0e3996e7ac4825f0b025f74223dc414b1f"},
		{DefaultLongContext(), 48, 792576, 74752, "1912ed4b00b9f07d0e0803ea71ec17f4185ecc9a18c7c014fc2e380debd11a91"},
	}
	for _, tt := range tests {
		tr := mustGenerate(t, tt.g, 1)
		if len(tr.Requests) != tt.requests || tr.PromptTokens() != tt.promptTokens {
			t.Errorf("%s: %d requests, %d prompt tokens; want %d, %d",
				tt.g.Name(), len(tr.Requests), tr.PromptTokens(), tt.requests, tt.promptTokens)
		}
		if d := tr.DistinctPrefixTokens(64); d != tt.distinct64 {
			t.Errorf("%s: %d distinct prefix tokens at page size 64, want %d", tt.g.Name(), d, tt.distinct64)
		}
		if d := digest(tr); d != tt.digest {
			t.Errorf("%s seed 1: digest %s, want %s; if the generator changed on purpose, update the digest "+
				"and say in the commit that benchmark results before it are not comparable", tt.g.Name(), d, tt.digest)
		}
	}
}

func straightMultiturn() Multiturn {
	m := DefaultMultiturn()
	m.RegenerateRatio, m.EditRatio, m.BranchRatio = 0, 0, 0
	return m
}

func digest(tr Trace) string {
	h := sha256.New()
	h.Write([]byte(tr.Name))
	var buf []byte
	for _, r := range tr.Requests {
		buf = binary.LittleEndian.AppendUint64(buf[:0], uint64(r.ID))
		buf = binary.LittleEndian.AppendUint64(buf, uint64(r.Session))
		buf = binary.LittleEndian.AppendUint64(buf, uint64(r.Round))
		for _, s := range [][]uint32{r.Prompt, r.Output} {
			buf = binary.LittleEndian.AppendUint64(buf, uint64(len(s)))
			for _, tok := range s {
				buf = binary.LittleEndian.AppendUint32(buf, tok)
			}
		}
		h.Write(buf)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func BenchmarkGenerateDefaults(b *testing.B) {
	for _, g := range defaults() {
		b.Run(g.Name(), func(b *testing.B) {
			tr := mustGenerate(b, g, 1)
			b.SetBytes(4 * (tr.PromptTokens() + tr.OutputTokens()))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := g.Generate(1); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkDistinctPrefixTokens(b *testing.B) {
	for _, g := range defaults() {
		b.Run(g.Name(), func(b *testing.B) {
			tr := mustGenerate(b, g, 1)
			b.SetBytes(4 * (tr.PromptTokens() + tr.OutputTokens()))
			for b.Loop() {
				tr.DistinctPrefixTokens(64)
			}
		})
	}
}
