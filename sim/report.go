package sim

import (
	"encoding/json"
	"time"
)

// Report is the result of one `strata bench` run: the same trace through every
// cache configuration, side by side. Its JSON form is what --json writes.
type Report struct {
	// Workload is the workload's name (multiturn, shared-prefix, long-context).
	Workload string `json:"workload"`
	// Seed makes the trace reproducible.
	Seed int64 `json:"seed"`
	// Model and Draft name the target and draft model presets ("" for no draft).
	Model string `json:"model"`
	Draft string `json:"draft,omitempty"`
	// PageSize is tokens per page.
	PageSize int `json:"page_size"`
	// L1Tokens and L2Tokens are the device and host pool capacities in tokens;
	// L2Ratio is L2 over L1.
	L1Tokens int64   `json:"l1_tokens"`
	L2Tokens int64   `json:"l2_tokens"`
	L2Ratio  float64 `json:"l2_ratio,omitempty"`
	// L3 names the L3 backend of the strata run ("" for none).
	L3 string `json:"l3,omitempty"`
	// Redis says which Redis the strata run used (addresses given, or the local
	// cluster the bench started); "" for none.
	Redis string `json:"redis,omitempty"`
	// Concurrent is the goroutines that served the l1-only and strata runs (see
	// Config.Concurrent); 0 for the deterministic event loop.
	Concurrent int `json:"concurrent,omitempty"`
	// Requests is the number of requests in the trace.
	Requests int `json:"requests"`
	// PromptTokens is the sum of every request's prompt length.
	PromptTokens int64 `json:"prompt_tokens"`
	// DistinctPrefixTokens is the working set: tokens of distinct whole-page prefixes
	// of every prompt and output in the trace.
	DistinctPrefixTokens int64 `json:"distinct_prefix_tokens"`
	// ReusedPrefixTokens is the part of the working set that later prompts hit
	// again (workload.Trace.ReusedPrefixTokens): a cache that holds less must
	// evict pages it is asked for again.
	ReusedPrefixTokens int64 `json:"reused_prefix_tokens"`
	// Scaling says how the trace was scaled down to fit the bench's budget; nil
	// for the workload as configured.
	Scaling *Scaling `json:"scaling,omitempty"`
	// Rate is the trace's mean arrival rate in requests per second, and Load that
	// over Capacity, the engine's modelled capacity without a cache: above 1 the
	// queue grows without bound.
	Rate     float64  `json:"rate"`
	Load     float64  `json:"load"`
	Capacity Capacity `json:"capacity"`
	// MaxRunning, PrefillPerToken and DecodeStep are the simulated engine's
	// figures the capacity comes from.
	MaxRunning      int      `json:"max_running"`
	PrefillPerToken Duration `json:"prefill_per_token"`
	DecodeStep      Duration `json:"decode_step"`
	// Notes says what the bench changed from what was asked, e.g. an L1 raised to
	// hold the longest request.
	Notes []string `json:"notes,omitempty"`
	// Runs has one entry per cache configuration, in the order they ran.
	Runs []RunReport `json:"runs"`
	// Restart is the restart experiment's result (Config.Restart); nil
	// without one.
	Restart *RestartReport `json:"restart,omitempty"`
	// Elapsed is the wall time of the whole bench.
	Elapsed Duration `json:"elapsed"`

	cleanup *cleaner // removals still running (Config.BackgroundCleanup)
}

