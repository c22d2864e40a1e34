package sim

import (
	"fmt"
	"log/slog"
	"math"
	"net"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/stratakv/strata/hicache"
	"github.com/stratakv/strata/node"
	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/radix"
	"github.com/stratakv/strata/workload"
)

// L3 backends of the strata run.
const (
	L3None  = "none"
	L3File  = "file"
	L3Node  = "node"
	L3Redis = "redis"
)

// Run names.
const (
	RunL1Only  = "l1-only"
	RunCeiling = "ceiling"
	RunStrata  = "strata"
)

// Config describes one bench.
type Config struct {
	// Workload generates the trace; nil means the default multiturn workload.
	Workload workload.Generator `json:"-"`
	// Seed makes the trace reproducible.
	Seed int64 `json:"seed"`
	// Model is the target model preset (and its EAGLE draft's geometry).
	Model Model `json:"model"`
	// Draft adds the EAGLE draft model's pool to the group.
	Draft bool `json:"draft"`
	// Bigram keys the cache by EAGLE bigrams. Draft KV at position i depends on
	// token i+1, so a cache with a draft pool needs bigram keys to serve it right;
	// turning it off with Draft on makes the verification report corrupt pages.
	Bigram bool `json:"bigram"`
	// PageSize is tokens per page.
	PageSize int `json:"pageSize"`
	// L1Tokens is the device pool's capacity in tokens. Realistic settings hold well
	// under a third of the workload's distinct prefix tokens. SizeL1 chooses it
	// from the trace.
	L1Tokens int64 `json:"l1Tokens"`
	// L2Ratio sizes the host pool as a multiple of L1 (SGLang's hicache ratio).
	// SizeL2 chooses it from the trace.
	L2Ratio float64 `json:"l2Ratio"`
	// SizeL1 and SizeL2 let the bench choose L1Tokens and L2Ratio from the trace:
	// L1 and L2 together hold 90% of the pages that are hit again (the reused
	// working set, workload.Trace.ReusedPrefixTokens), so that L3 serves the rest,
	// as in a deployment whose host memory runs out; L2 is 4 times L1, or less
	// where L1 must hold the longest request and that leaves less room; L1 holds
	// at least the longest request. The command line sets each when its flag is
	// not given.
	SizeL1 bool `json:"-"`
	SizeL2 bool `json:"-"`
	// Load, above 0, sets the workload's arrival rate to Load times the simulated
	// engine's modelled capacity without a cache (Capacity): a model twice as
	// expensive gets half the rate, and every run keeps up below 1. 0 keeps the
	// workload's own rate (--rate). The report gives the offered load either way,
	// and says when it is above capacity.
	Load float64 `json:"load,omitempty"`
	// ScaleTrace scales the workload down (workload.Scalable.Scaled) until its
	// trace's KV fits Budget, so that a large model's run takes a minute and a
	// few GiB of disk, not an hour and the disk: the same page size, geometry,
	// tier ratios and load on fewer conversations, groups or shorter documents.
	// The report says what changed. The command line sets it unless --full.
	ScaleTrace bool `json:"-"`
	// Budget is what ScaleTrace scales to; zero fields take DefaultBudget's.
	Budget Budget `json:"-"`
	// WritePolicy and Eviction configure strata's cache.
	WritePolicy hicache.WritePolicy `json:"writePolicy"`
	Eviction    radix.Policy        `json:"eviction"`
	// MaxRunning is the most requests the engine runs at once; each holds its pages
	// in L1 from admission to completion.
	MaxRunning int `json:"maxRunning"`
	// L3 is the strata run's L3 backend: node (the node service), redis (a Redis
	// Cluster or server, straight from each engine), file or none.
	L3 string `json:"l3"`
	// Redis are the addresses of the Redis Cluster (any of its masters) or
	// standalone server the strata run uses: its L3 with L3 redis, the node
	// services' remote tier with L3 node. Empty where Redis is needed (L3 redis, or
	// Nodes > 1) starts a local cluster of 3 masters in a temporary directory for
	// the run, when redis-server is installed. Pages that earlier benches left in
	// a given Redis are hits (and verified as any other).
	Redis []string `json:"redis"`
	// Nodes is the number of node services of the strata run (L3 node): each
	// started in this process with its own arena, spill and socket, all writing
	// through to one Redis, standing for nodes of a cluster. Engines are spread over
	// them (engine e uses node e mod Nodes); Engines defaults to Nodes.
	Nodes int `json:"nodes"`
	// NodeSocket is a running node service's socket; empty starts one in this
	// process, with an SSD spill directory in a temporary directory.
	NodeSocket string `json:"nodeSocket"`
	// NodeArenaBytes is the embedded node service's DRAM arena.
	NodeArenaBytes int64 `json:"nodeArenaBytes"`
	// L3Dir is the file backend's directory; empty means a temporary directory,
	// removed after the run.
	L3Dir string `json:"l3Dir"`
	// L3CapacityBytes bounds the file backend; 0 keeps its default.
	L3CapacityBytes int64 `json:"l3CapacityBytes"`
	// Engines is the number of engine processes of the strata run (node or redis
	// L3): each replays every Engines-th request with its own L1 and L2, all
	// sharing the L3, as engines behind a router without session affinity do.
	Engines int `json:"engines"`
	// EngineBinary is the strata binary engines are started from; empty means this
	// process's executable.
	EngineBinary string `json:"-"`
	// PrefetchPolicy and DraftPolicy configure strata's L3 tier.
	PrefetchPolicy hicache.PrefetchPolicy `json:"prefetchPolicy"`
	DraftPolicy    hicache.DraftPolicy    `json:"draftPolicy"`
	// Concurrent, above 0, serves the l1-only and strata runs from that many
	// goroutines instead of the simulated engine's event loop: each takes the next
	// request of the trace and serves it end to end (prefetch, match, load, verify,
	// prefill, insert, finish), and nothing waits for the cache's copies between
	// requests, so loads and backups overlap with other requests' matches, inserts
	// and evictions, as they do in a serving engine. Every page a hit serves is
	// still verified byte for byte: this mode is for finding concurrency bugs (run
	// it under the race detector), and corrupt pages must stay 0. Hits depend on
	// which request finished first, so they vary from run to run; arrival times,
	// MaxRunning and queueing do not apply (the goroutines bound the requests in
	// flight), and TTFT is the modelled prefill of the missed tokens plus the
	// measured load and prefetch time. The ceiling run stays sequential. 0 is the
	// deterministic event loop.
	Concurrent int `json:"concurrent,omitempty"`
	// Runs lists the configurations to replay, in order; nil means all three.
	Runs []string `json:"runs"`
	// FitL1 raises L1Tokens, when the trace's longest request (prompt and output)
	// does not fit L1, to the smallest multiple of L1Tokens that holds it, and says
	// so in the report's notes; without it such a trace is a configuration error,
	// since the request could never be served. The command line sets it when
	// --l1-tokens is not given, so every workload's defaults run.
	FitL1 bool `json:"-"`
	// L3Namespace prefixes the strata run's L3 object names (after the model's
	// name), so that a bench against a running node service or Redis starts from
	// an empty namespace and never reads what earlier benches left: Run sets a fresh
	// one when it is empty and L3Warm is false. Engine processes get the same one.
	L3Namespace string `json:"l3Namespace,omitempty"`
	// L3Warm names objects by the model alone, as engines do, so pages that
	// earlier benches (or engines of this model) left in the L3 are hits; the
	// report then counts the L3 hit tokens this run did not compute.
	L3Warm bool `json:"l3Warm,omitempty"`
	// FitMachine sizes what was not given from the machine: it lowers L1 (and L2
	// with it) to fit three quarters of the available memory, and bounds the
	// embedded node service's spill to half the temporary directory's free disk,
	// each with a note. The command line sets it when --l1-tokens, --l2-ratio and
	// --node-arena are not given.
	FitMachine bool `json:"-"`
	// Machine is what FitMachine measures; zero measures this machine.
	Machine Machine `json:"-"`
	// NodeSpillBytes bounds the embedded node services' spill directories; 0
	// keeps the node service's default.
	NodeSpillBytes int64 `json:"nodeSpillBytes,omitempty"`
	// BackgroundCleanup leaves the removal of the bench's temporary directories
	// running when Run returns, so that the report is out seconds earlier; the
	// caller must then call Report.WaitCleanup.
	BackgroundCleanup bool `json:"-"`
	// Restart, with a Mode, runs the strata run twice on a node service the
	// bench starts as a child `strata serve` process on an arena file: once as
	// it is, and once with the service signalled and started again at a point
	// of the run (RestartPlan), and reports the second's L3 hits over the
	// first's (Report.Restart).
	Restart RestartPlan `json:"restart,omitzero"`
	// Progress reports each run's progress; nil is silent.
	Progress *Progress `json:"-"`
	// Logger receives warnings; nil means slog.Default().
	Logger *slog.Logger `json:"-"`

	// allowOversize skips the check that every request fits L1, for the tests of
	// how the replays fail requests that do not.
	allowOversize bool

	// cleanup removes temporary directories in the background (BackgroundCleanup).
	cleanup *cleaner

	// watch, when set, sees the strata run's count of requests served (over
	// every engine), and trackL3Hits makes the run record when each L3 hit
	// came: the restart experiment's trigger and its count of hits after.
	watch       func(done int)
	trackL3Hits bool
	// holdAt, above 0, makes the strata run wait at that fraction of its
	// requests until its L3 client has reconnected (reconnectHold); paced
	// replays it in real time (engineSim.pace).
	holdAt float64
	paced  bool

	// startStats, when set (tests), rewrites the stats the bench reads of a
	// node service it started while it waits for it to be ready (warmup.go),
	// and beforeReplay runs as a run's replay is about to begin, its L3
	// service ready.
	startStats   func(node.Stats) node.Stats
	beforeReplay func(run string)

	// overlongServed, when set, makes the hicache runs' matches one page too
	// long where a request diverges inside a cached span (overlongMatch), and
	// counts the pages so served: a deliberate bug for the tests that prove the
	// verification catches it. Unexported, so no bench can set it, and never
	// passed to engine processes.
	overlongServed *atomic.Int64
}

