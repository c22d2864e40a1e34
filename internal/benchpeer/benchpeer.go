// Package benchpeer puts a benchmark beside its physical limit or a real peer in the
// same run, so that figures are ratios that survive a noisy or different machine.
//
// The two sides alternate (A B A B ...) in rounds, and every round gives one ratio:
// a peer timed after the whole benchmark loop meets a different machine on a busy
// host (other processes, a warmer or colder cache), and single ratios then swing
// from run to run. The median of the rounds is the figure; the min-max range says
// how much the machine moved under it.
package benchpeer

import (
	"slices"
	"testing"
	"time"
)

// rounds is how many A/B rounds a benchmark's b.N iterations are split into when
// b.N allows; each round gives one ratio.
const rounds = 25

// Result is the per-round ratios of one comparison.
type Result struct {
	Median, Min, Max float64
	Rounds           int
}

// Options adjusts a comparison. The zero value is ready to use.
type Options struct {
	// Setup, when not nil, runs untimed before every call of either side, with the
	// call's iteration index and whether the call is the peer's: for work that
	// neither side should be charged, such as emptying a server between batches.
	Setup func(i int, peer bool)
}

// Compare runs the benchmark loop itself: b.N calls of ours, and as many of peer,
// in alternating rounds. Only ours counts towards ns/op. It reports the median of
// the per-round ratios peerTime/oursTime as unit (for example "x-of-memcpy": 1.0 is
// as fast as the peer, 0.5 half as fast) and their range as unit-min and unit-max.
// Each call gets its iteration index. The peer runs once before the first round, to
// be warmed the way ours is warmed by its first call. Call it instead of writing a
// loop over b.N, after the benchmark's setup.
func Compare(b *testing.B, unit string, ours, peer func(i int), opt Options) Result {
	b.Helper()
	return CompareAll(b, ours, []Peer{{Unit: unit, Run: peer}}, opt)[0]
}

// CompareCost is Compare with the inverse ratio, oursTime/peerTime, for figures
// stated as "at most k times the peer's time".
func CompareCost(b *testing.B, unit string, ours, peer func(i int), opt Options) Result {
	b.Helper()
	return CompareAll(b, ours, []Peer{{Unit: unit, Run: peer, Cost: true}}, opt)[0]
}

// Peer is one side that ours is compared with.
type Peer struct {
	// Unit names the reported ratio, such as "x-of-memcpy".
	Unit string
	// Run does one iteration of the peer's work.
	Run func(i int)
	// Cost reports oursTime/peerTime instead of peerTime/oursTime.
	Cost bool
}

// CompareAll is Compare against several peers at once: every round runs ours and
// then each peer in turn, so all of them meet the same machine. Results are in the
// order of peers.
func CompareAll(b *testing.B, ours func(i int), peers []Peer, opt Options) []Result {
	b.Helper()
	b.StopTimer()
	timed := func(f func(int), i int) time.Duration {
		if opt.Setup != nil {
			opt.Setup(i, true)
		}
		start := time.Now()
		f(i)
		return time.Since(start)
	}
	for _, p := range peers {
		timed(p.Run, -1) // warm-up: index -1 is never a real iteration
	}
	chunk := max(1, (b.N+rounds-1)/rounds)
	ratios := make([][]float64, len(peers))
	b.ResetTimer()
	for done := 0; done < b.N; done += chunk {
		k := min(chunk, b.N-done)
		var a time.Duration
		if opt.Setup == nil {
			// Start and StopTimer read the memory statistics, which stops the
			// world: once per round, not once per call, when nothing runs between.
			b.StartTimer()
			start := time.Now()
			for i := done; i < done+k; i++ {
				ours(i)
			}
			a = time.Since(start)
			b.StopTimer()
		} else {
			for i := done; i < done+k; i++ {
				opt.Setup(i, false)
				b.StartTimer()
				start := time.Now()
				ours(i)
				a += time.Since(start)
				b.StopTimer()
			}
		}
		a = max(a, 1)
		for j, p := range peers {
			var t time.Duration
			for i := done; i < done+k; i++ {
				t += timed(p.Run, i)
			}
			t = max(t, 1)
			if p.Cost {
				ratios[j] = append(ratios[j], float64(a)/float64(t))
			} else {
				ratios[j] = append(ratios[j], float64(t)/float64(a))
			}
		}
	}
	res := make([]Result, len(peers))
	for j, p := range peers {
		res[j] = summarize(ratios[j])
		b.ReportMetric(res[j].Median, p.Unit)
		b.ReportMetric(res[j].Min, p.Unit+"-min")
		b.ReportMetric(res[j].Max, p.Unit+"-max")
	}
	return res
}

// summarize sorts ratios and returns their median and range; the median of an even
// count is the mean of the middle two.
func summarize(ratios []float64) Result {
	if len(ratios) == 0 {
		return Result{}
	}
	slices.Sort(ratios)
	n := len(ratios)
	med := ratios[n/2]
	if n%2 == 0 {
		med = (ratios[n/2-1] + ratios[n/2]) / 2
	}
	return Result{Median: med, Min: ratios[0], Max: ratios[n-1], Rounds: n}
}
