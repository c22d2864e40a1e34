package sim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/stratakv/strata/node"
	"github.com/stratakv/strata/storage"
	"github.com/stratakv/strata/workload"
)

// The restart experiment (Config.Restart): the strata run's node service runs
// as a child `strata serve` process on an arena file, and is signalled and
// started again on the same file at a point of the run, as a crash or an
// upgrade does to a serving node. Engines keep serving through the outage
// (their L3 calls fail and they compute what they miss), every page they are
// served is still verified, and the run's L3 hits are compared with those of
// the same run, on a service of its own, without the restart.

// Restart modes.
const (
	// RestartKill SIGKILLs the service and starts it on the same arena file:
	// a crash, after which the service comes back warm.
	RestartKill = "kill"
	// RestartTerm SIGTERMs it (a clean shutdown, as for an upgrade) and starts
	// it on the same file.
	RestartTerm = "term"
	// RestartCold SIGKILLs it and deletes the arena file before the start: the
	// service comes back empty, and the engines refill it from their L2.
	RestartCold = "cold"
)

// DefaultRestartAt is where in the strata run the restart comes by default:
// after 30% of its requests, once the L3 holds what later requests hit.
const DefaultRestartAt = 0.3

// RestartGoal is the ratio of L3 hit tokens with a restart to those without
// that issue 19 asks for.
const RestartGoal = 0.8

// RestartPlan is a restart of the strata run's node service.
type RestartPlan struct {
	// Mode is RestartKill, RestartTerm or RestartCold; "" for no restart.
	Mode string `json:"mode,omitempty"`
	// At is the fraction of the run's requests served (over every engine)
	// when the service is signalled, above 0 and below 1.
	At float64 `json:"at,omitempty"`
}

func (p RestartPlan) validate(c Config) error {
	if p.Mode == "" {
		return nil
	}
	switch {
	case p.Mode != RestartKill && p.Mode != RestartTerm && p.Mode != RestartCold:
		return fmt.Errorf("restart %q: want %s, %s or %s: %w", p.Mode, RestartKill, RestartTerm, RestartCold, ErrConfig)
	case math.IsNaN(p.At) || p.At <= 0 || p.At >= 1:
		return fmt.Errorf("restart at %v: want a fraction of the run's requests above 0 and below 1: %w", p.At, ErrConfig)
	case c.L3 != L3Node:
		return fmt.Errorf("a restart of the node service needs L3 node, not %q: %w", c.L3, ErrConfig)
	case c.NodeSocket != "":
		return fmt.Errorf("a restart needs a node service the bench starts itself; it cannot restart the one at %s: %w", c.NodeSocket, ErrConfig)
	case c.Nodes > 1:
		return fmt.Errorf("a restart runs one node service, not %d: %w", c.Nodes, ErrConfig)
	}
	return nil
}

