package spill

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/storage"
)

// The index: where each object's record is, kept off the Go heap.
//
// Every indexed object is a fixed-size, pointer-free record (48 bytes) in
// memory mapped outside the Go heap, chunk by chunk, addressed by a uint32;
// keys are found through an open-addressing hash table of record numbers, also
// mapped. The garbage collector never scans or sweeps either, so a collection
// costs the same with 100M objects spilled as with none, and an object costs
// its record and its table slot (8 bytes at a load of 3/8 to 3/4): 59 to 70
// bytes. (A Go map of the same entries cost 111-134 bytes an object and GC
// time that grew with it.) The same idea as node/arena's index; its own copy,
// because the spill looks up by a 128-bit hash and drops records a segment at
// a time.
//
// The records of a segment are linked in a list from the segment, so that
// dropping it forgets its objects without a key list on the heap. A record
// whose object is removed, or overridden by a later record at start-up, leaves
// the table but stays on its segment's list, dead, until the segment goes:
// like the record's bytes on disk.

// record is one object's metadata: 48 bytes, part of the per-object cost.
type record struct {
	hash   [16]byte // the key's 128-bit hash (hashKey)
	format uint64
	off    int64 // the record's offset in its segment
	// bits holds the data length (bits 0-47), the header length in sectors
	// (bits 48-55) and recLive (bit 63).
	bits uint64
	seg  uint32 // the segment's id
	// next is the record after it on its segment's list, or on the free list;
	// 0 ends a list.
	next uint32
}

const (
	recSizeMask = 1<<48 - 1
	recHdrShift = 48
	recLive     = 1 << 63 // in the table; clear once removed or overridden
)

// The record layout is the per-object cost: keep it at 48 bytes.
var _ [unsafe.Sizeof(record{}) - 48]byte
var _ [48 - unsafe.Sizeof(record{})]byte

func (r *record) entry() entry {
	return entry{seg: r.seg, hdrLen: uint32(r.bits>>recHdrShift&0xff) * sector, off: r.off, size: int64(r.bits & recSizeMask), format: r.format}
}

// chunkShift sets the records per mapped chunk: 64 Ki, 3 MiB.
const chunkShift = 16

// index maps a key's 128-bit hash to its object's entry. It is not safe for
// concurrent use: the store's mutex guards it.
type index struct {
	chunks [][]record // each a mapped chunk of 1<<chunkShift records
	next   uint32     // records handed out so far; record 0 is never used
	free   uint32     // the free list's first record, 0 when empty
	tab    table
	n      int // live records: objects indexed
}

func newIndex() (index, error) {
	t, err := newTable(tableMinSlots)
	if err != nil {
		return index{}, err
	}
	return index{tab: t, next: 1}, nil
}

func (x *index) rec(i uint32) *record { return &x.chunks[i>>chunkShift][i&(1<<chunkShift-1)] }

// hashBits is what the table keeps of a hash: its first 32 bits.
func hashBits(h [16]byte) uint64 { return uint64(binary.LittleEndian.Uint32(h[:4])) }

// find returns h's live record number, 0 when h is not indexed.
func (x *index) find(h [16]byte) uint32 {
	bits := hashBits(h)
	t := &x.tab
	for i := bits & t.mask; t.slots[i] != 0; i = (i + 1) & t.mask {
		if s := t.slots[i]; s>>32 == bits && x.rec(uint32(s)).hash == h {
			return uint32(s)
		}
	}
	if t.old != nil {
		for i := bits & t.oldMask; t.old[i] != 0; i = (i + 1) & t.oldMask {
			if s := t.old[i]; s>>32 == bits && uint32(s) != 0 && x.rec(uint32(s)).hash == h {
				return uint32(s)
			}
		}
	}
	return 0
}

// get returns h's entry.
func (x *index) get(h [16]byte) (entry, bool) {
	if i := x.find(h); i != 0 {
		return x.rec(i).entry(), true
	}
	return entry{}, false
}

