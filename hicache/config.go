package hicache

import (
	"fmt"
	"strings"
	"time"

	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/radix"
)

// WritePolicy says when pages are backed up from L1 to L2.
type WritePolicy uint8

const (
	// WriteThrough backs up every page when it is inserted: L1 evictions never wait,
	// at the cost of copying pages that are never reused.
	WriteThrough WritePolicy = iota
	// WriteThroughSelective backs up a page once it has been hit
	// WriteThroughThreshold times: only reused prefixes cost host bandwidth.
	WriteThroughSelective
	// WriteBack backs up a page only when it is evicted from L1, and the eviction
	// waits for the copy.
	WriteBack
)

// ParseWritePolicy accepts SGLang's spellings: write_through,
// write_through_selective, write_back.
func ParseWritePolicy(s string) (WritePolicy, error) {
	switch strings.ToLower(strings.ReplaceAll(s, "-", "_")) {
	case "write_through":
		return WriteThrough, nil
	case "write_through_selective":
		return WriteThroughSelective, nil
	case "write_back":
		return WriteBack, nil
	}
	return 0, fmt.Errorf("write policy %q: want write_through, write_through_selective or write_back: %w", s, ErrConfig)
}

// String returns SGLang's spelling.
func (p WritePolicy) String() string {
	switch p {
	case WriteThroughSelective:
		return "write_through_selective"
	case WriteBack:
		return "write_back"
	}
	return "write_through"
}

// Config tunes a Cache.
type Config struct {
	// PageSize is tokens per page; it must equal the pools' page size.
	PageSize int `json:"pageSize"`
	// Bigram keys the tree by EAGLE bigrams (t[i], t[i+1]) instead of tokens, as
	// SGLang does when the draft model's KV is cached: a sequence of n tokens has
	// n-1 cacheable positions.
	Bigram bool `json:"bigram"`
	// Eviction orders victims in both tiers.
	Eviction radix.Policy `json:"eviction"`
	// WritePolicy says when L1 pages are backed up to L2.
	WritePolicy WritePolicy `json:"writePolicy"`
	// WriteThroughThreshold is the hit count at which WriteThroughSelective backs a
	// page up. SGLang uses 2.
	WriteThroughThreshold int `json:"writeThroughThreshold"`
	// LoadBackMinTokens is the shortest L2 hit worth loading into L1; shorter hits
	// are recomputed, because a small copy costs about what its prefill does. SGLang
	// uses 10 tokens; anything up to a page or two is reasonable.
	LoadBackMinTokens int `json:"loadBackMinTokens"`
	// Copy sizes the copy engine that moves pages between L1 and L2.
	Copy pool.CopyConfig `json:"copy"`
	// KeyAlgorithm is the page-key chain that names pages in L3: SHA256 shares
	// keys with SGLang, XXH3 is faster.
	KeyAlgorithm pagekey.Algorithm `json:"keyAlgorithm"`
	// L3 tunes the L3 tier; it applies when Options.Storage is set.
	L3 L3Config `json:"l3"`
	// CloseTimeout bounds Cache.Close: how long it waits for copies and L3 calls
	// in flight to finish before it abandons them (a backend that ignores
	// canceled contexts would hold it forever). 0 means 10 s.
	CloseTimeout time.Duration `json:"closeTimeout"`
}

// defaultCloseTimeout is Close's guard when Config.CloseTimeout is 0.
const defaultCloseTimeout = 10 * time.Second

func (c Config) closeTimeout() time.Duration {
	if c.CloseTimeout == 0 {
		return defaultCloseTimeout
	}
	return c.CloseTimeout
}

// DefaultConfig returns SGLang's defaults: 64-token pages, LRU, write-through, a
// 10-token load-back threshold, and a copy engine on every core; Close waits at
// most 10 s.
func DefaultConfig() Config {
	return Config{
		PageSize:              64,
		Eviction:              radix.LRU,
		WritePolicy:           WriteThrough,
		WriteThroughThreshold: 2,
		LoadBackMinTokens:     10,
		Copy:                  pool.DefaultCopyConfig(),
		KeyAlgorithm:          pagekey.SHA256,
		L3:                    DefaultL3Config(),
		CloseTimeout:          defaultCloseTimeout,
	}
}

