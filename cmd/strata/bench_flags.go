package main

import (
	"flag"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/stratakv/strata/sim"
	"github.com/stratakv/strata/storagebench"
	"github.com/stratakv/strata/workload"
)

// flagScope names flags that mean something only where applies holds: given
// elsewhere, they would be ignored, and a bench that ran without what the
// user asked for would report figures of something else. to says where they
// apply and fix what to give instead, for the one-line usage error.
type flagScope struct {
	flags   []string
	applies bool
	to, fix string
}

// refuseInapplicable returns a usage error (exit 2) for the first flag given
// outside its scope, naming it, where it applies, and what to do.
func refuseInapplicable(fs *flag.FlagSet, scopes []flagScope) error {
	for _, s := range scopes {
		if s.applies {
			continue
		}
		for _, name := range s.flags {
			if flagSet(fs, name) {
				return usagef("--%s applies only to %s: drop it, or %s", name, s.to, s.fix)
			}
		}
	}
	return nil
}

// benchFlagScopes are where `strata bench`'s flags apply: node-service flags
// to --l3 node, file flags to --l3 file, Redis to node and redis, every L3
// flag to the strata run, the restart to a service the bench starts.
func benchFlagScopes(fs *flag.FlagSet, l3 string, runs []string, socket string) []flagScope {
	strata := len(runs) == 0 || slices.Contains(runs, sim.RunStrata)
	// --l3 itself stays: the header names it, and --l3 none is how a bench
	// of the other runs says it uses no L3 (no node service sized for it).
	l3Flags := []string{"socket", "node-arena", "nodes", "engines", "redis", "l3-dir", "l3-capacity", "l3-warm",
		"prefetch-policy", "draft-policy", "restart-node", "restart-at"}
	return []flagScope{
		{flags: l3Flags, applies: strata, to: "the strata run", fix: "add strata to --runs"},
		{flags: []string{"socket", "node-arena", "nodes", "restart-node"}, applies: l3 == sim.L3Node, to: "--l3 node", fix: "give --l3 node"},
		{flags: []string{"engines"}, applies: l3 == sim.L3Node || l3 == sim.L3Redis, to: "--l3 node and --l3 redis", fix: "give one of them"},
		{flags: []string{"redis"}, applies: l3 == sim.L3Node || l3 == sim.L3Redis, to: "--l3 redis (the L3) and --l3 node (the node services' remote tier)", fix: "give one of them"},
		{flags: []string{"l3-dir", "l3-capacity"}, applies: l3 == sim.L3File, to: "--l3 file", fix: "give --l3 file"},
		{flags: []string{"l3-warm", "prefetch-policy", "draft-policy"}, applies: l3 != sim.L3None, to: "a bench with an L3", fix: "give --l3 node, redis or file"},
		{flags: []string{"node-arena", "restart-node"}, applies: socket == "", to: "a node service the bench starts itself, not one given by --socket", fix: "drop --socket"},
		{flags: []string{"restart-at"}, applies: flagSet(fs, "restart-node"), to: "--restart-node", fix: "give --restart-node kill, term or cold"},
	}
}

// workloadFlagScopes are where the workloads' shape flags apply: each to the
// workload it shapes (--clients to multiturn, --documents to long-context).
// An unknown --workload is left to the configuration's check, which names them.
func workloadFlagScopes(wl string) []flagScope {
	if !slices.Contains(workload.Names(), wl) {
		return nil
	}
	mt, sp, lc := workload.DefaultMultiturn().Name(), workload.DefaultSharedPrefix().Name(), workload.DefaultLongContext().Name()
	return []flagScope{
		{flags: []string{"clients", "rounds", "regenerate-ratio", "edit-ratio", "branch-ratio", "request-tokens"},
			applies: wl == mt, to: "--workload " + mt, fix: "give --workload " + mt},
		{flags: []string{"groups", "prompts-per-group", "system-tokens"}, applies: wl == sp, to: "--workload " + sp, fix: "give --workload " + sp},
		{flags: []string{"documents", "document-tokens", "questions"}, applies: wl == lc, to: "--workload " + lc, fix: "give --workload " + lc},
		{flags: []string{"question-tokens"}, applies: wl == sp || wl == lc, to: "--workload " + sp + " and " + lc, fix: "give one of them"},
	}
}

