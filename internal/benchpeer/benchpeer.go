// Package benchpeer puts a benchmark beside its physical limit or a real peer in the
// same run, so that figures are ratios that survive a noisy or different machine.
package benchpeer

import (
	"testing"
	"time"
)

// Report times peer for as many iterations as the benchmark ran and reports
// peerTime/benchTime as the metric unit (for example "x-of-memcpy"): 1.0 means as
// fast as the peer, 0.5 half as fast. Call it after the benchmark loop.
func Report(b *testing.B, unit string, peer func()) float64 {
	b.Helper()
	ours := b.Elapsed()
	n := b.N
	if n < 1 || ours <= 0 {
		return 0
	}
	peer() // warm the peer the way the benchmark loop was warmed by its first iteration
	start := time.Now()
	for i := 0; i < n; i++ {
		peer()
	}
	theirs := time.Since(start)
	ratio := float64(theirs) / float64(ours)
	b.ReportMetric(ratio, unit)
	return ratio
}

// ReportCost is Report's inverse: it reports benchTime/peerTime, for figures stated
// as "at most k times the peer's time".
func ReportCost(b *testing.B, unit string, peer func()) float64 {
	b.Helper()
	ours := b.Elapsed()
	n := b.N
	if n < 1 || ours <= 0 {
		return 0
	}
	peer()
	start := time.Now()
	for i := 0; i < n; i++ {
		peer()
	}
	theirs := time.Since(start)
	cost := float64(ours) / float64(theirs)
	b.ReportMetric(cost, unit)
	return cost
}
