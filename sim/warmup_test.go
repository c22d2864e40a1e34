package sim

import (
	"context"
	"strings"
	"testing"

	"github.com/stratakv/strata/node"
)

// The strata run's replay begins only once the node service the bench
// started says it is ready: the stats the bench reads are held at
// "starting" for a few polls, and the replay must come after the real
// service's "ready" that follows them. The warm-up is reported on its own.
func TestStrataRunStartsOnceItsNodeServiceIsReady(t *testing.T) {
	cfg := smallConfig()
	cfg.Runs = []string{RunStrata}
	cfg.NodeArenaBytes = 64 << 20
	const held = 3
	polls, ready := 0, false
	cfg.startStats = func(st node.Stats) node.Stats {
		polls++
		if polls <= held {
			st.Start.State, st.Start.Message = node.StateStarting, "starting (held by the test)"
		}
		ready = st.Start.State == node.StateReady
		return st
	}
	var replays []string
	cfg.beforeReplay = func(run string) {
		if !ready || polls <= held {
			t.Errorf("run %s began after %d polls of the service's stats, the last ready=%v: before the service was ready", run, polls, ready)
		}
		replays = append(replays, run)
	}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(replays) != 1 || replays[0] != RunStrata {
		t.Fatalf("replays %v, want the strata run's", replays)
	}
	w := rep.Runs[0].Warmup
	if w == nil || w.Services != 1 || w.ArenaBytes != 64<<20 || w.Took <= 0 || w.GBps <= 0 || w.ReadyAfter <= 0 || w.Waited <= 0 {
		t.Fatalf("warm-up %+v", w)
	}
	var buf strings.Builder
	if err := rep.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "\nwarm-up        node service ready ") || !strings.Contains(buf.String(), "64.0 MiB arena populated in ") {
		t.Fatalf("no warm-up line in the report:\n%s", buf.String())
	}
}

// The warm-up line names each run's services, their arenas and the rate
// they were populated at; a report without a service the bench started has
// none.
func TestDescribeWarmups(t *testing.T) {
	w := &Warmup{Services: 2, ArenaBytes: 2 << 30, Took: Duration(500e6), GBps: 4.29, ReadyAfter: Duration(510e6)}
	r := &Report{Runs: []RunReport{{Name: RunL1Only}, {Name: RunStrata, Warmup: w}}}
	want := "strata: 2 node services ready 510ms after their start (2.0 GiB arena populated in 500ms, 4.29 GB/s); waited out before the run, in neither its wall nor its TTFT"
	if got := r.describeWarmups(); got != want {
		t.Fatalf("warm-up line\n got %s\nwant %s", got, want)
	}
	if got := (&Report{Runs: []RunReport{{Name: RunL1Only}}}).describeWarmups(); got != "" {
		t.Fatalf("a bench without a service: %q", got)
	}
}
