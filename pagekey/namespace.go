package pagekey

import (
	"encoding/binary"
)

// namespaceDomain versions the namespace seed; it is SGLang's, so seeded chains match.
const namespaceDomain = "sglang-cache-namespace-v1"

// Namespace separates key spaces: two requests with different namespaces never share
// a page key, even for identical tokens. ExtraKey carries what SGLang calls the extra
// key (LoRA adapter, multimodal inputs); CacheSalt the per-tenant cache salt. Absent
// and empty are different namespaces, as in SGLang.
type Namespace struct {
	ExtraKey     string `json:"extraKey,omitempty"`
	HasExtraKey  bool   `json:"hasExtraKey,omitempty"`
	CacheSalt    string `json:"cacheSalt,omitempty"`
	HasCacheSalt bool   `json:"hasCacheSalt,omitempty"`
}

// WithExtraKey returns ns with the extra key set to s.
func (ns Namespace) WithExtraKey(s string) Namespace {
	ns.ExtraKey, ns.HasExtraKey = s, true
	return ns
}

// WithCacheSalt returns ns with the cache salt set to s.
func (ns Namespace) WithCacheSalt(s string) Namespace {
	ns.CacheSalt, ns.HasCacheSalt = s, true
	return ns
}

// IsZero reports whether ns names no namespace (the unseeded, shared key space).
func (ns Namespace) IsZero() bool { return !ns.HasExtraKey && !ns.HasCacheSalt }

// Seed returns the key that starts ns's chain: the zero Key for no namespace,
// otherwise H(domain || frame(extra key) || frame(cache salt)) where an absent part
// is the byte 0x00 and a present one is 0x01, its UTF-8 length as 8 bytes
// little-endian, and its bytes. With SHA256 this is SGLang's storage namespace seed.
func (h *Hasher) Seed(ns Namespace) Key {
	if ns.IsZero() {
		return Key{}
	}
	buf := make([]byte, 0, len(namespaceDomain)+18+len(ns.ExtraKey)+len(ns.CacheSalt))
	buf = append(buf, namespaceDomain...)
	buf = appendFrame(buf, ns.ExtraKey, ns.HasExtraKey)
	buf = appendFrame(buf, ns.CacheSalt, ns.HasCacheSalt)
	return h.chain(Key{}, buf)
}

func appendFrame(dst []byte, s string, present bool) []byte {
	if !present {
		return append(dst, 0)
	}
	dst = append(dst, 1)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(len(s)))
	return append(dst, s...)
}
