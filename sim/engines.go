package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/stratakv/strata/workload"
)

// EngineJob is what one engine process of a multi-engine run is given (as JSON on
// its standard input, by `strata bench-engine`): the bench configuration, the
// workload, which share of the trace is its own, and the node service to share.
type EngineJob struct {
	Config         Config          `json:"config"`
	Workload       string          `json:"workload"`
	WorkloadConfig json.RawMessage `json:"workloadConfig"`
	Engine         int             `json:"engine"`
	Engines        int             `json:"engines"`
	Socket         string          `json:"socket"`
}

// EngineResult is what an engine process reports back.
type EngineResult struct {
	Run RunReport `json:"run"`
	// TTFTms is every request's modelled TTFT, for the merged quantiles.
	TTFTms []float64 `json:"ttftMs"`
	// CrossEngineHitTokens counts L3 hit tokens of pages this engine never computed:
	// another engine put them in the node service.
	CrossEngineHitTokens int64 `json:"crossEngineHitTokens"`
	PID                  int   `json:"pid"`
}

// share is engine e's requests of the trace: every Engines-th one, as a router
// without session affinity spreads a conversation's rounds over the engines.
func share(t workload.Trace, e, n int) workload.Trace {
	out := t
	out.Requests = nil
	for i := e; i < len(t.Requests); i += n {
		out.Requests = append(out.Requests, t.Requests[i])
	}
	return out
}

// RunEngine is an engine process of a multi-engine run: it replays its share of the
// trace through its own L1 and L2 and the shared node service, and reports.
func RunEngine(ctx context.Context, job EngineJob) (*EngineResult, error) {
	cfg := job.Config
	gen, err := workload.ByName(job.Workload)
	if err != nil {
		return nil, err
	}
	if len(job.WorkloadConfig) > 0 {
		if err := json.Unmarshal(job.WorkloadConfig, gen); err != nil {
			return nil, fmt.Errorf("workload config: %v: %w", err, ErrConfig)
		}
	}
	if job.Engines < 1 || job.Engine < 0 || job.Engine >= job.Engines {
		return nil, fmt.Errorf("engine %d of %d: %w", job.Engine, job.Engines, ErrConfig)
	}
	cfg.L3, cfg.NodeSocket, cfg.Engines = L3Node, job.Socket, 1
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	trace, err := gen.Generate(cfg.Seed)
	if err != nil {
		return nil, err
	}
	mine := share(trace, job.Engine, job.Engines)
	run, err := newHicacheRun(cfg, true, true)
	if err != nil {
		return nil, err
	}
	run.trackOwn()
	rr := RunReport{Name: RunStrata}
	e := &engineSim{model: cfg.Model, maxRunning: cfg.MaxRunning, run: run, progress: NewProgress(discard{}, false)}
	err = e.replay(ctx, mine, &rr)
	res := &EngineResult{Run: rr, TTFTms: e.ttfts, CrossEngineHitTokens: run.cross, PID: os.Getpid()}
	return res, errors.Join(err, run.close())
}