// DefaultConfig is the embedded default of `strata bench`: the multiturn workload
// on the small model with its EAGLE draft, 64-token pages, L1 of 16384 tokens (12%
// of the default workload's 136128 distinct prefix tokens, 18% of its 91584
// reused ones), L2 four times that (so L1 + L2 hold 89% of the reused working
// set), a node service L3 started in the process with a 1 GiB arena and an SSD
// spill in a temporary directory, and requests arriving at DefaultLoad of the
// engine's capacity, replayed by the deterministic event loop. The command line
// also sizes L1 and L2 from the trace (SizeL1, SizeL2), which gives these sizes
// for the default trace, and scales large models' traces (ScaleTrace).
func DefaultConfig() Config {
	m, _ := ModelByName(DefaultModel)
	return Config{
		Seed:           1,
		Model:          m,
		Draft:          true,
		Bigram:         true,
		PageSize:       64,
		L1Tokens:       16384,
		L2Ratio:        4,
		WritePolicy:    hicache.WriteThrough,
		Eviction:       radix.LRU,
		MaxRunning:     16,
		Load:           DefaultLoad,
		L3:             L3Node,
		NodeArenaBytes: 1 << 30,
		PrefetchPolicy: hicache.Timeout,
		DraftPolicy:    hicache.DraftRequired,
	}
}

