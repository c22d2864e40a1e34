package node

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stratakv/strata/node/wire"
)

// nodeShmDir is a private directory on tmpfs for an arena file.
func nodeShmDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "strata-node-test-")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no tmpfs for an arena file: %v", err)
		}
		t.Skipf("no tmpfs for an arena file: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// untilReady waits, within a bound, until the service says it is ready.
func untilReady(t *testing.T, s *Server) StartStats {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		st := s.Stats().Start
		if st.State == StateReady {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("the service was not ready in 20 s: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Evicted objects that are in neither tier at a start are reported lost by
// that start alone: the next start, with nothing lost since, reports none
// (it re-reported the same losses at every start).
func TestLostEvictionsAreReportedOnce(t *testing.T) {
	arenaFile := filepath.Join(nodeShmDir(t), "arena")
	spillDir := filepath.Join(t.TempDir(), "spill")
	tweak := func(c *Config) {
		c.ArenaBytes, c.ArenaFile, c.SpillDir = 8<<20, arenaFile, spillDir
	}
	s := start(t, tweak)
	c := dial(t, s)
	_, seg := c.segment(1 << 20)
	for i := range 24 {
		if res := c.batch(wire.TypePut, item(fmt.Sprintf("k%d", i), seg, 0, 1<<20)); res[0].Status != wire.OK {
			t.Fatalf("put k%d: %+v", i, res[0])
		}
	}
	if st := s.Stats(); st.Arena.Spilled == 0 {
		t.Fatalf("nothing was evicted to the spill: %+v", st.Arena)
	}
	untilReady(t, s)
	s.Close()
	// The spill's segments go while no service runs: what was evicted to
	// them is in neither tier now.
	if err := os.RemoveAll(spillDir); err != nil {
		t.Fatal(err)
	}

	s = start(t, tweak)
	st := untilReady(t, s)
	if st.LostEvicted == 0 || st.EvictionsChecked == 0 {
		t.Fatalf("the start after the spill was lost reports %d lost of %d checked", st.LostEvicted, st.EvictionsChecked)
	}
	s.Close()

	s = start(t, tweak)
	if st := untilReady(t, s); st.LostEvicted != 0 || st.EvictionsChecked != 0 {
		t.Fatalf("the next start reports %d lost of %d checked again", st.LostEvicted, st.EvictionsChecked)
	}
}
