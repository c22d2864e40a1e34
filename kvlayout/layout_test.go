package kvlayout

import (
	"errors"
	"testing"
)

// naiveElement is the flat byte offset of element (buf, layer, slot, head, dim) from
// the layout's shape written out as nested row-major dimensions.
func naiveElement(l Layout, buf, layer, slot, head, dim int) int64 {
	g := l.Geometry
	heads, hd := g.KVHeads, g.HeadDim
	if g.MLA {
		heads, hd = 1, g.LatentDim
	}
	var shape, idx []int
	page, inPage := slot/l.PageSize, slot%l.PageSize
	switch l.Kind {
	case LayerFirst:
		shape = []int{g.Buffers(), g.Layers, l.Slots(), heads, hd}
		idx = []int{buf, layer, slot, head, dim}
	case PageFirst:
		shape = []int{g.Buffers(), l.Slots(), g.Layers, heads, hd}
		idx = []int{buf, slot, layer, head, dim}
	case PageFirstDirect:
		shape = []int{g.Buffers(), l.Pages, g.Layers, l.PageSize, heads, hd}
		idx = []int{buf, page, layer, inPage, head, dim}
	}
	flat := 0
	for i := range shape {
		flat = flat*shape[i] + idx[i]
	}
	return int64(flat * g.DTypeBytes)
}

func smallGeometries() []Geometry {
	var gs []Geometry
	for _, layers := range []int{1, 3} {
		for _, dt := range []int{1, 2} {
			gs = append(gs,
				Geometry{Layers: layers, KVHeads: 2, HeadDim: 3, DTypeBytes: dt},
				Geometry{Layers: layers, KVHeads: 1, HeadDim: 4, DTypeBytes: dt},
				Geometry{Layers: layers, MLA: true, LatentDim: 5, DTypeBytes: dt})
		}
	}
	return gs
}

func TestOffsetsMatchNaiveIndexExhaustively(t *testing.T) {
	for _, g := range smallGeometries() {
		for _, kind := range []Kind{LayerFirst, PageFirst, PageFirstDirect} {
			for _, ps := range []int{1, 2, 4} {
				for _, pages := range []int{1, 3} {
					l, err := New(g, kind, ps, pages)
					if err != nil {
						t.Fatal(err)
					}
					checkLayout(t, l)
				}
			}
		}
	}
}

func checkLayout(t *testing.T, l Layout) {
	t.Helper()
	g := l.Geometry
	heads, hd := g.KVHeads, g.HeadDim
	if g.MLA {
		heads, hd = 1, g.LatentDim
	}
	seen := make([]bool, l.PoolBytes())
	for buf := 0; buf < g.Buffers(); buf++ {
		for layer := 0; layer < g.Layers; layer++ {
			for slot := 0; slot < l.Slots(); slot++ {
				base := l.Offset(buf, layer, slot)
				for h := 0; h < heads; h++ {
					for d := 0; d < hd; d++ {
						want := naiveElement(l, buf, layer, slot, h, d)
						got := base + int64((h*hd+d)*g.DTypeBytes)
						if got != want {
							t.Fatalf("%v: (%d,%d,%d,%d,%d) at %d, naive %d", l, buf, layer, slot, h, d, got, want)
						}
						for b := int64(0); b < int64(g.DTypeBytes); b++ {
							if seen[got+b] {
								t.Fatalf("%v: byte %d owned twice", l, got+b)
							}
							seen[got+b] = true
						}
					}
				}
			}
		}
	}
	for i, s := range seen {
		if !s {
			t.Fatalf("%v: byte %d of the pool belongs to no element", l, i)
		}
	}
	// Spans list exactly the entries of their page, in slot (and layer) order.
	tlb := int64(g.TokenLayerBytes())
	for buf := 0; buf < g.Buffers(); buf++ {
		for page := 0; page < l.Pages; page++ {
			for layer := 0; layer < g.Layers; layer++ {
				var want []int64
				for i := 0; i < l.PageSize; i++ {
					want = append(want, l.Offset(buf, layer, page*l.PageSize+i))
				}
				if got := spanEntries(l.PageLayerSpan(buf, layer, page), tlb); !equal(got, want) {
					t.Fatalf("%v: PageLayerSpan(%d,%d,%d) entries %v, want %v", l, buf, layer, page, got, want)
				}
			}
			var want []int64
			if l.Kind == PageFirst {
				for i := 0; i < l.PageSize; i++ {
					for layer := 0; layer < g.Layers; layer++ {
						want = append(want, l.Offset(buf, layer, page*l.PageSize+i))
					}
				}
			} else {
				for layer := 0; layer < g.Layers; layer++ {
					for i := 0; i < l.PageSize; i++ {
						want = append(want, l.Offset(buf, layer, page*l.PageSize+i))
					}
				}
			}
			span := l.PageBufferSpan(buf, page)
			if span.Bytes() != l.PageBufferBytes() {
				t.Fatalf("%v: PageBufferSpan has %d bytes, want %d", l, span.Bytes(), l.PageBufferBytes())
			}
			if got := spanEntries(span, tlb); !equal(got, want) {
				t.Fatalf("%v: PageBufferSpan(%d,%d) entries %v, want %v", l, buf, page, got, want)
			}
			if (l.Kind != LayerFirst || g.Layers == 1) && !span.Contiguous() {
				t.Fatalf("%v: page buffer span %+v should be one run", l, span)
			}
		}
	}
	if l.PageBytes()*int64(l.Pages) != l.PoolBytes() || l.PageBufferBytes()*int64(g.Buffers()) != l.PageBytes() {
		t.Fatalf("%v: sizes disagree", l)
	}
}