// Validate reports whether c can run.
func (c Config) Validate() error {
	if c.PageSize < 1 {
		return fmt.Errorf("page size %d: want at least 1: %w", c.PageSize, ErrConfig)
	}
	if c.Eviction != radix.LRU && c.Eviction != radix.LFU {
		return fmt.Errorf("eviction policy %d: %w", c.Eviction, ErrConfig)
	}
	if c.WritePolicy > WriteBack {
		return fmt.Errorf("write policy %d: %w", c.WritePolicy, ErrConfig)
	}
	if c.WritePolicy == WriteThroughSelective && c.WriteThroughThreshold < 1 {
		return fmt.Errorf("write-through threshold %d: want at least 1 hit: %w", c.WriteThroughThreshold, ErrConfig)
	}
	if c.LoadBackMinTokens < 0 {
		return fmt.Errorf("load-back threshold %d tokens: must not be negative: %w", c.LoadBackMinTokens, ErrConfig)
	}
	if c.KeyAlgorithm != pagekey.SHA256 && c.KeyAlgorithm != pagekey.XXH3 {
		return fmt.Errorf("key algorithm %v: %w", c.KeyAlgorithm, ErrConfig)
	}
	if c.CloseTimeout < 0 {
		return fmt.Errorf("close timeout %v: must not be negative (0 means %v): %w", c.CloseTimeout, defaultCloseTimeout, ErrConfig)
	}
	return nil
}

// positions is the number of cacheable key positions of n tokens.
func (c Config) positions(n int) int {
	if c.Bigram {
		return max(n-1, 0)
	}
	return n
}

// pages is the number of whole pages of n tokens.
func (c Config) pages(n int) int { return c.positions(n) / c.PageSize }

// PrefetchPolicy says how long a request waits for its L3 prefetch.
type PrefetchPolicy uint8

const (
	// BestEffort runs the request as soon as it is scheduled with whatever the
	// prefetch has finished, and cancels the rest.
	BestEffort PrefetchPolicy = iota
	// WaitComplete waits for the whole prefetch (bounded by the caller's context).
	WaitComplete
	// Timeout waits until the prefetch's deadline, min(max, base + per1K *
	// tokens/1024) after it started, then cancels what is left.
	Timeout
)

// ParsePrefetchPolicy accepts best_effort, wait_complete and timeout.
func ParsePrefetchPolicy(s string) (PrefetchPolicy, error) {
	switch strings.ToLower(strings.ReplaceAll(s, "-", "_")) {
	case "best_effort":
		return BestEffort, nil
	case "wait_complete":
		return WaitComplete, nil
	case "timeout":
		return Timeout, nil
	}
	return 0, fmt.Errorf("prefetch policy %q: want best_effort, wait_complete or timeout: %w", s, ErrConfig)
}

// String returns the policy's spelling.
func (p PrefetchPolicy) String() string {
	switch p {
	case WaitComplete:
		return "wait_complete"
	case Timeout:
		return "timeout"
	}
	return "best_effort"
}

// DraftPolicy says what an L3 hit needs from the draft pools.
type DraftPolicy uint8

const (
	// DraftRequired counts an L3 hit only for the leading pages every L3-enabled
	// pool has. When a draft pool runs without L3, target hits are served and the
	// draft KV of those pages is marked for recompute.
	DraftRequired DraftPolicy = iota
	// DraftBestEffort counts the target's pages and loads the draft pages that
	// exist; the engine recomputes the draft KV of the rest.
	DraftBestEffort
)

// ParseDraftPolicy accepts required and best_effort.
func ParseDraftPolicy(s string) (DraftPolicy, error) {
	switch strings.ToLower(strings.ReplaceAll(s, "-", "_")) {
	case "required":
		return DraftRequired, nil
	case "best_effort":
		return DraftBestEffort, nil
	}
	return 0, fmt.Errorf("draft policy %q: want required or best_effort: %w", s, ErrConfig)
}

// String returns the policy's spelling.
func (p DraftPolicy) String() string {
	if p == DraftBestEffort {
		return "best_effort"
	}
	return "required"
}

