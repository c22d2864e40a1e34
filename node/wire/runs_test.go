package wire

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
)

// runItems returns pages items of one run each, as a layer-first MLA pool
// names its pages: layers ranges of 1152 bytes a page, layer strides apart.
func runItems(pages, layers int) []Item {
	items := make([]Item, pages)
	for p := range items {
		items[p] = Item{Key: fmt.Sprintf("%064x_0_k", p), Format: 0x9e3779b97f4a7c15,
			Runs: []Run{{Segment: 1, Offset: uint64(p) * 1152, Length: 1152, Stride: 1 << 24, Count: uint32(layers)}}}
	}
	return items
}

// rangeItems is runItems with each run expanded into its ranges: the same
// bytes in revision 1's form.
func rangeItems(pages, layers int) []Item {
	items := runItems(pages, layers)
	for i := range items {
		r := items[i].Runs[0]
		items[i].Runs = nil
		for l := range int(r.Count) {
			items[i].Ranges = append(items[i].Ranges, r.Range(l))
		}
	}
	return items
}

func TestRunsRoundTrip(t *testing.T) {
	for name, items := range map[string][]Item{
		"runs":  runItems(512, 61),
		"mixed": append(rangeItems(3, 4), runItems(3, 4)...),
		"many runs": {{Key: "k", Runs: func() []Run {
			rs := make([]Run, MaxRuns)
			for i := range rs {
				rs[i] = Run{Segment: uint32(i), Offset: uint64(i) << 30, Length: 7, Stride: 9, Count: MaxRunCount / MaxRuns}
			}
			return rs
		}()}},
	} {
		for _, m := range []Message{&Put{Items: items}, &Get{Items: items, FenceSlot: 3}} {
			got, err := Decode(m.Type(), m.Marshal(nil))
			if err != nil || !reflect.DeepEqual(got, m) {
				t.Errorf("%s %s: decoded %v, %v", name, m.Type(), got, err)
			}
		}
	}
	if a, b := runItems(1, 61)[0], rangeItems(1, 61)[0]; a.Size() != b.Size() || a.Size() != 61*1152 || a.Spans() != 61 {
		t.Fatalf("run item of %d bytes, %d spans; ranges item of %d", a.Size(), a.Spans(), b.Size())
	}
}

func TestRunsMalformed(t *testing.T) {
	run := Run{Segment: 1, Offset: 0, Length: 8, Stride: 8, Count: 2}
	with := func(rs ...Run) Item { return Item{Key: "obj", Runs: rs} }
	many := make([]Run, MaxRuns+1)
	for i := range many {
		many[i] = Run{Segment: 1, Offset: uint64(i) * 8, Length: 8, Count: 1}
	}
	for _, c := range []struct {
		name, want string
		items      []Item
	}{
		{"both ranges and runs", "both ranges and runs", []Item{{Key: "obj", Ranges: []Range{{Segment: 1, Length: 1}}, Runs: []Run{run}}}},
		{"neither", "no ranges and no runs", []Item{{Key: "obj"}}},
		{"zero count", "count 0", []Item{with(Run{Segment: 1, Length: 8})}},
		{"count over limit", "count 4097", []Item{with(Run{Segment: 1, Length: 1, Stride: 1, Count: MaxRunCount + 1})}},
		{"zero length", "length 0", []Item{with(Run{Segment: 1, Stride: 8, Count: 2})}},
		{"stride under length", "stride 7 under length 8", []Item{with(Run{Segment: 1, Length: 8, Stride: 7, Count: 2})}},
		{"end overflows", "overflows", []Item{with(Run{Segment: 1, Offset: math.MaxUint64 - 100, Length: 8, Stride: 100, Count: 2})}},
		{"strides overflow", "overflows", []Item{with(Run{Segment: 1, Length: 8, Stride: 1 << 63, Count: 3})}},
		{"offset plus length overflows", "overflows", []Item{with(Run{Segment: 1, Offset: math.MaxUint64, Length: 1, Count: 1})}},
		{"total overflows", "total length overflows", []Item{with(Run{Segment: 1, Length: 1 << 62, Stride: 1 << 62, Count: 2}, Run{Segment: 2, Length: 1 << 62, Stride: 1 << 62, Count: 2})}},
		{"too many runs", "257 runs", []Item{with(many...)}},
		{"too many ranges in an item", "more than 4096 ranges", []Item{with(Run{Segment: 1, Length: 1, Stride: 1, Count: MaxRunCount}, Run{Segment: 2, Length: 1, Count: 1})}},
		{"too many ranges in a batch", "more than 1048576 ranges", func() []Item {
			items := runItems(MaxBatchRanges/MaxRunCount+1, MaxRunCount)
			for i := range items {
				items[i].Runs[0].Length = 1
			}
			return items
		}()},
	} {
		for _, m := range []Message{&Put{Items: c.items}, &Get{Items: c.items}} {
			err := m.Validate()
			if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "items[") {
				t.Errorf("%s: Validate = %v; want ErrMalformed naming the item, with %q", c.name, err, c.want)
			}
			if _, err := Decode(m.Type(), m.Marshal(nil)); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: Decode = %v; want ErrMalformed with %q", c.name, err, c.want)
			}
		}
	}
}

// TestRevisionFields checks the negotiation's fields: absent is revision 1,
// and an older peer's decoder skips them (they are unknown fields there).
func TestRevisionFields(t *testing.T) {
	if RevisionOf(0) != 1 || RevisionOf(1) != 1 || RevisionOf(Revision) != Revision {
		t.Fatal("RevisionOf")
	}
	old, err := Decode(TypeHello, Hello{Version: Version, ClientName: "old"}.Marshal(nil))
	if err != nil || old.(*Hello).Revision != 0 {
		t.Fatalf("a Hello without revision: %+v, %v", old, err)
	}
	hr, err := Decode(TypeHelloReply, HelloReply{ClientID: 1, Revision: Revision}.Marshal(nil))
	if err != nil || hr.(*HelloReply).Revision != Revision {
		t.Fatalf("HelloReply: %+v, %v", hr, err)
	}
}