func spanEntries(s Span, entry int64) []int64 {
	var out []int64
	for r := 0; r < s.Count; r++ {
		for off := int64(0); off < s.RunBytes; off += entry {
			out = append(out, s.Offset+int64(r)*s.Stride+off)
		}
	}
	return out
}

func equal(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestSizes(t *testing.T) {
	llama := Geometry{Layers: 32, KVHeads: 8, HeadDim: 128, DTypeBytes: 2}
	l, err := New(llama, PageFirst, 64, 10)
	if err != nil {
		t.Fatal(err)
	}
	if got := llama.TokenBytes(); got != 128<<10 {
		t.Errorf("llama3-8b token bytes %d, want 128 KiB", got)
	}
	if got := l.PageBufferBytes(); got != 4<<20 {
		t.Errorf("llama3-8b page buffer %d, want 4 MiB", got)
	}
	if got := l.PoolBytes(); got != 80<<20 {
		t.Errorf("pool %d, want 80 MiB", got)
	}
	dsv3 := Geometry{Layers: 61, MLA: true, LatentDim: 576, DTypeBytes: 2}
	if got := dsv3.TokenBytes(); got != 61*576*2 {
		t.Errorf("MLA token bytes %d", got)
	}
}

func TestValidation(t *testing.T) {
	bad := []Geometry{
		{},
		{Layers: 1, KVHeads: 0, HeadDim: 4, DTypeBytes: 2},
		{Layers: 1, KVHeads: 1, HeadDim: 4, DTypeBytes: 0},
		{Layers: 1, MLA: true, DTypeBytes: 2},
		{Layers: 1, MLA: true, LatentDim: 4, KVHeads: 1, DTypeBytes: 2},
		{Layers: 1, KVHeads: 1, HeadDim: 4, LatentDim: 3, DTypeBytes: 2},
		{Layers: 1 << 20, KVHeads: 1 << 10, HeadDim: 1 << 10, DTypeBytes: 2},
	}
	for _, g := range bad {
		if err := g.Validate(); !errors.Is(err, ErrGeometry) {
			t.Errorf("%+v: %v, want ErrGeometry", g, err)
		}
	}
	g := Geometry{Layers: 2, KVHeads: 1, HeadDim: 2, DTypeBytes: 2}
	for _, c := range []struct{ ps, pages int }{{0, 1}, {1, 0}, {-1, 4}, {1 << 30, 1 << 30}} {
		if _, err := New(g, PageFirst, c.ps, c.pages); !errors.Is(err, ErrLayout) {
			t.Errorf("page size %d pages %d: %v, want ErrLayout", c.ps, c.pages, err)
		}
	}
	if _, err := New(g, Kind(7), 1, 1); !errors.Is(err, ErrLayout) {
		t.Errorf("unknown kind: %v", err)
	}
	for _, s := range []string{"layer_first", "page_first", "page-first-direct"} {
		if _, err := ParseKind(s); err != nil {
			t.Errorf("ParseKind(%q): %v", s, err)
		}
	}
	if _, err := ParseKind("row_major"); !errors.Is(err, ErrLayout) {
		t.Errorf("ParseKind(row_major): %v", err)
	}
}
