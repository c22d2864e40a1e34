package node

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stratakv/strata/node/wire"
)

// dialRevision is dial with a Hello of revision rev (0: none, an old client),
// returning the connection's revision as the service answered it.
func dialRevision(t testing.TB, s *Server, rev uint32) (*rawClient, uint32) {
	t.Helper()
	conn, err := wire.Dial(context.Background(), s.Socket())
	if err != nil {
		t.Fatal(err)
	}
	c := &rawClient{t: t, conn: conn}
	t.Cleanup(func() { conn.Close() })
	m, err := c.call(wire.TypeHello, wire.Hello{Version: wire.Version, ClientName: t.Name(), Revision: rev})
	if err != nil {
		t.Fatal(err)
	}
	return c, m.(*wire.HelloReply).Revision
}

// layerFirst is pages items in a layer-first pool of layers layers of pages
// pages of n bytes: page p's layer l at l*pages*n + p*n, as runs or ranges.
func layerFirst(prefix string, seg uint32, base uint64, pages, layers int, n uint64, runs bool) []wire.Item {
	items := make([]wire.Item, pages)
	stride := uint64(pages) * n
	for p := range items {
		run := wire.Run{Segment: seg, Offset: base + uint64(p)*n, Length: n, Stride: stride, Count: uint32(layers)}
		items[p] = wire.Item{Key: fmt.Sprintf("%s/%d", prefix, p), Format: 7}
		if runs {
			items[p].Runs = []wire.Run{run}
			continue
		}
		for l := range layers {
			items[p].Ranges = append(items[p].Ranges, run.Range(l))
		}
	}
	return items
}

func allOK(t *testing.T, what string, res []wire.Result) {
	t.Helper()
	for i, r := range res {
		if r.Status != wire.OK {
			t.Fatalf("%s: item %d: %v %s", what, i, r.Status, r.Message)
		}
	}
}

// Runs move the same bytes as the ranges they stand for, both ways, through
// the small (inline) and the large (copy workers) paths; a client of
// revision 2 is answered revision 2, an old one (no revision) revision 1 and
// keeps working with ranges.
func TestRunsMoveTheSameBytesAsRanges(t *testing.T) {
	s := start(t, nil)
	c, rev := dialRevision(t, s, wire.Revision)
	old, oldRev := dialRevision(t, s, 0)
	if rev != wire.Revision || oldRev != 1 {
		t.Fatalf("revisions answered %d (new client), %d (old client)", rev, oldRev)
	}
	for _, size := range []struct {
		name          string
		pages, layers int
		n             uint64
	}{{"small", 8, 61, 64}, {"large", 64, 61, 1152}} {
		t.Run(size.name, func(t *testing.T) {
			area := uint64(size.pages*size.layers) * size.n
			r, seg := c.segment(int64(4 * area))
			mem := r.Bytes()
			for i := range mem[:area] {
				mem[i] = byte(i*7 + i>>9)
			}
			_, oldSeg := old.segment(int64(2 * area))
			// Put by runs, get by ranges (and by runs) elsewhere.
			allOK(t, "put runs", c.batch(wire.TypePut, layerFirst(size.name+"/r", seg, 0, size.pages, size.layers, size.n, true)...))
			allOK(t, "get ranges", c.batch(wire.TypeGet, layerFirst(size.name+"/r", seg, area, size.pages, size.layers, size.n, false)...))
			allOK(t, "get runs", c.batch(wire.TypeGet, layerFirst(size.name+"/r", seg, 2*area, size.pages, size.layers, size.n, true)...))
			if !bytes.Equal(mem[:area], mem[area:2*area]) || !bytes.Equal(mem[:area], mem[2*area:3*area]) {
				t.Fatal("bytes put by runs come back different")
			}
			// Put by ranges (an old client), get by runs.
			allOK(t, "old put ranges", old.batch(wire.TypePut, layerFirst(size.name+"/o", oldSeg, 0, size.pages, size.layers, size.n, false)...))
			allOK(t, "get runs of the old client's", c.batch(wire.TypeGet, layerFirst(size.name+"/o", seg, 3*area, size.pages, size.layers, size.n, true)...))
			allOK(t, "old get ranges", old.batch(wire.TypeGet, layerFirst(size.name+"/r", oldSeg, area, size.pages, size.layers, size.n, false)...))
		})
	}
}

