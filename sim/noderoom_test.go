package sim

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// Node arenas that would leave the strata run's pools no room are refused
// before any run, naming --node-arena and a size that fits; the same bench
// on a machine with room passes the check.
func TestNodeArenaLeavingThePoolsNoRoomIsRefused(t *testing.T) {
	cfg := smallConfig()
	cfg.NodeArenaBytes = 7 << 30
	cfg.Machine.AvailableMemory = func() (int64, error) { return 8 << 30, nil }
	ran := false
	cfg.beforeReplay = func(string) { ran = true }
	_, err := Run(context.Background(), cfg)
	if !errors.Is(err, ErrConfig) || ran || !strings.Contains(err.Error(), "--node-arena 7GiB: the node service's arena and the strata run's L1 and L2 pools") ||
		!strings.Contains(err.Error(), "give --node-arena 6GiB or less") {
		t.Fatalf("a 7 GiB arena on a machine with 8 GiB available (ran %v): %v", ran, err)
	}
	cfg.Machine.AvailableMemory = func() (int64, error) { return 64 << 30, nil }
	if err := cfg.checkNodeRoom(cfg.Runs); err != nil {
		t.Fatalf("with room: %v", err)
	}
	cfg.Runs = []string{RunL1Only}
	cfg.Machine.AvailableMemory = func() (int64, error) { return 2 << 30, nil }
	if err := cfg.checkNodeRoom(cfg.Runs); err != nil {
		t.Fatalf("no strata run, no node service: %v", err)
	}
}
