// Package kvlayout describes model KV geometry and how a pool's bytes are ordered:
// how many bytes a token, a page and a pool take, and where the bytes of
// (page or slot, layer, K|V) live for each layout.
package kvlayout

import (
	"fmt"
)

// Geometry is the shape of one model's KV cache on one tensor-parallel rank.
type Geometry struct {
	// Layers is the number of attention layers whose KV is cached.
	Layers int `json:"layers"`
	// KVHeads is the number of KV heads on this rank (MHA/GQA).
	KVHeads int `json:"kvHeads,omitempty"`
	// HeadDim is the dimension of one head (MHA/GQA).
	HeadDim int `json:"headDim,omitempty"`
	// MLA selects multi-head latent attention: one latent buffer per layer instead of K and V.
	MLA bool `json:"mla,omitempty"`
	// LatentDim is the width of the MLA latent per token (kv_lora_rank + qk_rope_head_dim,
	// 512+64 for DeepSeek-V3).
	LatentDim int `json:"latentDim,omitempty"`
	// DTypeBytes is the size of one element: 2 for bf16/fp16, 1 for fp8.
	DTypeBytes int `json:"dtypeBytes"`
}

// maxDim bounds every geometry dimension so that size arithmetic cannot overflow.
const maxDim = 1 << 16

// Validate reports whether g describes a cache.
func (g Geometry) Validate() error {
	if g.Layers < 1 || g.Layers > maxDim {
		return fmt.Errorf("geometry: %d layers, want 1 to %d: %w", g.Layers, maxDim, ErrGeometry)
	}
	if g.KVHeads < 0 || g.KVHeads > maxDim || g.HeadDim < 0 || g.HeadDim > maxDim || g.LatentDim < 0 || g.LatentDim > maxDim {
		return fmt.Errorf("geometry: dimensions must lie in [1, %d]: %w", maxDim, ErrGeometry)
	}
	if g.DTypeBytes < 1 || g.DTypeBytes > 8 {
		return fmt.Errorf("geometry: dtype of %d bytes, want 1 to 8: %w", g.DTypeBytes, ErrGeometry)
	}
	if g.MLA {
		if g.LatentDim < 1 {
			return fmt.Errorf("geometry: MLA latent dim %d, want at least 1: %w", g.LatentDim, ErrGeometry)
		}
		if g.KVHeads != 0 || g.HeadDim != 0 {
			return fmt.Errorf("geometry: MLA geometry with KV heads/head dim set; MLA uses latent dim only: %w", ErrGeometry)
		}
	} else {
		if g.KVHeads < 1 || g.HeadDim < 1 {
			return fmt.Errorf("geometry: %d KV heads of dim %d, want both at least 1: %w", g.KVHeads, g.HeadDim, ErrGeometry)
		}
		if g.LatentDim != 0 {
			return fmt.Errorf("geometry: latent dim set on an MHA geometry; set MLA or clear it: %w", ErrGeometry)
		}
	}
	if int64(g.TokenBytes()) > 1<<30 {
		return fmt.Errorf("geometry: %d bytes per token is not a model: %w", g.TokenBytes(), ErrGeometry)
	}
	return nil
}

// Buffers is the number of KV buffers per layer: 2 (K and V) for MHA, 1 for MLA.
func (g Geometry) Buffers() int {
	if g.MLA {
		return 1
	}
	return 2
}

// TokenLayerBytes is the size of one token's entry in one buffer of one layer.
func (g Geometry) TokenLayerBytes() int {
	if g.MLA {
		return g.LatentDim * g.DTypeBytes
	}
	return g.KVHeads * g.HeadDim * g.DTypeBytes
}

// TokenBytes is the size of one token's KV across every layer and buffer.
func (g Geometry) TokenBytes() int { return g.Buffers() * g.Layers * g.TokenLayerBytes() }

// TokenBytes64 is the size of n tokens' KV, in int64 so large counts cannot overflow.
func (g Geometry) TokenBytes64(n int) int64 { return int64(n) * int64(g.TokenBytes()) }

// String is a short description such as "mha 32L 8x128 bf16".
func (g Geometry) String() string {
	if g.MLA {
		return fmt.Sprintf("mla %dL latent %d %dB", g.Layers, g.LatentDim, g.DTypeBytes)
	}
	return fmt.Sprintf("mha %dL %dx%d %dB", g.Layers, g.KVHeads, g.HeadDim, g.DTypeBytes)
}
