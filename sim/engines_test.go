package sim

import (
	"context"
	"os"
	"testing"

	"github.com/stratakv/strata/internal/redistest"
)

// Engines 0 and 2 run on node 0, engine 1 on node 1: an L3 hit counts as
// cross-node when no engine of its own node computed the page.
func TestCrossNodeHitTokens(t *testing.T) {
	results := []*EngineResult{
		{ComputedPages: []uint64{1, 2}, L3HitPages: []uint64{3, 4, 1}},
		{ComputedPages: []uint64{3}, L3HitPages: []uint64{1, 2, 3, 5}},
		{ComputedPages: []uint64{4}, L3HitPages: []uint64{2, 3}},
	}
	// Node 0 computed 1, 2, 4: its hits 3 (engine 0) and 3 (engine 2) are
	// cross-node. Node 1 computed 3: its hits 1, 2 and 5 are.
	if got := crossNodeHitTokens(results, 2, 64); got != 5*64 {
		t.Fatalf("cross-node hit tokens %d, want %d", got, 5*64)
	}
	if got := crossNodeHitTokens(results, 1, 64); got != 64 {
		t.Fatalf("one node: %d, want 64 (page 5, computed by no engine)", got)
	}
}

// --l3 redis with no address starts a local cluster for the run, and removes it.
func TestBenchL3RedisStartsALocalCluster(t *testing.T) {
	redistest.Require(t)
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	cfg := sequential(smallConfig())
	cfg.L3, cfg.Runs = L3Redis, []string{RunStrata}
	cfg.L1Tokens, cfg.L2Ratio = 2048, 1 // L1 holds the largest request, L1 + L2 under half the working set
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := rep.Runs[0]
	if rep.Redis != "local cluster of 3 masters" || r.HitTokens.L3 == 0 || r.CorruptPages != 0 || r.L3 == nil || r.L3.Backend != L3Redis {
		t.Fatalf("report redis %q, run %+v", rep.Redis, r)
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Fatalf("left in the temporary directory: %v", left)
	}
}
