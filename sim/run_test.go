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

func TestRequestLargerThanL1Fails(t *testing.T) {
	cfg := smallConfig()
	cfg.L1Tokens = 256
	cfg.Runs = []string{RunL1Only}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Runs[0].Failed == 0 {
		t.Fatal("requests larger than L1 were not reported as failed")
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