// runEngines runs the strata run as cfg.Engines engine processes sharing one node
// service, and merges their reports.
func runEngines(ctx context.Context, cfg Config, gen workload.Generator, log *slog.Logger) (RunReport, error) {
	rr := RunReport{Name: RunStrata, Engines: cfg.Engines,
		Description: fmt.Sprintf("%d engine processes, each L1 + L2 (%gx host), sharing the node service as L3", cfg.Engines, cfg.L2Ratio)}
	socket := cfg.NodeSocket
	if socket == "" {
		srv, dir, err := startEmbeddedNode(cfg, log)
		if err != nil {
			return rr, err
		}
		defer func() { _ = srv.Close(); _ = os.RemoveAll(dir) }()
		socket = srv.Socket()
	}
	wcfg, err := json.Marshal(gen)
	if err != nil {
		return rr, err
	}
	bin := cfg.EngineBinary
	if bin == "" {
		if bin, err = os.Executable(); err != nil {
			return rr, fmt.Errorf("find the strata binary to start engines with: %w", err)
		}
	}
	start := time.Now()
	results := make([]*EngineResult, cfg.Engines)
	errs := make([]error, cfg.Engines)
	var wg sync.WaitGroup
	progress := cfg.Progress
	if progress == nil {
		progress = NewProgress(discard{}, false)
	}
	progress.Start(fmt.Sprintf("strata (%d engines)", cfg.Engines), cfg.Engines)
	var done int
	var mu sync.Mutex
	for e := 0; e < cfg.Engines; e++ {
		job := EngineJob{Config: cfg, Workload: gen.Name(), WorkloadConfig: wcfg, Engine: e, Engines: cfg.Engines, Socket: socket}
		job.Config.Progress, job.Config.Logger, job.Config.Workload = nil, nil, nil
		in, err := json.Marshal(job)
		if err != nil {
			return rr, err
		}
		wg.Add(1)
		go func(e int) {
			defer wg.Done()
			cmd := exec.CommandContext(ctx, bin, "bench-engine")
			cmd.Stdin = bytes.NewReader(in)
			var out, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &stderr
			if err := cmd.Run(); err != nil {
				errs[e] = fmt.Errorf("engine %d: %v: %s", e, err, strings.TrimSpace(lastLines(stderr.String(), 5)))
			} else {
				var res EngineResult
				if err := json.Unmarshal(out.Bytes(), &res); err != nil {
					errs[e] = fmt.Errorf("engine %d report: %v", e, err)
				} else {
					results[e] = &res
				}
			}
			mu.Lock()
			done++
			progress.Step(done)
			mu.Unlock()
		}(e)
	}
	wg.Wait()
	progress.Finish()
	if err := errors.Join(errs...); err != nil {
		return rr, err
	}
	var ttfts []float64
	var l3 *L3Report
	for _, res := range results {
		r := res.Run
		rr.HitTokens.L1 += r.HitTokens.L1
		rr.HitTokens.L2 += r.HitTokens.L2
		rr.HitTokens.L3 += r.HitTokens.L3
		rr.PromptTokens += r.PromptTokens
		rr.VerifiedPages += r.VerifiedPages
		rr.CorruptPages += r.CorruptPages
		rr.DraftRecomputePages += r.DraftRecomputePages
		rr.Failed += r.Failed
		rr.LoadBack = addTraffic(rr.LoadBack, r.LoadBack)
		rr.Backup = addTraffic(rr.Backup, r.Backup)
		rr.EvictedTokens.L1 += r.EvictedTokens.L1
		rr.EvictedTokens.L2 += r.EvictedTokens.L2
		rr.CrossEngineHitTokens += res.CrossEngineHitTokens
		ttfts = append(ttfts, res.TTFTms...)
		if r.L3 != nil {
			if l3 == nil {
				l3 = &L3Report{Backend: r.L3.Backend, Pools: r.L3.Pools, Faults: map[string]int64{}}
			}
			l3.BytesRead += r.L3.BytesRead
			l3.BytesWritten += r.L3.BytesWritten
			l3.Prefetch.Completed += r.L3.Prefetch.Completed
			l3.Prefetch.TimedOut += r.L3.Prefetch.TimedOut
			l3.Prefetch.BelowThreshold += r.L3.Prefetch.BelowThreshold
			l3.Prefetch.Canceled += r.L3.Prefetch.Canceled
			for k, v := range r.L3.Faults {
				l3.Faults[k] += v
			}
		}
	}
	rr.L3 = l3
	if rr.PromptTokens > 0 {
		rr.HitRatio = float64(rr.HitTokens.Total()) / float64(rr.PromptTokens)
	}
	rr.TTFTms = quantiles(ttfts)
	rr.Elapsed = Duration(time.Since(start))
	return rr, nil
}

func addTraffic(a, b Traffic) Traffic {
	return Traffic{Pages: a.Pages + b.Pages, Bytes: a.Bytes + b.Bytes, Elapsed: a.Elapsed + b.Elapsed}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