// Validate reports whether c can run.
func (c Config) Validate() error {
	if c.PageSize < 1 || c.PageSize > 4096 {
		return fmt.Errorf("page size %d: want 1 to 4096 tokens: %w", c.PageSize, ErrConfig)
	}
	if c.L1Tokens < int64(c.PageSize) {
		return fmt.Errorf("L1 of %d tokens holds no %d-token page: %w", c.L1Tokens, c.PageSize, ErrConfig)
	}
	if c.L1Tokens/int64(c.PageSize) > math.MaxInt32 {
		return fmt.Errorf("L1 of %d tokens is more pages than a pool can index: %w", c.L1Tokens, ErrConfig)
	}
	if math.IsNaN(c.L2Ratio) || c.L2Ratio < 1 || c.L2Ratio > 1024 {
		return fmt.Errorf("L2 ratio %v: L2 must hold at least L1 (ratio >= 1; SGLang uses 2 to 4): %w", c.L2Ratio, ErrConfig)
	}
	if c.Concurrent < 0 || c.Concurrent > maxConcurrent {
		return fmt.Errorf("concurrent %d: want 0 (the deterministic event loop) to %d goroutines: %w", c.Concurrent, maxConcurrent, ErrConfig)
	}
	if math.IsNaN(c.Load) || c.Load < 0 || c.Load > 100 {
		return fmt.Errorf("load %v: want a fraction of the engine's capacity above 0 (0.7 keeps up; 1 and above queue without bound), at most 100: %w", c.Load, ErrConfig)
	}
	if c.MaxRunning < 1 {
		return fmt.Errorf("max running %d: want at least 1: %w", c.MaxRunning, ErrConfig)
	}
	if err := c.Model.Geometry.Validate(); err != nil {
		return fmt.Errorf("model %q: %w", c.Model.Name, err)
	}
	if c.L3 != L3None && c.L3 != L3File && c.L3 != L3Node && c.L3 != L3Redis {
		return fmt.Errorf("L3 backend %q: want %s, %s, %s or %s: %w", c.L3, L3Node, L3Redis, L3File, L3None, ErrConfig)
	}
	if c.Engines > 1 && c.L3 != L3Node && c.L3 != L3Redis {
		return fmt.Errorf("%d engines share L3 through the node service or Redis; use --l3 node or --l3 redis: %w", c.Engines, ErrConfig)
	}
	if c.Engines < 0 || c.Engines > 64 {
		return fmt.Errorf("%d engines: want 1 to 64: %w", c.Engines, ErrConfig)
	}
	if c.Nodes < 0 || c.Nodes > 16 {
		return fmt.Errorf("%d node services: want 1 to 16: %w", c.Nodes, ErrConfig)
	}
	if c.Nodes > 1 {
		if c.L3 != L3Node {
			return fmt.Errorf("%d node services need --l3 node: %w", c.Nodes, ErrConfig)
		}
		if c.NodeSocket != "" {
			return fmt.Errorf("%d node services are started by the bench; --socket names one running service, drop one of them: %w", c.Nodes, ErrConfig)
		}
		if c.Engines > 1 && c.Engines < c.Nodes {
			return fmt.Errorf("%d engines over %d node services leaves a node without an engine; give at least as many engines: %w", c.Engines, c.Nodes, ErrConfig)
		}
	}
	for _, a := range c.Redis {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return fmt.Errorf("redis address %q: want host:port: %w", a, ErrConfig)
		}
	}
	if c.L3 == L3Node && c.NodeSocket == "" && c.NodeArenaBytes < 1<<20 {
		return fmt.Errorf("node arena of %d bytes: want at least 1 MiB: %w", c.NodeArenaBytes, ErrConfig)
	}
	if c.L3CapacityBytes < 0 {
		return fmt.Errorf("L3 capacity %d bytes: must not be negative: %w", c.L3CapacityBytes, ErrConfig)
	}
	for _, r := range c.Runs {
		if r != RunL1Only && r != RunCeiling && r != RunStrata {
			return fmt.Errorf("run %q: want %s, %s or %s: %w", r, RunL1Only, RunCeiling, RunStrata, ErrConfig)
		}
	}
	if c.Restart.Mode != "" && len(c.Runs) > 0 && !slices.Contains(c.Runs, RunStrata) {
		return fmt.Errorf("a restart of the node service happens in the %s run, and the runs are %s: %w", RunStrata, strings.Join(c.Runs, ","), ErrConfig)
	}
	return c.Restart.validate(c)
}

// engines is the number of engine processes of the strata run: Engines, or one per
// node service.
func (c Config) engines() int {
	return max(c.Engines, c.nodes(), 1)
}

// nodes is the number of node services of the strata run.
func (c Config) nodes() int { return max(c.Nodes, 1) }

// needsRedis reports whether the strata run needs a Redis: as its L3, or as the
// remote tier that connects several node services.
func (c Config) needsRedis() bool { return c.L3 == L3Redis || c.L3 == L3Node && c.Nodes > 1 }

func (c Config) l2Pages() int {
	return int(math.Ceil(float64(c.L1Tokens/int64(c.PageSize)) * c.L2Ratio))
}

func (c Config) poolSpecs() []pool.PoolSpec {
	specs := []pool.PoolSpec{{Name: pagekey.TargetPool, Geometry: c.Model.Geometry}}
	if c.Draft {
		specs = append(specs, pool.PoolSpec{Name: pagekey.DraftPool, Geometry: c.Model.DraftGeometry})
	}
	return specs
}
