package hicache

import (
	"fmt"
	"strings"

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
}

// DefaultConfig returns SGLang's defaults: 64-token pages, LRU, write-through, a
// 10-token load-back threshold, and a copy engine on every core.
func DefaultConfig() Config {
	return Config{
		PageSize:              64,
		Eviction:              radix.LRU,
		WritePolicy:           WriteThrough,
		WriteThroughThreshold: 2,
		LoadBackMinTokens:     10,
		Copy:                  pool.DefaultCopyConfig(),
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