// A run whose last range leaves its segment is refused, naming the item and
// the run; the batch's other items are served.
func TestRunOutsideItsSegmentIsRefused(t *testing.T) {
	s := start(t, nil)
	c, _ := dialRevision(t, s, wire.Revision)
	_, seg := c.segment(64 << 10)
	good := wire.Item{Key: "good", Format: 7, Runs: []wire.Run{{Segment: seg, Offset: 0, Length: 512, Stride: 4096, Count: 16}}}
	bad := wire.Item{Key: "bad", Format: 7, Runs: []wire.Run{{Segment: seg, Offset: 0, Length: 8, Count: 1},
		{Segment: seg, Offset: 64<<10 - 15*4096 - 256, Length: 512, Stride: 4096, Count: 16}}} // its last range crosses the end
	for _, op := range []wire.Type{wire.TypePut, wire.TypeGet} {
		res := c.batch(op, good, bad)
		if res[0].Status != wire.OK && !(op == wire.TypeGet && res[0].Status == wire.NotFound) {
			t.Fatalf("%v good item: %v %s", op, res[0].Status, res[0].Message)
		}
		if r := res[1]; r.Status != wire.BadRange || !strings.Contains(r.Message, "object bad (item 1)") || !strings.Contains(r.Message, "run 1,") {
			t.Fatalf("%v run outside its segment: %v %q", op, r.Status, r.Message)
		}
	}
}

// Items of a Get that name the same memory are both refused, by runs or by
// ranges alike; a Put may read the same bytes twice.
func TestGetItemsThatOverlapAreRefused(t *testing.T) {
	s := start(t, nil)
	c, _ := dialRevision(t, s, wire.Revision)
	r, seg := c.segment(1 << 20)
	mem := r.Bytes()
	const pages, layers, n = 4, 8, 256
	area := uint64(pages * layers * n)
	for i := range mem[:area] {
		mem[i] = byte(i * 5)
	}
	puts := layerFirst("ov", seg, 0, pages, layers, n, true)
	puts = append(puts, wire.Item{Key: "dup", Format: 7, Runs: puts[0].Runs}) // reads page 0 again: fine
	allOK(t, "put", c.batch(wire.TypePut, puts...))
	for _, runs := range []bool{true, false} {
		gets := layerFirst("ov", seg, area, pages, layers, n, runs)
		shift := func(it *wire.Item, by uint64) {
			for j := range it.Runs {
				it.Runs[j].Offset -= by
			}
			for j := range it.Ranges {
				it.Ranges[j].Offset -= by
			}
		}
		shift(&gets[3], 2*n) // from page 3 onto page 1
		res := c.batch(wire.TypeGet, gets...)
		if res[0].Status != wire.OK || res[2].Status != wire.OK {
			t.Fatalf("runs %v: the items that overlap nothing: %+v", runs, res)
		}
		for _, i := range []int{1, 3} {
			other := 4 - i
			if r := res[i]; r.Status != wire.BadRange || !strings.Contains(r.Message, fmt.Sprintf("ov/%d (item %d of the Get)", i, i)) ||
				!strings.Contains(r.Message, fmt.Sprintf("item %d (ov/%d)", other, other)) {
				t.Fatalf("runs %v: item %d: %v %q", runs, i, r.Status, r.Message)
			}
		}
	}
}

// Concurrent clients putting and getting by runs, some of them overlapping
// on purpose, each get their own bytes back.
func TestRunsConcurrentClients(t *testing.T) {
	s := start(t, nil)
	var wg sync.WaitGroup
	for w := range 4 {
		c, _ := dialRevision(t, s, wire.Revision)
		r, seg := c.segment(1 << 20)
		wg.Go(func() {
			mem := r.Bytes()
			const pages, layers, n = 16, 8, 512
			area := uint64(pages * layers * n)
			for round := range 5 {
				for i := range mem[:area] {
					mem[i] = byte(i + w*31 + round)
				}
				prefix := fmt.Sprintf("c%d/%d", w, round)
				res := c.batch(wire.TypePut, layerFirst(prefix, seg, 0, pages, layers, n, true)...)
				res = append(res, c.batch(wire.TypeGet, layerFirst(prefix, seg, area, pages, layers, n, round%2 == 0)...)...)
				for i, r := range res {
					if r.Status != wire.OK {
						t.Errorf("client %d round %d item %d: %v %s", w, round, i, r.Status, r.Message)
						return
					}
				}
				if !bytes.Equal(mem[:area], mem[area:2*area]) {
					t.Errorf("client %d round %d: bytes differ", w, round)
					return
				}
			}
		})
	}
	wg.Wait()
}

