package spill

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unsafe"

	"github.com/zeebo/xxh3"

	"github.com/stratakv/strata/internal/offheap"
	"github.com/stratakv/strata/storage"
)

// The index: where each object's record is, kept off the Go heap.
//
// Every indexed object is a fixed-size, pointer-free record (48 bytes) in an
// offheap.Pool, memory mapped outside the Go heap and addressed by a uint32;
// keys are found through an offheap.Table of record numbers under the first
// 32 bits of their 128-bit hash, also mapped. The garbage collector never
// scans or sweeps either, so a collection costs the same with 100M objects
// spilled as with none, and an object costs its record and its table slot (8
// bytes at a load of 3/8 to 3/4): 59 to 70 bytes. (A Go map of the same
// entries cost 111-134 bytes an object and GC time that grew with it.) The
// same building blocks as node/arena's index.
//
// The records of a segment are linked in a list from the segment, so that
// dropping it forgets its objects without a key list on the heap, and so that
// compaction finds a segment's live objects without reading it. A record whose
// object is removed, or overridden by a later record (at start-up, or by
// compaction's copy of it), leaves the table but stays on its segment's list,
// dead, until the segment goes: like the record's bytes on disk.
//
// A put indexes its object as pending when it places the record, before it
// copies the bytes, and commits it once they are copied: a pending object is
// invisible to reads; a second put of the key finds it and is skipped, so
// that two records of one key are never both being written; and a remove
// finds it and cancels it (abort), so that the put's commit finds it gone.

// record is one object's metadata: 48 bytes, part of the per-object cost.
// Record 0 is never used: 0 ends a list, and the table holds no index 0.
type record struct {
	hash   [16]byte // the key's 128-bit hash (hashKey)
	format uint64
	off    int64 // the record's offset in its segment
	// bits holds the data length (bits 0-47), the header length in sectors
	// (bits 48-55), recPending (bit 62) and recLive (bit 63).
	bits uint64
	seg  uint32 // the segment's id
	// next is the record after it on its segment's list; 0 ends the list.
	next uint32
}

const (
	recSizeMask = 1<<48 - 1
	recHdrShift = 48
	recLive     = 1 << 63 // in the table; clear once removed or overridden
	recPending  = 1 << 62 // placed by a put still copying its bytes
)

// The record layout is the per-object cost: keep it at 48 bytes.
var _ [unsafe.Sizeof(record{}) - 48]byte
var _ [48 - unsafe.Sizeof(record{})]byte

func (r *record) entry() entry {
	return entry{seg: r.seg, hdrLen: uint32(r.bits>>recHdrShift&0xff) * sector, off: r.off, size: int64(r.bits & recSizeMask),
		format: r.format, pending: r.bits&recPending != 0}
}

// index maps a key's 128-bit hash to its object's entry. It is not safe for
// concurrent use: the store's mutex guards it.
type index struct {
	recs offheap.Pool[record]
	tab  offheap.Table
	n    int // live records: objects indexed
}

func newIndex() (index, error) {
	var x index
	var err error
	if x.tab, err = offheap.NewTable(); err != nil {
		return index{}, indexErr(err)
	}
	if _, err := x.recs.Alloc(); err != nil { // record 0: never used
		x.tab.Close()
		return index{}, indexErr(err)
	}
	return x, nil
}

// indexErr makes a failure of the pool or table, out of mapped memory or of
// record numbers, a storage.ErrNoSpace: what the store's callers handle.
func indexErr(err error) error {
	if errors.Is(err, offheap.ErrFull) {
		return fmt.Errorf("spill: the index: %w; lower --spill-capacity: %w", err, storage.ErrNoSpace)
	}
	return fmt.Errorf("spill: the index: %w: %w", err, storage.ErrNoSpace)
}

func (x *index) rec(i uint32) *record { return x.recs.Get(i) }

// hashBits is what the table keeps of a hash: its first 32 bits.
func hashBits(h [16]byte) uint32 { return binary.LittleEndian.Uint32(h[:4]) }

// find returns h's live record number, 0 when h is not indexed.
func (x *index) find(h [16]byte) uint32 {
	return x.tab.Find(hashBits(h), func(i uint32) bool { return x.rec(i).hash == h })
}

