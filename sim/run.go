// Package sim is `strata bench`: it generates a workload trace and replays it
// through a simulated inference engine, once per cache configuration (an L1-only
// prefix cache, an infinite-capacity ceiling, and strata's tiers), verifying
// every page a hit serves byte for byte, and reports hits, traffic and modelled
// time to first token side by side.
package sim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/stratakv/strata/workload"
)

// Run generates the trace and replays it through every configured run.
func Run(ctx context.Context, cfg Config) (rep *Report, err error) {
	defer func() {
		if err != nil && cfg.cleanup != nil {
			// No report to wait on: the caller cannot, so Run does.
			cfg.cleanup.wg.Wait()
		}
	}()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	gen := cfg.Workload
	if gen == nil {
		m := workload.DefaultMultiturn()
		gen = &m
	}
	start := time.Now()
	var notes []string
	note := func(n string) {
		if n == "" {
			return
		}
		notes = append(notes, n)
		if cfg.Progress != nil {
			cfg.Progress.Note(n)
		}
	}
	scalable, _ := gen.(workload.Scalable)
	if (cfg.ScaleTrace || cfg.Load > 0) && scalable == nil {
		return nil, fmt.Errorf("workload %s cannot be scaled or given a load (it is not a workload.Scalable): give its rate and size yourself: %w", gen.Name(), ErrConfig)
	}
	var scaling *Scaling
	if cfg.ScaleTrace {
		if scalable, scaling, err = cfg.scaleWorkload(scalable); err != nil {
			return nil, err
		}
		gen = scalable
		if scaling != nil && scaling.OverBudget {
			note("the trace is " + scaling.describe())
		}
	}
	trace, err := gen.Generate(cfg.Seed)
	if err != nil {
		return nil, err
	}
	if cfg.SizeL1 || cfg.SizeL2 {
		note(cfg.sizeTiers(trace))
	}
	n, err := cfg.fitL1(trace)
	if err != nil {
		return nil, err
	}
	note(n)
	if cfg.FitMachine {
		more, err := cfg.fitMachine(trace, cfg.Runs)
		if err != nil {
			return nil, err
		}
		for _, n := range more {
			note(n)
		}
	}
	if err := cfg.checkNodeRoom(cfg.Runs); err != nil {
		return nil, err
	}
	// The load is taken against the engine as sized: L1 bounds how many requests
	// run at once.
	capacity := cfg.capacityOf(trace)
	if cfg.Load > 0 && capacity.RequestsPerSecond > 0 {
		scalable = scalable.WithRate(cfg.Load * capacity.RequestsPerSecond)
		gen = scalable
		if trace, err = gen.Generate(cfg.Seed); err != nil {
			return nil, err
		}
	}
	rate := 0.0
	if d := trace.Duration(); d > 0 && len(trace.Requests) > 1 {
		rate = float64(len(trace.Requests)-1) / d.Seconds()
	}
	if scalable != nil {
		rate = scalable.Rate()
	}
	if cfg.BackgroundCleanup {
		cfg.cleanup = &cleaner{}
	}
	if cfg.L3 != L3None && !cfg.L3Warm && cfg.L3Namespace == "" {
		cfg.L3Namespace = freshNamespace()
	}
	rep = &Report{
		cleanup:              cfg.cleanup,
		Notes:                notes,
		Workload:             gen.Name(),
		Seed:                 cfg.Seed,
		Model:                cfg.Model.Name,
		PageSize:             cfg.PageSize,
		L1Tokens:             cfg.L1Tokens / int64(cfg.PageSize) * int64(cfg.PageSize),
		L2Tokens:             int64(cfg.l2Pages()) * int64(cfg.PageSize),
		L2Ratio:              cfg.L2Ratio,
		Requests:             len(trace.Requests),
		PromptTokens:         trace.PromptTokens(),
		DistinctPrefixTokens: trace.DistinctPrefixTokens(cfg.PageSize),
		ReusedPrefixTokens:   trace.ReusedPrefixTokens(cfg.PageSize),
		Scaling:              scaling,
		Rate:                 rate,
		Capacity:             capacity,
		MaxRunning:           cfg.MaxRunning,
		PrefillPerToken:      Duration(cfg.Model.PrefillPerToken),
		DecodeStep:           Duration(cfg.Model.DecodeStep),
	}
	if capacity.RequestsPerSecond > 0 {
		rep.Load = rate / capacity.RequestsPerSecond
	}
	if cfg.Draft {
		rep.Draft = cfg.Model.Name + "-eagle"
	}
	if cfg.L3 != L3None {
		rep.L3 = cfg.L3
	}
	rep.Concurrent = cfg.Concurrent
	runs := cfg.Runs
	if len(runs) == 0 {
		runs = []string{RunL1Only, RunCeiling, RunStrata}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if len(cfg.Redis) > 0 {
		rep.Redis = strings.Join(cfg.Redis, ",")
	}
	if cfg.needsRedis() && len(cfg.Redis) == 0 && slices.Contains(runs, RunStrata) {
		addrs, stop, err := startLocalRedis(log)
		if err != nil {
			return nil, err
		}
		defer func() { _ = stop() }()
		cfg.Redis = addrs
		rep.Redis = fmt.Sprintf("local cluster of %d masters", localRedisMasters)
	}
	maxPages := int((trace.PromptTokens()+trace.OutputTokens())/int64(cfg.PageSize)) + 1
	for _, name := range runs {
		if name == RunStrata && cfg.Restart.Mode != "" {
			rrs, rs, err := runRestartExperiment(ctx, cfg, gen, trace, maxPages, log)
			if err != nil {
				return nil, err
			}
			rep.Runs = append(rep.Runs, rrs...)
			rep.Restart = rs
			continue
		}
		if name == RunStrata && cfg.engines() > 1 {
			rr, err := runEngines(ctx, cfg, gen, name, len(trace.Requests), log)
			if err != nil {
				return nil, fmt.Errorf("run %s: %w", name, err)
			}
			rep.Runs = append(rep.Runs, rr)
			continue
		}
		rr, err := runOne(ctx, cfg, name, trace, maxPages)
		if err != nil {
			return nil, fmt.Errorf("run %s: %w", name, err)
		}
		rep.Runs = append(rep.Runs, rr)
	}
	rep.Elapsed = Duration(time.Since(start))
	return rep, nil
}

// fitL1 checks that the trace's longest request fits L1, raising L1 when FitL1
// allows it; it returns the note that says so.
func (c *Config) fitL1(trace workload.Trace) (string, error) {
	longest := 0
	for _, r := range trace.Requests {
		longest = max(longest, len(r.Prompt)+len(r.Output))
	}
	ps := int64(c.PageSize)
	need := (int64(longest) + ps - 1) / ps * ps
	if need <= c.L1Tokens/ps*ps || c.allowOversize {
		return "", nil
	}
	if !c.FitL1 {
		return "", fmt.Errorf("the longest request (%d tokens with its output) needs %d tokens of L1, and L1 holds %d: give --l1-tokens %d or more, or a smaller workload: %w",
			longest, need, c.L1Tokens, need, ErrConfig)
	}
	was := c.L1Tokens
	c.L1Tokens = (need + was - 1) / was * was
	return fmt.Sprintf("L1 raised from %d to %d tokens so that the longest request (%d tokens with its output) fits (set --l1-tokens to choose)", was, c.L1Tokens, longest), nil
}

// freshNamespace names one bench's L3 objects apart from every other bench's.
func freshNamespace() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "bench-" + hex.EncodeToString(b[:])
}

