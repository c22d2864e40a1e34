package workload

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
)

func TestDefaultsAreValid(t *testing.T) {
	for _, g := range defaults() {
		if err := g.(interface{ Validate() error }).Validate(); err != nil {
			t.Errorf("%s defaults: %v", g.Name(), err)
		}
	}
}

func TestBadConfigs(t *testing.T) {
	mt := func(f func(*Multiturn)) Generator { m := DefaultMultiturn(); f(&m); return m }
	sp := func(f func(*SharedPrefix)) Generator { s := DefaultSharedPrefix(); f(&s); return s }
	lc := func(f func(*LongContext)) Generator { l := DefaultLongContext(); f(&l); return l }
	tests := []struct {
		name string
		g    Generator
		want string // in the message: the field at fault
	}{
		{"no clients", mt(func(m *Multiturn) { m.Clients = 0 }), "Clients"},
		{"negative rounds", mt(func(m *Multiturn) { m.Rounds = -1 }), "Rounds"},
		{"no request tokens", mt(func(m *Multiturn) { m.RequestTokens = 0 }), "RequestTokens"},
		{"no output", mt(func(m *Multiturn) { m.OutputTokens = 0 }), "OutputTokens"},
		{"zero rate", mt(func(m *Multiturn) { m.RequestRate = 0 }), "RequestRate"},
		{"negative rate", mt(func(m *Multiturn) { m.RequestRate = -1 }), "RequestRate"},
		{"NaN rate", mt(func(m *Multiturn) { m.RequestRate = math.NaN() }), "RequestRate"},
		{"infinite rate", mt(func(m *Multiturn) { m.RequestRate = math.Inf(1) }), "RequestRate"},
		{"vocab 1", mt(func(m *Multiturn) { m.Vocab = 1 }), "Vocab"},
		{"vocab 0", mt(func(m *Multiturn) { m.Vocab = 0 }), "Vocab"},
		{"vocab beyond uint32", mt(func(m *Multiturn) { m.Vocab = 1<<32 + 1 }), "Vocab"},
		{"more clients than tokens", mt(func(m *Multiturn) { m.Vocab = 10 }), "Clients"},
		{"negative regenerate ratio", mt(func(m *Multiturn) { m.RegenerateRatio = -0.1 }), "RegenerateRatio"},
		{"NaN edit ratio", mt(func(m *Multiturn) { m.EditRatio = math.NaN() }), "EditRatio"},
		{"edit ratio over 1", mt(func(m *Multiturn) { m.EditRatio = 1.5 }), "EditRatio"},
		{"negative branch ratio", mt(func(m *Multiturn) { m.BranchRatio = -1 }), "BranchRatio"},
		{"ratios over 1 together", mt(func(m *Multiturn) { m.RegenerateRatio, m.EditRatio = 0.6, 0.5 }), "RegenerateRatio"},
		{"too many tokens", mt(func(m *Multiturn) { m.Rounds = 1000 }), "MaxTokens"},
		{"overflowing sizes", mt(func(m *Multiturn) { m.Clients, m.Rounds, m.Vocab = 1<<31, math.MaxInt, 1<<32 }), "MaxTokens"},
		{"too many requests", mt(func(m *Multiturn) {
			m.Clients, m.Rounds, m.RequestTokens, m.OutputTokens, m.Vocab = 1<<20, 2, 1, 1, 1<<32
		}), "MaxRequests"},

		{"no groups", sp(func(s *SharedPrefix) { s.Groups = 0 }), "Groups"},
		{"no prompts per group", sp(func(s *SharedPrefix) { s.PromptsPerGroup = -5 }), "PromptsPerGroup"},
		{"no system prompt", sp(func(s *SharedPrefix) { s.SystemTokens = 0 }), "SystemTokens"},
		{"no question", sp(func(s *SharedPrefix) { s.QuestionTokens = 0 }), "QuestionTokens"},
		{"shared-prefix no output", sp(func(s *SharedPrefix) { s.OutputTokens = 0 }), "OutputTokens"},
		{"shared-prefix zero rate", sp(func(s *SharedPrefix) { s.RequestRate = 0 }), "RequestRate"},
		{"shared-prefix vocab 1", sp(func(s *SharedPrefix) { s.Vocab = 1 }), "Vocab"},
		{"more prompts per group than tokens", sp(func(s *SharedPrefix) { s.Vocab = 20 }), "PromptsPerGroup"},
		{"huge system prompt", sp(func(s *SharedPrefix) { s.SystemTokens = 1 << 30 }), "MaxTokens"},

		{"no documents", lc(func(l *LongContext) { l.Documents = 0 }), "Documents"},
		{"empty documents", lc(func(l *LongContext) { l.DocumentTokens = 0 }), "DocumentTokens"},
		{"no questions per document", lc(func(l *LongContext) { l.QuestionsPerDocument = 0 }), "QuestionsPerDocument"},
		{"empty question", lc(func(l *LongContext) { l.QuestionTokens = -1 }), "QuestionTokens"},
		{"long-context no output", lc(func(l *LongContext) { l.OutputTokens = 0 }), "OutputTokens"},
		{"long-context negative rate", lc(func(l *LongContext) { l.RequestRate = -4 }), "RequestRate"},
		{"long-context vocab", lc(func(l *LongContext) { l.Vocab = -1 }), "Vocab"},
		{"more documents than tokens", lc(func(l *LongContext) { l.Vocab = 3 }), "Documents"},
		{"huge documents", lc(func(l *LongContext) { l.DocumentTokens = math.MaxInt }), "MaxTokens"},
		{"zero value", LongContext{}, "Documents"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr, err := tt.g.Generate(1)
			if !errors.Is(err, ErrConfig) {
				t.Fatalf("Generate: %v, want ErrConfig", err)
			}
			if !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(err.Error(), tt.g.Name()+": ") {
				t.Errorf("error %q does not start with the workload or does not name %s", err, tt.want)
			}
			if tr.Requests != nil {
				t.Error("a failed Generate returned requests")
			}
		})
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	err := Multiturn{}.Validate()
	for _, field := range []string{"Clients", "Rounds", "RequestTokens", "OutputTokens", "RequestRate", "Vocab"} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("zero Multiturn: error %q does not name %s", err, field)
		}
	}
}

