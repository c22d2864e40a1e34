package wire

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

// marshalItemsSized is how marshalItems wrote items before it set lengths in
// place: every item and range sized first, its length written before it. The
// bytes must not change (the golden frames and the Python codec hold them).
func marshalItemsSized(b []byte, items []Item) []byte {
	rangeSize := func(r Range) int {
		return sizeVarint(fRangeSegment, uint64(r.Segment)) + sizeVarint(fRangeOffset, r.Offset) + sizeVarint(fRangeLength, r.Length)
	}
	for i := range items {
		it := &items[i]
		n := sizeString(fItemKey, it.Key) + sizeFixed64(fItemFormat, it.Format)
		for _, r := range it.Ranges {
			n += protowire.SizeTag(fItemRanges) + protowire.SizeBytes(rangeSize(r))
		}
		b = protowire.AppendTag(b, fBatchItems, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(n))
		b = appendString(b, fItemKey, it.Key)
		b = appendFixed64(b, fItemFormat, it.Format)
		for _, r := range it.Ranges {
			b = protowire.AppendTag(b, fItemRanges, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(rangeSize(r)))
			b = r.marshal(b)
		}
	}
	return b
}

// TestMarshalItemsBytesUnchanged compares marshalItems with the sizing
// encoder on items of every shape: keys from empty to MaxKey (items from a
// few bytes to past 128 and 16384, where the length takes two and three
// bytes), zero and extreme fields, no range to many, appended after other
// bytes.
func TestMarshalItemsBytesUnchanged(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	pick := func(vs ...uint64) uint64 { return vs[rng.IntN(len(vs))] }
	for n := range 2000 {
		items := make([]Item, rng.IntN(6))
		for i := range items {
			it := &items[i]
			it.Key = strings.Repeat("k", int(pick(0, 1, 90, 110, 127, 128, 200, MaxKey)))
			it.Format = pick(0, 1, 1<<63, ^uint64(0))
			it.Ranges = make([]Range, int(pick(0, 1, 2, 8, 1200)))
			for j := range it.Ranges {
				it.Ranges[j] = Range{Segment: uint32(pick(0, 1, 1<<31)), Offset: pick(0, 127, 1<<40, ^uint64(0)), Length: pick(0, 1024, ^uint64(0))}
			}
		}
		prefix := []byte("head")[:rng.IntN(5)]
		got := marshalItems(append([]byte(nil), prefix...), items)
		want := marshalItemsSized(append([]byte(nil), prefix...), items)
		if !bytes.Equal(got, want) {
			t.Fatalf("case %d: %d items encode to %d bytes, the sizing encoder's %d", n, len(items), len(got), len(want))
		}
	}
}
