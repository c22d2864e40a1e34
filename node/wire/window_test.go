package wire

import (
	"errors"
	"reflect"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

// A batch's deadline and fence slot decode the same wherever they lie: first,
// as the encoders write them (the fast path takes them off), or after the
// items (the general walk), and a slot past the fence page is refused.
func TestBatchDeadlineAndFenceSlotAnywhere(t *testing.T) {
	items := putItems(3, 2, 2)
	want := Get{Items: items, DeadlineNS: 1<<40 + 3, FenceSlot: 17}
	first := want.Marshal(nil)
	last := marshalItems(nil, items)
	last = protowire.AppendVarint(protowire.AppendTag(last, fBatchDeadlineNS, protowire.VarintType), want.DeadlineNS)
	last = protowire.AppendVarint(protowire.AppendTag(last, fBatchFenceSlot, protowire.VarintType), uint64(want.FenceSlot))
	for name, body := range map[string][]byte{"first": first, "last": last} {
		for _, typ := range []Type{TypeGet, TypePut} {
			m, err := Decode(typ, body)
			if err != nil {
				t.Fatalf("%s %v: %v", name, typ, err)
			}
			var got Get
			switch m := m.(type) {
			case *Get:
				got = *m
			case *Put:
				got = Get{Items: m.Items, DeadlineNS: m.DeadlineNS, FenceSlot: m.FenceSlot}
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%s %v: decoded %+v, want %+v", name, typ, got, want)
			}
		}
	}
	// Without them, the frame is what it was before they existed.
	if got, old := (Get{Items: items}).Marshal(nil), marshalItems(nil, items); string(got) != string(old) {
		t.Fatal("a batch without a deadline encodes differently")
	}
	for name, body := range map[string][]byte{
		"slot past the page, last": protowire.AppendVarint(protowire.AppendTag(marshalItems(nil, items), fBatchFenceSlot, protowire.VarintType), FenceSlots+1),
		"slot first":               protowire.AppendVarint(protowire.AppendTag(nil, fBatchFenceSlot, protowire.VarintType), FenceSlots+1),
		"fence of 2":               protowire.AppendVarint(protowire.AppendTag(nil, fRegisterFence, protowire.VarintType), 2),
	} {
		typ := TypePut
		if name == "fence of 2" {
			typ = TypeRegisterSegment
		}
		if _, err := Decode(typ, body); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
	if err := (Put{FenceSlot: FenceSlots + 1}).Validate(); !errors.Is(err, ErrMalformed) {
		t.Errorf("Validate of a slot past the page: %v", err)
	}
}