// L3Config tunes the L3 tier: prefetch into L2 and backup from L2.
type L3Config struct {
	// PrefetchThreshold is the shortest L3 hit, in tokens, worth prefetching.
	PrefetchThreshold int `json:"prefetchThreshold"`
	// PrefetchPolicy says how long a request waits for its prefetch.
	PrefetchPolicy PrefetchPolicy `json:"prefetchPolicy"`
	// PrefetchTimeoutBase, PrefetchTimeoutPer1K and PrefetchTimeoutMax set the
	// Timeout policy's deadline: min(max, base + per1K * tokens/1024).
	PrefetchTimeoutBase  time.Duration `json:"prefetchTimeoutBase"`
	PrefetchTimeoutPer1K time.Duration `json:"prefetchTimeoutPer1K"`
	PrefetchTimeoutMax   time.Duration `json:"prefetchTimeoutMax"`
	// PrefetchCapacity is the fraction of the host pool that prefetches may hold
	// at once; the rest stays for L1 backups. SGLang-sized L2 (2-4x L1) does well
	// with half.
	PrefetchCapacity float64 `json:"prefetchCapacity"`
	// DraftPolicy says what an L3 hit needs from the draft pools.
	DraftPolicy DraftPolicy `json:"draftPolicy"`
	// CallTimeout bounds every storage call; a slow or dead backend gives misses.
	CallTimeout time.Duration `json:"callTimeout"`
	// RegisterTimeout bounds each pool's registration at construction.
	RegisterTimeout time.Duration `json:"registerTimeout"`
	// Workers is the number of goroutines that talk to the backend; prefetches go
	// ahead of backups. Size it to the backend's useful parallelism (an NVMe
	// directory: 4; a network store: more).
	Workers int `json:"workers"`
	// BackupQueuePages bounds the pages waiting to be backed up to L3; beyond it
	// backups are skipped (and counted) rather than queued. 0 means the host pool.
	BackupQueuePages int `json:"backupQueuePages"`
	// Names spells object names: model prefix and tensor-parallel rank.
	Names pagekey.Names `json:"names"`
}

// DefaultL3Config returns SGLang's defaults: a 256-token threshold, the timeout
// policy with 2 s + 0.1 s per 1024 tokens capped at 30 s, half the host pool for
// prefetch, required draft pages, 5 s per call, 4 workers.
func DefaultL3Config() L3Config {
	return L3Config{
		PrefetchThreshold:    256,
		PrefetchPolicy:       Timeout,
		PrefetchTimeoutBase:  2 * time.Second,
		PrefetchTimeoutPer1K: 100 * time.Millisecond,
		PrefetchTimeoutMax:   30 * time.Second,
		PrefetchCapacity:     0.5,
		DraftPolicy:          DraftRequired,
		CallTimeout:          5 * time.Second,
		RegisterTimeout:      10 * time.Second,
		Workers:              4,
	}
}

// Validate reports whether c can run.
func (c L3Config) Validate() error {
	switch {
	case c.PrefetchThreshold < 0:
		return fmt.Errorf("prefetch threshold %d tokens: must not be negative: %w", c.PrefetchThreshold, ErrConfig)
	case c.PrefetchPolicy > Timeout:
		return fmt.Errorf("prefetch policy %d: %w", c.PrefetchPolicy, ErrConfig)
	case c.DraftPolicy > DraftBestEffort:
		return fmt.Errorf("draft policy %d: %w", c.DraftPolicy, ErrConfig)
	case c.PrefetchTimeoutBase < 0 || c.PrefetchTimeoutPer1K < 0 || c.PrefetchTimeoutMax < c.PrefetchTimeoutBase:
		return fmt.Errorf("prefetch timeout base %v, per 1K %v, max %v: want non-negative and max >= base: %w",
			c.PrefetchTimeoutBase, c.PrefetchTimeoutPer1K, c.PrefetchTimeoutMax, ErrConfig)
	case c.PrefetchCapacity <= 0 || c.PrefetchCapacity > 1:
		return fmt.Errorf("prefetch capacity %v of the host pool: want (0, 1]: %w", c.PrefetchCapacity, ErrConfig)
	case c.CallTimeout <= 0 || c.RegisterTimeout <= 0:
		return fmt.Errorf("call timeout %v, register timeout %v: want positive: %w", c.CallTimeout, c.RegisterTimeout, ErrConfig)
	case c.Workers < 1 || c.Workers > 256:
		return fmt.Errorf("%d L3 workers: want 1 to 256: %w", c.Workers, ErrConfig)
	case c.BackupQueuePages < 0:
		return fmt.Errorf("backup queue of %d pages: must not be negative: %w", c.BackupQueuePages, ErrConfig)
	}
	return nil
}

// deadline is the Timeout policy's wait for a prefetch of tokens tokens.
func (c L3Config) deadline(tokens int) time.Duration {
	d := c.PrefetchTimeoutBase + time.Duration(float64(c.PrefetchTimeoutPer1K)*float64(tokens)/1024)
	return min(d, c.PrefetchTimeoutMax)
}
