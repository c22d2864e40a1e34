package node

import (
	"fmt"
	"slices"
	"unsafe"

	"github.com/stratakv/strata/node/wire"
)

// Overlaps between the items of a Get. Each item of a Get is copied into its
// own ranges, by whichever copy worker serves it: two items that name the
// same bytes of the client's memory would be two copies racing into them, and
// the client would read either object, or a mix. So an item of a Get whose
// ranges overlap another item's is refused (BadRange), and so is the other
// item: one rule for ranges and for runs, since runs are checked as the
// ranges they stand for. A Put only reads the client's memory, so two of its
// items may name the same bytes. Ranges of one item that overlap each other
// are the client's own affair, as they were before runs.
//
// The check is O(n log n) in the ranges of the batch, and mostly much less:
// a batch whose ranges all have one length, and whose runs one stride (pages
// of one pool: the common case by far), is checked on the ranges' and runs'
// first addresses modulo the stride, one point a run (fastDisjoint); only a
// batch that check cannot clear is sorted range by range (sweepOverlaps).

// refuseOverlaps marks every item that overlaps another item's memory as
// refused, with its reason in b.overlap.
func (b *batchRanges) refuseOverlaps(items []wire.Item) {
	if len(items) < 2 || b.fastDisjoint(items) {
		return
	}
	b.sweepOverlaps(items)
}

// addr is the address of a range's first byte in the service's mappings:
// ranges of distinct segments never share addresses, so addresses compare
// ranges across segments.
func addr(r []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(r))) }

// fastDisjoint reports true when no two ranges of the resolved items can
// overlap, by an argument that costs O(k log k) for k runs: when every range
// has length L and every run of more than one range has stride S (S >= L),
// and the first addresses of all runs and ranges, taken modulo S, are at
// least L apart around the circle of S, then any two ranges' addresses
// differ by at least L (a difference d with d mod S in [L, S-L] is never
// within L of a multiple of S), so they are disjoint. False means "could
// not tell", not "they overlap".
func (b *batchRanges) fastDisjoint(items []wire.Item) bool {
	var length, stride uint64
	points := 0
	same := true
	for i := range items {
		if b.items[i].size >= 0 {
			eachRun(items[i], int(b.items[i].first), func(_ int, run wire.Run) {
				if length == 0 {
					length = run.Length
				}
				if run.Count > 1 && stride == 0 {
					stride = run.Stride
				}
				same = same && run.Length == length && (run.Count == 1 || run.Stride == stride)
				points++
			})
		}
	}
	switch {
	case !same:
		return false
	case points < 2:
		return true
	case stride != 0 && uint64(points) > stride/length:
		return false // no room for that many points L apart on the circle
	}
	ps := make([]uint64, 0, points)
	for i := range items {
		if b.items[i].size >= 0 {
			eachRun(items[i], int(b.items[i].first), func(at int, _ wire.Run) {
				ps = append(ps, point(addr(b.runs[at]), stride))
			})
		}
	}
	slices.Sort(ps)
	for k := 1; k < len(ps); k++ {
		if ps[k]-ps[k-1] < length {
			return false
		}
	}
	// Around the circle: from the last point to the first.
	return stride == 0 || stride-ps[len(ps)-1]+ps[0] >= length
}

// eachRun calls fn with each run of it, and the index in batchRanges.runs of
// its first range (the item's first at first): its runs, or its ranges as
// runs. Ranges of one segment, one length and even steps of at least that
// length are one run (a layer-first page of an older client: one run, not
// 61 ranges); other ranges are runs of one.
func eachRun(it wire.Item, first int, fn func(at int, run wire.Run)) {
	if len(it.Runs) > 0 {
		for _, run := range it.Runs {
			fn(first, contiguous(run))
			first += int(run.Count)
		}
		return
	}
	if run, ok := evenRanges(it.Ranges); ok {
		fn(first, contiguous(run))
		return
	}
	for j, rg := range it.Ranges {
		fn(first+j, wire.Run{Segment: rg.Segment, Offset: rg.Offset, Length: rg.Length, Count: 1})
	}
}

// contiguous returns a run whose ranges touch (stride = length) as the one
// range they make.
func contiguous(run wire.Run) wire.Run {
	if run.Count > 1 && run.Stride == run.Length {
		run.Length, run.Stride, run.Count = run.Length*uint64(run.Count), 0, 1
	}
	return run
}

