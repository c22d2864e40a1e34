package main

import (
	"context"
	"encoding/json"
	"flag"
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
	if len(args) > 0 && args[0] == "matrix" {
		return runBenchMatrix(ctx, args[1:], stdout, stderr)
	}
	def := sim.DefaultConfig()
	fs := newFlagSet("bench", stdout)
	wl := fs.String("workload", "multiturn", "workload: "+strings.Join(workload.Names(), ", "))
	seed := fs.Int64("seed", def.Seed, "trace seed; the same seed gives the same trace")
	model := fs.String("model", def.Model.Name, "model preset: "+describeModels())
	draft := fs.Bool("draft", def.Draft, "cache the EAGLE draft model's KV beside the target's")
	bigram := fs.Bool("bigram", def.Bigram, "key the cache by EAGLE bigrams (needed to serve draft KV right)")
	pageSize := fs.Int("page-size", def.PageSize, "tokens per page")
	l1 := fs.Int64("l1-tokens", 0, "L1 (device pool) capacity in tokens (default: sized from the trace, so that L1 + L2 hold 90% of the tokens that are hit again and L3 serves the rest; at least the longest request)")
	l2 := fs.Float64("l2-ratio", 0, "L2 (host pool) size as a multiple of L1 (default: 4, less where L1 must hold a long request and L1 + L2 would hold all that is hit again)")
	load := fs.Float64("load", sim.DefaultLoad, "offered load as a fraction of the simulated engine's modelled capacity without a cache: the arrival rate follows from the model's prefill and decode costs (above 1 the queue grows without bound); --rate overrides it")
	full := fs.Bool("full", false, "run the workload unscaled: without it a large model's trace is scaled down (fewer clients, groups, or shorter documents) so that its prompts' KV fits 12 GiB and its working set 4 GiB; the header says what was scaled (default: scaled)")
	writePolicy := fs.String("write-policy", def.WritePolicy.String(), "write_through, write_through_selective or write_back")
	eviction := fs.String("eviction", def.Eviction.String(), "eviction policy: lru or lfu")
	prefillUS := fs.Float64("prefill-us-per-token", 0, "modelled prefill time per token in microseconds (default: the model preset's, listed under --model)")
	decodeMS := fs.Float64("decode-ms", 0, "modelled decode step of the running batch in milliseconds (default: the model preset's)")
	maxRunning := fs.Int("max-running", def.MaxRunning, "most requests the simulated engine runs at once")
	concurrent := fs.Int("concurrent", 0, "serve the l1-only and strata runs from N goroutines, with no wait for copies between requests, to find concurrency bugs: every page is still verified, hits vary run to run (default 0: the deterministic event loop)")
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
	jsonPath := fs.String("json", "", "write the full report as JSON to this file (default: none)")
	plotPath := fs.String("plot", "", "write a PNG of hit ratio and TTFT per run to this file, named .png")
	restartNode := fs.String("restart-node", "", describeRestart())
	restartAt := fs.Float64("restart-at", sim.DefaultRestartAt, "with --restart-node: restart when this fraction of the strata run's requests has been served")
	// Workload shape: the flags show each workload's defaults, and only the
	// flags given change it.
	defMT, defSP, defLC := workload.DefaultMultiturn(), workload.DefaultSharedPrefix(), workload.DefaultLongContext()
	clients := fs.Int("clients", defMT.Clients, "multiturn: concurrent conversations (scaled down for a large model unless --full)")
	rounds := fs.Int("rounds", defMT.Rounds, "multiturn: rounds per conversation")
	regenerate := fs.Float64("regenerate-ratio", defMT.RegenerateRatio, "multiturn: share of later rounds that regenerate the last answer (0: none)")
	edit := fs.Float64("edit-ratio", defMT.EditRatio, "multiturn: share of later rounds that edit an earlier message at any token, so prompts leave cached pages mid-page (0: none)")
	branch := fs.Float64("branch-ratio", defMT.BranchRatio, "multiturn: share of later rounds that an agent also branches, with a second request that leaves the conversation mid-page (0: none)")
	requestTokens := fs.Int("request-tokens", defMT.RequestTokens, "multiturn: new tokens per round")
	outputTokens := fs.Int("output-tokens", defMT.OutputTokens, "tokens decoded per request, every workload")
	rate := fs.Float64("rate", 0, "mean request arrivals per second (Poisson) (default: the rate --load derives from the model's costs)")
	groups := fs.Int("groups", defSP.Groups, "shared-prefix: system prompts (scaled down for a large model unless --full)")
	perGroup := fs.Int("prompts-per-group", defSP.PromptsPerGroup, "shared-prefix: prompts behind each system prompt (scaled down for a large model unless --full)")
	systemTokens := fs.Int("system-tokens", defSP.SystemTokens, "shared-prefix: system prompt length")
	questionTokens := fs.Int("question-tokens", 0, fmt.Sprintf("shared-prefix and long-context: question length (default %d for shared-prefix, %d for long-context)", defSP.QuestionTokens, defLC.QuestionTokens))
	documents := fs.Int("documents", defLC.Documents, "long-context: documents")
	documentTokens := fs.Int("document-tokens", defLC.DocumentTokens, "long-context: document length (scaled down for a large model unless --full)")
	questions := fs.Int("questions", defLC.QuestionsPerDocument, "long-context: questions per document")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: strata bench [flags]          the workload simulator: l1-only, ceiling and strata runs of one trace")
		fmt.Fprintln(fs.Output(), "       strata bench tiers [flags]    the storage benchmark: an L3 backend's put/get vs its physical limit (strata bench tiers -h)")
		fmt.Fprintln(fs.Output(), "       strata bench matrix [flags]   every model preset on every workload, on defaults: the README's table (strata bench matrix -h)")
		printFlags(fs)
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := checkBenchFlags(fs, *wl, *l3, splitList(*runs), *socket, *plotPath); err != nil {
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
	cfg.Draft, cfg.Bigram, cfg.PageSize, cfg.MaxRunning = *draft, *bigram, *pageSize, *maxRunning
	if flagSet(fs, "l1-tokens") {
		cfg.L1Tokens = *l1
	}
	if flagSet(fs, "l2-ratio") {
		cfg.L2Ratio = *l2
	}
	// What was not given is sized from the trace, and a large model's trace is
	// scaled to the budget: every preset's defaults run in about a minute here,
	// with every tier in play.
	cfg.SizeL1, cfg.SizeL2 = !flagSet(fs, "l1-tokens"), !flagSet(fs, "l2-ratio")
	cfg.ScaleTrace = !*full
	cfg.Load = *load
	if flagSet(fs, "rate") {
		if flagSet(fs, "load") {
			return usagef("--rate and --load both set the arrival rate; give one")
		}
		cfg.Load = 0
	}
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
	cfg.Restart = sim.RestartPlan{Mode: *restartNode, At: *restartAt}
	if err := checkRestartFlags(cfg); err != nil {
		return err
	}
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
	// A flag given sets its field, whatever its value: a 0 or a negative one is
	// then refused by the workload's validation, naming the field.
	setIf := func(dst *int, name string, v int) {
		if flagSet(fs, name) {
			*dst = v
		}
	}
	setRate := func(dst *float64) {
		if flagSet(fs, "rate") {
			*dst = *rate
		}
	}
	switch g := gen.(type) {
	case *workload.Multiturn:
		setIf(&g.Clients, "clients", *clients)
		setIf(&g.Rounds, "rounds", *rounds)
		setIf(&g.RequestTokens, "request-tokens", *requestTokens)
		setIf(&g.OutputTokens, "output-tokens", *outputTokens)
		setRate(&g.RequestRate)
		g.RegenerateRatio, g.EditRatio, g.BranchRatio = *regenerate, *edit, *branch
	case *workload.SharedPrefix:
		setIf(&g.Groups, "groups", *groups)
		setIf(&g.PromptsPerGroup, "prompts-per-group", *perGroup)
		setIf(&g.SystemTokens, "system-tokens", *systemTokens)
		setIf(&g.QuestionTokens, "question-tokens", *questionTokens)
		setIf(&g.OutputTokens, "output-tokens", *outputTokens)
		setRate(&g.RequestRate)
	case *workload.LongContext:
		setIf(&g.Documents, "documents", *documents)
		setIf(&g.DocumentTokens, "document-tokens", *documentTokens)
		setIf(&g.QuestionsPerDocument, "questions", *questions)
		setIf(&g.QuestionTokens, "question-tokens", *questionTokens)
		setIf(&g.OutputTokens, "output-tokens", *outputTokens)
		setRate(&g.RequestRate)
	}
	cfg.Workload = gen
	cfg.L3Warm = *l3Warm
	// Without --l1-tokens, L1 holds at least the workload's longest request, so
	// every workload runs on its defaults.
	cfg.FitL1 = !flagSet(fs, "l1-tokens")
	// Without sizes given, the bench sizes itself to this machine's memory and disk.
	cfg.FitMachine = !flagSet(fs, "l1-tokens") && !flagSet(fs, "l2-ratio") && !flagSet(fs, "node-arena")
	cfg.Machine.AvailableMemory = benchAvailableMemory
	if err := cfg.Validate(); err != nil {
		return usageError{err}
	}
	// Check every path, address and socket before the first run, not after
	// it, and the node services the bench starts against this machine.
	if err := benchPreflight(ctx, cfg, *jsonPath, *plotPath); err != nil {
		return err
	}
	if err := checkBenchNodes(ctx, cfg); err != nil {
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

// runBenchMatrix is `strata bench matrix`: every model preset on every workload,
// each a bench of its own on its defaults, as the README's Markdown table.
func runBenchMatrix(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench matrix", stdout)
	models := fs.String("models", "", "model presets, comma-separated (default: every one: "+strings.Join(sim.ModelNames(), ", ")+")")
	workloads := fs.String("workloads", "", "workloads, comma-separated (default: every one: "+strings.Join(workload.Names(), ", ")+")")
	repeat := fs.Int("repeat", 2, "runs of each cell, for the spread of its time on a shared machine")
	jsonPath := fs.String("json", "", "write every cell's figures and report as JSON to this file")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: strata bench matrix [flags] [-- bench flags]   runs `strata bench --model M --workload W` for every cell,")
		fmt.Fprintln(fs.Output(), "       one at a time, each with a temporary directory of its own, and prints the Markdown table of the README")
		printFlags(fs)
	}
	var extra []string
	for i, a := range args {
		if a == "--" {
			args, extra = args[:i], args[i+1:]
			break
		}
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *repeat < 1 || *repeat > 20 {
		return usagef("--repeat %d: want 1 to 20 runs of each cell", *repeat)
	}
	for _, name := range flagNames(extra) {
		if name == "model" || name == "workload" || name == "json" {
			return usagef("--%s after --: the matrix sets --model, --workload and --json itself; use --models and --workloads", name)
		}
	}
	if err := checkMatrixExtra(splitList(*workloads), extra); err != nil {
		return err
	}
	if *jsonPath != "" {
		if err := checkOutputFile(*jsonPath); err != nil {
			return usagef("--json: %w", err)
		}
	}
	cfg := sim.MatrixConfig{Models: splitList(*models), Workloads: splitList(*workloads), Args: extra, Repeat: *repeat, Progress: stderr}
	cells, err := sim.RunMatrix(ctx, cfg)
	if err != nil {
		if isUsage(err) {
			return usageError{err}
		}
		return err
	}
	// The command that gives the table again; where its JSON went does not
	// change it.
	shown := []string{"strata bench matrix"}
	fs.Visit(func(f *flag.Flag) {
		if f.Name != "json" {
			shown = append(shown, "--"+f.Name, f.Value.String())
		}
	})
	if len(extra) > 0 {
		shown = append(append(shown, "--"), extra...)
	}
	command := strings.Join(shown, " ")
	if err := sim.WriteMatrix(stdout, cells, command); err != nil {
		return err
	}
	if *jsonPath != "" {
		raw, err := json.MarshalIndent(cells, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(*jsonPath, append(raw, '\n'), 0o644); err != nil {
			return fmt.Errorf("--json: %w", err)
		}
	}
	return nil
}

// describeModels lists the presets with the figures that set their costs, for -h.
func describeModels() string {
	var out []string
	for _, name := range sim.ModelNames() {
		m, _ := sim.ModelByName(name)
		out = append(out, fmt.Sprintf("%s (%.4g KiB of KV per token, prefill %v/token, decode step %v)",
			name, float64(m.Geometry.TokenBytes())/1024, m.PrefillPerToken, m.DecodeStep))
	}
	return strings.Join(out, ", ")
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
