package wire

import (
	"reflect"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

// FuzzItemCanonical holds the fast decoder of an item (unmarshalCanonical) to
// the general one (unmarshal): wherever the fast one accepts a body, the general
// one decodes it to the same item, with the keys shared or not; where it
// declines, the general one decides, so its errors are the only ones a client
// sees.
func FuzzItemCanonical(f *testing.F) {
	for _, it := range putItems(3, 2, 4) {
		f.Add(it.marshal(nil))
	}
	f.Add(Item{Key: "k", Ranges: []Range{{Segment: 1, Length: 5}}}.marshalCopy())
	f.Add(Item{Key: "k", Format: 7, Ranges: []Range{{Offset: 9, Length: 1}}}.marshalCopy())
	f.Add(Item{Key: "k", Format: 7, Runs: []Run{{Segment: 2, Offset: 9, Length: 4, Stride: 16, Count: 61}}}.marshalCopy())
	f.Add(Item{Key: "k", Runs: []Run{{Length: 1, Count: 1}, {Segment: 1, Offset: 1 << 40, Length: 8, Stride: 8, Count: 4096}}}.marshalCopy())
	f.Add([]byte{tagItemRuns, 4, tagRunCount, 0xff, 0xff, 0x7f})
	f.Add([]byte{tagItemKey, 1, 'a', tagItemKey, 1, 'b', tagItemRanges, 2, tagRangeLength, 3})
	f.Add([]byte{tagItemRanges, 6, tagRangeSegment, 0xff, 0xff, 0xff, 0xff, 0x1f})
	f.Add(protowire.AppendTag(nil, 9, protowire.VarintType))
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, share := range []bool{false, true} {
			var keys, keys2 *keyBuffer
			if share {
				keys, keys2 = newKeyBuffer(len(body)), newKeyBuffer(len(body))
			}
			var fast, slow Item
			if !fast.unmarshalCanonical(body, make([]Range, 1), make([]Run, 1), keys) {
				if share && keys.sb.Len() != 0 {
					t.Fatalf("declined, but took %d key bytes", keys.sb.Len())
				}
				continue
			}
			if err := slow.unmarshal(body, make([]Range, 1), make([]Run, 1), keys2); err != nil {
				t.Fatalf("the fast decoder accepted what the general one refuses (%v): %+v", err, fast)
			}
			if !reflect.DeepEqual(fast, slow) {
				t.Fatalf("decoders differ:\nfast    %+v\ngeneral %+v", fast, slow)
			}
		}
	})
}

// marshalCopy encodes the item on its own, for seeds.
func (it Item) marshalCopy() []byte { return it.marshal(nil) }

// TestItemCanonicalDeclines checks that what the fast decoder leaves to the
// general one still gets the general one's answer through Decode: an unknown
// field is skipped, a range over MaxRanges and a key over MaxKey are refused.
func TestItemCanonicalDeclines(t *testing.T) {
	ok := Item{Key: "key", Format: 3, Ranges: []Range{{Segment: 1, Offset: 8, Length: 4}}}
	withUnknown := protowire.AppendVarint(protowire.AppendTag(ok.marshal(nil), 15, protowire.VarintType), 1)
	if got := decodeGetItem(t, withUnknown); !reflect.DeepEqual(got, ok) {
		t.Fatalf("item with an unknown field decoded as %+v, want %+v", got, ok)
	}
	many := Item{Key: "key", Ranges: make([]Range, MaxRanges+1)}
	for i := range many.Ranges {
		many.Ranges[i] = Range{Segment: 1, Length: 1}
	}
	long := Item{Key: string(make([]byte, MaxKey+1)), Ranges: ok.Ranges}
	for name, it := range map[string]Item{"too many ranges": many, "key too long": long} {
		body := protowire.AppendBytes(protowire.AppendTag(nil, fBatchItems, protowire.BytesType), it.marshal(nil))
		if _, err := Decode(TypeGet, body); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
}

// decodeGetItem decodes a Get of the one encoded item body.
func decodeGetItem(t *testing.T, item []byte) Item {
	t.Helper()
	body := protowire.AppendBytes(protowire.AppendTag(nil, fBatchItems, protowire.BytesType), item)
	m, err := Decode(TypeGet, body)
	if err != nil {
		t.Fatal(err)
	}
	return m.(*Get).Items[0]
}

// FuzzBatchCanonical holds the decoding of a Put's or Get's items and of a
// BatchReply, which take a fast path over bodies laid out as this package
// writes them, to the generic decoding of the same bodies by strata.proto
// alone (schemaDecode, schema_test.go), which knows no fast path and no field
// of the codec: both accept a body or both refuse it, and decode it alike.
// Each body is tried as each of the three.
func FuzzBatchCanonical(f *testing.F) {
	f.Add(Get{Items: putItems(3, 2, 4)}.Marshal(nil))
	f.Add(Put{Items: putItems(2, 1, 1)}.Marshal(nil))
	f.Add(Get{Items: putItems(1, 2, 2), DeadlineNS: 1 << 50, FenceSlot: 9}.Marshal(nil))
	f.Add(Get{Items: runItems(4, 61), FenceSlot: 2}.Marshal(nil))
	f.Add(Put{Items: append(putItems(1, 1, 1), runItems(2, 3)...)}.Marshal(nil))
	f.Add(BatchReply{Results: []Result{{}, {Status: NotFound, Message: "gone"}, {}}}.Marshal(nil))
	f.Add([]byte{tagBatchField, 0, tagBatchField, 2, 0x08, 0x03})
	f.Add(protowire.AppendVarint(protowire.AppendTag([]byte{tagBatchField, 0}, 7, protowire.VarintType), 5))
	f.Add([]byte{tagBatchDeadline, 1, tagBatchSlot, 0x81, 0x08, tagBatchField, 0})
	s := testSchema(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, typ := range []Type{TypePut, TypeGet, TypeBatchReply} {
			sameDecoding(t, s, typ, body)
		}
	})
}
