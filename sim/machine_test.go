package sim

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/stratakv/strata/workload"
)

// On a machine with little memory and disk the bench lowers L1 (not below the
// longest request) and caps the spill, saying so in one line each, instead of
// failing or swapping.
func TestFitMachineScalesDown(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Model, _ = ModelByName("llama3-8b")
	cfg.FitMachine = true
	cfg.Machine = Machine{
		AvailableMemory: func() (int64, error) { return 8 << 30, nil },
		FreeDisk:        func(string) (int64, error) { return 4 << 30, nil },
	}
	m := workload.DefaultMultiturn()
	trace, err := m.Generate(cfg.Seed)
	if err != nil {
		t.Fatal(err)
	}
	notes, err := cfg.fitMachine(trace, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(notes) != 2 || !strings.Contains(notes[0], "L1 lowered from 16384 to") || !strings.Contains(notes[1], "node spill capped at 2.0 GiB") {
		t.Fatalf("notes %q", notes)
	}
	if need := cfg.memoryNeed(nil); need > 6<<30 {
		t.Errorf("the runs still need %d bytes of 8 GiB", need)
	}
	if cfg.NodeSpillBytes != 2<<30 {
		t.Errorf("spill %d bytes, want half the free disk", cfg.NodeSpillBytes)
	}
	// A machine with room changes nothing.
	roomy := DefaultConfig()
	roomy.Machine = Machine{
		AvailableMemory: func() (int64, error) { return 64 << 30, nil },
		FreeDisk:        func(string) (int64, error) { return 1 << 40, nil },
	}
	if notes, err := roomy.fitMachine(trace, nil); err != nil || len(notes) != 0 || roomy.L1Tokens != 16384 || roomy.NodeSpillBytes != 0 {
		t.Fatalf("roomy machine: notes %q, err %v, L1 %d, spill %d", notes, err, roomy.L1Tokens, roomy.NodeSpillBytes)
	}
}

// A bench sized down still runs, and reports what it changed.
func TestBenchRunsOnASmallMachine(t *testing.T) {
	cfg := smallConfig()
	cfg.Runs = []string{RunL1Only}
	cfg.L1Tokens = 8192
	cfg.FitMachine = true
	cfg.Machine = Machine{
		AvailableMemory: func() (int64, error) { return 1, nil },
		FreeDisk:        func(string) (int64, error) { return 1 << 40, nil },
	}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.L1Tokens >= 8192 || len(rep.Notes) != 1 || !strings.Contains(rep.Notes[0], "L1 lowered") || rep.Runs[0].Failed != 0 {
		t.Fatalf("L1 %d, notes %q, failed %d", rep.L1Tokens, rep.Notes, rep.Runs[0].Failed)
	}
}

// The temporary spill is removed in the background, and WaitCleanup waits for it.
func TestBackgroundCleanupRemovesTheSpill(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	cfg := sequential(smallConfig())
	cfg.Runs = []string{RunStrata}
	cfg.NodeArenaBytes = 64 << 20
	cfg.BackgroundCleanup = true
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var progress strings.Builder
	if err := rep.WaitCleanup(&progress); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(tmp)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Fatalf("left in the temporary directory: %v", entries)
	}
}
