package storagebench

import (
	"slices"
	"strconv"
	"time"
)

// RatioSpread is a ratio taken batch by batch: the backend and its peer move the
// same bytes of each batch one right after the other (their order rotated from
// batch to batch), so each batch gives one ratio of two runs that met the same
// machine. The median is the figure; the min-max range says how much the machine
// moved under it, which one ratio of two totals would hide.
type RatioSpread struct {
	Median  float64 `json:"median"`
	Min     float64 `json:"min"`
	Max     float64 `json:"max"`
	Batches int     `json:"batches"`
}

// pairedRatios is the backend's bandwidth over its peer's, batch by batch: the
// peer's time over the backend's, as both moved the same bytes. Where several
// peers are given, each batch is compared with the fastest of them on that batch,
// so the ratio is against the stronger way of doing the job, not the one that
// happened to suit the backend. Batches missing from any side are left out;
// a batch with a zero time on either side gives no ratio.
func pairedRatios(ours []time.Duration, peers ...[]time.Duration) *RatioSpread {
	n := len(ours)
	for _, p := range peers {
		n = min(n, len(p))
	}
	if len(peers) == 0 || n == 0 {
		return nil
	}
	ratios := make([]float64, 0, n)
	for i := range n {
		best := peers[0][i]
		for _, p := range peers[1:] {
			best = min(best, p[i])
		}
		if ours[i] <= 0 || best <= 0 {
			continue
		}
		ratios = append(ratios, float64(best)/float64(ours[i]))
	}
	return summarizeRatios(ratios)
}

// summarizeRatios sorts ratios and returns their median and range; the median of
// an even count is the mean of the middle two. Nil for no ratios.
func summarizeRatios(ratios []float64) *RatioSpread {
	if len(ratios) == 0 {
		return nil
	}
	slices.Sort(ratios)
	n := len(ratios)
	med := ratios[n/2]
	if n%2 == 0 {
		med = (ratios[n/2-1] + ratios[n/2]) / 2
	}
	return &RatioSpread{Median: med, Min: ratios[0], Max: ratios[n-1], Batches: n}
}

// formatRatioSpread renders "0.91x (0.85-0.95)", or "-" when nothing was measured.
func formatRatioSpread(s *RatioSpread) string {
	if s == nil || s.Median <= 0 {
		return "-"
	}
	if s.Batches < 2 {
		return formatRatio(s.Median)
	}
	return formatRatio(s.Median) + " (" + strconv.FormatFloat(s.Min, 'f', 2, 64) + "-" + strconv.FormatFloat(s.Max, 'f', 2, 64) + ")"
}

// orMedian is s, or, for a report without batch ratios (one built by hand or
// read from an older run), the single ratio v.
func orMedian(s *RatioSpread, v float64) *RatioSpread {
	if s != nil {
		return s
	}
	return &RatioSpread{Median: v, Min: v, Max: v, Batches: 1}
}

// medianOr is the spread's median, or v when there is none.
func medianOr(s *RatioSpread, v float64) float64 {
	if s == nil {
		return v
	}
	return s.Median
}
