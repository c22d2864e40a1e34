package spill

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/zeebo/xxh3"
)

// A segment file is a sequence of records, each starting on a 512-byte boundary
// and naming the next by its length. A record is a header, padded to its header
// length, then the data, then zeros up to the record length. All fields are
// little-endian:
//
//	[0, 8)    magic "STRSPILL"
//	[8, 10)   version (1)
//	[10, 11)  kind: 1 object, 2 tombstone (the key was removed), 3 padding
//	[11, 12)  zero
//	[12, 14)  key length
//	[14, 16)  zero
//	[16, 20)  header length: a multiple of 512; the data starts there
//	[20, 24)  segment id of the file the record was written to
//	[24, 32)  record length: a multiple of 512; the next record starts there
//	[32, 40)  data length
//	[40, 48)  format (storage.Format of the writer); in a tombstone that
//	          compaction copied forward, the id of the segment its remove was
//	          first written to (0 in the original: its own segment)
//	[48, 56)  xxh3-64 of the data
//	[56, 64)  xxh3-64 of bytes [0, 56) and the key (the key seeded by the first)
//	[64, ...) the key, so a read checks it is the record of the key it asked for
//
// Records staged in a write buffer have a 512-byte header (keys up to
// maxKey fit it with room to spare) and are padded to 512 bytes; records
// written straight from the caller's memory have a 4096-byte header so that
// their data starts 4 KiB-aligned in the file, as O_DIRECT needs, and are
// padded to 4 KiB. A buffer written out is padded to 4 KiB with a padding
// record, so every write starts and ends on a 4 KiB boundary.
const (
	sector       = 512  // record alignment
	block        = 4096 // O_DIRECT alignment of offsets, lengths and buffers
	fixedHeader  = 64
	magic        = "STRSPILL"
	version      = 1
	offVersion   = 8
	offKind      = 10
	offKeyLen    = 12
	offHdrLen    = 16
	offSegment   = 20
	offRecLen    = 24
	offDataLen   = 32
	offFormat    = 40
	offDataSum   = 48
	offHeaderSum = 56
	// maxKey bounds a key: the node's wire keys (512 bytes) with a tenant's
	// namespace prefix fit with room to spare.
	maxKey = 1024
	// maxHeader is the largest header length a record may declare.
	maxHeader = block
	// maxData bounds a record's data (1 TiB): a larger length is damage.
	maxData = 1 << 40
)

// Record kinds.
const (
	kindObject    = 1
	kindTombstone = 2
	kindPad       = 3
)

// header is what a record says about itself.
type header struct {
	kind    uint8
	hdrLen  int64
	segment uint32
	recLen  int64
	dataLen int64
	format  uint64
	dataSum uint64
	key     string
}

func roundUp(n, to int64) int64   { return (n + to - 1) / to * to }
func roundDown(n, to int64) int64 { return n / to * to }

// headerLen is the header length of a record for key: one sector in a staged
// buffer, a whole block for a record written straight from the caller.
func headerLen(key string, direct bool) int64 {
	if direct {
		return block
	}
	return roundUp(fixedHeader+int64(len(key)), sector)
}

// encode writes h into dst[:h.hdrLen], zeroing what the fields leave.
func (h header) encode(dst []byte) {
	dst = dst[:h.hdrLen]
	clear(dst)
	copy(dst, magic)
	binary.LittleEndian.PutUint16(dst[offVersion:], version)
	dst[offKind] = h.kind
	binary.LittleEndian.PutUint16(dst[offKeyLen:], uint16(len(h.key)))
	binary.LittleEndian.PutUint32(dst[offHdrLen:], uint32(h.hdrLen))
	binary.LittleEndian.PutUint32(dst[offSegment:], h.segment)
	binary.LittleEndian.PutUint64(dst[offRecLen:], uint64(h.recLen))
	binary.LittleEndian.PutUint64(dst[offDataLen:], uint64(h.dataLen))
	binary.LittleEndian.PutUint64(dst[offFormat:], h.format)
	binary.LittleEndian.PutUint64(dst[offDataSum:], h.dataSum)
	copy(dst[fixedHeader:], h.key)
	binary.LittleEndian.PutUint64(dst[offHeaderSum:], headerSum(dst, len(h.key)))
}