// get returns h's entry.
func (x *index) get(h [16]byte) (entry, bool) {
	if i := x.find(h); i != 0 {
		return x.rec(i).entry(), true
	}
	return entry{}, false
}

// add indexes e under h, on the list of segment seg (whose first record is
// *head), replacing h's entry if it had one: that one is returned, with the
// new record's number. e.seg must be seg's id; e.pending indexes it pending.
func (x *index) add(head *uint32, h [16]byte, e entry) (i uint32, old entry, replaced bool, err error) {
	if e.size < 0 || e.size > recSizeMask || e.hdrLen%sector != 0 || e.hdrLen/sector > 0xff {
		return 0, entry{}, false, fmt.Errorf("spill: a record of %d+%d bytes cannot be indexed (a bug): %w", e.hdrLen, e.size, storage.ErrIO)
	}
	if i := x.find(h); i != 0 {
		old, replaced = x.rec(i).entry(), true
		x.unlink(h, i)
	}
	i, err = x.recs.Alloc()
	if err != nil {
		return 0, old, replaced, indexErr(err)
	}
	if err := x.tab.Insert(i, hashBits(h)); err != nil {
		x.recs.Release(i)
		return 0, old, replaced, indexErr(err)
	}
	bits := uint64(e.size) | uint64(e.hdrLen/sector)<<recHdrShift | recLive
	if e.pending {
		bits |= recPending
	}
	*x.rec(i) = record{hash: h, format: e.format, off: e.off, bits: bits, seg: e.seg, next: *head}
	*head = i
	x.n++
	return i, old, replaced, nil
}

// commit makes pending record i an indexed object.
func (x *index) commit(i uint32) { x.rec(i).bits &^= recPending }

// isPending reports whether record i is still pending: not committed, and
// not aborted.
func (x *index) isPending(i uint32) bool {
	return x.rec(i).bits&(recLive|recPending) == recLive|recPending
}

// abort forgets pending record i. It stays on its segment's list until
// dropSegment.
func (x *index) abort(i uint32) {
	r := x.rec(i)
	if r.bits&recLive != 0 {
		x.unlink(r.hash, i)
	}
	r.bits &^= recPending
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
	x.tab.Remove(i, hashBits(h))
	x.rec(i).bits &^= recLive
	x.n--
}

// live returns the live records of the list that starts at from (a segment's
// head, or where an earlier call stopped), at most max of them, and where to
// go on (0: the list's end).
func (x *index) live(from uint32, max int, fn func(i uint32, h [16]byte, e entry)) (next uint32) {
	for i := from; i != 0; i = x.rec(i).next {
		if max == 0 {
			return i
		}
		if r := x.rec(i); r.bits&recLive != 0 {
			fn(i, r.hash, r.entry())
			max--
		}
	}
	return 0
}

// dropSegment forgets the records of the list that starts at head, live or
// not, and returns how many objects and data bytes were live.
func (x *index) dropSegment(head uint32) (objects, bytes int64) {
	for i := head; i != 0; {
		r := x.rec(i)
		if r.bits&recLive != 0 {
			x.unlink(r.hash, i)
			objects++
			bytes += int64(r.bits & recSizeMask)
		}
		next := r.next
		x.recs.Release(i)
		i = next
	}
	return objects, bytes
}

// bytes is the memory the index has mapped.
func (x *index) bytes() int64 {
	return x.recs.Bytes() + x.tab.Bytes()
}

func (x *index) close() {
	x.recs.Close()
	x.tab.Close()
	*x = index{n: x.n} // Stats still counts the objects
}

// entry is where an object's record is, as the index returns it.
type entry struct {
	seg    uint32
	hdrLen uint32
	off    int64
	size   int64
	format uint64
	// pending: placed by a put that is still copying its bytes; not yet
	// visible to reads and removes.
	pending bool
}

// recLen is the length of e's record: its header, data and padding.
func recLen(e entry) int64 {
	if e.hdrLen == block { // written straight from the caller's memory
		return roundUp(block+e.size, block)
	}
	return roundUp(int64(e.hdrLen)+e.size, sector)
}

// hashKey names key in the index. Two keys of one hash are the one risk of a
// wrong answer from the index alone (2^-128 a pair); reads compare the key in
// the record's header, so they never serve the other key's bytes.
func hashKey(key string) [16]byte {
	return xxh3.HashString128(key).Bytes()
}