// RunReport is one cache configuration's result over the trace.
type RunReport struct {
	// Name is "l1-only", "ceiling" or "strata".
	Name string `json:"name"`
	// Description says what the run models, in a few words.
	Description string `json:"description"`
	// HitTokens counts prompt tokens served from each tier.
	HitTokens TierTokens `json:"hit_tokens"`
	// PromptTokens is the number of prompt tokens the run served (hits + computed).
	PromptTokens int64 `json:"prompt_tokens"`
	// HitRatio is (l1+l2+l3 hit tokens) / prompt tokens.
	HitRatio float64 `json:"hit_ratio"`
	// VerifiedPages counts pages (of every pool) checked byte for byte after a hit.
	VerifiedPages int64 `json:"verified_pages"`
	// CorruptPages counts verified pages whose bytes were wrong. It must be zero.
	CorruptPages int64 `json:"corrupt_pages"`
	// DraftRecomputePages counts hit pages whose draft KV was missing and had to be
	// recomputed (EAGLE draft pool without L3).
	DraftRecomputePages int64 `json:"draft_recompute_pages,omitempty"`
	// TTFTms is the modelled time to first token: queueing + prefill compute of the
	// tokens that missed + the measured time to load the tokens that hit (and the
	// part of the L3 prefetch that outlasted the queueing). A concurrent run models
	// no queueing: prefill compute + measured load + measured prefetch.
	TTFTms Quantiles `json:"ttft_ms"`
	// QueueMs is how long requests waited between arrival and admission (the
	// event loop's runs; a concurrent run does not queue).
	QueueMs Quantiles `json:"queue_ms"`
	// Backlog is set when the run's queue grew over the trace: arrivals outran
	// the engine, and TTFT measures the backlog.
	Backlog *Backlog `json:"backlog,omitempty"`
	// LoadBack is L2→L1 traffic; Backup is L1→L2 traffic.
	LoadBack Traffic `json:"load_back"`
	Backup   Traffic `json:"backup"`
	// EvictedTokens counts tokens evicted from each tier.
	EvictedTokens TierTokens `json:"evicted_tokens"`
	// L3 is the L3 tier's activity; nil for runs without L3.
	L3 *L3Report `json:"l3,omitempty"`
	// L3WarmHitTokens counts, with Config.L3Warm, L3 hit tokens of pages this run
	// did not compute: the L3 was warm when it started.
	L3WarmHitTokens int64 `json:"l3_warm_hit_tokens,omitempty"`
	// Failed counts requests the run could not serve (larger than the device pool).
	Failed int `json:"failed,omitempty"`
	// Concurrency is the goroutines that served the run (summed over engine
	// processes); 0 for the event loop. MaxInFlight is the most requests that held
	// the cache at once, from match to finish (summed over engine processes: each
	// one's peak), which shows the requests really overlapped.
	Concurrency int `json:"concurrency,omitempty"`
	MaxInFlight int `json:"max_in_flight,omitempty"`
	// Engines is the number of engine processes of a multi-engine run.
	Engines int `json:"engines,omitempty"`
	// CrossEngineHitTokens counts L3 hit tokens of pages another engine computed.
	CrossEngineHitTokens int64 `json:"cross_engine_hit_tokens,omitempty"`
	// Nodes is the number of node services of a multi-node run.
	Nodes int `json:"nodes,omitempty"`
	// CrossNodeHitTokens counts L3 hit tokens, on the engines of one node service,
	// of pages that no engine of that node computed: they came from another node
	// through Redis. Pages an engine computed after it had them from Redis are left
	// out, so this is a lower bound.
	CrossNodeHitTokens int64 `json:"cross_node_hit_tokens,omitempty"`
	// Remote is the node services' remote tier activity, summed; nil without one.
	Remote *RemoteReport `json:"remote,omitempty"`
	// Warmup is the start of the node services the bench started for the
	// run, which it waited out before the run (warmup.go); nil when it
	// started none.
	Warmup *Warmup `json:"warmup,omitempty"`
	// Elapsed is the wall time of the run.
	Elapsed Duration `json:"elapsed"`

	// l3HitTimes is when each L3 hit came (Config.trackL3Hits), and held how
	// long the run waited for its L3 client to reconnect (Config.holdAt; the
	// longest of its engines).
	l3HitTimes []L3HitAt
	held       time.Duration
	started    time.Time // when the run began (the restart experiment)
}

// TierTokens is a token count per tier.
type TierTokens struct {
	L1 int64 `json:"l1"`
	L2 int64 `json:"l2"`
	L3 int64 `json:"l3"`
}

// Total is the sum over tiers.
func (t TierTokens) Total() int64 { return t.L1 + t.L2 + t.L3 }

// Quantiles summarises a latency distribution in milliseconds.
type Quantiles struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	Mean float64 `json:"mean"`
}

