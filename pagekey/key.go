package pagekey

import (
	"encoding/hex"
	"fmt"
	"strings"
)

// MaxDigestSize is the largest digest any Algorithm produces (SHA-256).
const MaxDigestSize = 32

// Key is the content address of one page and, through the chain, of the whole
// prefix that ends with it. Keys are comparable and can be map keys. The zero Key
// means "no previous page".
type Key struct {
	digest [MaxDigestSize]byte
	size   uint8
}

// KeyFromDigest builds a Key from a raw digest of 16 (XXH3-128) or 32 (SHA-256) bytes.
func KeyFromDigest(d []byte) (Key, error) {
	var k Key
	if len(d) != 16 && len(d) != 32 {
		return k, fmt.Errorf("digest of %d bytes, want 16 or 32: %w", len(d), ErrKey)
	}
	copy(k.digest[:], d)
	k.size = uint8(len(d))
	return k, nil
}

// ParseKey parses the lowercase or uppercase hex form of a key (64 hex digits for
// SHA-256 keys, 32 for XXH3 keys).
func ParseKey(s string) (Key, error) {
	if len(s) != 64 && len(s) != 32 {
		return Key{}, fmt.Errorf("key %q has %d hex digits, want 64 (sha256) or 32 (xxh3): %w", abbreviate(s), len(s), ErrKey)
	}
	var buf [MaxDigestSize]byte
	n, err := hex.Decode(buf[:], []byte(s))
	if err != nil {
		return Key{}, fmt.Errorf("key %q: %v: %w", abbreviate(s), err, ErrKey)
	}
	return KeyFromDigest(buf[:n])
}

// IsZero reports whether k is the zero Key (no page).
func (k Key) IsZero() bool { return k.size == 0 }

// Size is the digest length in bytes: 32 for SHA-256, 16 for XXH3-128, 0 for the zero Key.
func (k Key) Size() int { return int(k.size) }

// Digest returns the raw digest bytes (a copy).
func (k Key) Digest() []byte { return append([]byte(nil), k.digest[:k.size]...) }

// AppendHex appends the lowercase hex form of k to dst.
func (k Key) AppendHex(dst []byte) []byte {
	return hex.AppendEncode(dst, k.digest[:k.size])
}

// String returns the lowercase hex form of k, as SGLang prints page hashes.
func (k Key) String() string { return string(k.AppendHex(make([]byte, 0, 2*int(k.size)))) }

// MarshalText encodes k as hex so keys read naturally in JSON.
func (k Key) MarshalText() ([]byte, error) { return k.AppendHex(nil), nil }

// UnmarshalText parses the hex form of a key.
func (k *Key) UnmarshalText(b []byte) error {
	p, err := ParseKey(string(b))
	if err != nil {
		return err
	}
	*k = p
	return nil
}

func abbreviate(s string) string {
	if len(s) > 80 {
		return s[:77] + "..."
	}
	return strings.ToValidUTF8(s, "?")
}
