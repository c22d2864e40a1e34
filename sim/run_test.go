package sim

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stratakv/strata/node"

	"github.com/stratakv/strata/workload"
)

// smallConfig is a bench that runs in well under a second: 8 conversations of 4
// rounds on the small model, L1 too small for them, L2 big enough. Its hicache
// runs are served by 4 goroutines, so that every test runs the cache
// concurrently (under -race in CI) unless it needs the event loop's
// reproducible hits: those call sequential.
func smallConfig() Config {
	cfg := DefaultConfig()
	m := workload.DefaultMultiturn()
	m.Clients, m.Rounds, m.RequestTokens, m.OutputTokens = 8, 4, 256, 32
	cfg.Workload = &m
	cfg.L1Tokens = 2048
	cfg.MaxRunning = 4
	cfg.Concurrent = 4
	return cfg
}

// sequential is cfg replayed by the deterministic event loop, for tests that
// compare hit counts between runs or with a bound.
func sequential(cfg Config) Config {
	cfg.Concurrent = 0
	return cfg
}

func TestBenchRunsAllThreeAndVerifies(t *testing.T) {
	rep, err := Run(context.Background(), sequential(smallConfig()))
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Runs) != 3 {
		t.Fatalf("%d runs", len(rep.Runs))
	}
	byName := map[string]RunReport{}
	for _, r := range rep.Runs {
		byName[r.Name] = r
		if r.CorruptPages != 0 {
			t.Fatalf("run %s served %d corrupt pages", r.Name, r.CorruptPages)
		}
		if r.PromptTokens != rep.PromptTokens || r.Failed != 0 {
			t.Fatalf("run %s served %d of %d prompt tokens, %d failed", r.Name, r.PromptTokens, rep.PromptTokens, r.Failed)
		}
	}
	l1, ceil, st := byName[RunL1Only], byName[RunCeiling], byName[RunStrata]
	if !(st.HitRatio > l1.HitRatio) || st.HitRatio > ceil.HitRatio+1e-9 {
		t.Fatalf("hit ratios l1-only %.3f strata %.3f ceiling %.3f", l1.HitRatio, st.HitRatio, ceil.HitRatio)
	}
	if st.HitTokens.L2 == 0 || st.LoadBack.Pages == 0 || st.VerifiedPages == 0 {
		t.Fatalf("strata did not use L2: %+v", st)
	}
	if st.VerifiedPages != st.HitTokens.Total()/int64(rep.PageSize) {
		t.Fatalf("verified %d pages, hits cover %d", st.VerifiedPages, st.HitTokens.Total()/int64(rep.PageSize))
	}
	if st.TTFTms.P50 <= 0 || st.TTFTms.P90 < st.TTFTms.P50 {
		t.Fatalf("TTFT %+v", st.TTFTms)
	}
}

func TestBenchIsDeterministicForASeed(t *testing.T) {
	a, err := Run(context.Background(), sequential(smallConfig()))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Run(context.Background(), sequential(smallConfig()))
	if err != nil {
		t.Fatal(err)
	}
	for i := range a.Runs {
		if a.Runs[i].HitTokens != b.Runs[i].HitTokens || a.Runs[i].VerifiedPages != b.Runs[i].VerifiedPages {
			t.Fatalf("run %s differs between identical benches: %+v vs %+v", a.Runs[i].Name, a.Runs[i].HitTokens, b.Runs[i].HitTokens)
		}
	}
}

// Draft KV depends on the next token; keyed by tokens alone, a hit can serve draft
// KV computed for another continuation. The verification must see it.
func TestTokenKeysWithADraftPoolAreCaughtAsCorrupt(t *testing.T) {
	cfg := sequential(smallConfig())
	cfg.Bigram = false
	cfg.Runs = []string{RunStrata}
	// Rounds whose new text starts right after a page boundary of the previous
	// round's output: the last cached page's draft entry saw a different next token.
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Runs[0].CorruptPages == 0 {
		t.Fatal("token-keyed cache with a draft pool reported no corrupt pages")
	}
	cfg.Draft = false
	rep, err = Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Runs[0].CorruptPages != 0 {
		t.Fatalf("token keys without a draft pool: %d corrupt pages", rep.Runs[0].CorruptPages)
	}
}