// add indexes e under h, on the list of segment seg (whose first record is
// *head), replacing h's entry if it had one: that one is returned. e.seg must
// be seg's id.
func (x *index) add(head *uint32, h [16]byte, e entry) (old entry, replaced bool, err error) {
	if e.size < 0 || e.size > recSizeMask || e.hdrLen%sector != 0 || e.hdrLen/sector > 0xff {
		return entry{}, false, fmt.Errorf("spill: a record of %d+%d bytes cannot be indexed (a bug): %w", e.hdrLen, e.size, storage.ErrIO)
	}
	if i := x.find(h); i != 0 {
		old, replaced = x.rec(i).entry(), true
		x.unlink(h, i)
	}
	i, err := x.alloc()
	if err != nil {
		return old, replaced, err
	}
	if err := x.tab.insert(i, hashBits(h)); err != nil {
		x.release(i)
		return old, replaced, err
	}
	*x.rec(i) = record{hash: h, format: e.format, off: e.off, bits: uint64(e.size) | uint64(e.hdrLen/sector)<<recHdrShift | recLive, seg: e.seg, next: *head}
	*head = i
	x.n++
	return old, replaced, nil
}

// remove forgets h and returns its entry. Its record stays on its segment's
// list until dropSegment.
func (x *index) remove(h [16]byte) (entry, bool) {
	i := x.find(h)
	if i == 0 {
		return entry{}, false
	}
	e := x.rec(i).entry()
	x.unlink(h, i)
	return e, true
}

// unlink takes live record i, of hash h, out of the table.
func (x *index) unlink(h [16]byte, i uint32) {
	x.tab.remove(i, hashBits(h))
	x.rec(i).bits &^= recLive
	x.n--
}

// dropSegment forgets the records of the list that starts at head, live or
// not, and returns how many objects and data bytes were live.
func (x *index) dropSegment(head uint32) (objects, bytes int64) {
	if head == 0 {
		return 0, 0
	}
	last := head
	for i := head; i != 0; i = x.rec(i).next {
		r := x.rec(i)
		if r.bits&recLive != 0 {
			x.unlink(r.hash, i)
			objects++
			bytes += int64(r.bits & recSizeMask)
		}
		last = i
	}
	x.rec(last).next = x.free
	x.free = head
	return objects, bytes
}

// alloc returns an unused record's number.
func (x *index) alloc() (uint32, error) {
	if i := x.free; i != 0 {
		x.free = x.rec(i).next
		return i, nil
	}
	if x.next == 1<<32-1 {
		return 0, fmt.Errorf("spill: the index holds %d records, its limit; lower --spill-capacity: %w", x.next, storage.ErrNoSpace)
	}
	if int(x.next>>chunkShift) == len(x.chunks) {
		mem, err := mapAnon(int(unsafe.Sizeof(record{})) << chunkShift)
		if err != nil {
			return 0, err
		}
		x.chunks = append(x.chunks, unsafe.Slice((*record)(unsafe.Pointer(unsafe.SliceData(mem))), 1<<chunkShift))
	}
	i := x.next
	x.next++
	return i, nil
}

// release returns a record that alloc handed out and nothing links to.
func (x *index) release(i uint32) {
	x.rec(i).next = x.free
	x.free = i
}

// bytes is the memory the index has mapped.
func (x *index) bytes() int64 {
	return int64(len(x.chunks))<<chunkShift*int64(unsafe.Sizeof(record{})) + x.tab.bytes()
}

func (x *index) close() {
	for _, c := range x.chunks {
		unmapAnon(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(c))), len(c)*int(unsafe.Sizeof(record{}))))
	}
	x.tab.close()
	*x = index{n: x.n} // Stats still counts the objects
}

// table is an open-addressing hash table (linear probing, deletion by backward
// shift, no tombstones) of record numbers in mapped memory. A slot holds the
// record number in its low 32 bits and the hash's first 32 bits in its high
// ones, so that probing and growing never touch the records; 0 is an empty
// slot (record 0 is never used).
//
// It grows by doubling, incrementally: rehashing 100M entries at once would
// hold the store's lock for seconds. The grown table takes every insert while
// each insert and remove also moves migrateStep slots of the old one across;
// until the old one is empty, lookups probe both. In the old table a moved or
// removed entry leaves a tombstone (record 0, hash bits 1): a backward shift
// there could move a waiting entry behind the migration cursor, and an empty
// slot would cut the probe runs of the entries still waiting.
type table struct {
	slots   []uint64
	mask    uint64
	n       int      // entries in both tables
	old     []uint64 // the table being migrated from, nil when none
	oldMask uint64
	cursor  int // old slots before it have been moved
}

