package nodeclient

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stratakv/strata/kvlayout"
	"github.com/stratakv/strata/node/wire"
	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/storage"
)

// TestBatchRequestNamesAndRanges holds the request a batch is sent as to the
// object names and spans storage defines for each page part, for the
// spellings whose parts share a suffix rule (MHA target and draft, model
// prefixes, ranks), MLA (one part), and layouts whose parts are one run
// (page_first, page_first_direct) or many (layer_first): each page's spans
// come from the batch's per-part step, and each request is built in the
// recycled buffers of the one before.
func TestBatchRequestNamesAndRanges(t *testing.T) {
	mha := kvlayout.Geometry{Layers: 2, KVHeads: 2, HeadDim: 8, DTypeBytes: 2}
	mla := kvlayout.Geometry{Layers: 3, MLA: true, LatentDim: 16, DTypeBytes: 2}
	keys := make([]pagekey.Key, 0, 6)
	// Every request below is built in the buffers of the one before.
	rb := new(requestBuffers)
	var recycled sync.Pool
	for i := range 6 {
		d := make([]byte, 16+16*(i%2)) // digests of both sizes
		for j := range d {
			d[j] = byte(i*31 + j)
		}
		k, err := pagekey.KeyFromDigest(d)
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	pages := []pool.PageID{5, 0, 3, 7, 1, 2}
	for _, c := range []struct {
		pool   string
		geo    kvlayout.Geometry
		kind   kvlayout.Kind
		names  pagekey.Names
		shared bool // the parts' names share a prefix: partTails applies
	}{
		{"kv", mha, kvlayout.PageFirst, pagekey.Names{}, true},
		{"kv", mha, kvlayout.PageFirst, pagekey.Names{ModelPrefix: "org/model-1", TPRank: 3}, true},
		{"draft", mha, kvlayout.LayerFirst, pagekey.Names{TPRank: 1}, true},
		{"kv", mla, kvlayout.PageFirst, pagekey.Names{ModelPrefix: "m"}, false},
		{"kv", mla, kvlayout.LayerFirst, pagekey.Names{}, false},
		{"kv", mha, kvlayout.PageFirstDirect, pagekey.Names{}, true},
		{"kv", mla, kvlayout.PageFirstDirect, pagekey.Names{}, false},
	} {
		t.Run(fmt.Sprintf("%s-%s-%v", c.pool, c.geo, c.kind), func(t *testing.T) {
			layout, err := kvlayout.New(c.geo, c.kind, 4, 8)
			if err != nil {
				t.Fatal(err)
			}
			spec := storage.PoolSpec{Name: c.pool, Layout: layout, Names: c.names}
			names := c.names
			names.MLA = c.geo.MLA
			p := &poolReg{spec: spec, names: names, tails: partTails(names, c.pool), format: 9}
			if (p.tails != nil) != c.shared {
				t.Fatalf("part tails %q", p.tails)
			}
			for _, c := range []struct {
				typ  wire.Type
				runs bool
			}{{wire.TypeGet, false}, {wire.TypePut, false}, {wire.TypeGet, true}, {wire.TypePut, true}} {
				typ := c.typ
				msg, n := batchRequest(typ, p, 4, c.runs, keys, pages, rb)
				var items []wire.Item
				switch m := msg.(type) {
				case wire.Get:
					items = m.Items
				case wire.Put:
					items = m.Items
				}
				if msg.Type() != typ || n != len(items) || n != len(keys)*names.Parts() {
					t.Fatalf("%v request: %v with %d items (said %d)", typ, msg.Type(), len(items), n)
				}
				for i, k := range keys {
					want := storage.ObjectNames(spec, k)
					for part, span := range storage.Parts(spec, pages[i]) {
						it := items[i*names.Parts()+part]
						if it.Key != want[part] || it.Format != 9 {
							t.Errorf("page %d part %d: key %q format %d, want %q", i, part, it.Key, it.Format, want[part])
						}
						var runs []wire.Range
						for r := 0; r < span.Count; r++ {
							runs = append(runs, wire.Range{Segment: 4, Offset: uint64(span.Offset + int64(r)*span.Stride), Length: uint64(span.RunBytes)})
						}
						if span.Contiguous() {
							runs = []wire.Range{{Segment: 4, Offset: uint64(span.Offset), Length: uint64(span.Bytes())}}
						}
						got := it.Ranges
						if c.runs && !span.Contiguous() {
							// One run for the part's equally spaced ranges.
							if len(it.Ranges) != 0 || len(it.Runs) != 1 {
								t.Fatalf("page %d part %d: %d ranges and %d runs, want one run", i, part, len(it.Ranges), len(it.Runs))
							}
							got = nil
							for r := range int(it.Runs[0].Count) {
								got = append(got, it.Runs[0].Range(r))
							}
						} else if len(it.Runs) != 0 {
							t.Errorf("page %d part %d: runs %v, want ranges only", i, part, it.Runs)
						}
						if fmt.Sprint(got) != fmt.Sprint(runs) {
							t.Errorf("page %d part %d (runs %v): ranges %v, want %v", i, part, c.runs, got, runs)
						}
					}
				}
				if err := msg.Validate(); err != nil {
					t.Errorf("request does not validate: %v", err)
				}
				// The next request is built in the same buffers, as a Backend's
				// next batch is: it must come out as if they were fresh.
				rb.recycle(&recycled)
			}
		})
	}
}
