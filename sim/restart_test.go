package sim

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

// A restart the bench cannot make is a configuration error that says why.
func TestRestartPlanValidate(t *testing.T) {
	ok := DefaultConfig()
	ok.Restart = RestartPlan{Mode: RestartKill, At: DefaultRestartAt}
	if err := ok.Validate(); err != nil {
		t.Fatalf("kill at %v: %v", DefaultRestartAt, err)
	}
	for _, tc := range []struct {
		change func(*Config)
		want   string
	}{
		{func(c *Config) { c.Restart.Mode = "bounce" }, `restart "bounce"`},
		{func(c *Config) { c.Restart.At = 0 }, "restart at 0"},
		{func(c *Config) { c.Restart.At = 1 }, "restart at 1"},
		{func(c *Config) { c.Restart.At = math.NaN() }, "restart at NaN"},
		{func(c *Config) { c.L3 = L3File }, `needs L3 node, not "file"`},
		{func(c *Config) { c.NodeSocket = "/tmp/s.sock" }, "cannot restart the one at /tmp/s.sock"},
		{func(c *Config) { c.Nodes = 2 }, "one node service, not 2"},
		{func(c *Config) { c.Runs = []string{RunL1Only, RunCeiling} }, "happens in the strata run"},
	} {
		c := ok
		tc.change(&c)
		err := c.Validate()
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want an ErrConfig naming %q, got %v", tc.want, err)
		}
	}
}

// The restart's L3 hits are split by when each request was admitted: while
// the service was down, and after it answered again.
func TestRestarterSplitsHitsAtTheRestart(t *testing.T) {
	r := &restarter{plan: RestartPlan{Mode: RestartKill, At: 0.5}, at: 2, done: make(chan struct{})}
	r.watch(1)
	if r.atRequest != 0 {
		t.Fatal("restarted before its point")
	}
	// Stand in for the restart goroutine: what it records, then done.
	r.once.Do(func() {})
	r.atRequest = 2
	base := int64(1_000_000_000)
	r.signalled, r.back, r.ready = unixNano(base+100), unixNano(base+200), unixNano(base+300)
	close(r.done)
	rs, err := r.finish([]L3HitAt{{base, 64}, {base + 150, 128}, {base + 200, 256}, {base + 900, 512}})
	if err != nil {
		t.Fatal(err)
	}
	if rs.DownL3HitTokens != 128 || rs.AfterL3HitTokens != 768 || rs.AtRequest != 2 || rs.Restarted != 1 {
		t.Fatalf("report %+v", *rs)
	}
}

func unixNano(n int64) time.Time { return time.Unix(0, n) }