// RestartReport is what the restart experiment measured.
type RestartReport struct {
	// Mode and At are the plan; AtRequest is the requests served when the
	// service was signalled.
	Mode      string  `json:"mode"`
	At        float64 `json:"at"`
	AtRequest int     `json:"at_request"`
	// Run names the run with the restart; Baseline the same run without.
	Run      string `json:"run"`
	Baseline string `json:"baseline"`
	// Restarted counts the restarts the bench made (1), ServiceRestarts
	// those the restarted service counts on its arena file (0 after a cold
	// start, whose file is new).
	Restarted       int    `json:"restarted"`
	ServiceRestarts uint64 `json:"service_restarts"`
	// Down is the time from the signal to the restarted service's first
	// answered Hello: how long the engines could not reach it. Ready is the
	// time from the signal to its start being over (its objects recovered).
	Down  Duration `json:"down"`
	Ready Duration `json:"ready"`
	// HoldAt is the fraction of its requests at which each engine waits, if
	// it must, until its L3 client has reconnected to the restarted service,
	// so that the restart ends inside the run however fast the replay goes;
	// Held is the longest any engine waited. The wait is wall time between
	// requests: the modelled TTFT does not count it.
	HoldAt float64  `json:"hold_at"`
	Held   Duration `json:"held"`
	// ObjectsBefore is what the service held just before the signal;
	// Recovered, Lost, Unsealed and LostEvicted are what the restarted one
	// reports it found, dropped as damaged, dropped as put in the last
	// moments before a kill and not sealed yet, and lost of the last
	// evictions to the spill.
	ObjectsBefore int64 `json:"objects_before"`
	// SpillBefore and SpillAfter are the objects the service's spill held
	// just before the signal and once the restarted service was ready.
	SpillBefore   int64  `json:"spill_before"`
	SpillAfter    int64  `json:"spill_after"`
	Warm          bool   `json:"warm"`
	ColdReason    string `json:"cold_reason,omitempty"`
	PreviousClean bool   `json:"previous_clean"`
	Recovered     int64  `json:"recovered"`
	Lost          int64  `json:"lost"`
	Unsealed      int64  `json:"unsealed"`
	LostEvicted   int64  `json:"lost_evicted"`
	// L3HitTokens and BaselineL3HitTokens are the runs' L3 hits, Ratio the
	// first over the second (goal RestartGoal). DownL3HitTokens and
	// AfterL3HitTokens split the first by when the request was admitted:
	// while the service was down, and after it answered again.
	L3HitTokens         int64   `json:"l3_hit_tokens"`
	BaselineL3HitTokens int64   `json:"baseline_l3_hit_tokens"`
	Ratio               float64 `json:"ratio"`
	DownL3HitTokens     int64   `json:"down_l3_hit_tokens"`
	AfterL3HitTokens    int64   `json:"after_l3_hit_tokens"`
	// BackAt is when the restarted service answered, from the start of its
	// run; BaselineAfterL3HitTokens are the baseline's L3 hits of requests
	// admitted as long after its own start or later, and AfterRatio the
	// hits after the restart over those: below 1, the loss outlasted the
	// outage.
	BackAt                   Duration `json:"back_at"`
	BaselineAfterL3HitTokens int64    `json:"baseline_after_l3_hit_tokens"`
	AfterRatio               float64  `json:"after_ratio"`
	// Refills counts the engines' refills of the L3 from their L2 after it
	// came back empty, RefillPages the pages queued for them.
	Refills     int64 `json:"refills"`
	RefillPages int64 `json:"refill_pages"`
}

// L3HitAt is one request's L3 hit tokens and when it was admitted, for
// counting the hits after a restart.
type L3HitAt struct {
	UnixNano int64 `json:"t"`
	Tokens   int64 `json:"n"`
}

// runRestartExperiment runs the strata run twice, each on a child node
// service of its own: without a restart (the baseline, named strata), and
// with the planned one (named strata-MODE).
func runRestartExperiment(ctx context.Context, cfg Config, gen workload.Generator, trace workload.Trace, maxPages int, log *slog.Logger) ([]RunReport, *RestartReport, error) {
	base, _, err := runOnChild(ctx, cfg, RunStrata, gen, trace, maxPages, log, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("run %s: %w", RunStrata, err)
	}
	name := RunStrata + "-" + cfg.Restart.Mode
	rr, rs, err := runOnChild(ctx, cfg, name, gen, trace, maxPages, log, &cfg.Restart)
	if err != nil {
		return nil, nil, fmt.Errorf("run %s: %w", name, err)
	}
	rs.Run, rs.Baseline = name, RunStrata
	rs.L3HitTokens, rs.BaselineL3HitTokens = rr.HitTokens.L3, base.HitTokens.L3
	if base.HitTokens.L3 > 0 {
		rs.Ratio = float64(rr.HitTokens.L3) / float64(base.HitTokens.L3)
	}
	// Both runs keep the trace's times, so the baseline's requests admitted
	// as long after its start as the restarted service answered are the ones
	// to set the hits after the restart against.
	from := base.started.Add(time.Duration(rs.BackAt)).UnixNano()
	for _, h := range base.l3HitTimes {
		if h.UnixNano >= from {
			rs.BaselineAfterL3HitTokens += h.Tokens
		}
	}
	if rs.BaselineAfterL3HitTokens > 0 {
		rs.AfterRatio = float64(rs.AfterL3HitTokens) / float64(rs.BaselineAfterL3HitTokens)
	}
	if rr.L3 != nil {
		rs.Refills, rs.RefillPages = rr.L3.Refills, rr.L3.RefillPages
	}
	return []RunReport{base, rr}, rs, nil
}