func TestBenchConfigErrors(t *testing.T) {
	bad := []func(*Config){
		func(c *Config) { c.PageSize = 0 },
		func(c *Config) { c.L1Tokens = 0 },
		func(c *Config) { c.L2Ratio = 0.5 },
		func(c *Config) { c.MaxRunning = 0 },
		func(c *Config) { c.Runs = []string{"l9"} },
	}
	for i, f := range bad {
		cfg := smallConfig()
		f(&cfg)
		if _, err := Run(context.Background(), cfg); !errors.Is(err, ErrConfig) {
			t.Errorf("case %d: %v", i, err)
		}
	}
	if _, err := ModelByName("gpt-5"); !errors.Is(err, ErrConfig) {
		t.Error("unknown model accepted")
	}
}

// A request larger than L1 can never be served: without FitL1 that is a
// configuration error before any run, with it L1 grows to hold it and the report
// says so.
func TestRequestLargerThanL1(t *testing.T) {
	cfg := smallConfig()
	cfg.L1Tokens = 256
	cfg.Runs = []string{RunL1Only}
	if _, err := Run(context.Background(), cfg); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "--l1-tokens") {
		t.Fatalf("L1 smaller than a request: %v, want ErrConfig naming --l1-tokens", err)
	}
	cfg.FitL1 = true
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Runs[0].Failed != 0 || rep.L1Tokens <= 256 || rep.L1Tokens%256 != 0 {
		t.Fatalf("fitted L1: %d tokens, %d failed", rep.L1Tokens, rep.Runs[0].Failed)
	}
	if len(rep.Notes) != 1 || !strings.Contains(rep.Notes[0], "L1 raised from 256") {
		t.Fatalf("notes %q", rep.Notes)
	}
}

