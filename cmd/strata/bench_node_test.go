package main

import (
	"strings"
	"testing"
)

// A node service the bench would start that this machine cannot hold is
// refused before any run, in one line that names --node-arena (not serve's
// --arena) and proposes a size that fits, exit 2; so is a remote tier
// nothing answers at.
func TestBenchRefusesANodeServiceTheMachineCannotHold(t *testing.T) {
	was := benchAvailableMemory
	t.Cleanup(func() { benchAvailableMemory = was })
	benchAvailableMemory = func() (int64, error) { return 8 << 30, nil } // 7 GiB past serve's 1 GiB reserve
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"bench", "--node-arena", "100GiB"}, []string{"--node-arena 100GiB", "8.0 GiB of memory available", "give --node-arena 7GiB or less"}},
		{[]string{"bench", "--runs", "l1-only,strata", "--node-arena", "7680MiB"}, []string{"--node-arena 7680MiB", "give --node-arena 7GiB or less"}},
		{[]string{"bench", "--nodes", "3", "--node-arena", "4GiB"}, []string{"--node-arena 4GiB", "--nodes 3", "give --node-arena 2GiB or less"}},
		{[]string{"bench", "--nodes", "16", "--node-arena", "1GiB"}, []string{"--node-arena 1GiB", "give --node-arena 448MiB or less"}},
		{[]string{"bench", "--restart-node", "kill", "--node-arena", "64GiB"}, []string{"--node-arena 64GiB", "give --node-arena 7GiB or less"}},
		{[]string{"bench", "--redis", "127.0.0.1:1"}, []string{"--redis", "remote tier", "127.0.0.1:1"}},
	} {
		code, out, errs := runCLI(t, "", tc.args...)
		msg := strings.TrimSpace(errs)
		// One line on stderr: no run's progress before it.
		if code != 2 || out != "" || strings.Contains(msg, "\n") || strings.Contains(msg, "(--arena)") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q: want exit 2 and one line, no run", tc.args, code, out, errs)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(msg, w) {
				t.Errorf("%v: %q does not say %q", tc.args, msg, w)
			}
		}
	}
	// An arena that fits alone but leaves the strata run's L1 and L2 no
	// room is refused once they are sized from the trace, before any run.
	code, out, errs := runCLI(t, "", "bench", "--node-arena", "7GiB")
	last := strings.TrimSpace(errs)
	last = last[strings.LastIndex(last, "\n")+1:]
	if code != 2 || out != "" || strings.Contains(errs, "l1-only:") || !strings.Contains(last, "--node-arena 7GiB: the node service's arena and the strata run's L1 and L2 pools") ||
		!strings.Contains(last, "or less") {
		t.Errorf("--node-arena 7GiB with 8 GiB available: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	// What fits is not refused here: a bench of the other runs, or a
	// service the user runs, starts no arena.
	for _, args := range [][]string{
		{"bench", "--runs", "l1-only", "--l3", "none", "--clients", "2", "--rounds", "2"},
	} {
		if code, _, errs := runCLI(t, "", args...); code != 0 {
			t.Errorf("%v: exit %d: %s", args, code, errs)
		}
	}
}