// runOnChild runs the strata run against a child node service, restarting
// it as plan says when plan is not nil.
func runOnChild(ctx context.Context, cfg Config, name string, gen workload.Generator, trace workload.Trace, maxPages int, log *slog.Logger, plan *RestartPlan) (rr RunReport, rs *RestartReport, err error) {
	begun := time.Now()
	child, err := startChildNode(ctx, cfg)
	if err != nil {
		return rr, nil, err
	}
	defer func() { err = errors.Join(err, child.close()) }()
	// The run starts once the service is ready, as on an embedded one
	// (warmup.go); the restarted service is not waited for: its start is
	// what the experiment measures.
	st, err := awaitReady(ctx, "the node service (strata serve) at "+child.socket, child.statsFor(cfg))
	if err != nil {
		return rr, nil, err
	}
	warmup := warmupOf(begun, st)
	defer func() { rr.Warmup = warmup }()
	// Both runs replay the trace in real time, so that the outage meets the
	// requests that arrive while it lasts (engineSim.pace).
	cfg.NodeSocket, cfg.Restart, cfg.paced, cfg.trackL3Hits = child.socket, RestartPlan{}, true, true
	var r *restarter
	if plan != nil {
		r = &restarter{child: child, plan: *plan, at: max(1, int(math.Ceil(plan.At*float64(len(trace.Requests))))), done: make(chan struct{})}
		cfg.watch, cfg.holdAt = r.watch, plan.holdAt()
	}
	started := time.Now()
	defer func() { rr.started = started }()
	if cfg.engines() > 1 {
		rr, err = runEngines(ctx, cfg, gen, name, len(trace.Requests), log)
	} else {
		rr, err = runOne(ctx, cfg, name, trace, maxPages)
	}
	if err != nil || r == nil {
		return rr, nil, err
	}
	rr.Description += fmt.Sprintf("; the node service %s after %d requests", r.verb(), r.at)
	rs, err = r.finish(rr.l3HitTimes)
	if rs != nil {
		rs.HoldAt, rs.Held = plan.holdAt(), Duration(rr.held)
		rs.BackAt = Duration(r.back.Sub(started))
	}
	return rr, rs, err
}

// restarter restarts the child service once the run has served its at-th
// request, in the background, while the engines go on.
type restarter struct {
	child *childNode
	plan  RestartPlan
	at    int
	once  sync.Once
	done  chan struct{} // closed when the restart is over
	err   error

	atRequest     int
	objectsBefore int64
	spillBefore   int64
	signalled     time.Time
	back          time.Time // the restarted service's first answered Hello
	ready         time.Time // its start over
	st            node.Stats
}

func (r *restarter) verb() string {
	switch r.plan.Mode {
	case RestartTerm:
		return "SIGTERMed and restarted"
	case RestartCold:
		return "SIGKILLed and restarted without its arena file"
	}
	return "SIGKILLed and restarted"
}

// watch sees the run's progress: the count of requests served.
func (r *restarter) watch(done int) {
	if done >= r.at {
		r.once.Do(func() {
			r.atRequest = done
			go r.restart()
		})
	}
}

