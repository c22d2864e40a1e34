package benchpeer

import (
	"flag"
	"testing"
)

func TestSummarize(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want Result
	}{
		{nil, Result{}},
		{[]float64{3}, Result{Median: 3, Min: 3, Max: 3, Rounds: 1}},
		{[]float64{5, 1, 3}, Result{Median: 3, Min: 1, Max: 5, Rounds: 3}},
		{[]float64{4, 1, 2, 8}, Result{Median: 3, Min: 1, Max: 8, Rounds: 4}},
	} {
		if got := summarize(append([]float64(nil), c.in...)); got != c.want {
			t.Errorf("summarize(%v) = %+v, want %+v", c.in, got, c.want)
		}
	}
}

// Compare must call each side once per iteration, with every index in order, the
// two sides alternating in rounds rather than one after the other, and the peer
// warmed once before the first round.
func TestCompareAlternatesAndCountsCalls(t *testing.T) {
	// A fixed count, so that testing.Benchmark does not grow b.N to a second's worth
	// of empty calls.
	old := flag.Lookup("test.benchtime").Value.String()
	if err := flag.Set("test.benchtime", "60x"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { flag.Set("test.benchtime", old) })
	for _, withSetup := range []bool{false, true} {
		var calls []int // >= 0: ours(i); < 0: peer(i) as -(i+2)
		var setups, runs int
		var res Result
		var n int
		testing.Benchmark(func(b *testing.B) {
			calls, setups, runs = calls[:0], 0, runs+1
			opt := Options{}
			if withSetup {
				opt.Setup = func(int, bool) { setups++ }
			}
			res = Compare(b, "x-of-peer",
				func(i int) { calls = append(calls, i) },
				func(i int) { calls = append(calls, -(i + 2)) }, opt)
			n = b.N
		})
		if runs == 0 || n == 0 {
			t.Fatal("benchmark did not run")
		}
		if len(calls) != 2*n+1 || calls[0] != -1 {
			t.Fatalf("setup=%v: %d calls for b.N=%d, first %d; want %d calls, the peer's warm-up first", withSetup, len(calls), n, calls[0], 2*n+1)
		}
		var ours, peer []int
		switches := 0
		for j, c := range calls[1:] {
			if c >= 0 {
				ours = append(ours, c)
			} else {
				peer = append(peer, -c-2)
			}
			if j > 0 && (c >= 0) != (calls[j] >= 0) {
				switches++
			}
		}
		for i := 0; i < n; i++ {
			if ours[i] != i || peer[i] != i {
				t.Fatalf("setup=%v: call %d got ours %d, peer %d", withSetup, i, ours[i], peer[i])
			}
		}
		if want := 2*res.Rounds - 1; switches != want {
			t.Errorf("setup=%v: sides switched %d times over %d rounds, want %d", withSetup, switches, res.Rounds, want)
		}
		if n >= 2 && res.Rounds < 2 {
			t.Errorf("setup=%v: b.N=%d ran as %d round(s), want alternation", withSetup, n, res.Rounds)
		}
		if withSetup && setups != 2*n+1 {
			t.Errorf("setup ran %d times, want %d", setups, 2*n+1)
		}
		if res.Min > res.Median || res.Median > res.Max || res.Min <= 0 {
			t.Errorf("setup=%v: result %+v out of order", withSetup, res)
		}
	}
}