// Traffic is bytes moved between two tiers and the wall time spent moving them.
type Traffic struct {
	Pages   int64    `json:"pages"`
	Bytes   int64    `json:"bytes"`
	Elapsed Duration `json:"elapsed"`
}

// GBps is the traffic's bandwidth in GB/s (0 when nothing moved).
func (t Traffic) GBps() float64 {
	if t.Elapsed <= 0 {
		return 0
	}
	return float64(t.Bytes) / time.Duration(t.Elapsed).Seconds() / 1e9
}

// L3Report is the L3 tier's activity during a run.
type L3Report struct {
	// Backend names the backend ("file", "node", "redis").
	Backend string `json:"backend"`
	// BytesRead and BytesWritten count L3 object bytes moved.
	BytesRead    int64 `json:"bytes_read"`
	BytesWritten int64 `json:"bytes_written"`
	// PrefetchedTokens counts tokens the prefetches fetched from L3 into L2. They
	// count as L3 hits only when the request whose prefetch fetched them loads them
	// in its match; found in L2 by a later match (the request's own after it waited
	// for L1 room, or another request's) they are L2 hits.
	PrefetchedTokens int64 `json:"prefetched_tokens"`
	// Prefetch counts prefetch outcomes.
	Prefetch PrefetchOutcomes `json:"prefetch"`
	// Faults counts L3 errors by kind (timeout, io, corrupt, ...).
	Faults map[string]int64 `json:"faults,omitempty"`
	// Refills counts the times the L3 came back empty (a node service
	// restarted cold) and the cache queued what it held in L2 to be written
	// to it again; RefillPages counts those pages.
	Refills     int64 `json:"refills,omitempty"`
	RefillPages int64 `json:"refill_pages,omitempty"`
	// Pools is the L3 status of each pool of the group.
	Pools []PoolL3Status `json:"pools"`
	// Outage is what the L3 client saw of its connection to the node
	// service (outage.go); nil for the other backends.
	Outage *L3Outage `json:"outage,omitempty"`
}

// RemoteReport is the node services' write-through to Redis during a run, in
// objects (one per page and pool part).
type RemoteReport struct {
	// Written objects reached Redis; WriteFailed did not (Redis refused or was
	// down); Dropped were never sent because the bounded write queue was full.
	Written     int64 `json:"written"`
	WriteFailed int64 `json:"write_failed"`
	Dropped     int64 `json:"dropped"`
	// Hits are local misses that Redis served (and the node promoted into its
	// arena); Misses are local misses Redis did not have either.
	Hits   int64 `json:"hits"`
	Misses int64 `json:"misses"`
	// Faults counts Redis errors other than a miss.
	Faults int64 `json:"faults"`
}

// PrefetchOutcomes counts how prefetches ended.
type PrefetchOutcomes struct {
	Completed      int64 `json:"completed"`
	TimedOut       int64 `json:"timed_out"`
	BelowThreshold int64 `json:"below_threshold"`
	Canceled       int64 `json:"canceled"`
	// NoRoom found no host pages to fetch into; Stale fetched pages whose
	// prefix had left L2 by the time they arrived, and dropped them.
	NoRoom int64 `json:"no_room,omitempty"`
	Stale  int64 `json:"stale,omitempty"`
}

// PoolL3Status is one pool's L3 registration state.
type PoolL3Status struct {
	Pool    string `json:"pool"`
	Enabled bool   `json:"enabled"`
	// Reason says why L3 is disabled for the pool, and what to change.
	Reason string `json:"reason,omitempty"`
}

// Duration is a time.Duration that reads as seconds in JSON.
type Duration time.Duration

// MarshalJSON writes the duration as fractional seconds.
func (d Duration) MarshalJSON() ([]byte, error) {
	return []byte(formatSeconds(time.Duration(d))), nil
}

// UnmarshalJSON reads fractional seconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s float64
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	*d = Duration(s * float64(time.Second))
	return nil
}

func formatSeconds(d time.Duration) string {
	return strconvFloat(d.Seconds())
}