// The ceiling bounds strata: on long documents behind an L1 that holds one
// request at a time, strata's requests wait for L1 and find the document cached
// by then; a ceiling that took hits at admission (as it once did) missed them
// and came out below strata.
func TestCeilingBoundsStrata(t *testing.T) {
	for _, l1 := range []int64{2048, 4096} {
		cfg := sequential(smallConfig())
		lc := workload.DefaultLongContext()
		lc.Documents, lc.DocumentTokens, lc.QuestionsPerDocument, lc.QuestionTokens, lc.OutputTokens = 2, 1536, 6, 64, 16
		lc.RequestRate = 40
		cfg.Workload = lc
		cfg.PageSize, cfg.L1Tokens, cfg.L3 = 64, l1, L3None
		rep, err := Run(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		ceiling, _ := rep.run(RunCeiling)
		for _, r := range rep.Runs {
			if r.HitTokens.Total() > ceiling.HitTokens.Total() {
				t.Errorf("L1 %d: %s hit %d tokens, above the ceiling's %d", l1, r.Name, r.HitTokens.Total(), ceiling.HitTokens.Total())
			}
		}
	}
}

func TestBenchL3FileServesWhatL1AndL2Lost(t *testing.T) {
	cfg := sequential(smallConfig())
	// L1 holds the largest request; L1 and L2 together hold under half the
	// working set.
	cfg.L1Tokens, cfg.L2Ratio = 2048, 1
	cfg.L3, cfg.L3Dir = L3File, t.TempDir()
	cfg.Runs = []string{RunStrata}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	st := rep.Runs[0]
	if st.CorruptPages != 0 || st.HitTokens.L3 == 0 || st.L3 == nil || st.L3.BytesWritten == 0 || st.L3.Prefetch.Completed == 0 {
		t.Fatalf("L3 run: %+v %+v", st, st.L3)
	}
	if len(st.L3.Pools) != 2 || !st.L3.Pools[0].Enabled || !st.L3.Pools[1].Enabled {
		t.Fatalf("pools %+v", st.L3.Pools)
	}
	cfg.L3 = L3None
	without, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if without.Runs[0].HitRatio >= st.HitRatio {
		t.Fatalf("L3 did not raise the hit ratio: %.3f without, %.3f with", without.Runs[0].HitRatio, st.HitRatio)
	}
}

// The node service refuses the draft pool's registration (over the client quota):
// target L2/L3 and draft L2 keep working, target L3 hits are served with the draft
// KV recomputed, nothing is corrupt, and the report says which pool and why.
func TestNodeRefusesTheDraftPoolByQuota(t *testing.T) {
	cfg := sequential(smallConfig())
	m := workload.DefaultMultiturn()
	m.Clients, m.Rounds, m.RequestTokens, m.OutputTokens = 12, 4, 256, 32
	cfg.Workload = &m
	cfg.L1Tokens, cfg.L2Ratio, cfg.MaxRunning = 4096, 1, 2
	cfg.Runs = []string{RunStrata}
	target := int64(cfg.l2Pages()) * int64(cfg.PageSize) * int64(cfg.Model.Geometry.TokenBytes())
	dir, err := os.MkdirTemp("", "sq")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	nc := node.DefaultConfig(filepath.Join(dir, "s"))
	nc.Admin, nc.ArenaBytes, nc.Logger = "", 256<<20, slog.New(slog.DiscardHandler)
	nc.ClientQuotaBytes = target + 4096 // the target pool fits, the draft pool does not
	srv, err := node.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	cfg.L3, cfg.NodeSocket = L3Node, srv.Socket()
	cfg.Logger = slog.New(slog.DiscardHandler)
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	st := rep.Runs[0]
	if st.L3 == nil || len(st.L3.Pools) != 2 || !st.L3.Pools[0].Enabled || st.L3.Pools[1].Enabled ||
		!strings.Contains(st.L3.Pools[1].Reason, "quota") {
		t.Fatalf("pool status %+v", st.L3)
	}
	if st.CorruptPages != 0 || st.Failed != 0 || st.HitTokens.L3 == 0 || st.DraftRecomputePages == 0 || st.HitTokens.L2 == 0 {
		t.Fatalf("with the draft pool refused: %+v\nL3 %+v", st, *st.L3)
	}
	if s := srv.Stats(); s.Ops.Refused == 0 {
		t.Fatalf("service did not count the refusal: %+v", s.Ops)
	}
}

// Each bench names its L3 objects in a fresh namespace, so a second bench on the
// same L3 finds it empty and reports what the first did; --l3-warm reads what
// earlier benches left and counts it.
func TestBenchStartsFromAnEmptyL3UnlessWarm(t *testing.T) {
	cfg := sequential(smallConfig())
	cfg.L3, cfg.L3Dir, cfg.L2Ratio = L3File, t.TempDir(), 1
	cfg.Runs = []string{RunStrata}
	first, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	second, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	a, b := first.Runs[0], second.Runs[0]
	if a.HitTokens.L3 == 0 {
		t.Fatalf("no L3 hits to compare: %+v", a.HitTokens)
	}
	if a.HitTokens != b.HitTokens || b.L3WarmHitTokens != 0 {
		t.Fatalf("second bench on the same L3 hit %+v (warm %d), the first %+v", b.HitTokens, b.L3WarmHitTokens, a.HitTokens)
	}
	cfg.L3Warm = true
	if _, err := Run(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	warm, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if w := warm.Runs[0]; w.L3WarmHitTokens == 0 || w.HitTokens.Total() <= a.HitTokens.Total() {
		t.Fatalf("warm bench: hits %+v, warm L3 hit tokens %d; cold %+v", w.HitTokens, w.L3WarmHitTokens, a.HitTokens)
	}
	var buf strings.Builder
	if err := warm.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "L3 started warm") {
		t.Fatalf("table does not say the L3 was warm:\n%s", buf.String())
	}
}