func (r *restarter) restart() {
	defer close(r.done)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	if st, err := r.child.stats(ctx); err == nil {
		r.objectsBefore = st.Arena.Objects
		if st.Spill != nil {
			r.spillBefore = st.Spill.Objects
		}
	}
	cancel()
	sig := syscall.SIGKILL
	if r.plan.Mode == RestartTerm {
		sig = syscall.SIGTERM
	}
	r.signalled = time.Now()
	if r.err = r.child.stop(sig); r.err != nil {
		return
	}
	if r.plan.Mode == RestartCold {
		if err := os.Remove(r.child.arenaFile); err != nil {
			r.err = fmt.Errorf("remove the arena file for a cold restart: %w", err)
			return
		}
	}
	if r.err = r.child.start(context.Background()); r.err != nil {
		return
	}
	r.back = time.Now()
	if r.st, r.err = r.child.waitReady(context.Background(), childStartTimeout); r.err == nil {
		r.ready = time.Now()
	}
}

// finish waits for the restart and the restarted service's start (both
// bounded by the child's start and stop timeouts), and reports.
func (r *restarter) finish(hits []L3HitAt) (*RestartReport, error) {
	select {
	case <-r.done:
	default:
		// The run served fewer requests than the restart point: it never came.
		if r.atRequest == 0 {
			return nil, fmt.Errorf("the run ended before its restart point (request %d)", r.at)
		}
		<-r.done
	}
	if r.err != nil {
		return nil, fmt.Errorf("restart of the node service: %w", r.err)
	}
	s := r.st.Start
	rs := &RestartReport{Mode: r.plan.Mode, At: r.plan.At, AtRequest: r.atRequest, Restarted: 1, ServiceRestarts: s.Restarts,
		Down: Duration(r.back.Sub(r.signalled)), Ready: Duration(r.ready.Sub(r.signalled)),
		ObjectsBefore: r.objectsBefore, Warm: s.Warm, ColdReason: s.ColdReason, PreviousClean: s.PreviousClean,
		Recovered: s.Recovered, Lost: s.Lost, Unsealed: s.Unsealed, LostEvicted: s.LostEvicted, SpillBefore: r.spillBefore}
	if r.st.Spill != nil {
		rs.SpillAfter = r.st.Spill.Objects
	}
	from, back := r.signalled.UnixNano(), r.back.UnixNano()
	for _, h := range hits {
		switch {
		case h.UnixNano >= back:
			rs.AfterL3HitTokens += h.Tokens
		case h.UnixNano >= from:
			rs.DownL3HitTokens += h.Tokens
		}
	}
	return rs, nil
}

// holdAt is where the run waits for the restarted service (RestartReport.HoldAt):
// halfway from the restart point to the end.
func (p RestartPlan) holdAt() float64 { return p.At + (1-p.At)/2 }

// reconnectHold makes a run wait, once it has served its at-th request, until
// its L3 client has connected again since the run began (storage.EpochOf
// moved): the restart is then over for this engine, and what follows runs on
// the restarted service. The wait is bounded by the child service's stop and
// start timeouts. A nil *reconnectHold holds nothing.
type reconnectHold struct {
	backend storage.Backend
	at      int
	first   uint64
	once    sync.Once
	held    time.Duration
	err     error
}

func newReconnectHold(b storage.Backend, frac float64, requests int) *reconnectHold {
	if b == nil {
		return nil
	}
	return &reconnectHold{backend: b, at: max(1, int(math.Ceil(frac*float64(requests)))), first: storage.EpochOf(b)}
}

func (h *reconnectHold) watch(done int) {
	if h == nil || done < h.at {
		return
	}
	h.once.Do(func() {
		start := time.Now()
		limit := childStopTimeout + childStartTimeout
		for storage.EpochOf(h.backend) <= h.first {
			if time.Since(start) > limit {
				h.err = fmt.Errorf("the L3 client did not reconnect to the restarted node service within %v of request %d", limit, h.at)
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		h.held = time.Since(start)
	})
}

func (h *reconnectHold) waited() time.Duration {
	if h == nil {
		return 0
	}
	return h.held
}

func (h *reconnectHold) failed() error {
	if h == nil {
		return nil
	}
	return h.err
}
