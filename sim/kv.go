package sim

import (
	"unsafe"

	"github.com/stratakv/strata/kvlayout"
	"github.com/stratakv/strata/pool"
)

// kvModel is what the simulated engine "computes": KV bytes that are a
// deterministic function of (pool, layer, K|V, position, prefix). The target
// model's entry at position i depends on tokens[0..i]; the EAGLE draft model's on
// tokens[0..i+1], because the draft layer consumes the next token's embedding.
// That is why SGLang keys draft-carrying caches by bigrams, and why a cache that
// keyed them by tokens alone would serve wrong draft KV, which verify catches.
type kvModel struct {
	ps    int
	pools []kvPool
}

type kvPool struct {
	index  int
	draft  bool
	layout kvlayout.Layout
	mem    []byte
}

func newKVModel(dev pool.DeviceGroup, draftFrom int) *kvModel {
	k := &kvModel{ps: dev.Pools[0].Layout().PageSize}
	for i, p := range dev.Pools {
		m := p.(*pool.MemDevicePool)
		k.pools = append(k.pools, kvPool{index: i, draft: i >= draftFrom, layout: m.Layout(), mem: m.Bytes()})
	}
	return k
}

// prefixHashes returns h[i], a 64-bit digest of tokens[0..i].
func prefixHashes(tokens []uint32) []uint64 {
	out := make([]uint64, len(tokens))
	h := uint64(0x243f6a8885a308d3)
	for i, t := range tokens {
		h = mix64(h ^ uint64(t) ^ uint64(i)<<32)
		out[i] = h
	}
	return out
}

func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// entryHash is the digest the pool's entry at pos depends on.
func (p *kvPool) entryHash(hs []uint64, pos int) uint64 {
	if !p.draft {
		return hs[pos]
	}
	if pos+1 < len(hs) {
		return hs[pos+1]
	}
	// The next token is not known yet; a real engine computes this entry when it is.
	return ^hs[pos]
}

func entrySeed(h uint64, pool, layer, buf int) uint64 {
	return mix64(h ^ uint64(pool)<<56 ^ uint64(layer)<<40 ^ uint64(buf)<<32)
}

const wordStep = 0x9e3779b97f4a7c15

// fill writes the pool's entries for positions [from, to) into the request's pages.
func (k *kvModel) fill(p *kvPool, hs []uint64, pages []pool.PageID, from, to int) {
	g := p.layout.Geometry
	tlb := g.TokenLayerBytes()
	for pos := from; pos < to; pos++ {
		slot := int(pages[pos/k.ps])*k.ps + pos%k.ps
		h := p.entryHash(hs, pos)
		for layer := 0; layer < g.Layers; layer++ {
			for buf := 0; buf < g.Buffers(); buf++ {
				off := p.layout.Offset(buf, layer, slot)
				writeEntry(p.mem[off:off+int64(tlb)], entrySeed(h, p.index, layer, buf))
			}
		}
	}
}

// verify checks the pool's entries for the whole pages [0, pagesN) and marks bad[i]
// for every page with a wrong byte.
func (k *kvModel) verify(p *kvPool, hs []uint64, pages []pool.PageID, pagesN int, bad []bool) {
	g := p.layout.Geometry
	tlb := g.TokenLayerBytes()
	for pg := 0; pg < pagesN; pg++ {
		if bad[pg] {
			continue
		}
	page:
		for i := 0; i < k.ps; i++ {
			pos := pg*k.ps + i
			slot := int(pages[pg])*k.ps + i
			h := p.entryHash(hs, pos)
			for layer := 0; layer < g.Layers; layer++ {
				for buf := 0; buf < g.Buffers(); buf++ {
					off := p.layout.Offset(buf, layer, slot)
					if !checkEntry(p.mem[off:off+int64(tlb)], entrySeed(h, p.index, layer, buf)) {
						bad[pg] = true
						break page
					}
				}
			}
		}
	}
}

// writeEntry fills b with the word sequence of seed.
func writeEntry(b []byte, seed uint64) {
	words := len(b) / 8
	if words > 0 {
		w := unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(b))), words)
		x := seed
		for i := range w {
			w[i] = x
			x += wordStep
		}
	}
	for i := words * 8; i < len(b); i++ {
		b[i] = byte(seed >> (8 * (i % 8)))
	}
}

// checkEntry reports whether b holds the word sequence of seed.
func checkEntry(b []byte, seed uint64) bool {
	words := len(b) / 8
	if words > 0 {
		w := unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(b))), words)
		x := seed
		for i := range w {
			if w[i] != x {
				return false
			}
			x += wordStep
		}
	}
	for i := words * 8; i < len(b); i++ {
		if b[i] != byte(seed>>(8*(i%8))) {
			return false
		}
	}
	return true
}
