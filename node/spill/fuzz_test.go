package spill

import (
	"bytes"
	"testing"
)

// FuzzDecodeHeader: record headers are read from files on disk, outside
// input. The decoder never panics, and what it accepts encodes back to the
// same bytes.
func FuzzDecodeHeader(f *testing.F) {
	for _, h := range []header{
		{kind: kindObject, hdrLen: sector, segment: 3, recLen: 1024, dataLen: 100, format: 7, dataSum: 42, key: "key"},
		{kind: kindObject, hdrLen: block, segment: 1, recLen: 2 * block, dataLen: block, key: "direct"},
		{kind: kindTombstone, hdrLen: sector, segment: 9, recLen: sector, key: "gone"},
		{kind: kindPad, hdrLen: sector, segment: 2, recLen: 3 * sector},
	} {
		b := make([]byte, h.hdrLen)
		h.encode(b)
		f.Add(b)
	}
	f.Add([]byte("STRSPILL"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := decodeHeader(b)
		if err != nil {
			return
		}
		if h.hdrLen > int64(len(b)) {
			// Only the fixed part and the key were there; the rest is padding.
			b = append(b, make([]byte, h.hdrLen-int64(len(b)))...)
		}
		out := make([]byte, h.hdrLen)
		h.encode(out)
		if !bytes.Equal(out[:fixedHeader+len(h.key)], b[:fixedHeader+len(h.key)]) {
			t.Fatalf("decode then encode changed the header:\n%x\n%x", b[:fixedHeader+len(h.key)], out[:fixedHeader+len(h.key)])
		}
		if _, err := decodeHeader(out); err != nil {
			t.Fatalf("re-encoded header refused: %v", err)
		}
	})
}

// FuzzDecodeHints: hint files are read from disk, outside input. The decoder
// never panics, and what it accepts encodes back to the same bytes.
func FuzzDecodeHints(f *testing.F) {
	f.Add(encodeHints(5, 1<<20, []hint{
		{kind: kindObject, hdrLen: sector, off: 0, size: 1000, format: 7, hash: hashKey("a")},
		{kind: kindTombstone, hash: hashKey("b")},
		{kind: kindObject, hdrLen: block, off: 4096, size: 100_000, format: 7, hash: hashKey("c")},
	}), uint32(5), int64(1<<20))
	f.Add(encodeHints(1, 0, nil), uint32(1), int64(0))
	f.Fuzz(func(t *testing.T, b []byte, id uint32, size int64) {
		hs, err := decodeHints(b, id, size)
		if err != nil {
			return
		}
		if out := encodeHints(id, size, hs); !bytes.Equal(out, b) {
			t.Fatalf("decode then encode changed the hints:\n%x\n%x", b, out)
		}
	})
}
