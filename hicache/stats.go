package hicache

import "time"

// Stats is a snapshot of a cache's counters.
type Stats struct {
	// Requests is the number of Match calls.
	Requests int64 `json:"requests"`
	// PromptTokens is the sum of the token counts given to Match.
	PromptTokens int64 `json:"promptTokens"`
	// HitTokens counts matched tokens by the tier they were found in: L1 (already on
	// the device), L2 (loaded back from host memory), L3 (fetched from storage by the
	// request's own prefetch, then loaded like L2 hits).
	HitTokensL1 int64 `json:"hitTokensL1"`
	HitTokensL2 int64 `json:"hitTokensL2"`
	HitTokensL3 int64 `json:"hitTokensL3"`
	// DraftRecomputeTokens counts hit tokens whose draft KV the engine had to
	// recompute because a draft pool runs without L3.
	DraftRecomputeTokens int64 `json:"draftRecomputeTokens"`
	// SkippedL2Tokens counts L2 hits below the load-back threshold or that found no
	// room in L1; they were recomputed.
	SkippedL2Tokens int64 `json:"skippedL2Tokens"`
	// InsertedTokens counts tokens newly cached in L1.
	InsertedTokens int64 `json:"insertedTokens"`

	// LoadBack is L2→L1 traffic, Backup L1→L2 traffic.
	LoadBack Transfers `json:"loadBack"`
	Backup   Transfers `json:"backup"`
	// BackupSkipped counts pages not backed up because L2 had no room.
	BackupSkipped int64 `json:"backupSkipped"`

	// EvictedTokensL1 counts tokens evicted from L1 (kept in L2 or dropped);
	// EvictedTokensL2 tokens dropped from L2.
	EvictedTokensL1 int64 `json:"evictedTokensL1"`
	EvictedTokensL2 int64 `json:"evictedTokensL2"`
	// EvictionTime is the wall time spent choosing and releasing victims.
	EvictionTime time.Duration `json:"evictionTime"`
	// CopyWaits counts the times a Match or AllocDevice found L1 short of free
	// pages while L1→L2 copies held some (write-through backups, write-back
	// evictions) and waited for them, without holding the cache, before trying
	// again.
	CopyWaits int64 `json:"copyWaits"`
	// LoadBackSeconds is the distribution of L2→L1 load durations, one per load;
	// EvictionSeconds of evictions that freed pages.
	LoadBackSeconds Histogram `json:"loadBackSeconds"`
	EvictionSeconds Histogram `json:"evictionSeconds"`

	// DevicePages and HostPages are the pools' sizes; *Used what the cache and
	// running requests hold.
	DevicePages     int `json:"devicePages"`
	DevicePagesUsed int `json:"devicePagesUsed"`
	HostPages       int `json:"hostPages"`
	HostPagesUsed   int `json:"hostPagesUsed"`
	// TreePages is the number of distinct pages cached in any tier; TreeNodes the
	// radix tree's nodes.
	TreePages int `json:"treePages"`
	TreeNodes int `json:"treeNodes"`

	// L3 is the storage tier's activity.
	L3 L3Stats `json:"l3"`
}

// Transfers counts copies between two tiers.
type Transfers struct {
	Transfers int64         `json:"transfers"`
	Pages     int64         `json:"pages"`
	Bytes     int64         `json:"bytes"`
	Elapsed   time.Duration `json:"elapsed"`
}

// L3Stats is the storage tier's activity.
type L3Stats struct {
	// Backend names the backend; "" when the cache has no L3.
	Backend string `json:"backend"`
	// Enabled reports whether L3 serves the group (the target pool registered).
	Enabled bool `json:"enabled"`
	// Pools is each pool's registration status.
	Pools []PoolStatus `json:"pools"`
	// PrefetchedTokens counts tokens fetched from L3 into L2.
	PrefetchedTokens int64 `json:"prefetchedTokens"`
	// BackedUpTokens counts tokens written from L2 to L3 (pages L3 already had are
	// not counted).
	BackedUpTokens int64 `json:"backedUpTokens"`
	// BackupSkippedPages counts pages not backed up: the queue was full or L3 was down.
	BackupSkippedPages int64 `json:"backupSkippedPages"`
	// Refills counts the times the backend came back emptied (a node service
	// restarted cold: storage.ContentTracker) and the cache started backing up
	// again what it held in L2; RefillPages counts the pages it queued for that,
	// at the lowest priority.
	Refills     int64 `json:"refills"`
	RefillPages int64 `json:"refillPages"`
	// BytesRead and BytesWritten count object bytes moved, every pool included.
	BytesRead    int64 `json:"bytesRead"`
	BytesWritten int64 `json:"bytesWritten"`
	// Prefetch counts how prefetches ended.
	Prefetch PrefetchStats `json:"prefetch"`
	// Faults counts storage errors by kind (storage.FaultKind).
	Faults map[string]int64 `json:"faults,omitempty"`
	// ReservedPages is the host pages prefetches hold right now.
	ReservedPages int `json:"reservedPages"`
	// Down reports that calls are being skipped after the backend failed.
	Down bool `json:"down"`
}

// PoolStatus is one pool's L3 registration state.
type PoolStatus struct {
	Pool    string `json:"pool"`
	Enabled bool   `json:"enabled"`
	// Reason says why L3 is off for the pool and what to change.
	Reason string `json:"reason,omitempty"`
}

// PrefetchStats counts prefetch outcomes. Every prefetch ends in exactly one.
type PrefetchStats struct {
	Started int64 `json:"started"`
	// Joined counts prefetches that joined one already in flight for the same pages.
	Joined int64 `json:"joined"`
	// Completed brought at least one page.
	Completed int64 `json:"completed"`
	// TimedOut passed the Timeout policy's deadline; Canceled was given up by the
	// request (best effort) or by Cancel.
	TimedOut int64 `json:"timedOut"`
	Canceled int64 `json:"canceled"`
	// BelowThreshold found fewer L3 tokens than the threshold.
	BelowThreshold int64 `json:"belowThreshold"`
	// NoRoom found no host pages to reserve.
	NoRoom int64 `json:"noRoom"`
	// Failed ended in storage errors (or L3 was down).
	Failed int64 `json:"failed"`
	// Stale fetched pages whose prefix was evicted before they could be cached.
	Stale int64 `json:"stale"`
}

// Histogram is a distribution of observations in fixed buckets: Counts[i] counts
// observations <= Bounds[i] (and above the previous bound); the last count is for
// observations above every bound.
type Histogram struct {
	Bounds []float64 `json:"bounds"`
	Counts []uint64  `json:"counts"`
	Sum    float64   `json:"sum"`
	Count  uint64    `json:"count"`
}

// durationBounds are the buckets of copy and eviction durations, in seconds:
// 100 µs to 10 s.
var durationBounds = []float64{1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

func newDurationHistogram() Histogram {
	return Histogram{Bounds: durationBounds, Counts: make([]uint64, len(durationBounds)+1)}
}

func (h *Histogram) observe(v float64) {
	if h.Counts == nil {
		*h = newDurationHistogram()
	}
	i := 0
	for i < len(h.Bounds) && v > h.Bounds[i] {
		i++
	}
	h.Counts[i]++
	h.Sum += v
	h.Count++
}

// clone copies h so a snapshot does not share its counts.
func (h Histogram) clone() Histogram {
	h.Counts = append([]uint64(nil), h.Counts...)
	return h
}
