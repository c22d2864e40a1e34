package kvlayout

import (
	"fmt"
	"strings"
)

// Kind is the order of a pool's bytes. Shapes are row-major, outermost first; MLA
// pools have no leading buffer dimension.
type Kind uint8

const (
	// LayerFirst is (buffer, layer, slot, heads, dim): each layer is one contiguous
	// tensor, the layout attention kernels read. The default device layout.
	LayerFirst Kind = iota
	// PageFirst is (buffer, slot, layer, heads, dim): one page's K (or V) across every
	// layer is contiguous, so a page moves to storage as one object per buffer.
	PageFirst
	// PageFirstDirect is (buffer, page, layer, page slot, heads, dim): page-contiguous
	// like PageFirst and also layer-contiguous within a page, so one layer of a page
	// is a single run for per-layer transfers.
	PageFirstDirect
)

// ParseKind accepts the SGLang spellings layer_first, page_first, page_first_direct.
func ParseKind(s string) (Kind, error) {
	switch strings.ToLower(strings.ReplaceAll(s, "-", "_")) {
	case "layer_first":
		return LayerFirst, nil
	case "page_first":
		return PageFirst, nil
	case "page_first_direct":
		return PageFirstDirect, nil
	}
	return 0, fmt.Errorf("layout %q: want layer_first, page_first or page_first_direct: %w", s, ErrLayout)
}

// String returns the SGLang spelling.
func (k Kind) String() string {
	switch k {
	case LayerFirst:
		return "layer_first"
	case PageFirst:
		return "page_first"
	case PageFirstDirect:
		return "page_first_direct"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// MarshalText writes the SGLang spelling.
func (k Kind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText parses the SGLang spelling.
func (k *Kind) UnmarshalText(b []byte) error {
	v, err := ParseKind(string(b))
	*k = v
	return err
}

// Layout places a pool of Pages pages of PageSize tokens with geometry Geometry.
// Slot s is token s%PageSize of page s/PageSize.
type Layout struct {
	Geometry Geometry `json:"geometry"`
	Kind     Kind     `json:"kind"`
	PageSize int      `json:"pageSize"`
	Pages    int      `json:"pages"`
}

// New validates and returns a Layout.
func New(g Geometry, kind Kind, pageSize, pages int) (Layout, error) {
	l := Layout{Geometry: g, Kind: kind, PageSize: pageSize, Pages: pages}
	return l, l.Validate()
}

// Validate reports whether l describes a pool.
func (l Layout) Validate() error {
	if err := l.Geometry.Validate(); err != nil {
		return err
	}
	if l.Kind > PageFirstDirect {
		return fmt.Errorf("%v: %w", l.Kind, ErrLayout)
	}
	if l.PageSize < 1 || l.PageSize > 1<<20 {
		return fmt.Errorf("page size %d, want 1 to %d tokens: %w", l.PageSize, 1<<20, ErrLayout)
	}
	if l.Pages < 1 || l.Pages > 1<<31-1 {
		return fmt.Errorf("%d pages, want 1 to %d: %w", l.Pages, 1<<31-1, ErrLayout)
	}
	if l.PoolBytes()/int64(l.Pages) != l.PageBytes() || l.PoolBytes() > 1<<50 {
		return fmt.Errorf("%d pages of %d bytes overflow a pool: %w", l.Pages, l.PageBytes(), ErrLayout)
	}
	return nil
}

// Slots is the number of token slots in the pool.
func (l Layout) Slots() int { return l.Pages * l.PageSize }

// PageBytes is the size of one page across every layer and buffer.
func (l Layout) PageBytes() int64 { return int64(l.PageSize) * int64(l.Geometry.TokenBytes()) }

// PageBufferBytes is the size of one buffer (K, V, or the MLA latent) of one page
// across every layer: the size of one L3 object part.
func (l Layout) PageBufferBytes() int64 {
	return int64(l.PageSize) * int64(l.Geometry.Layers) * int64(l.Geometry.TokenLayerBytes())
}

// PoolBytes is the size of the whole pool.
func (l Layout) PoolBytes() int64 { return int64(l.Pages) * l.PageBytes() }

// Compatible reports whether pages can be copied between l and o: the same geometry
// and page size (layouts and page counts may differ).
func (l Layout) Compatible(o Layout) bool {
	return l.Geometry == o.Geometry && l.PageSize == o.PageSize
}

// Offset is where the TokenLayerBytes bytes of slot's entry in buffer buf (0 = K or
// MLA latent, 1 = V) of layer live, from the start of the pool.
func (l Layout) Offset(buf, layer, slot int) int64 {
	tlb := int64(l.Geometry.TokenLayerBytes())
	L := int64(l.Geometry.Layers)
	slots := int64(l.Slots())
	b, ly, s := int64(buf), int64(layer), int64(slot)
	switch l.Kind {
	case PageFirst:
		return ((b*slots+s)*L + ly) * tlb
	case PageFirstDirect:
		ps := int64(l.PageSize)
		page, i := s/ps, s%ps
		return (((b*int64(l.Pages)+page)*L+ly)*ps + i) * tlb
	default:
		return ((b*L+ly)*slots + s) * tlb
	}
}

// Span is a strided set of byte runs: Count runs of RunBytes bytes, the first at
// Offset and each next one Stride bytes further.
type Span struct {
	Offset   int64 `json:"offset"`
	RunBytes int64 `json:"runBytes"`
	Count    int   `json:"count"`
	Stride   int64 `json:"stride"`
}

// Bytes is the total size of the span's runs.
func (s Span) Bytes() int64 { return s.RunBytes * int64(s.Count) }

// Contiguous reports whether the span is one run.
func (s Span) Contiguous() bool { return s.Count == 1 || s.Stride == s.RunBytes }

// PageLayerSpan is where one layer of buffer buf of page lives: the unit the copy
// engine moves for per-layer transfers, in slot order.
func (l Layout) PageLayerSpan(buf, layer, page int) Span {
	tlb := int64(l.Geometry.TokenLayerBytes())
	ps := l.PageSize
	off := l.Offset(buf, layer, page*ps)
	if l.Kind == PageFirst {
		return Span{Offset: off, RunBytes: tlb, Count: ps, Stride: int64(l.Geometry.Layers) * tlb}
	}
	return Span{Offset: off, RunBytes: int64(ps) * tlb, Count: 1, Stride: int64(ps) * tlb}
}

// PageBufferSpan is where buffer buf of page lives across every layer, in the order
// (layer, slot) for LayerFirst and PageFirstDirect and (slot, layer) for PageFirst:
// the bytes of one L3 object part. It is one run for the page-first layouts and one
// run per layer for LayerFirst.
func (l Layout) PageBufferSpan(buf, page int) Span {
	ps := int64(l.PageSize)
	tlb := int64(l.Geometry.TokenLayerBytes())
	L := l.Geometry.Layers
	off := l.Offset(buf, 0, page*l.PageSize)
	if l.Kind == LayerFirst {
		return Span{Offset: off, RunBytes: ps * tlb, Count: L, Stride: int64(l.Slots()) * tlb}
	}
	n := ps * int64(L) * tlb
	return Span{Offset: off, RunBytes: n, Count: 1, Stride: n}
}

// String is a short description such as "page_first 1024x64 mha 32L 8x128 2B".
func (l Layout) String() string {
	return fmt.Sprintf("%v %dx%d %v", l.Kind, l.Pages, l.PageSize, l.Geometry)
}