func TestSmallestValidConfigs(t *testing.T) {
	for _, g := range []Generator{
		Multiturn{Clients: 2, Rounds: 1, RequestTokens: 1, OutputTokens: 1, RequestRate: 1e-300, Vocab: 2},
		SharedPrefix{Groups: 2, PromptsPerGroup: 2, SystemTokens: 1, QuestionTokens: 1, OutputTokens: 1, RequestRate: 1e300, Vocab: 2},
		LongContext{Documents: 1, DocumentTokens: 1, QuestionsPerDocument: 1, QuestionTokens: 1, OutputTokens: 1, RequestRate: 1, Vocab: 1 << 32},
	} {
		tr := mustGenerate(t, g, -1)
		checkCommon(t, tr, g.Name(), -1, 1<<32)
	}
}

func TestByName(t *testing.T) {
	if want := []string{"multiturn", "shared-prefix", "long-context"}; !slices.Equal(Names(), want) {
		t.Fatalf("Names() = %v, want %v", Names(), want)
	}
	for _, name := range Names() {
		g, err := ByName(name)
		if err != nil {
			t.Fatalf("ByName(%q): %v", name, err)
		}
		if g.Name() != name {
			t.Errorf("ByName(%q).Name() = %q", name, g.Name())
		}
	}
	if g, _ := ByName("multiturn"); g.(*Multiturn).Clients != DefaultMultiturn().Clients {
		t.Error("ByName(multiturn) is not the default configuration")
	}
	_, err := ByName("sharegpt")
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("ByName(sharegpt): %v, want ErrConfig", err)
	}
	for _, name := range Names() {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("error %q does not list %s", err, name)
		}
	}
}
