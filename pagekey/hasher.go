package pagekey

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// Algorithm selects the hash function of the page chain.
type Algorithm uint8

const (
	// SHA256 is the SGLang HiCache chain: keys can be shared with SGLang deployments
	// and checked by routers that compute the same hashes.
	SHA256 Algorithm = iota
	// XXH3 is a 128-bit non-cryptographic chain, many times faster than SHA256. Use it
	// only where no other system has to compute the same keys, and where tenants do
	// not hand the cache adversarial token streams (it is not collision resistant).
	XXH3
)

// ParseAlgorithm accepts "sha256" and "xxh3" (case-insensitive).
func ParseAlgorithm(s string) (Algorithm, error) {
	switch strings.ToLower(s) {
	case "sha256":
		return SHA256, nil
	case "xxh3", "xxh3-128":
		return XXH3, nil
	}
	return 0, fmt.Errorf("algorithm %q: want sha256 or xxh3: %w", s, ErrConfig)
}

// String returns the name ParseAlgorithm accepts.
func (a Algorithm) String() string {
	switch a {
	case SHA256:
		return "sha256"
	case XXH3:
		return "xxh3"
	}
	return fmt.Sprintf("Algorithm(%d)", uint8(a))
}

// DigestSize is the number of digest bytes one key of this algorithm carries.
func (a Algorithm) DigestSize() int {
	if a == XXH3 {
		return 16
	}
	return 32
}

// Config describes how token sequences become page keys.
type Config struct {
	// PageSize is the number of tokens (or bigrams, in bigram mode) per page. It must
	// match the engine's page size: a key covers exactly one page. SGLang's HiCache
	// default is 64.
	PageSize int `json:"pageSize"`
	// Bigram hashes EAGLE bigram keys: position i of the page is the pair
	// (t[i], t[i+1]), so a sequence of n tokens has n-1 positions.
	Bigram bool `json:"bigram"`
	// Algorithm is the chain's hash. SHA256 is SGLang-compatible.
	Algorithm Algorithm `json:"algorithm"`
}

// DefaultConfig returns the SGLang-compatible configuration: SHA-256, 64-token pages.
func DefaultConfig() Config { return Config{PageSize: 64, Algorithm: SHA256} }

// Validate reports whether c can produce keys.
func (c Config) Validate() error {
	if c.PageSize < 1 {
		return fmt.Errorf("page size %d: must be at least 1: %w", c.PageSize, ErrConfig)
	}
	if c.PageSize > 1<<20 {
		return fmt.Errorf("page size %d: larger than 1Mi tokens is not a page: %w", c.PageSize, ErrConfig)
	}
	if c.Algorithm != SHA256 && c.Algorithm != XXH3 {
		return fmt.Errorf("%v: %w", c.Algorithm, ErrConfig)
	}
	return nil
}

// Pages returns how many whole pages a sequence of n tokens has under c.
func (c Config) Pages(n int) int {
	if c.Bigram {
		n--
	}
	if n <= 0 || c.PageSize <= 0 {
		return 0
	}
	return n / c.PageSize
}

// Hasher computes page keys. It keeps its scratch space between calls so that
// hashing allocates nothing but the returned keys. A Hasher is not safe for
// concurrent use; give each goroutine its own.
type Hasher struct {
	cfg Config
	// msg is the message of one page: the previous digest in its first MaxDigestSize
	// bytes (right-aligned, so the message starts at MaxDigestSize-size), then the
	// page's token bytes. One contiguous message lets the one-shot hash functions,
	// which beat the streaming interface by a wide margin on 300-byte inputs, do the work.
	msg []byte
}

var nativeLittleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// New returns a Hasher for cfg.
func New(cfg Config) (*Hasher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	perPosition := 4
	if cfg.Bigram {
		perPosition = 8
	}
	return &Hasher{cfg: cfg, msg: make([]byte, MaxDigestSize+cfg.PageSize*perPosition)}, nil
}

// Config returns the configuration h was built with.
func (h *Hasher) Config() Config { return h.cfg }

// Keys returns the keys of every whole page of tokens, chained from prior (the zero
// Key starts a new chain; pass Seed(ns) to start a namespaced one, or the key of
// the page before tokens[0] to continue a chain). A trailing partial page gets no key.
func (h *Hasher) Keys(prior Key, tokens []uint32) []Key {
	return h.AppendKeys(make([]Key, 0, h.cfg.Pages(len(tokens))), prior, tokens)
}

// AppendKeys is Keys appending to dst, so a caller can reuse a key slice.
func (h *Hasher) AppendKeys(dst []Key, prior Key, tokens []uint32) []Key {
	pages := h.cfg.Pages(len(tokens))
	if pages == 0 {
		return dst
	}
	ps := h.cfg.PageSize
	end := len(h.msg)
	// start is where the message begins in h.msg: the previous digest is
	// right-aligned against the page body, so a 16-byte XXH3 digest starts at 16.
	start := MaxDigestSize - int(prior.size)
	copy(h.msg[start:MaxDigestSize], prior.digest[:prior.size])
	dst = slices.Grow(dst, pages)
	switch h.cfg.Algorithm {
	case XXH3:
		for p := 0; p < pages; p++ {
			h.fillPage(tokens, p*ps)
			d := xxh3.Hash128(h.msg[start:end]).Bytes()
			var k Key
			copy(k.digest[:16], d[:])
			k.size = 16
			dst = append(dst, k)
			start = MaxDigestSize - 16
			copy(h.msg[start:MaxDigestSize], d[:])
		}
	default:
		for p := 0; p < pages; p++ {
			h.fillPage(tokens, p*ps)
			dst = append(dst, Key{digest: sha256.Sum256(h.msg[start:end]), size: 32})
			start = 0
			copy(h.msg[:MaxDigestSize], dst[len(dst)-1].digest[:])
		}
	}
	return dst
}

// fillPage writes the bytes hashed for the page that starts at position start into
// h.msg after the digest slot.
func (h *Hasher) fillPage(tokens []uint32, start int) {
	ps := h.cfg.PageSize
	body := h.msg[MaxDigestSize:]
	if !h.cfg.Bigram {
		page := tokens[start : start+ps]
		if nativeLittleEndian {
			copy(body, unsafe.Slice((*byte)(unsafe.Pointer(&page[0])), 4*ps))
			return
		}
		for i, t := range page {
			binary.LittleEndian.PutUint32(body[4*i:], t)
		}
		return
	}
	for i := 0; i < ps; i++ {
		binary.LittleEndian.PutUint32(body[8*i:], tokens[start+i])
		binary.LittleEndian.PutUint32(body[8*i+4:], tokens[start+i+1])
	}
}

// chain computes H(prior digest || body) for a message that is not a page.
func (h *Hasher) chain(prior Key, body []byte) Key {
	msg := append(append(make([]byte, 0, int(prior.size)+len(body)), prior.digest[:prior.size]...), body...)
	var k Key
	switch h.cfg.Algorithm {
	case XXH3:
		b := xxh3.Hash128(msg).Bytes()
		copy(k.digest[:], b[:])
		k.size = 16
	default:
		k.digest = sha256.Sum256(msg)
		k.size = 32
	}
	return k
}