// refuseOverlaps marks exactly the items that overlap another item's
// memory, as a check of every pair finds them, fast path or sweep.
func TestOverlapsMatchEveryPair(t *testing.T) {
	const segSize = 1 << 16
	c := &session{segments: map[uint32]*segment{1: {id: 1, mem: make([]byte, segSize)}, 2: {id: 2, mem: make([]byte, segSize)}}}
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 3000 {
		items := make([]wire.Item, 2+rng.IntN(8))
		length := uint64(1 + rng.IntN(64))
		stride := length * uint64(1+rng.IntN(8))
		for i := range items {
			it := wire.Item{Key: fmt.Sprint(i)}
			for range 1 + rng.IntN(3) {
				if rng.IntN(4) == 0 && round%2 == 0 {
					length = uint64(1 + rng.IntN(64)) // mixed lengths: no fast path
				}
				seg := uint32(1 + rng.IntN(2))
				count := uint32(1 + rng.IntN(6))
				off := uint64(rng.IntN(segSize/2)) / length * length
				if rng.IntN(3) == 0 {
					it.Ranges = append(it.Ranges, wire.Range{Segment: seg, Offset: off, Length: length})
					continue
				}
				it.Runs = append(it.Runs, wire.Run{Segment: seg, Offset: off, Length: length, Stride: stride, Count: count})
			}
			if len(it.Ranges) > 0 && len(it.Runs) > 0 {
				it.Runs = nil
			}
			items[i] = it
		}
		b := c.resolveBatch(items, nil, true)
		// The reference: every pair of ranges of two items.
		want := map[int]bool{}
		spans := func(it wire.Item) []wire.Range {
			out := append([]wire.Range(nil), it.Ranges...)
			for _, r := range it.Runs {
				for k := range int(r.Count) {
					out = append(out, r.Range(k))
				}
			}
			return out
		}
		for i := range items {
			for j := range i {
				for _, x := range spans(items[i]) {
					for _, y := range spans(items[j]) {
						if x.Segment == y.Segment && x.Offset < y.Offset+y.Length && y.Offset < x.Offset+x.Length {
							want[i], want[j] = true, true
						}
					}
				}
			}
		}
		for i := range items {
			_, got := b.overlap[i]
			if got != want[i] {
				t.Fatalf("round %d: item %d refused %v, want %v: %+v", round, i, got, want[i], items)
			}
		}
		b.done()
	}
}

// BenchmarkDecodeExpand is the service's cost of taking in a Get of 512
// layer-first MLA pages: decoding it and resolving (expanding, bounds- and
// overlap-checking) its items, by one run of 61 ranges an item against 61
// ranges an item, alternated in each iteration; runs-x-of-ranges is the
// ratio of the two.
func BenchmarkDecodeExpand(b *testing.B) {
	const pages, layers, n = 512, 61, 1152
	c := &session{segments: map[uint32]*segment{1: {id: 1, mem: make([]byte, pages*layers*n)}}}
	var bodies [2][]byte
	for k, runs := range []bool{false, true} {
		bodies[k] = wire.Get{Items: layerFirst("deepseek-ai_2fDeepSeek-V3:0123456789abcdef0123456789abcdef", 1, 0, pages, layers, n, runs)}.Marshal(nil)
	}
	// spent[2] and [3]: the same two, resolved as a Put's items are (no
	// overlap check), so that what the Get's check costs is seen beside them.
	var spent [4]time.Duration
	for b.Loop() {
		for k := range spent {
			t0 := time.Now()
			m, err := wire.Decode(wire.TypeGet, bodies[k%2])
			if err != nil {
				b.Fatal(err)
			}
			br := c.resolveBatch(m.(*wire.Get).Items, nil, k < 2)
			spent[k] += time.Since(t0)
			if br.overlap != nil {
				b.Fatal("overlap")
			}
			br.done()
		}
	}
	per := func(k int) float64 { return float64(spent[k].Nanoseconds()) / float64(b.N) / pages }
	b.ReportMetric(per(1), "ns/item-runs")
	b.ReportMetric(per(0), "ns/item-ranges")
	b.ReportMetric(per(1)/per(0), "runs-x-of-ranges")
	b.ReportMetric(per(1)/per(3), "runs-get-x-of-unchecked")
	b.ReportMetric(per(0)/per(2), "ranges-get-x-of-unchecked")
	b.ReportMetric(float64(len(bodies[1])), "B-request-runs")
	b.ReportMetric(float64(len(bodies[0])), "B-request-ranges")
}
