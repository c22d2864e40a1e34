package sim

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stratakv/strata/workload"
)

// capacityConfig is a bench of 8 conversations of 4 rounds replayed by the event
// loop, without L3 (no node service to start): the runs that queue.
func capacityConfig() Config {
	cfg := sequential(smallConfig())
	cfg.L3 = L3None
	cfg.Runs = []string{RunL1Only, RunCeiling}
	return cfg
}

// The engine serves identical requests at MaxRunning over their hold time, or at
// what L1 holds of them when that is fewer.
func TestCapacityOfIdenticalRequests(t *testing.T) {
	reqs := make([]workload.Request, 8)
	for i := range reqs {
		reqs[i] = workload.Request{ID: i, Prompt: make([]uint32, 100), Output: make([]uint32, 10)}
	}
	cfg := DefaultConfig()
	cfg.PageSize, cfg.MaxRunning = 10, 4
	cfg.Model.PrefillPerToken, cfg.Model.DecodeStep = time.Millisecond, 10*time.Millisecond // 0.2 s a request
	cfg.L1Tokens = 1 << 20
	c := cfg.capacityOf(workload.Trace{Requests: reqs})
	if math.Abs(c.RequestsPerSecond-20) > 1e-9 || c.Running != 4 || c.L1Bound || math.Abs(c.HoldSeconds-0.2) > 1e-12 || c.Window != 2 {
		t.Fatalf("4 places, 0.2 s a request: %+v, want 20 requests/s", c)
	}
	for _, l1 := range []int64{220, 320} { // two requests of 11 pages, and a part of a third
		cfg.L1Tokens = l1
		c = cfg.capacityOf(workload.Trace{Requests: reqs})
		if math.Abs(c.RequestsPerSecond-10) > 1e-9 || c.Running != 2 || !c.L1Bound {
			t.Fatalf("L1 of %d tokens: %+v, want 2 running, 10 requests/s, L1-bound", l1, c)
		}
	}
	cfg.L1Tokens = 100 // less than a request: it still runs, alone
	if c = cfg.capacityOf(workload.Trace{Requests: reqs}); c.Running != 1 || math.Abs(c.RequestsPerSecond-5) > 1e-9 {
		t.Fatalf("L1 below a request: %+v, want 1 running", c)
	}
}

// The busiest quarter of the trace sets the capacity: multiturn's last rounds
// hold the longest prompts, and a rate taken over the whole trace would overload
// them.
func TestCapacityIsTheBusiestQuarters(t *testing.T) {
	cfg := capacityConfig()
	tr, err := cfg.Workload.Generate(cfg.Seed)
	if err != nil {
		t.Fatal(err)
	}
	c := cfg.capacityOf(tr)
	if c.First < len(tr.Requests)/2 {
		t.Errorf("busiest quarter starts at request %d of %d, want in the later rounds", c.First, len(tr.Requests))
	}
	if mean := float64(tr.PromptTokens()) / float64(len(tr.Requests)); c.PromptTokens <= mean {
		t.Errorf("busiest quarter's prompts average %.0f tokens, the trace's %.0f", c.PromptTokens, mean)
	}
}

// A model twice as expensive (prefill and decode) gets half the default rate, at
// the same load: the offered load is relative to what its engine serves.
func TestLoadDerivesTheRateFromTheModelsCost(t *testing.T) {
	cfg := capacityConfig()
	cfg.Load = DefaultLoad
	cheap, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Model.PrefillPerToken *= 2
	cfg.Model.DecodeStep *= 2
	dear, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if cheap.Rate <= 0 || math.Abs(dear.Rate/cheap.Rate-0.5) > 1e-9 {
		t.Fatalf("rates %v and %v requests/s: want the twice as expensive model at half", cheap.Rate, dear.Rate)
	}
	if math.Abs(dear.Capacity.RequestsPerSecond/cheap.Capacity.RequestsPerSecond-0.5) > 1e-9 {
		t.Fatalf("capacities %+v and %+v", cheap.Capacity, dear.Capacity)
	}
	for _, r := range []*Report{cheap, dear} {
		if math.Abs(r.Load-DefaultLoad) > 1e-9 || math.Abs(r.Rate-DefaultLoad*r.Capacity.RequestsPerSecond) > 1e-9 {
			t.Fatalf("load %v at %v requests/s of %+v, want %v", r.Load, r.Rate, r.Capacity, DefaultLoad)
		}
		for _, run := range r.Runs {
			if run.Backlog != nil {
				t.Errorf("%s at load %v: backlog %+v", run.Name, r.Load, run.Backlog)
			}
		}
		var out strings.Builder
		if err := r.WriteTable(&out); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out.String(), "OVERLOAD") || !strings.Contains(out.String(), "load 0.70 of the engine's capacity") {
			t.Fatalf("table at the default load:\n%s", out.String())
		}
	}
	// The same requests arrive, later by the factor the rate fell.
	if cheap.Requests != dear.Requests || cheap.PromptTokens != dear.PromptTokens {
		t.Fatalf("the traces differ beyond their arrivals: %d/%d requests", cheap.Requests, dear.Requests)
	}
}