func headerSum(b []byte, keyLen int) uint64 {
	return xxh3.HashSeed(b[fixedHeader:fixedHeader+keyLen], xxh3.Hash(b[:offHeaderSum]))
}

// errRecord reports bytes that are not a record this package wrote intact.
var errRecord = errors.New("bad spill record")

// decodeHeader parses and checks a record header read from a segment file. It
// never panics: b is outside input. b may be shorter than the header length
// (only the fixed part and the key are read).
func decodeHeader(b []byte) (header, error) {
	if len(b) < fixedHeader {
		return header{}, fmt.Errorf("%d header bytes, want at least %d: %w", len(b), fixedHeader, errRecord)
	}
	if string(b[:len(magic)]) != magic {
		return header{}, fmt.Errorf("no magic: %w", errRecord)
	}
	if v := binary.LittleEndian.Uint16(b[offVersion:]); v != version {
		return header{}, fmt.Errorf("version %d, want %d: %w", v, version, errRecord)
	}
	klen := int(binary.LittleEndian.Uint16(b[offKeyLen:]))
	if klen > maxKey || fixedHeader+klen > len(b) {
		return header{}, fmt.Errorf("key of %d bytes in a header of %d: %w", klen, len(b), errRecord)
	}
	if sum := binary.LittleEndian.Uint64(b[offHeaderSum:]); sum != headerSum(b, klen) {
		return header{}, fmt.Errorf("header checksum mismatch: %w", errRecord)
	}
	if b[offKind+1] != 0 || b[offKeyLen+2] != 0 || b[offKeyLen+3] != 0 {
		return header{}, fmt.Errorf("reserved bytes set: %w", errRecord)
	}
	if binary.LittleEndian.Uint64(b[offRecLen:]) > 1<<62 || binary.LittleEndian.Uint64(b[offDataLen:]) > maxData {
		return header{}, fmt.Errorf("lengths out of range: %w", errRecord)
	}
	h := header{
		kind:    b[offKind],
		hdrLen:  int64(binary.LittleEndian.Uint32(b[offHdrLen:])),
		segment: binary.LittleEndian.Uint32(b[offSegment:]),
		recLen:  int64(binary.LittleEndian.Uint64(b[offRecLen:])),
		dataLen: int64(binary.LittleEndian.Uint64(b[offDataLen:])),
		format:  binary.LittleEndian.Uint64(b[offFormat:]),
		dataSum: binary.LittleEndian.Uint64(b[offDataSum:]),
		key:     string(b[fixedHeader : fixedHeader+klen]),
	}
	switch {
	case h.hdrLen%sector != 0 || h.hdrLen < fixedHeader+int64(klen) || h.hdrLen > maxHeader:
		return header{}, fmt.Errorf("header length %d: %w", h.hdrLen, errRecord)
	case h.recLen%sector != 0 || h.recLen < h.hdrLen+h.dataLen:
		return header{}, fmt.Errorf("record length %d for a header of %d and data of %d: %w", h.recLen, h.hdrLen, h.dataLen, errRecord)
	}
	switch h.kind {
	case kindObject:
		if klen == 0 {
			return header{}, fmt.Errorf("object without a key: %w", errRecord)
		}
	case kindTombstone:
		if klen == 0 || h.dataLen != 0 {
			return header{}, fmt.Errorf("tombstone of %d key bytes with %d data bytes: %w", klen, h.dataLen, errRecord)
		}
	case kindPad:
		if klen != 0 || h.dataLen != 0 {
			return header{}, fmt.Errorf("padding with a key or data: %w", errRecord)
		}
	default:
		return header{}, fmt.Errorf("kind %d: %w", h.kind, errRecord)
	}
	return h, nil
}
