package radix

import (
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"

	"github.com/stratakv/strata/internal/benchpeer"
	"github.com/stratakv/strata/pageid"
)

const (
	benchPage   = 64
	benchPrefix = 131072
)

func randomTokens(r *rand.Rand, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = r.Uint32N(151936)
	}
	return t
}

// benchTree holds a 131072-token sequence and 64 branches of 16384 tokens that leave
// it every 2048 tokens: 1.18M cached tokens, the main path cut into 65 nodes.
func benchTree(b *testing.B) (*Tree[uint32], []uint32) {
	r := rand.New(rand.NewPCG(1, 2))
	tree, err := New[uint32](Config{PageSize: benchPage, MaxPages: 1 << 17})
	if err != nil {
		b.Fatal(err)
	}
	next := pageid.ID(0)
	devPages := func(n int) []pageid.ID {
		out := make([]pageid.ID, n)
		for i := range out {
			out[i] = next
			next++
		}
		return out
	}
	main := randomTokens(r, benchPrefix)
	if _, err := tree.Insert(noNS, main, devPages(benchPrefix/benchPage), nil); err != nil {
		b.Fatal(err)
	}
	for i := 0; i < 64; i++ {
		at := (i + 1) * 2048
		branch := append(slices.Clone(main[:at]), randomTokens(r, 16384)...)
		dev := tree.Match(noNS, branch).AppendDevice(nil)
		if _, err := tree.Insert(noNS, branch, append(dev, devPages(16384/benchPage)...), nil); err != nil {
			b.Fatal(err)
		}
	}
	return tree, main
}

// BenchmarkMatch131072 is the figure: matching a 131072-token prefix in a tree
// of over 1M cached tokens, against a plain comparison of the same token arrays
// (the runtime's vectorised memequal over their bytes, the fastest comparison Go
// has), alternated round by round. Target: cost-vs-compare at most 1.5.
func BenchmarkMatch131072(b *testing.B) {
	tree, main := benchTree(b)
	query := slices.Clone(main)
	var m Match[uint32]
	benchpeer.CompareCost(b, "cost-vs-compare", func(int) {
		m = tree.Match(noNS, query)
	}, func(int) {
		if !equalElems(query, main) {
			b.Fatal("unequal")
		}
	}, benchpeer.Options{})
	if m.Pages != benchPrefix/benchPage {
		b.Fatalf("matched %d pages", m.Pages)
	}
	b.ReportMetric(float64(len(m.Spans())), "nodes-on-path")
}

// BenchmarkInsert131072 inserts 131072-token sequences that leave the main path half
// way (a split, 65536 new tokens stored), in batches of 32 distinct sequences that
// are removed untimed between batches, against a plain comparison of each
// sequence with an equal copy, alternated round by round. Target: cost-vs-compare
// at most 2.
func BenchmarkInsert131072(b *testing.B) {
	tree, main := benchTree(b)
	const batch = 32
	r := rand.New(rand.NewPCG(3, 4))
	seqs := make([][]uint32, batch)
	clones := make([][]uint32, batch)
	for i := range seqs {
		seqs[i] = slices.Clone(main)
		copy(seqs[i][benchPrefix/2:], randomTokens(r, benchPrefix/2))
		clones[i] = slices.Clone(seqs[i])
	}
	dev := make([]pageid.ID, benchPrefix/benchPage)
	shared := tree.Match(noNS, main[:benchPrefix/2]).AppendDevice(nil)
	copy(dev, shared)
	for i := len(shared); i < len(dev); i++ {
		dev[i] = pageid.ID(1<<30 + i)
	}
	var inserted []*Node[uint32]
	// The peer compares the same arrays the inserts read, in the same rotation, so
	// both meet the same cache state.
	benchpeer.CompareCost(b, "cost-vs-compare", func(i int) {
		res, err := tree.Insert(noNS, seqs[i%batch], dev, nil)
		if err != nil || res.NewPages != len(dev)-len(shared) {
			b.Fatalf("insert: %v %+v", err, res.NewPages)
		}
		inserted = append(inserted, res.New[0])
	}, func(i int) {
		i = max(i, 0) // the peer's warm-up call has index -1
		if !equalElems(seqs[i%batch], clones[i%batch]) {
			b.Fatal("unequal")
		}
	}, benchpeer.Options{Setup: func(i int, peer bool) {
		if peer || len(inserted) < batch {
			return
		}
		for _, n := range inserted {
			if _, _, err := tree.Remove(n); err != nil {
				b.Fatal(err)
			}
		}
		inserted = inserted[:0]
	}})
}

// BenchmarkHeapPerPage reports the Go heap the tree spends per cached page (the
// token ids live in the mapped token arena, not on the heap): for long sequences
// (few large nodes) and for a bushy tree where every node is a single page.
func BenchmarkHeapPerPage(b *testing.B) {
	shapes := []struct {
		name      string
		seqs, len int
		branchAt  func(i int) int
	}{
		{"long", 64, 16384, func(i int) int { return 0 }},
		{"one-page-nodes", 16384, 2 * benchPage, func(i int) int { return benchPage }},
	}
	for _, shape := range shapes {
		b.Run(shape.name, func(b *testing.B) {
			var perPage float64
			for i := 0; i < b.N; i++ {
				r := rand.New(rand.NewPCG(5, 6))
				seqs := make([][]uint32, shape.seqs)
				// Bushy: 128 first pages, each followed by 128 distinct second pages.
				firsts := make([][]uint32, 128)
				for j := range firsts {
					firsts[j] = randomTokens(r, benchPage)
				}
				for j := range seqs {
					if shape.branchAt(j) > 0 {
						seqs[j] = append(slices.Clone(firsts[j%128]), randomTokens(r, shape.len-benchPage)...)
					} else {
						seqs[j] = randomTokens(r, shape.len)
					}
				}
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				tree, err := New[uint32](Config{PageSize: benchPage, MaxPages: 1 << 15})
				if err != nil {
					b.Fatal(err)
				}
				next := pageid.ID(0)
				for _, s := range seqs {
					dev := tree.Match(noNS, s).AppendDevice(nil)
					for len(dev) < len(s)/benchPage {
						dev = append(dev, next)
						next++
					}
					if _, err := tree.Insert(noNS, s, dev, nil); err != nil {
						b.Fatal(err)
					}
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				heap := int64(after.HeapAlloc) - int64(before.HeapAlloc)
				perPage = float64(heap) / float64(tree.DevicePages())
				b.ReportMetric(float64(tree.DevicePages()), "pages")
				b.ReportMetric(float64(tree.Nodes()), "nodes")
				runtime.KeepAlive(tree)
				runtime.KeepAlive(seqs)
				tree.Close()
			}
			b.ReportMetric(perPage, "heap-bytes/page")
		})
	}
}
