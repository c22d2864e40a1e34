package main

import (
	"context"
	"os"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/sim"
)

// The node services a bench starts itself (embedded in the process, or a
// child strata serve for --restart-node) get their arena from --node-arena
// and their remote tier from --redis. Checked when the service starts, in
// the strata run, a size the machine cannot hold failed after the runs
// before it, naming serve's --arena; so they are checked here, before any
// run, as strata serve checks --arena, and refused naming the bench's flag.

// benchAvailableMemory reads the memory an arena may take; tests replace it.
var benchAvailableMemory = hostmem.AvailableBytes

// benchShmDir is where the restart experiment's child service keeps its
// arena file (sim's childnode.go); tests replace it.
var benchShmDir = "/dev/shm"

// checkBenchNodes refuses, before any run, a node service the bench would
// start that this machine cannot hold: arenas (--nodes of them) above the
// available memory less the reserve strata serve keeps free (the check
// node/arena's allocator makes of --arena), an arena file the restart
// experiment's tmpfs cannot hold, and a --redis remote tier nothing answers
// at. The fix it proposes fits this machine.
func checkBenchNodes(ctx context.Context, cfg sim.Config) error {
	strata := len(cfg.Runs) == 0 || slices.Contains(cfg.Runs, sim.RunStrata)
	if !strata || cfg.L3 != sim.L3Node || cfg.NodeSocket != "" {
		return nil
	}
	nodes := int64(max(cfg.Nodes, 1))
	arena := cfg.NodeArenaBytes
	if avail, err := benchAvailableMemory(); err == nil {
		reserve := hostmem.DefaultConfig(hostmem.Mmap).ReserveBytes
		if room := avail - reserve; nodes*arena > room {
			what := "the node service's arena does"
			if nodes > 1 {
				what = "the arenas of --nodes " + strconv.FormatInt(nodes, 10) + " node services do"
			}
			return usagef("--node-arena %s: %s not fit this machine: %s of memory available, %s of it kept free (strata serve's reserve); %s",
				hostmem.FormatSize(arena), what, hostmem.FormatBytes(avail), hostmem.FormatBytes(reserve), fitNodeArena(room/nodes))
		}
	}
	if cfg.Restart.Mode != "" {
		var fs unix.Statfs_t
		if st, err := os.Stat(benchShmDir); err == nil && st.IsDir() && unix.Statfs(benchShmDir, &fs) == nil {
			free := int64(fs.Bavail) * fs.Bsize
			if need := arena + arenaFileOverhead(arena); need > free {
				return usagef("--node-arena %s: --restart-node keeps the arena in a file on %s, which has %s free and the file needs %s; %s, or free room on %s",
					hostmem.FormatSize(arena), benchShmDir, hostmem.FormatBytes(free), hostmem.FormatBytes(need), fitNodeArena(arenaForFileRoom(free)), benchShmDir)
			}
		}
	}
	if len(cfg.Redis) > 0 {
		if err := checkTCP(ctx, cfg.Redis); err != nil {
			return usagef("--redis: the node service's remote tier: %w", err)
		}
	}
	return nil
}

// fitNodeArena proposes the largest --node-arena within room: whole GiB, or
// 64 MiB steps below 1 GiB; below 64 MiB, a bench without the node L3.
func fitNodeArena(room int64) string {
	if fit := hostmem.FitSize(room); fit > 0 {
		return "give --node-arena " + hostmem.FormatSize(fit) + " or less"
	}
	return "this machine has no room for a node service's arena: give --l3 file or --l3 none"
}
