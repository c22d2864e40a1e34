package sim

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/stratakv/strata/node"
)

// The warm-up of the node services the bench starts. A service listens at
// once and populates its arena in the background (node/arena's warm.go),
// which takes the machine's cores and memory bandwidth for a while: 1 GiB is
// a third of a second on a quiet machine, seconds on a busy 2-core one. A run
// replayed meanwhile shares the machine with it and writes into an arena that
// hands out memory only as fast as it is populated, and reports that as the
// cache's TTFT (its p90 above an L1-only cache's). So the bench waits until
// every service it started is ready before the run, and reports the warm-up
// on a line of its own.

// Warmup is the start of the node services a run's L3 ran on, waited out
// before the run.
type Warmup struct {
	// Services counts the node services the bench started for the run.
	Services int `json:"services"`
	// ArenaBytes is their arenas' memory, summed: what was populated.
	ArenaBytes int64 `json:"arena_bytes"`
	// Took is the longest arena warm-up (populating its memory); GBps is
	// ArenaBytes over it, the services warming at once.
	Took Duration `json:"took"`
	GBps float64  `json:"gbps"`
	// ReadyAfter is the longest time from a service's start to its being
	// ready (the arena warm and the spill indexed); Waited is how long the
	// bench waited for it, from the service's start to the run's.
	ReadyAfter Duration `json:"ready_after"`
	Waited     Duration `json:"waited"`
}

// readyTimeout bounds the wait for a node service the bench started to be
// ready: far past a warm-up at the slowest page-fault rate seen (0.12 GB/s)
// of the largest arena a bench gives one.
const readyTimeout = 10 * time.Minute

// awaitReady polls stats until the service says it is ready, and returns its
// stats then. what names the service in the error of a wait that ends first.
func awaitReady(ctx context.Context, what string, stats func(context.Context) (node.Stats, error)) (node.Stats, error) {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	for {
		st, err := stats(ctx)
		if err == nil && st.Start.State == node.StateReady {
			return st, nil
		}
		select {
		case <-ctx.Done():
			return st, fmt.Errorf("%s was not ready within %v (%s): %v", what, readyTimeout, st.Start.Message, err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// embeddedStats reads an embedded service's stats, through Config.startStats
// when a test set it.
func (c Config) embeddedStats(srv *node.Server) func(context.Context) (node.Stats, error) {
	return func(context.Context) (node.Stats, error) {
		st := srv.Stats()
		if c.startStats != nil {
			st = c.startStats(st)
		}
		return st, nil
	}
}

// warmupOf sums the stats of ready services started at started.
func warmupOf(started time.Time, sts ...node.Stats) *Warmup {
	w := &Warmup{Services: len(sts), Waited: Duration(time.Since(started))}
	var took time.Duration
	for _, st := range sts {
		w.ArenaBytes += st.Arena.SizeBytes
		took = max(took, st.Arena.WarmupTook)
		w.ReadyAfter = max(w.ReadyAfter, Duration(st.Start.ReadyAfter))
	}
	w.Took = Duration(took)
	if took > 0 {
		w.GBps = float64(w.ArenaBytes) / took.Seconds() / 1e9
	}
	return w
}

// describeWarmups is the report's warm-up line: each run's services, how
// long they took to be ready and at what rate their arenas were populated;
// "" when the bench started no service.
func (r *Report) describeWarmups() string {
	var parts []string
	for _, run := range r.Runs {
		w := run.Warmup
		if w == nil {
			continue
		}
		what, its := "node service", "its"
		if w.Services > 1 {
			what, its = fmt.Sprintf("%d node services", w.Services), "their"
		}
		part := fmt.Sprintf("%s ready %s after %s start (%s arena populated in %s, %.2f GB/s)", what,
			formatWall(w.ReadyAfter), its, formatBytes(w.ArenaBytes), formatWall(w.Took), w.GBps)
		if len(r.Runs) > 1 {
			part = run.Name + ": " + part
		}
		parts = append(parts, part)
	}
	if len(parts) == 0 {
		return ""
	}
	return strings.Join(parts, "; ") + "; waited out before the run, in neither its wall nor its TTFT"
}