// evenRanges returns ranges as one run when they are one, or false.
func evenRanges(ranges []wire.Range) (wire.Run, bool) {
	if len(ranges) < 2 {
		return wire.Run{}, false
	}
	r0 := ranges[0]
	step := ranges[1].Offset - r0.Offset
	if ranges[1].Offset < r0.Offset || step < r0.Length {
		return wire.Run{}, false
	}
	for k, rg := range ranges[1:] {
		if rg.Segment != r0.Segment || rg.Length != r0.Length || rg.Offset != r0.Offset+uint64(k+1)*step {
			return wire.Run{}, false
		}
	}
	return wire.Run{Segment: r0.Segment, Offset: r0.Offset, Length: r0.Length, Stride: step, Count: uint32(len(ranges))}, true
}

// point is a range's first address on the circle of stride (the line when
// stride is 0: no run repeats).
func point(a uintptr, stride uint64) uint64 {
	if stride == 0 {
		return uint64(a)
	}
	return uint64(a) % stride
}

// span is one range of a batch, for sweepOverlaps.
type span struct {
	start, end uintptr
	item       int32
	at         int32 // its index in batchRanges.runs
}

// sweepOverlaps sorts every range of the batch by address and walks them in
// order, grouping ranges that overlap into clusters (a cluster goes on while
// the next range starts before the furthest end so far). Every item of a
// cluster that holds ranges of two items or more overlaps another item (the
// cluster is connected by overlaps, so some overlap leaves each item's
// ranges for another item's), and is refused.
func (b *batchRanges) sweepOverlaps(items []wire.Item) {
	spans := make([]span, 0, len(b.runs))
	for i, it := range b.items {
		if it.size < 0 {
			continue
		}
		for j := it.first; j < it.end; j++ {
			a := addr(b.runs[j])
			spans = append(spans, span{start: a, end: a + uintptr(len(b.runs[j])), item: int32(i), at: j})
		}
	}
	slices.SortFunc(spans, func(x, y span) int {
		if x.start != y.start {
			if x.start < y.start {
				return -1
			}
			return 1
		}
		return int(x.item) - int(y.item)
	})
	for lo := 0; lo < len(spans); {
		hi, end, mixed := lo+1, spans[lo].end, false
		for ; hi < len(spans) && spans[hi].start < end; hi++ {
			end = max(end, spans[hi].end)
			mixed = mixed || spans[hi].item != spans[lo].item
		}
		if mixed {
			b.refuseCluster(items, spans[lo:hi], end)
		}
		lo = hi
	}
}

// refuseCluster refuses every item with a range in cluster, ranges that
// overlap one another up to end, each naming another item of the cluster.
func (b *batchRanges) refuseCluster(items []wire.Item, cluster []span, end uintptr) {
	if b.overlap == nil {
		b.overlap = map[int]string{}
	}
	first := cluster[0]
	seg := b.segs[first.at]
	base := addr(seg.mem)
	for _, s := range cluster {
		i := int(s.item)
		if _, done := b.overlap[i]; done {
			continue
		}
		other := first.item
		if other == s.item {
			for _, t := range cluster {
				if t.item != s.item {
					other = t.item
					break
				}
			}
		}
		b.overlap[i] = fmt.Sprintf("object %s (item %d of the Get): %s overlaps the memory that item %d (%s) names, "+
			"in segment %d [%#x, %#x): a Get copies each object into bytes of its own; name distinct memory for each item",
			items[i].Key, i, describePart(items[i], int(s.at-b.items[i].first)), other, items[other].Key,
			seg.id, first.start-base, end-base)
		b.items[i].size = -1
	}
}

// describePart names the descriptor of it that holds its range k (runs
// expanded): "range 3" or "run 0 (its range 12)".
func describePart(it wire.Item, k int) string {
	if len(it.Runs) == 0 {
		return fmt.Sprintf("its range %d", k)
	}
	for j, run := range it.Runs {
		if k < int(run.Count) {
			return fmt.Sprintf("its run %d (range %d of it)", j, k)
		}
		k -= int(run.Count)
	}
	return "a range"
}
