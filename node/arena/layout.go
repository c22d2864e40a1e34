package arena

import (
	"encoding/binary"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// What the arena keeps in its own memory, so that a service restarted on the
// same arena file finds its objects again (recover.go). Three structures, all
// in the arena's mapping (a file on tmpfs or hugetlbfs, or anonymous memory,
// laid out the same way):
//
//   - the superblock (superblock.go): the arena's geometry, a format
//     version, the secret that keys every checksum below, and the counters
//     that outlive a process (starts, the content id, whether the last run
//     shut down cleanly);
//   - the unit map: one 32-bit word per unit of the data region, nonzero only
//     at the first unit of an allocated extent, saying what the extent is (a
//     slab of which class, or a large object's bytes) and how many units it
//     spans. A restart rebuilds the allocator from it alone, in one pass over
//     1/1024 of the arena's size, before it knows a single object;
//   - a trailer at the end of every object's slot: an object under the
//     alignment lies in a slot of a slab with its key and the trailer; a
//     larger one has its bytes in an extent of its own (aligned for O_DIRECT,
//     nothing else in it) and a descriptor slot holding its key, where its
//     bytes lie and the trailer. So every object, small or large, is found by
//     scanning the slabs, and the allocator's extents say where they are.
//
// The commit mark is the trailer's check word: a checksum keyed by the file's
// secret and the slot's place, of the trailer, the key, and a small object's
// bytes or a large object's descriptor, written by Commit after the object's
// bytes and cleared when the object leaves the index (removed, evicted). A
// slot whose check does not match is not an object: a write in flight at a
// kill left it 0, and random bytes, a slot copied elsewhere or one of another
// arena file do not match. The bytes of a large object (at least the
// alignment) are not in the check word: hashing them in Commit (xxh3, the
// fastest hash this project has, runs at about memcpy speed here) would
// halve put throughput. They have a seal of their own instead, in the
// descriptor: a hash keyed by the secret and the extent's place, computed
// after Commit by the sealer (seal.go) and checked by a restart before the
// object is served or evicted to the spill.

// layoutVersion is the version of the layout above; a file of another
// version is not reused.
const layoutVersion = 2

// trailerBytes is the size of a slot's trailer:
//
//	[0, 8)   format
//	[8, 16)  commit sequence (recency after a restart; the newer of two copies)
//	[16, 18) small: the object's size; large: 0
//	[18, 20) key length
//	[20]     kind: kindSmall or kindLarge
//	[21, 24) zero
//	[24, 28) record index: this process's, never trusted after a restart
//	[28, 32) check: the commit mark, 0 while pending and once gone
const trailerBytes = 32

// descBytes is what a large object's descriptor slot holds beside its key:
// the seal of its bytes (0 until sealed; outside the check word, so that
// sealing is one store), the extent's byte offset and the object's size, then
// the trailer.
const descBytes = 24 + trailerBytes

// descAt is where the descriptor's offset and size begin, past the seal.
const descAt = descBytes - 8

const (
	kindSmall = 1
	kindLarge = 2
)

// Unit map words: the extent's kind in the top 8 bits, its length in units in
// the low 24.
const (
	umLarge   = 0x80 // a large object's bytes
	umLenBits = 24
	// maxExtentUnits is the longest extent the unit map records.
	maxExtentUnits = 1<<umLenBits - 1
)

func umWord(kind uint8, units int64) uint32 { return uint32(kind)<<umLenBits | uint32(units) }

func umSlab(class int) uint8 { return uint8(class + 1) }

func umDecode(w uint32) (kind uint8, units int64) {
	return uint8(w >> umLenBits), int64(w & maxExtentUnits)
}

// trailerAt is the offset in the data region of the trailer of the slot that
// ends at end.
func trailerAt(end int64) int64 { return end - trailerBytes }

// trailer is a decoded trailer.
type trailer struct {
	format uint64
	seq    uint64
	size   uint16
	keyLen uint16
	kind   uint8
	rec    uint32
	check  uint32
}

func (a *Arena) readTrailer(end int64) trailer {
	b := a.mem[trailerAt(end):end:end]
	return trailer{
		format: binary.LittleEndian.Uint64(b[0:]),
		seq:    binary.LittleEndian.Uint64(b[8:]),
		size:   binary.LittleEndian.Uint16(b[16:]),
		keyLen: binary.LittleEndian.Uint16(b[18:]),
		kind:   b[20],
		rec:    binary.LittleEndian.Uint32(b[24:]),
		check:  binary.LittleEndian.Uint32(b[28:]),
	}
}

// writeTrailer writes t without its check word, which Commit writes last.
func (a *Arena) writeTrailer(end int64, t trailer) {
	b := a.mem[trailerAt(end):end:end]
	binary.LittleEndian.PutUint64(b[0:], t.format)
	binary.LittleEndian.PutUint64(b[8:], t.seq)
	binary.LittleEndian.PutUint16(b[16:], t.size)
	binary.LittleEndian.PutUint16(b[18:], t.keyLen)
	b[20], b[21], b[22], b[23] = t.kind, 0, 0, 0
	binary.LittleEndian.PutUint32(b[24:], t.rec)
}

// checkWord is the check word of the slot that ends at end.
func (a *Arena) checkWord(end int64) *uint32 {
	return (*uint32)(unsafe.Pointer(&a.mem[end-4]))
}

// setCheck publishes the slot: the last store of a Commit.
func (a *Arena) setCheck(end int64, c uint32) {
	*a.checkWord(end) = c
}

// clearCheck unpublishes the slot: the first store when an object leaves.
func (a *Arena) clearCheck(end int64) {
	*a.checkWord(end) = 0
}

// checkOf computes the check word of the slot [slot, end), from what its
// trailer says it holds: keyed by the arena's secret and the slot's place,
// over a small object's bytes and key, or a large object's key and
// descriptor, and the trailer's first 24 bytes; never 0 (0 is "no object").
// The caller has checked that the trailer's sizes lie inside the slot.
func (a *Arena) checkOf(slot, end int64) uint32 {
	t := trailerAt(end)
	keyLen := int64(binary.LittleEndian.Uint16(a.mem[t+18:]))
	body, tail := a.mem[slot:slot+keyLen], a.mem[t:t+24]
	if a.mem[t+20] == kindLarge {
		tail = a.mem[end-descAt : t+24]
	} else {
		body = a.mem[slot : slot+int64(binary.LittleEndian.Uint16(a.mem[t+16:]))+keyLen]
	}
	h := xxh3.HashSeed(body, a.secret^uint64(slot)*0x9e3779b97f4a7c15)
	c := uint32(xxh3.HashSeed(tail, h))
	if c == 0 {
		c = 1
	}
	return c
}

// descriptor reads a large object's descriptor: where its bytes lie and how
// many there are.
func (a *Arena) descriptor(end int64) (off, size int64) {
	b := a.mem[end-descAt : end-trailerBytes]
	return int64(binary.LittleEndian.Uint64(b[0:])), int64(binary.LittleEndian.Uint64(b[8:]))
}

// writeDescriptor writes a new large object's descriptor, unsealed.
func (a *Arena) writeDescriptor(end, off, size int64) {
	b := a.mem[end-descBytes : end-trailerBytes]
	binary.LittleEndian.PutUint64(b[0:], 0)
	binary.LittleEndian.PutUint64(b[8:], uint64(off))
	binary.LittleEndian.PutUint64(b[16:], uint64(size))
}

// sealWord is the seal of the large object whose descriptor slot ends at end.
func (a *Arena) sealWord(end int64) *uint64 {
	return (*uint64)(unsafe.Pointer(&a.mem[end-descBytes]))
}

// sealOf is the seal of a large object's bytes b at byte offset off: keyed by
// the file's secret and the place, so that bytes moved to another extent or
// taken from another arena file do not match; never 0 (0 is "not sealed").
func (a *Arena) sealOf(off int64, b []byte) uint64 {
	s := xxh3.HashSeed(b, a.secret^uint64(off)*0xc2b2ae3d27d4eb4f)
	if s == 0 {
		s = 1
	}
	return s
}

// setUnit records in the unit map what the extent at unit u is.
func (a *Arena) setUnit(u int64, w uint32) { a.umap[u] = w }
