package sim

import (
	"context"
	"fmt"
	"log/slog"
	"testing"

	"github.com/stratakv/strata/workload"
)

// concurrentConfig is a small trace that makes the tiers work under concurrency:
// 16 conversations of 4 rounds that regenerate answers, edit earlier messages
// and branch (a second request of the same conversation sent with the round's
// own, leaving it mid-page, so one request splits what another may still be
// loading), served by 8 goroutines, with an L1 too small for the requests in
// flight to keep their conversations (loads back from L2, evictions) and an L2
// that holds part of the working set.
func concurrentConfig(seed int64) Config {
	cfg := DefaultConfig()
	m := workload.DefaultMultiturn()
	m.Clients, m.Rounds, m.RequestTokens, m.OutputTokens = 16, 4, 256, 32
	m.RegenerateRatio, m.EditRatio, m.BranchRatio = 0.2, 0.2, 0.6
	cfg.Workload = &m
	cfg.Seed = seed
	cfg.L1Tokens, cfg.L2Ratio = 4096, 4
	cfg.Concurrent = 8
	cfg.NodeArenaBytes = 64 << 20
	cfg.Logger = slog.New(slog.DiscardHandler)
	return cfg
}

// Requests served from 8 goroutines, copies overlapping other requests' matches,
// inserts and evictions: every served page is right, over several seeds, and the
// requests really overlapped. Hit counts vary run to run and are not compared.
// Run it under -race: that and the page checks are what it is for. Without L3,
// conversations come back from L2 alone, and a branch's match splits spans the
// other request of its round is loading (cheap, so over 8 seeds: that found
// hicache serving pages before their load finished in about 4 seeds of 5); with
// the node service, prefetches and L3 backups join in.
func TestConcurrentBenchServesNoCorruptPages(t *testing.T) {
	for _, tc := range []struct {
		l3    string
		seeds int64
		runs  []string
	}{
		{L3None, 8, []string{RunStrata}},
		{L3Node, 2, []string{RunL1Only, RunStrata}},
	} {
		for seed := int64(1); seed <= tc.seeds; seed++ {
			t.Run(fmt.Sprintf("l3-%s/seed%d", tc.l3, seed), func(t *testing.T) {
				cfg := concurrentConfig(seed)
				cfg.L3, cfg.Runs = tc.l3, tc.runs
				rep, err := Run(context.Background(), cfg)
				if err != nil {
					t.Fatal(err)
				}
				if rep.Concurrent != cfg.Concurrent {
					t.Errorf("report says %d goroutines, want %d", rep.Concurrent, cfg.Concurrent)
				}
				for _, r := range rep.Runs {
					if r.CorruptPages != 0 {
						t.Errorf("run %s served %d corrupt pages of %d verified", r.Name, r.CorruptPages, r.VerifiedPages)
					}
					if r.Failed != 0 || r.PromptTokens != rep.PromptTokens {
						t.Errorf("run %s served %d of %d prompt tokens, %d requests failed", r.Name, r.PromptTokens, rep.PromptTokens, r.Failed)
					}
					if r.Concurrency != cfg.Concurrent || r.MaxInFlight < 2 || r.MaxInFlight > cfg.Concurrent {
						t.Errorf("run %s: %d goroutines, at most %d requests in flight; want %d goroutines and requests that overlapped",
							r.Name, r.Concurrency, r.MaxInFlight, cfg.Concurrent)
					}
					if r.VerifiedPages == 0 || r.HitTokens.Total() == 0 {
						t.Errorf("run %s hit nothing: %+v", r.Name, r)
					}
				}
				st := rep.Runs[len(rep.Runs)-1]
				if st.HitTokens.L2 == 0 || st.LoadBack.Pages == 0 || st.Backup.Pages == 0 || st.EvictedTokens.L1 == 0 {
					t.Errorf("strata moved no pages between L1 and L2: L2 hits %d, load-back %+v, backup %+v, evicted %+v",
						st.HitTokens.L2, st.LoadBack, st.Backup, st.EvictedTokens)
				}
				if tc.l3 != L3None && (st.L3 == nil || st.L3.BytesWritten == 0) {
					t.Errorf("strata wrote nothing to L3: %+v", st.L3)
				}
			})
		}
	}
}

// A request larger than L1 fails in the concurrent replay as in the event loop,
// while the others are served; nothing waits forever for pages that cannot come.
func TestConcurrentBenchFailsRequestsLargerThanL1(t *testing.T) {
	cfg := concurrentConfig(1)
	cfg.Runs = []string{RunL1Only}
	cfg.L1Tokens = 512 // round 0 fits (288 tokens), later rounds do not
	cfg.allowOversize = true
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := rep.Runs[0]
	if r.Failed == 0 || r.Failed == rep.Requests || r.CorruptPages != 0 {
		t.Fatalf("%d of %d requests failed, %d corrupt pages; want the large ones to fail, the rest served", r.Failed, rep.Requests, r.CorruptPages)
	}
}
