package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/stratakv/strata/hicache"
	"github.com/stratakv/strata/radix"
	"github.com/stratakv/strata/sim"
	"github.com/stratakv/strata/workload"
)

func runBench(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) (err error) {
	if len(args) > 0 && args[0] == "tiers" {
		return runTiers(ctx, args[1:], stdout, stderr)
	}
	def := sim.DefaultConfig()
	fs := newFlagSet("bench", stderr)
	wl := fs.String("workload", "multiturn", "workload: "+strings.Join(workload.Names(), ", "))
	seed := fs.Int64("seed", def.Seed, "trace seed; the same seed gives the same trace")
	model := fs.String("model", def.Model.Name, "model preset: "+strings.Join(sim.ModelNames(), ", "))
	draft := fs.Bool("draft", def.Draft, "cache the EAGLE draft model's KV beside the target's")
	bigram := fs.Bool("bigram", def.Bigram, "key the cache by EAGLE bigrams (needed to serve draft KV right)")
	pageSize := fs.Int("page-size", def.PageSize, "tokens per page")
	l1 := fs.Int64("l1-tokens", def.L1Tokens, "L1 (device pool) capacity in tokens")
	l2 := fs.Float64("l2-ratio", def.L2Ratio, "L2 (host pool) size as a multiple of L1")
	writePolicy := fs.String("write-policy", def.WritePolicy.String(), "write_through, write_through_selective or write_back")
	eviction := fs.String("eviction", def.Eviction.String(), "eviction policy: lru or lfu")
	prefillUS := fs.Float64("prefill-us-per-token", 0, "modelled prefill time per token in microseconds (0 = the model preset's)")
	decodeMS := fs.Float64("decode-ms", 0, "modelled decode step in milliseconds (0 = the model preset's)")
	maxRunning := fs.Int("max-running", def.MaxRunning, "most requests the simulated engine runs at once")
	concurrent := fs.Int("concurrent", 0, "serve the l1-only and strata runs from N goroutines, with no wait for copies between requests, to find concurrency bugs: every page is still verified, hits vary run to run (0 = the deterministic event loop)")
	runs := fs.String("runs", "l1-only,ceiling,strata", "runs to replay, comma-separated")
	l3Warm := fs.Bool("l3-warm", false, "name L3 objects by the model alone, as engines do, so what earlier benches left in --socket or --redis is hit (and counted in the report); default: a fresh namespace per bench, so every bench starts from an empty L3")
	l3 := fs.String("l3", def.L3, "strata's L3 backend: node (the node service), redis, file or none")
	redisAddrs := fs.String("redis", "", "Redis Cluster node(s) or server, host:port,...: the L3 with --l3 redis, the node services' remote tier with --l3 node (default where needed: start a local 3-master cluster, if redis-server is installed)")
	nodes := fs.Int("nodes", 1, "node L3: node services started in this process, writing through to one Redis, engines spread over them (the strata run only)")
	socket := fs.String("socket", "", "node L3: a running node service's socket (default: start one in this process, spill in a temporary directory)")
	nodeArena := fs.String("node-arena", "1GiB", "node L3: the embedded node service's DRAM arena")
	engines := fs.Int("engines", 0, "node or redis L3: engine processes sharing L3 (the strata run only; default 1, or one per node service)")
	l3Dir := fs.String("l3-dir", "", "file L3 directory (default: a temporary directory, removed afterwards)")
	l3Capacity := fs.String("l3-capacity", "", "file L3 capacity, e.g. 64GiB (default: the backend's)")
	prefetchPolicy := fs.String("prefetch-policy", def.PrefetchPolicy.String(), "best_effort, wait_complete or timeout")
	draftPolicy := fs.String("draft-policy", def.DraftPolicy.String(), "required or best_effort")
	jsonPath := fs.String("json", "", "write the full report as JSON to this file")
	plotPath := fs.String("plot", "", "write a PNG of hit ratio and TTFT per run to this file")
	// Workload shape.
	clients := fs.Int("clients", 0, "multiturn: concurrent conversations (0 = default)")
	rounds := fs.Int("rounds", 0, "multiturn: rounds per conversation")
	defMT := workload.DefaultMultiturn()
	regenerate := fs.Float64("regenerate-ratio", defMT.RegenerateRatio, "multiturn: share of later rounds that regenerate the last answer (0: none)")
	edit := fs.Float64("edit-ratio", defMT.EditRatio, "multiturn: share of later rounds that edit an earlier message at any token, so prompts leave cached pages mid-page (0: none)")
	branch := fs.Float64("branch-ratio", defMT.BranchRatio, "multiturn: share of later rounds that an agent also branches, with a second request that leaves the conversation mid-page (0: none)")
	requestTokens := fs.Int("request-tokens", 0, "multiturn: new tokens per round")
	outputTokens := fs.Int("output-tokens", 0, "tokens decoded per request")
	rate := fs.Float64("rate", 0, "mean request arrivals per second (Poisson)")
	groups := fs.Int("groups", 0, "shared-prefix: system prompts")
	perGroup := fs.Int("prompts-per-group", 0, "shared-prefix: prompts behind each system prompt")
	systemTokens := fs.Int("system-tokens", 0, "shared-prefix: system prompt length")
	questionTokens := fs.Int("question-tokens", 0, "shared-prefix and long-context: question length")
	documents := fs.Int("documents", 0, "long-context: documents")
	documentTokens := fs.Int("document-tokens", 0, "long-context: document length")
	questions := fs.Int("questions", 0, "long-context: questions per document")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: strata bench [flags]          the workload simulator: l1-only, ceiling and strata runs of one trace")
		fmt.Fprintln(fs.Output(), "       strata bench tiers [flags]    the storage benchmark: an L3 backend's put/get vs its physical limit (strata bench tiers -h)")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *nodes < 1 {
		return usagef("--nodes %d: want 1 to 16 node services", *nodes)
	}
	cfg := def
	cfg.Seed = *seed

	if cfg.Model, err = sim.ModelByName(*model); err != nil {
		return usagef("--model: %w", err)
	}
	if *prefillUS < 0 || *decodeMS < 0 {
		return usagef("--prefill-us-per-token and --decode-ms must not be negative")
	}
	if *prefillUS > 0 {
		cfg.Model.PrefillPerToken = time.Duration(*prefillUS * float64(time.Microsecond))
	}
	if *decodeMS > 0 {
		cfg.Model.DecodeStep = time.Duration(*decodeMS * float64(time.Millisecond))
	}
	cfg.Draft, cfg.Bigram, cfg.PageSize, cfg.L1Tokens, cfg.L2Ratio, cfg.MaxRunning = *draft, *bigram, *pageSize, *l1, *l2, *maxRunning
	cfg.Concurrent = *concurrent
	if cfg.WritePolicy, err = hicache.ParseWritePolicy(*writePolicy); err != nil {
		return usagef("--write-policy: %w", err)
	}
	if cfg.Eviction, err = radix.ParsePolicy(*eviction); err != nil {
		return usagef("--eviction: %w", err)
	}
	cfg.Runs = splitList(*runs)
	cfg.L3, cfg.L3Dir, cfg.NodeSocket, cfg.Engines, cfg.Nodes = *l3, *l3Dir, *socket, *engines, *nodes
	cfg.Redis = splitList(*redisAddrs)
	if cfg.NodeArenaBytes, err = parseBytes(*nodeArena); err != nil {
		return usagef("--node-arena: %w", err)
	}
	if *l3Capacity != "" {
		if cfg.L3CapacityBytes, err = parseBytes(*l3Capacity); err != nil {
			return usagef("--l3-capacity: %w", err)
		}
	}
	if cfg.PrefetchPolicy, err = hicache.ParsePrefetchPolicy(*prefetchPolicy); err != nil {
		return usagef("--prefetch-policy: %w", err)
	}
	if cfg.DraftPolicy, err = hicache.ParseDraftPolicy(*draftPolicy); err != nil {
		return usagef("--draft-policy: %w", err)
	}
	gen, err := workload.ByName(*wl)
	if err != nil {
		return usagef("--workload: %w", err)
	}
	setIf := func(dst *int, v int) {
		if v != 0 {
			*dst = v
		}
	}
	setRate := func(dst *float64) {
		if *rate != 0 {
			*dst = *rate
		}
	}
	switch g := gen.(type) {
	case *workload.Multiturn:
		setIf(&g.Clients, *clients)
		setIf(&g.Rounds, *rounds)
		setIf(&g.RequestTokens, *requestTokens)
		setIf(&g.OutputTokens, *outputTokens)
		setRate(&g.RequestRate)
		g.RegenerateRatio, g.EditRatio, g.BranchRatio = *regenerate, *edit, *branch
	case *workload.SharedPrefix:
		setIf(&g.Groups, *groups)
		setIf(&g.PromptsPerGroup, *perGroup)
		setIf(&g.SystemTokens, *systemTokens)
		setIf(&g.QuestionTokens, *questionTokens)
		setIf(&g.OutputTokens, *outputTokens)
		setRate(&g.RequestRate)
	case *workload.LongContext:
		setIf(&g.Documents, *documents)
		setIf(&g.DocumentTokens, *documentTokens)
		setIf(&g.QuestionsPerDocument, *questions)
		setIf(&g.QuestionTokens, *questionTokens)
		setIf(&g.OutputTokens, *outputTokens)
		setRate(&g.RequestRate)
	}
	cfg.Workload = gen
	cfg.L3Warm = *l3Warm
	// Without --l1-tokens, L1 grows to hold the workload's longest request, so
	// every workload runs on its defaults.
	cfg.FitL1 = !flagSet(fs, "l1-tokens")
	// Without sizes given, the bench sizes itself to this machine's memory and disk.
	cfg.FitMachine = !flagSet(fs, "l1-tokens") && !flagSet(fs, "l2-ratio") && !flagSet(fs, "node-arena")
	if err := cfg.Validate(); err != nil {
		return usageError{err}
	}
	// Check every path, address and socket before the first run, not after it.
	if err := benchPreflight(ctx, cfg, *jsonPath, *plotPath); err != nil {
		return err
	}
	cfg.Progress = sim.NewProgress(stderr, isTerminalWriter(stderr))
	// The temporary spill directory (gigabytes) is removed while the report is
	// printed, not before.
	cfg.BackgroundCleanup = true
	rep, err := sim.Run(ctx, cfg)
	if err != nil {
		if isUsage(err) {
			return usageError{err}
		}
		return err
	}
	defer func() {
		if cerr := rep.WaitCleanup(stderr); cerr != nil && err == nil {
			err = cerr
		}
	}()
	if err := rep.WriteTable(stdout); err != nil {
		return err
	}
	if *jsonPath != "" {
		if err := rep.WriteJSON(*jsonPath); err != nil {
			return fmt.Errorf("--json: %w", err)
		}
	}
	if *plotPath != "" {
		if err := rep.WritePlot(*plotPath); err != nil {
			return fmt.Errorf("--plot: %w", err)
		}
	}
	for _, r := range rep.Runs {
		if r.CorruptPages > 0 {
			return fmt.Errorf("run %s served %d corrupt pages", r.Name, r.CorruptPages)
		}
	}
	for _, r := range rep.Runs {
		if r.Failed > 0 {
			return fmt.Errorf("run %s: %d requests failed (larger than the device pool): its figures leave them out; give a larger --l1-tokens", r.Name, r.Failed)
		}
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func isTerminalWriter(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && sim.IsTerminal(f)
}

// isUsage reports whether err is a configuration error the caller can fix.
func isUsage(err error) bool {
	return errorsIs(err, sim.ErrConfig) || errorsIs(err, workload.ErrConfig) || errorsIs(err, hicache.ErrConfig)
}
