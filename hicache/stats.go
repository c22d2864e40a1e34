package hicache

import "time"

// Stats is a snapshot of a cache's counters.
type Stats struct {
	// Requests is the number of Match calls.
	Requests int64 `json:"requests"`
	// PromptTokens is the sum of the token counts given to Match.
	PromptTokens int64 `json:"promptTokens"`
	// HitTokens counts matched tokens by the tier they were found in: L1 (already on
	// the device) and L2 (loaded back from host memory).
	HitTokensL1 int64 `json:"hitTokensL1"`
	HitTokensL2 int64 `json:"hitTokensL2"`
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
	// EvictionTime is the wall time spent choosing and releasing victims (and, with
	// write-back, waiting for their backups).
	EvictionTime time.Duration `json:"evictionTime"`

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
}

// Transfers counts copies between two tiers.
type Transfers struct {
	Transfers int64         `json:"transfers"`
	Pages     int64         `json:"pages"`
	Bytes     int64         `json:"bytes"`
	Elapsed   time.Duration `json:"elapsed"`
}