func runOne(ctx context.Context, cfg Config, name string, trace workload.Trace, maxPages int) (rr RunReport, err error) {
	rr = RunReport{Name: name}
	var run cacheRun
	switch name {
	case RunL1Only:
		rr.Description = "prefix cache in device memory only"
		run, err = newHicacheRun(cfg, false, false)
	case RunCeiling:
		rr.Description = "infinite capacity: every page ever computed stays cached"
		run, err = newCeilingRun(cfg, maxPages)
	default:
		rr.Description = fmt.Sprintf("L1 + L2 (%gx host), %s", cfg.L2Ratio, cfg.WritePolicy)
		if cfg.L3 != L3None {
			rr.Description += " + L3 " + cfg.L3
			if cfg.L3 == L3Node && len(cfg.Redis) > 0 {
				rr.Description += " writing through to Redis"
			}
		}
		var hr *hicacheRun
		hr, err = newHicacheRun(cfg, true, true)
		if err == nil {
			rr.Warmup = hr.warmup
		}
		if err == nil && cfg.L3Warm && hr.backend != nil {
			// Count the L3 hits of pages this run never computed: what the L3
			// held before it started.
			hr.trackComputed()
			defer func() { rr.L3WarmHitTokens = hr.cross }()
		}
		run = hr
	}
	if err != nil {
		return rr, err
	}
	progress := cfg.Progress
	if progress == nil {
		progress = NewProgress(discard{}, false)
	}
	if cfg.beforeReplay != nil {
		cfg.beforeReplay(name)
	}
	progress.Start(name, len(trace.Requests))
	var hold *reconnectHold
	if hr, ok := run.(*hicacheRun); ok && cfg.holdAt > 0 {
		hold = newReconnectHold(hr.backend, cfg.holdAt, len(trace.Requests))
	}
	if cfg.watch != nil || hold != nil {
		progress.watch = func(done int) {
			if cfg.watch != nil {
				cfg.watch(done)
			}
			hold.watch(done)
		}
		defer func() { progress.watch = nil }()
	}
	e := &engineSim{model: cfg.Model, maxRunning: cfg.MaxRunning, run: run, progress: progress, trackL3: cfg.trackL3Hits, paced: cfg.paced}
	defer func() {
		rr.l3HitTimes, rr.held = e.l3Hits, hold.waited()
		err = errors.Join(err, hold.failed())
	}()
	if name == RunCeiling {
		// The ceiling is a bound on what any order of the trace can hit; it keeps
		// the event loop.
		err = e.replay(ctx, trace, &rr)
	} else {
		err = e.serve(ctx, trace, &rr, cfg.Concurrent)
	}
	progress.Finish()
	return rr, errors.Join(err, run.close())
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
