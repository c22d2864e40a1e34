package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/stratakv/strata/node"
	"github.com/stratakv/strata/workload"
)

// EngineJob is what one engine process of a multi-engine run is given (as JSON on
// its standard input, by `strata bench-engine`): the bench configuration, the
// workload, which share of the trace is its own, and its node service's socket
// (node L3; with redis L3 the configuration's Redis addresses are the L3).
type EngineJob struct {
	Config         Config          `json:"config"`
	Workload       string          `json:"workload"`
	WorkloadConfig json.RawMessage `json:"workloadConfig"`
	Engine         int             `json:"engine"`
	Engines        int             `json:"engines"`
	Socket         string          `json:"socket"`
	// TrackL3Hits makes the engine report when each L3 hit came, and
	// HoldAt, above 0, makes it wait at that fraction of its requests until
	// its L3 client has reconnected (the restart experiment).
	TrackL3Hits bool    `json:"trackL3Hits,omitempty"`
	HoldAt      float64 `json:"holdAt,omitempty"`
	// Paced replays the engine's share in real time (engineSim.pace).
	Paced bool `json:"paced,omitempty"`
}

// EngineResult is what an engine process reports back.
type EngineResult struct {
	Run RunReport `json:"run"`
	// TTFTms is every request's modelled TTFT, for the merged quantiles.
	TTFTms []float64 `json:"ttftMs"`
	// CrossEngineHitTokens counts L3 hit tokens of pages this engine never computed:
	// another engine put them in L3.
	CrossEngineHitTokens int64 `json:"crossEngineHitTokens"`
	// ComputedPages are the prefix digests of the pages this engine computed, and
	// L3HitPages those of every page it had from L3 (one per hit), for the
	// cross-node count.
	ComputedPages []uint64 `json:"computedPages"`
	L3HitPages    []uint64 `json:"l3HitPages"`
	// L3HitTimes is when each L3 hit came (EngineJob.TrackL3Hits).
	L3HitTimes []L3HitAt `json:"l3HitTimes,omitempty"`
	// Held is how long the engine waited for its L3 client to reconnect.
	Held Duration `json:"held,omitempty"`
	PID  int      `json:"pid"`
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
// trace through its own L1 and L2 and the shared node service, and reports. When
// progress is not nil, it gets one line per request served, which the bench that
// started the engine reads to show requests across every engine.
func RunEngine(ctx context.Context, job EngineJob, progress io.Writer) (*EngineResult, error) {
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
	if cfg.L3 != L3Node && cfg.L3 != L3Redis {
		return nil, fmt.Errorf("engine with L3 %q: engines share L3 through the node service or Redis: %w", cfg.L3, ErrConfig)
	}
	if cfg.L3 == L3Node {
		cfg.NodeSocket = job.Socket
	}
	cfg.Engines, cfg.Nodes = 1, 0
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
	run.trackComputed()
	rr := RunReport{Name: RunStrata}
	p := NewProgress(discard{}, false)
	if progress != nil {
		p.onStep = func(done int) { _, _ = fmt.Fprintf(progress, "%s%d\n", engineProgressPrefix, done) }
	}
	var hold *reconnectHold
	if job.HoldAt > 0 {
		hold = newReconnectHold(run.backend, job.HoldAt, len(mine.Requests))
		p.watch = hold.watch
	}
	e := &engineSim{model: cfg.Model, maxRunning: cfg.MaxRunning, run: run, progress: p, trackL3: job.TrackL3Hits, paced: job.Paced}
	err = e.serve(ctx, mine, &rr, cfg.Concurrent)
	res := &EngineResult{Run: rr, TTFTms: e.ttfts, CrossEngineHitTokens: run.cross,
		ComputedPages: slices.Collect(maps.Keys(run.computed)), L3HitPages: run.l3Hits, L3HitTimes: e.l3Hits,
		Held: Duration(hold.waited()), PID: os.Getpid()}
	return res, errors.Join(err, hold.failed(), run.close())
}

// runEngines runs the strata run as several engine processes sharing L3 (one node
// service, several writing through to one Redis, or Redis itself), and merges
// their reports.
// engineProgressPrefix starts an engine process's progress lines on its stderr:
// the prefix, then the requests it has served.
const engineProgressPrefix = "strata-engine-progress "

// progressTap passes an engine's stderr to out, but for its progress lines, whose
// counts it hands to step.
type progressTap struct {
	out     io.Writer
	step    func(done int)
	partial []byte
}

func (t *progressTap) Write(p []byte) (int, error) {
	t.partial = append(t.partial, p...)
	for {
		i := bytes.IndexByte(t.partial, '\n')
		if i < 0 {
			return len(p), nil
		}
		line := t.partial[:i+1]
		if rest, ok := bytes.CutPrefix(line, []byte(engineProgressPrefix)); ok {
			if n, err := strconv.Atoi(string(bytes.TrimSpace(rest))); err == nil {
				t.step(n)
			}
		} else {
			_, _ = t.out.Write(line)
		}
		t.partial = t.partial[i+1:]
	}
}

func runEngines(ctx context.Context, cfg Config, gen workload.Generator, name string, requests int, log *slog.Logger) (RunReport, error) {
	engines, nodes := cfg.engines(), cfg.nodes()
	rr := RunReport{Name: name, Engines: engines}
	switch {
	case cfg.L3 == L3Redis:
		rr.Description = fmt.Sprintf("%d engine processes, each L1 + L2 (%gx host), sharing Redis as L3", engines, cfg.L2Ratio)
	case nodes > 1:
		rr.Nodes = nodes
		rr.Description = fmt.Sprintf("%d engine processes, each L1 + L2 (%gx host), over %d node services writing through to one Redis",
			engines, cfg.L2Ratio, nodes)
	default:
		rr.Description = fmt.Sprintf("%d engine processes, each L1 + L2 (%gx host), sharing the node service as L3", engines, cfg.L2Ratio)
	}
	var sockets []string
	var servers []*node.Server
	if cfg.L3 == L3Node {
		if cfg.NodeSocket != "" {
			sockets = []string{cfg.NodeSocket}
		}
		started := time.Now()
		for len(sockets) < nodes {
			srv, dir, err := startEmbeddedNode(cfg, log)
			if err != nil {
				return rr, err
			}
			defer func() { _ = srv.Close(); _ = os.RemoveAll(dir) }()
			sockets = append(sockets, srv.Socket())
			servers = append(servers, srv)
		}
		if len(servers) > 0 {
			w, err := cfg.awaitEmbedded(ctx, started, servers...)
			if err != nil {
				return rr, err
			}
			rr.Warmup = w
		}
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
	if cfg.beforeReplay != nil {
		cfg.beforeReplay(name)
	}
	start := time.Now()
	results := make([]*EngineResult, engines)
	errs := make([]error, engines)
	var wg sync.WaitGroup
	progress := cfg.Progress
	if progress == nil {
		progress = NewProgress(discard{}, false)
	}
	// The bar counts requests across every engine.
	progress.Start(fmt.Sprintf("%s (%d engines)", name, engines), requests)
	if cfg.watch != nil {
		progress.watch = cfg.watch
		defer func() { progress.watch = nil }()
	}
	perEngine := make([]int, engines)
	var mu sync.Mutex
	stepEngine := func(e, done int) {
		mu.Lock()
		defer mu.Unlock()
		perEngine[e] = max(perEngine[e], done)
		sum := 0
		for _, n := range perEngine {
			sum += n
		}
		progress.Step(sum)
	}
	for e := range engines {
		job := EngineJob{Config: cfg, Workload: gen.Name(), WorkloadConfig: wcfg, Engine: e, Engines: engines, TrackL3Hits: cfg.trackL3Hits, HoldAt: cfg.holdAt, Paced: cfg.paced}
		if len(sockets) > 0 {
			job.Socket = sockets[e%len(sockets)]
		}
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
			cmd.Stdout = &out
			cmd.Stderr = &progressTap{out: &stderr, step: func(done int) { stepEngine(e, done) }}
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
		rr.Concurrency += r.Concurrency
		rr.MaxInFlight += r.MaxInFlight // each engine's peak; together a bound
		if rr.Backlog == nil {
			rr.Backlog = r.Backlog
		}
		ttfts = append(ttfts, res.TTFTms...)
		rr.l3HitTimes = append(rr.l3HitTimes, res.L3HitTimes...)
		rr.held = max(rr.held, time.Duration(res.Held))
		if r.L3 != nil {
			if l3 == nil {
				l3 = &L3Report{Backend: r.L3.Backend, Pools: r.L3.Pools, Faults: map[string]int64{}}
			}
			l3.BytesRead += r.L3.BytesRead
			l3.BytesWritten += r.L3.BytesWritten
			l3.PrefetchedTokens += r.L3.PrefetchedTokens
			l3.Prefetch.Completed += r.L3.Prefetch.Completed
			l3.Prefetch.TimedOut += r.L3.Prefetch.TimedOut
			l3.Prefetch.BelowThreshold += r.L3.Prefetch.BelowThreshold
			l3.Prefetch.Canceled += r.L3.Prefetch.Canceled
			l3.Prefetch.NoRoom += r.L3.Prefetch.NoRoom
			l3.Prefetch.Stale += r.L3.Prefetch.Stale
			for k, v := range r.L3.Faults {
				l3.Faults[k] += v
			}
			l3.Refills += r.L3.Refills
			l3.RefillPages += r.L3.RefillPages
			l3.Outage = l3.Outage.add(r.L3.Outage)
		}
	}
	rr.L3 = l3
	if nodes > 1 {
		rr.CrossNodeHitTokens = crossNodeHitTokens(results, nodes, cfg.PageSize)
	}
	if cfg.L3 == L3Node && len(cfg.Redis) > 0 {
		rr.Remote = remoteReport(servers)
	}
	if rr.PromptTokens > 0 {
		rr.HitRatio = float64(rr.HitTokens.Total()) / float64(rr.PromptTokens)
	}
	rr.TTFTms = quantiles(ttfts)
	rr.Elapsed = Duration(time.Since(start))
	return rr, nil
}

// crossNodeHitTokens counts the L3 hit tokens of each node's engines (engine e on
// node e mod nodes) of pages that none of that node's engines computed.
func crossNodeHitTokens(results []*EngineResult, nodes, pageSize int) int64 {
	computed := make([]map[uint64]struct{}, nodes)
	for n := range computed {
		computed[n] = map[uint64]struct{}{}
	}
	for e, res := range results {
		for _, d := range res.ComputedPages {
			computed[e%nodes][d] = struct{}{}
		}
	}
	var tokens int64
	for e, res := range results {
		for _, d := range res.L3HitPages {
			if _, local := computed[e%nodes][d]; !local {
				tokens += int64(pageSize)
			}
		}
	}
	return tokens
}

// remoteReport sums the node services' remote tier counters.
func remoteReport(servers []*node.Server) *RemoteReport {
	var out *RemoteReport
	for _, srv := range servers {
		r := srv.Stats().Remote
		if r == nil {
			continue
		}
		if out == nil {
			out = &RemoteReport{}
		}
		out.Written += r.Written
		out.WriteFailed += r.WriteFailed
		out.Dropped += r.Dropped
		out.Hits += r.Hits
		out.Misses += r.Misses
		out.Faults += r.Faults
	}
	return out
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
