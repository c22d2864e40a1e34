package pagekey

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"testing"

	"github.com/zeebo/xxh3"
	"pgregory.net/rapid"
)

// Vectors computed with SGLang's Python hashing (hashlib, bytes.fromhex(prior), 4-byte
// little-endian tokens, namespace seed framing).
func TestSHA256MatchesSGLangVectors(t *testing.T) {
	tests := []struct {
		name   string
		cfg    Config
		ns     Namespace
		tokens []uint32
		want   []string
	}{
		{"design vector", Config{PageSize: 2}, Namespace{}, []uint32{1, 2, 3, 4}, []string{
			"34fb5c825de7ca4aea6e712f19d439c1da0c92c37b423936c5f618545ca4fa1f",
			"c57b445f90651b9a650e516ab2238c965b21af35608a31c303e6d9e407f2915c"}},
		{"partial page gets no key", Config{PageSize: 2}, Namespace{}, []uint32{1, 2, 3, 4, 5}, []string{
			"34fb5c825de7ca4aea6e712f19d439c1da0c92c37b423936c5f618545ca4fa1f",
			"c57b445f90651b9a650e516ab2238c965b21af35608a31c303e6d9e407f2915c"}},
		{"shorter than a page", Config{PageSize: 64}, Namespace{}, []uint32{1, 2, 3}, nil},
		{"bigram", Config{PageSize: 2, Bigram: true}, Namespace{}, []uint32{1, 2, 3, 4, 5}, []string{
			"ede8ef26a097f0fd889f9f39f6f5af921370630b164c4a4fa28eb716b2df9269",
			"678c5307f2a02a2aaf8edbeb80ebac13663f70e14a4fc8d5d62b77e702841e4b"}},
		{"extra key", Config{PageSize: 2}, Namespace{}.WithExtraKey("lora-a"), []uint32{1, 2, 3, 4}, []string{
			"ad023babe5121ed61b30e57d93dc9d29cb19b361c098794f361e7a94bf561d88",
			"f674138b108a1679dcac30e25f6350895dbc23f3632541a20a855bc4093382a7"}},
		{"cache salt", Config{PageSize: 2}, Namespace{}.WithCacheSalt("tenant-1"), []uint32{1, 2, 3, 4}, []string{
			"a63b0d65e8e35cedc7224ba8bfbdd84b7cb84bedffc4c0f6890659fa4b2e8455",
			"b88acb4922be5241c0f257f6a0888b24b182cb017c00d7f035210fc685826330"}},
		{"both", Config{PageSize: 2}, Namespace{}.WithExtraKey("x").WithCacheSalt("y"), []uint32{1, 2, 3, 4}, []string{
			"6f3cc3dd33532804747a65e5f95a53f5586dc308b9212c8d12b3b19424b9008c",
			"99b2249b8a96a2d47af1632509ab4c1e5b9ab885a39e317cf01cac55ff85fde4"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := New(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			got := h.Keys(h.Seed(tt.ns), tt.tokens)
			if len(got) != len(tt.want) {
				t.Fatalf("got %d keys, want %d", len(got), len(tt.want))
			}
			for i := range got {
				if got[i].String() != tt.want[i] {
					t.Errorf("key %d = %s, want %s", i, got[i], tt.want[i])
				}
			}
		})
	}
}

func TestNamespaceSeeds(t *testing.T) {
	h, _ := New(DefaultConfig())
	cases := []struct {
		ns   Namespace
		want string
	}{
		{Namespace{}, ""},
		{Namespace{}.WithExtraKey("lora-a"), "407c773a7c02b33bd4a62af6bf5fc77997c2c8067811ecf2b39e3839c3f4284b"},
		{Namespace{}.WithCacheSalt("tenant-1"), "3ad2e4c0a01548f53b6eeefabd91653acdebfc600f84ca614c46d961df378b83"},
		{Namespace{}.WithExtraKey(""), "fd649dd130277fa0773e23e84ddfa4ec779d9df77087968a60d7cefb9050ab1d"},
		{Namespace{}.WithExtraKey("ü").WithCacheSalt("日本"), "f7bf17fba01ce4e3db89cba2df82db1f082232bb181a3e0b5302f10bc9c07a2c"},
	}
	for _, c := range cases {
		if got := h.Seed(c.ns).String(); got != c.want {
			t.Errorf("Seed(%+v) = %q, want %q", c.ns, got, c.want)
		}
	}
	// Absent and empty must differ, and so must the same text in different fields.
	a := h.Seed(Namespace{}.WithExtraKey("s"))
	b := h.Seed(Namespace{}.WithCacheSalt("s"))
	if a == b {
		t.Fatal("extra key and cache salt with equal text share a seed")
	}
}

func TestPage64MatchesReference(t *testing.T) {
	tokens := make([]uint32, 300)
	for i := range tokens {
		tokens[i] = uint32(i*7919) % 50000
	}
	h, _ := New(DefaultConfig())
	keys := h.Keys(Key{}, tokens)
	if len(keys) != 4 {
		t.Fatalf("got %d keys for 300 tokens at page 64, want 4", len(keys))
	}
	if got, want := keys[3].String(), "20d350950e9bcf30ad79aecf94c2b548360dec789b826a35de655101f478048c"; got != want {
		t.Fatalf("last key %s, want %s", got, want)
	}
}

// referenceKeys is the obvious implementation: one sha256/xxh3 per page over freshly
// encoded bytes, chaining the previous digest.
func referenceKeys(cfg Config, prior Key, tokens []uint32) []Key {
	var out []Key
	positions := len(tokens)
	if cfg.Bigram {
		positions--
	}
	for p := 0; (p+1)*cfg.PageSize <= positions; p++ {
		var buf []byte
		buf = append(buf, prior.digest[:prior.size]...)
		for i := p * cfg.PageSize; i < (p+1)*cfg.PageSize; i++ {
			buf = binary.LittleEndian.AppendUint32(buf, tokens[i])
			if cfg.Bigram {
				buf = binary.LittleEndian.AppendUint32(buf, tokens[i+1])
			}
		}
		var k Key
		if cfg.Algorithm == XXH3 {
			d := xxh3.Hash128(buf).Bytes()
			k, _ = KeyFromDigest(d[:])
		} else {
			d := sha256.Sum256(buf)
			k, _ = KeyFromDigest(d[:])
		}
		out = append(out, k)
		prior = k
	}
	return out
}

func TestKeysMatchReferenceProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cfg := Config{
			PageSize:  rapid.IntRange(1, 9).Draw(t, "pageSize"),
			Bigram:    rapid.Bool().Draw(t, "bigram"),
			Algorithm: rapid.SampledFrom([]Algorithm{SHA256, XXH3}).Draw(t, "algo"),
		}
		tokens := rapid.SliceOfN(rapid.Uint32(), 0, 60).Draw(t, "tokens")
		h, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		got := h.Keys(Key{}, tokens)
		want := referenceKeys(cfg, Key{}, tokens)
		if len(got) != len(want) || len(got) != cfg.Pages(len(tokens)) {
			t.Fatalf("got %d keys, reference %d, Pages %d", len(got), len(want), cfg.Pages(len(tokens)))
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("key %d differs: %s vs %s", i, got[i], want[i])
			}
		}
		// Hashing in two calls, continuing from the last key, gives the same chain.
		if len(got) >= 2 && !cfg.Bigram {
			cut := rapid.IntRange(1, len(got)-1).Draw(t, "cut") * cfg.PageSize
			first := h.Keys(Key{}, tokens[:cut])
			rest := h.Keys(first[len(first)-1], tokens[cut:])
			all := append(first, rest...)
			for i := range got {
				if all[i] != got[i] {
					t.Fatalf("continued chain differs at page %d", i)
				}
			}
		}
	})
}

