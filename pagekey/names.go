package pagekey

import (
	"strconv"
)

// Pool names that have SGLang/Mooncake object-name spellings.
const (
	// TargetPool is the name of the target model's pool in a pool group.
	TargetPool = "kv"
	// DraftPool is the name of the speculative-decoding (EAGLE) draft model's pool.
	DraftPool = "draft"
)

// Names builds the L3 object names of a page, following SGLang's Mooncake store
// spelling so that objects written by strata and by SGLang share one namespace:
// MHA target {key}_{rank}_k and {key}_{rank}_v, MLA target {key}__k, draft
// {key}_{rank}_draft_k and {key}_{rank}_draft_v (MLA draft {key}__draft_k). Pools
// other than kv and draft are spelled like the draft pool with their own name.
type Names struct {
	// ModelPrefix, when set, is prepended as "{prefix}:" so that two models writing
	// the same token prefixes into one store never read each other's KV.
	ModelPrefix string `json:"modelPrefix,omitempty"`
	// TPRank is the tensor-parallel rank whose KV shard the objects hold. MLA objects
	// are the same on every rank and carry no rank.
	TPRank int `json:"tpRank"`
	// MLA selects the single-buffer spelling (no separate V object).
	MLA bool `json:"mla"`
}

// Parts is the number of objects one page of one pool is stored as: 2 (K, V) for
// MHA, 1 for MLA.
func (n Names) Parts() int {
	if n.MLA {
		return 1
	}
	return 2
}

// AppendObject appends the name of part (0 = K or the MLA buffer, 1 = V) of pool's
// object for key k to dst.
func (n Names) AppendObject(dst []byte, k Key, pool string, part int) []byte {
	if n.ModelPrefix != "" {
		dst = append(dst, n.ModelPrefix...)
		dst = append(dst, ':')
	}
	dst = k.AppendHex(dst)
	dst = append(dst, '_')
	if !n.MLA {
		dst = strconv.AppendInt(dst, int64(n.TPRank), 10)
	}
	dst = append(dst, '_')
	if pool != TargetPool && pool != "" {
		dst = append(dst, pool...)
		dst = append(dst, '_')
	}
	if part == 1 {
		return append(dst, 'v')
	}
	return append(dst, 'k')
}

// Object returns the name of part of pool's object for key k.
func (n Names) Object(k Key, pool string, part int) string {
	return string(n.AppendObject(make([]byte, 0, 96+len(n.ModelPrefix)+len(pool)), k, pool, part))
}

// Objects returns the names of every part of pool's object for key k, K first.
func (n Names) Objects(k Key, pool string) []string {
	out := make([]string, n.Parts())
	for p := range out {
		out[p] = n.Object(k, pool, p)
	}
	return out
}
