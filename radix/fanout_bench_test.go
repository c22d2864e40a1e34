package radix

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"

	"github.com/stratakv/strata/internal/benchpeer"
	"github.com/stratakv/strata/pageid"
)

// The commonest shape of a cache: one shared prefix (a system prompt) and many
// different continuations under it, so one node with a very wide fan-out.
const (
	fanoutPrefixPages = 8
	fanoutBranchPages = 2
	fanoutQueries     = 1024
)

// fanoutTree caches a prefix of fanoutPrefixPages pages with children branches of
// fanoutBranchPages pages under it, each starting with its own random page.
func fanoutTree(b *testing.B, children int) (*Tree[uint32], []uint32) {
	b.Helper()
	r := rand.New(rand.NewPCG(uint64(children), 7))
	tree, err := New[uint32](Config{PageSize: benchPage, MaxPages: fanoutPrefixPages + children*fanoutBranchPages})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { tree.Close() })
	prefix := randomTokens(r, fanoutPrefixPages*benchPage)
	dev := make([]pageid.ID, fanoutPrefixPages+fanoutBranchPages)
	for i := range fanoutPrefixPages {
		dev[i] = pageid.ID(i)
	}
	next := pageid.ID(fanoutPrefixPages)
	key := slices.Clone(prefix)
	for range children {
		key = append(key[:len(prefix)], randomTokens(r, fanoutBranchPages*benchPage)...)
		for i := fanoutPrefixPages; i < len(dev); i++ {
			dev[i] = next
			next++
		}
		if _, err := tree.Insert(noNS, key, dev, nil); err != nil {
			b.Fatal(err)
		}
	}
	if got := len(tree.Match(noNS, prefix).Last.Children()); got != children {
		b.Fatalf("prefix has %d children, want %d", got, children)
	}
	return tree, prefix
}

// newBranches returns queries that follow prefix and then leave the tree: each is a
// branch no request has taken yet, so the child lookup under the prefix misses.
func newBranches(prefix []uint32) [][]uint32 {
	r := rand.New(rand.NewPCG(11, 13))
	out := make([][]uint32, fanoutQueries)
	for i := range out {
		out[i] = append(slices.Clone(prefix), randomTokens(r, fanoutBranchPages*benchPage)...)
	}
	return out
}

// BenchmarkMatchNewBranch matches requests that share the prefix and then take a
// new branch, under prefixes of 256 to 64k children, against the same matches under
// 256 children, alternated round by round. The figure is x-of-256-children
// at 64k children: a child lookup that costs the same for any fan-out keeps it
// near 1 (target: at most 2). An iteration is fanoutBatch matches, so that timing
// each call costs nothing beside them; ns/match is the time of one.
func BenchmarkMatchNewBranch(b *testing.B) {
	const fanoutBatch = 64
	base, basePrefix := fanoutTree(b, 256)
	baseQueries := newBranches(basePrefix)
	for _, children := range []int{256, 4 << 10, 16 << 10, 64 << 10} {
		// The function of b.Run runs once per b.N tried: build the tree once.
		tree, prefix := fanoutTree(b, children)
		queries := newBranches(prefix)
		b.Run(fmt.Sprintf("children=%d", children), func(b *testing.B) {
			match := func(tree *Tree[uint32], queries [][]uint32) func(int) {
				return func(i int) {
					i = max(i, 0) // the peer's warm-up call has index -1
					for j := range fanoutBatch {
						q := queries[(i*fanoutBatch+j)%fanoutQueries]
						if m := tree.Match(noNS, q); m.Pages != fanoutPrefixPages {
							b.Fatalf("matched %d pages, want the %d of the prefix", m.Pages, fanoutPrefixPages)
						}
					}
				}
			}
			benchpeer.CompareCost(b, "x-of-256-children", match(tree, queries), match(base, baseQueries), benchpeer.Options{})
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*fanoutBatch), "ns/match")
		})
	}
}

// BenchmarkInsertFanout1M inserts 1M pages in the one-prefix-many-branches shape: an
// 8-page prefix and 65536 branches of 16 pages, each insert a new child of the
// prefix, into an empty tree per iteration. It reports pages inserted per second
// and the Go heap the tree holds per page at the end.
func BenchmarkInsertFanout1M(b *testing.B) {
	const (
		branchPages = 16
		branches    = 1 << 16
		batch       = 4096 // branches whose keys are drawn, untimed, at a time
	)
	r := rand.New(rand.NewPCG(17, 19))
	prefix := randomTokens(r, fanoutPrefixPages*benchPage)
	suffixes := make([]uint32, batch*branchPages*benchPage)
	key := make([]uint32, 0, len(prefix)+branchPages*benchPage)
	dev := make([]pageid.ID, fanoutPrefixPages+branchPages)
	var perPage float64
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		tree, err := New[uint32](Config{PageSize: benchPage, MaxPages: fanoutPrefixPages + branches*branchPages})
		if err != nil {
			b.Fatal(err)
		}
		for i := range fanoutPrefixPages {
			dev[i] = pageid.ID(i)
		}
		next := pageid.ID(fanoutPrefixPages)
		b.StartTimer()
		for i := range branches {
			if i%batch == 0 {
				b.StopTimer()
				for j := range suffixes {
					suffixes[j] = r.Uint32N(151936)
				}
				b.StartTimer()
			}
			s := i % batch * branchPages * benchPage
			key = append(append(key[:0], prefix...), suffixes[s:s+branchPages*benchPage]...)
			for j := fanoutPrefixPages; j < len(dev); j++ {
				dev[j] = next
				next++
			}
			res, err := tree.Insert(noNS, key, dev, nil)
			if err != nil || res.NewPages != branchPages && i > 0 {
				b.Fatalf("insert %d: %v, %d new pages", i, err, res.NewPages)
			}
		}
		b.StopTimer()
		if tree.Pages() != fanoutPrefixPages+branches*branchPages {
			b.Fatalf("tree holds %d pages", tree.Pages())
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		perPage = float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(tree.Pages())
		runtime.KeepAlive(tree)
		tree.Close()
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)*float64(fanoutPrefixPages+branches*branchPages)/b.Elapsed().Seconds(), "pages/s")
	b.ReportMetric(perPage, "heap-bytes/page")
}