func TestXXH3KeysAreShortAndDistinctFromSHA(t *testing.T) {
	x, _ := New(Config{PageSize: 2, Algorithm: XXH3})
	s, _ := New(Config{PageSize: 2})
	tokens := []uint32{1, 2, 3, 4}
	xk, sk := x.Keys(Key{}, tokens), s.Keys(Key{}, tokens)
	if xk[0].Size() != 16 || len(xk[0].String()) != 32 {
		t.Fatalf("xxh3 key %s: size %d", xk[0], xk[0].Size())
	}
	if xk[1] == sk[1] {
		t.Fatal("xxh3 and sha256 keys collide")
	}
	// Namespaces separate xxh3 chains too.
	if a, b := x.Keys(x.Seed(Namespace{}.WithCacheSalt("a")), tokens), x.Keys(Key{}, tokens); a[0] == b[0] {
		t.Fatal("namespaced xxh3 key equals unnamespaced one")
	}
}

func TestConfigErrors(t *testing.T) {
	for _, cfg := range []Config{{PageSize: 0}, {PageSize: -3}, {PageSize: 64, Algorithm: 9}} {
		if _, err := New(cfg); !errors.Is(err, ErrConfig) {
			t.Errorf("New(%+v) = %v, want ErrConfig", cfg, err)
		}
	}
	if _, err := ParseAlgorithm("md5"); !errors.Is(err, ErrConfig) {
		t.Errorf("ParseAlgorithm(md5) = %v", err)
	}
	for _, s := range []string{"sha256", "SHA256", "xxh3"} {
		if _, err := ParseAlgorithm(s); err != nil {
			t.Errorf("ParseAlgorithm(%q): %v", s, err)
		}
	}
}

func TestKeyTextRoundTrip(t *testing.T) {
	h, _ := New(DefaultConfig())
	k := h.Keys(Key{}, make([]uint32, 64))[0]
	p, err := ParseKey(k.String())
	if err != nil || p != k {
		t.Fatalf("ParseKey(%s) = %v, %v", k, p, err)
	}
	if !bytes.Equal(p.Digest(), mustHex(k.String())) {
		t.Fatal("digest does not match hex")
	}
	for _, bad := range []string{"", "zz", k.String()[:63], k.String() + "0", "g" + k.String()[1:]} {
		if _, err := ParseKey(bad); !errors.Is(err, ErrKey) {
			t.Errorf("ParseKey(%q) = %v, want ErrKey", bad, err)
		}
	}
}

func mustHex(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

func TestKeysAllocateOnlyTheResult(t *testing.T) {
	tokens := make([]uint32, 64*32)
	for _, cfg := range []Config{DefaultConfig(), {PageSize: 64, Algorithm: XXH3}, {PageSize: 64, Bigram: true}} {
		h, _ := New(cfg)
		dst := make([]Key, 0, 64)
		allocs := testing.AllocsPerRun(20, func() {
			dst = h.AppendKeys(dst[:0], Key{}, tokens)
		})
		if allocs != 0 {
			t.Errorf("%+v: AppendKeys allocated %.1f times per call, want 0", cfg, allocs)
		}
	}
}