// A rate above what the engine serves is said in one line, with the flags that
// fix it, and the queue's growth shows in the runs.
func TestOverloadIsSaidInOneLine(t *testing.T) {
	cfg := capacityConfig()
	// Long enough for the backlog to build: 128 rounds and their branches.
	m := workload.DefaultMultiturn()
	m.Clients, m.Rounds, m.RequestTokens, m.OutputTokens = 32, 4, 256, 32
	tr, err := m.Generate(cfg.Seed)
	if err != nil {
		t.Fatal(err)
	}
	capacity := cfg.capacityOf(tr).RequestsPerSecond
	m.RequestRate = 4 * capacity
	cfg.Workload, cfg.Load = m, 0
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(rep.Load-4) > 1e-9 {
		t.Fatalf("load %v, want 4", rep.Load)
	}
	l1, _ := rep.run(RunL1Only)
	if l1.Backlog == nil || l1.Backlog.LastQuarterWaitSeconds <= 10*l1.Backlog.HoldSeconds {
		t.Fatalf("l1-only at 4x capacity: backlog %+v, queue %+v", l1.Backlog, l1.QueueMs)
	}
	var out strings.Builder
	if err := rep.WriteTable(&out); err != nil {
		t.Fatal(err)
	}
	var lines []string
	for line := range strings.Lines(out.String()) {
		if strings.Contains(line, "OVERLOAD") {
			lines = append(lines, line)
		}
	}
	if len(lines) != 1 {
		t.Fatalf("%d OVERLOAD lines, want 1:\n%s", len(lines), out.String())
	}
	for _, want := range []string{"OVERLOAD: the queue grew in l1-only", "4.00x the engine's modelled capacity", "--load 0.7", "--rate below"} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("overload line lacks %q: %s", want, lines[0])
		}
	}
}

// On defaults (the trace scaled to a budget, L1 and L2 sized from it, the load
// derived), every workload's strata run serves hits from L3, verified, and the
// ceiling bounds it. The budget is small so that the test is quick; the scaled
// traces keep their shapes.
func TestDefaultsPutL3InPlay(t *testing.T) {
	for _, name := range workload.Names() {
		t.Run(name, func(t *testing.T) {
			gen, err := workload.ByName(name)
			if err != nil {
				t.Fatal(err)
			}
			cfg := DefaultConfig()
			cfg.Workload = gen
			cfg.ScaleTrace, cfg.SizeL1, cfg.SizeL2, cfg.FitL1 = true, true, true, true
			cfg.Budget = Budget{PromptKVBytes: 384 << 20, WorkingSetBytes: 128 << 20}
			cfg.NodeArenaBytes = 64 << 20
			rep, err := Run(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Scaling == nil || rep.PromptTokens*cfg.tokenBytes() > cfg.Budget.PromptKVBytes && !rep.Scaling.OverBudget {
				t.Fatalf("scaling %+v for %d prompt tokens", rep.Scaling, rep.PromptTokens)
			}
			if rep.L1Tokens+rep.L2Tokens >= rep.ReusedPrefixTokens {
				t.Fatalf("L1 %d + L2 %d hold all %d tokens hit again", rep.L1Tokens, rep.L2Tokens, rep.ReusedPrefixTokens)
			}
			st, _ := rep.run(RunStrata)
			ceil, _ := rep.run(RunCeiling)
			if st.HitTokens.L3 == 0 || st.CorruptPages != 0 || st.Failed != 0 || st.VerifiedPages == 0 {
				t.Fatalf("strata: hits %+v, %d verified, %d corrupt, %d failed", st.HitTokens, st.VerifiedPages, st.CorruptPages, st.Failed)
			}
			if st.HitTokens.Total() > ceil.HitTokens.Total() {
				t.Fatalf("strata hit %d tokens, above the ceiling's %d", st.HitTokens.Total(), ceil.HitTokens.Total())
			}
			if math.Abs(rep.Load-DefaultLoad) > 1e-9 {
				t.Fatalf("load %v", rep.Load)
			}
		})
	}
}
