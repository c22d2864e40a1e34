package storage

import (
	"slices"
	"sync/atomic"
)

// faultKinds are the kinds FaultKind returns, in a fixed order, "io" last.
var faultKinds = [...]string{"timeout", "unavailable", "corrupt", "no_space", "not_registered", "closed", "batch", "io"}

// FaultKinds lists every kind FaultKind returns, for metrics and reports that show
// a zero for each.
func FaultKinds() []string { return slices.Clone(faultKinds[:]) }

// FaultCounts counts storage errors by FaultKind, as backends and caches report
// them. The zero value is ready; it is safe for concurrent use.
type FaultCounts struct {
	n [len(faultKinds)]atomic.Int64
}

// Add counts err under its FaultKind and returns the kind; nil and ErrNotFound
// are not faults ("" and nothing counted).
func (c *FaultCounts) Add(err error) string {
	kind := FaultKind(err)
	if kind != "" {
		c.AddKind(kind)
	}
	return kind
}

// AddAll counts every error of errs.
func (c *FaultCounts) AddAll(errs []error) {
	for _, err := range errs {
		c.Add(err)
	}
}

// AddKind counts one fault of kind; a kind FaultKind never returns counts as "io".
func (c *FaultCounts) AddKind(kind string) {
	i := slices.Index(faultKinds[:], kind)
	if i < 0 {
		i = len(faultKinds) - 1
	}
	c.n[i].Add(1)
}

// All returns the count of every kind, zeros included.
func (c *FaultCounts) All() map[string]int64 {
	out := make(map[string]int64, len(faultKinds))
	for i, k := range faultKinds {
		out[k] = c.n[i].Load()
	}
	return out
}

// NonZero returns the counts of the kinds that occurred; nil when none did.
func (c *FaultCounts) NonZero() map[string]int64 {
	var out map[string]int64
	for i, k := range faultKinds {
		if n := c.n[i].Load(); n > 0 {
			if out == nil {
				out = map[string]int64{}
			}
			out[k] = n
		}
	}
	return out
}