// checkMatrixExtra refuses a workload's shape flag after `bench matrix --`
// when the matrix runs another workload too: every cell of that workload would
// refuse it, after the cells before it had run.
func checkMatrixExtra(workloads, extra []string) error {
	if len(workloads) == 0 {
		workloads = workload.Names()
	}
	for _, name := range flagNames(extra) {
		for _, wl := range workloads {
			for _, s := range workloadFlagScopes(wl) {
				if !s.applies && slices.Contains(s.flags, name) {
					return usagef("--%s after --: applies only to %s, and the matrix also runs --workload %s: give --workloads with only those", name, s.to, wl)
				}
			}
		}
	}
	return nil
}

// flagNames are the names of the flags in args as the flag package reads
// them: -name or --name, with or without =value. It may take a value that
// begins with a dash for a flag; the checks that use it refuse only names of
// bench flags, which no value of one is.
func flagNames(args []string) []string {
	var names []string
	for _, a := range args {
		if len(a) < 2 || a[0] != '-' || a == "--" {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimPrefix(a[1:], "-"), "=")
		if name != "" && name[0] != '-' {
			names = append(names, name)
		}
	}
	return names
}

// checkBenchFlags refuses bench flags that do not apply to the chosen
// workload, L3 and runs, and a --plot whose name says it is not the PNG it
// gets. An --l3 or --runs that is not one of the known values is left to the
// configuration's check, which names the values.
func checkBenchFlags(fs *flag.FlagSet, wl, l3 string, runs []string, socket, plot string) error {
	if plot != "" && !strings.EqualFold(filepath.Ext(plot), ".png") {
		return usagef("--plot %s: the plot is a PNG; name it with .png", plot)
	}
	if err := refuseInapplicable(fs, workloadFlagScopes(wl)); err != nil {
		return err
	}
	if l3 != sim.L3Node && l3 != sim.L3Redis && l3 != sim.L3File && l3 != sim.L3None {
		return nil
	}
	for _, r := range runs {
		if r != sim.RunL1Only && r != sim.RunCeiling && r != sim.RunStrata {
			return nil
		}
	}
	return refuseInapplicable(fs, benchFlagScopes(fs, l3, runs, socket))
}

// tiersFlagScopes are where `strata bench tiers`' flags apply; an unknown
// --backend is left to the configuration's check, which names the backends.
func tiersFlagScopes(backend string) []flagScope {
	if !slices.Contains(storagebench.Backends(), backend) {
		return nil
	}
	node, redis := storagebench.BackendNode, storagebench.BackendRedis
	return []flagScope{
		{flags: []string{"socket", "no-redis", "engines"}, applies: backend == node, to: "--backend " + node, fix: "give --backend " + node},
		{flags: []string{"redis", "redis-cluster"}, applies: backend == redis, to: "--backend " + redis, fix: "give --backend " + redis},
	}
}

// describeRestart is the restart flags' help, kept beside their checks.
func describeRestart() string {
	return fmt.Sprintf("node L3: restart the node service inside the strata run as `mode`: "+
		"%s (SIGKILL, then a warm restart on the same arena file), %s (SIGTERM, a clean shutdown, then the same) or %s (SIGKILL and the file deleted: "+
		"the engines refill it from L2); the bench runs the service as a child strata serve on an arena file on /dev/shm, replays the strata run twice in real time, "+
		"without and with the restart, and reports the L3 hit tokens of one over the other; empty: no restart",
		sim.RestartKill, sim.RestartTerm, sim.RestartCold)
}

// checkRestartFlags names the flag of a restart the bench cannot make.
func checkRestartFlags(cfg sim.Config) error {
	r := cfg.Restart
	switch {
	case r.Mode == "":
		return nil
	case r.Mode != sim.RestartKill && r.Mode != sim.RestartTerm && r.Mode != sim.RestartCold:
		return usagef("--restart-node %q: want %s, %s or %s", r.Mode, sim.RestartKill, sim.RestartTerm, sim.RestartCold)
	case !(r.At > 0 && r.At < 1):
		return usagef("--restart-at %v: want a fraction of the strata run's requests above 0 and below 1, e.g. %v", r.At, sim.DefaultRestartAt)
	case cfg.Nodes > 1:
		return usagef("--restart-node restarts one node service: drop --nodes %d", cfg.Nodes)
	}
	return nil
}
