package main

import (
	"strings"
	"testing"
)

// A bench flag that does not apply to the chosen workload, L3, runs or backend is
// refused in one line that names it, with exit status 2, before anything
// runs: ignored, it would give figures of another bench than the one asked.
func TestBenchRefusesFlagsThatDoNotApply(t *testing.T) {
	for _, tc := range []struct {
		args []string
		flag string // the flag the message must name
		fix  string // and what it must say to do
	}{
		{[]string{"bench", "--l3", "file", "--socket", "/tmp/s.sock"}, "--socket", "--l3 node"},
		{[]string{"bench", "--l3", "none", "--node-arena", "1GiB"}, "--node-arena", "--l3 node"},
		{[]string{"bench", "--l3", "redis", "--nodes", "2"}, "--nodes", "--l3 node"},
		{[]string{"bench", "--l3", "file", "--engines", "2"}, "--engines", "--l3 redis"},
		{[]string{"bench", "--l3", "file", "--redis", "127.0.0.1:6379"}, "--redis", "--l3 redis"},
		{[]string{"bench", "--l3", "none", "--redis", "127.0.0.1:6379"}, "--redis", "--l3 node"},
		{[]string{"bench", "--l3", "node", "--l3-dir", "/tmp"}, "--l3-dir", "--l3 file"},
		{[]string{"bench", "--l3", "redis", "--l3-capacity", "1GiB"}, "--l3-capacity", "--l3 file"},
		{[]string{"bench", "--l3", "none", "--l3-warm"}, "--l3-warm", "an L3"},
		{[]string{"bench", "--l3", "none", "--prefetch-policy", "best_effort"}, "--prefetch-policy", "an L3"},
		{[]string{"bench", "--runs", "l1-only,ceiling", "--socket", "/tmp/s.sock"}, "--socket", "add strata to --runs"},
		{[]string{"bench", "--runs", "ceiling", "--engines", "2"}, "--engines", "add strata to --runs"},
		{[]string{"bench", "--socket", "/tmp/s.sock", "--node-arena", "1GiB"}, "--node-arena", "drop --socket"},
		{[]string{"bench", "--plot", "x.jpg"}, "--plot", ".png"},
		{[]string{"bench", "--plot", "x"}, "--plot", ".png"},
		{[]string{"bench", "--restart-at", "0.5"}, "--restart-at", "--restart-node kill"},
		{[]string{"bench", "--l3", "redis", "--restart-node", "kill"}, "--restart-node", "--l3 node"},
		{[]string{"bench", "--socket", "/tmp/s.sock", "--restart-node", "kill"}, "--restart-node", "drop --socket"},
		{[]string{"bench", "--runs", "l1-only", "--restart-node", "kill"}, "--restart-node", "add strata to --runs"},
		{[]string{"bench", "--restart-node", "bounce"}, "--restart-node", "kill, term or cold"},
		{[]string{"bench", "--restart-node", "kill", "--restart-at", "1"}, "--restart-at", "below 1"},
		{[]string{"bench", "--restart-node", "kill", "--nodes", "2"}, "--nodes", "drop"},
		{[]string{"bench", "--documents", "3"}, "--documents", "--workload long-context"},
		{[]string{"bench", "--workload", "long-context", "--clients", "3"}, "--clients", "--workload multiturn"},
		{[]string{"bench", "--workload", "shared-prefix", "--edit-ratio", "0"}, "--edit-ratio", "--workload multiturn"},
		{[]string{"bench", "--workload", "long-context", "--groups", "2"}, "--groups", "--workload shared-prefix"},
		{[]string{"bench", "--question-tokens", "8"}, "--question-tokens", "shared-prefix and long-context"},
		{[]string{"bench", "matrix", "--", "--documents", "2"}, "--documents", "--workloads"},
		{[]string{"bench", "matrix", "--workloads", "multiturn,long-context", "--", "--clients=2"}, "--clients", "--workload long-context"},
		{[]string{"bench", "tiers", "--backend", "file", "--socket", "/tmp/s.sock"}, "--socket", "--backend node"},
		{[]string{"bench", "tiers", "--backend", "file", "--no-redis"}, "--no-redis", "--backend node"},
		{[]string{"bench", "tiers", "--backend", "node", "--redis-cluster"}, "--redis-cluster", "--backend redis"},
		{[]string{"bench", "tiers", "--backend", "file", "--redis", "127.0.0.1:6379"}, "--redis", "--backend redis"},
	} {
		code, out, errs := runCLI(t, "", tc.args...)
		msg := strings.TrimSpace(errs)
		if code != 2 || out != "" || strings.Count(msg, "\n") != 0 || !strings.Contains(msg, tc.flag) || !strings.Contains(msg, tc.fix) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q: want exit 2 and one line naming %s and %q", tc.args, code, out, errs, tc.flag, tc.fix)
		}
	}
}