const (
	tableMinSlots = 1024
	// migrateStep is the old slots each insert or remove moves: the old table
	// is empty long before the new one needs to grow (it has taken 3/4 of the
	// old one's slots in inserts by then).
	migrateStep = 16
	tombstone   = 1 << 32
)

func newTable(slots int) (table, error) {
	s, err := mapSlots(slots)
	if err != nil {
		return table{}, err
	}
	return table{slots: s, mask: uint64(slots - 1)}, nil
}

func mapSlots(n int) ([]uint64, error) {
	mem, err := mapAnon(n * 8)
	if err != nil {
		return nil, err
	}
	return unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(mem))), n), nil
}

func unmapSlots(s []uint64) {
	if s != nil {
		unmapAnon(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*8))
	}
}

func (t *table) close() {
	unmapSlots(t.slots)
	unmapSlots(t.old)
	*t = table{}
}

// insert adds record idx under hash bits, starting to grow the table past a
// load of 3/4.
func (t *table) insert(idx uint32, bits uint64) error {
	if (t.n+1)*4 > len(t.slots)*3 {
		for t.old != nil { // never in practice: see migrateStep
			t.migrate()
		}
		bigger, err := mapSlots(len(t.slots) * 2)
		if err != nil {
			return err
		}
		t.old, t.oldMask, t.cursor = t.slots, t.mask, 0
		t.slots, t.mask = bigger, uint64(len(bigger)-1)
	}
	t.migrate()
	t.put(uint64(idx) | bits<<32)
	t.n++
	return nil
}

// migrate moves the next migrateStep slots of the old table into the new one,
// and drops the old one once it is empty.
func (t *table) migrate() {
	if t.old == nil {
		return
	}
	for end := min(t.cursor+migrateStep, len(t.old)); t.cursor < end; t.cursor++ {
		if s := t.old[t.cursor]; uint32(s) != 0 {
			t.put(s)
			t.old[t.cursor] = tombstone
		}
	}
	if t.cursor == len(t.old) {
		unmapSlots(t.old)
		t.old, t.oldMask, t.cursor = nil, 0, 0
	}
}

func (t *table) put(s uint64) {
	i := s >> 32 & t.mask
	for t.slots[i] != 0 {
		i = (i + 1) & t.mask
	}
	t.slots[i] = s
}

// remove takes record idx, under hash bits, out of the table.
func (t *table) remove(idx uint32, bits uint64) {
	s := uint64(idx) | bits<<32
	pos, old := -1, false
	for i := bits & t.mask; t.slots[i] != 0; i = (i + 1) & t.mask {
		if t.slots[i] == s {
			pos = int(i)
			break
		}
	}
	if pos < 0 && t.old != nil {
		for i := bits & t.oldMask; t.old[i] != 0; i = (i + 1) & t.oldMask {
			if t.old[i] == s {
				pos, old = int(i), true
				break
			}
		}
	}
	switch {
	case pos < 0:
		panic(fmt.Sprintf("spill: record %d is not in the index", idx)) // a bookkeeping bug
	case old:
		t.old[pos] = tombstone
	default:
		// Backward shift: move each later entry of the run into the hole
		// unless its home slot lies cyclically in (hole, its slot].
		i := uint64(pos)
		for j := (i + 1) & t.mask; t.slots[j] != 0; j = (j + 1) & t.mask {
			home := t.slots[j] >> 32 & t.mask
			if (j-home)&t.mask >= (j-i)&t.mask {
				t.slots[i] = t.slots[j]
				i = j
			}
		}
		t.slots[i] = 0
	}
	t.n--
	t.migrate()
}

// bytes is the memory the table has mapped.
func (t *table) bytes() int64 { return int64(len(t.slots)+len(t.old)) * 8 }

// mapAnon maps n bytes of zeroed memory outside the Go heap. MAP_NORESERVE:
// only the pages written cost memory.
func mapAnon(n int) ([]byte, error) {
	p, err := unix.MmapPtr(-1, 0, nil, uintptr(n), unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("spill: map %d bytes for the index: %v; the host is out of address space or memory: %w", n, err, storage.ErrNoSpace)
	}
	return unsafe.Slice((*byte)(p), n), nil
}

func unmapAnon(b []byte) {
	if len(b) > 0 {
		_ = unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(b)), uintptr(len(b)))
	}
}
