package arena

import (
	"encoding/binary"
	"fmt"
	"slices"
)

// slotRec is the record index in the trailer of the slot that ends at end.
func (a *Arena) slotRec(end int64) uint32 {
	return binary.LittleEndian.Uint32(a.mem[trailerAt(end)+24:])
}

// Small objects: size classes in slabs.
//
// An object smaller than the alignment does not take an extent of its own (a
// 1 KiB object would cost 4 KiB): its bytes, its key right after them, and the
// slot's trailer (layout.go: its format, commit sequence, sizes, the index of
// its record, and the check word that marks it committed) at the end, go into a
// slot of the smallest size class that holds them. A larger object's key and
// trailer go into a slot too, its descriptor, beside where its bytes lie. The
// classes run from 32 B to 32 KiB, four per doubling, so a slot wastes under a
// quarter of its size (an eighth on average). A slab is one extent of the
// allocator (Config.SlabBytes, at least four slots, rounded up to the
// alignment) cut into the slots of one class; a slab with a free slot is on its
// class's partial list, and a slab whose last object goes is returned to the
// allocator at once, so the space serves any class or a large object again.
// Free slots are linked through their own first 4 bytes, and slots never used
// are handed out by a bump pointer, so a new slab touches no memory it does not
// use but its slots' check words, which it clears.
//
// Small objects are not aligned: the spill stages them (see Evicted). For
// eviction a slab is one region: the record index in each slot's trailer finds
// its objects without any per-slot table.

// classes are the slot sizes in bytes.
var classes = func() []int64 {
	var c []int64
	for base := int64(32); base < 32<<10; base *= 2 {
		for q := int64(4); q < 8; q++ {
			c = append(c, base*q/4)
		}
	}
	return append(c, 32<<10)
}()

// classOf is the index of the smallest class that holds n bytes, or -1.
func classOf(n int64) int {
	i, _ := slices.BinarySearch(classes, n)
	if i == len(classes) {
		return -1
	}
	return i
}

// slab is one extent cut into slots of one class. Pointer-free: the GC does not
// scan the slice of slabs.
type slab struct {
	off    int64 // byte offset in the region
	span   int64 // bytes
	slot   int64 // slot bytes: its class
	class  uint8
	live   bool
	onList bool // on its class's partial list
	// unscanned: recovered from the unit map, its slots not read yet
	// (recover.go); until they are it takes no objects and is not evicted.
	unscanned bool
	nslots    uint32 // slots it holds
	used      uint32 // slots holding an object (pending, committed, or removed but pinned)
	descs     uint32 // of them, large objects' descriptors
	carved    uint32 // slots the bump pointer has handed out
	free      uint32 // 1 + the first slot of the free list, 0 when it is empty
	// prev and next are 1 + the neighbours on the class's partial list.
	prev, next uint32
}

// slabOwner marks an owner entry as a slab id rather than a record index.
const slabOwner = 1 << 31

// slabSpan is the bytes of a slab of class c.
func (a *Arena) slabSpan(c int) int64 {
	n := max(a.cfg.SlabBytes, 4*classes[c])
	return (n + a.unit - 1) / a.unit * a.unit
}

// descSpan is the bytes of a slab of descriptors of class c: a slab of the
// class, or in an arena too small for one, as few units as hold one slot.
func (a *Arena) descSpan(c int) int64 {
	if n := a.slabSpan(c); n <= a.size {
		return n
	}
	return (classes[c] + a.unit - 1) / a.unit * a.unit
}

// smallClass is the class an object of size bytes under a key of keyLen bytes
// goes in, or -1 when it takes an extent of its own: it is at least the
// alignment (such objects stay aligned for O_DIRECT), too large for a class, or
// its slab would not fit in the arena.
func (a *Arena) smallClass(size int64, keyLen int) int {
	if size >= a.unit {
		return -1
	}
	c := classOf(size + int64(keyLen) + trailerBytes)
	if c < 0 || a.slabSpan(c) > a.size {
		return -1
	}
	return c
}

// descClass is the class of the descriptor slot of a large object under a
// key of keyLen bytes.
func (a *Arena) descClass(keyLen int) int { return classOf(int64(keyLen) + descBytes) }

// slotAllocLocked takes a slot of class c, from a partial slab or a new one, and
// returns its slab and offset; false when there is no slot and no extent for a
// new slab.
func (a *Arena) slotAllocLocked(c int) (uint32, int64, bool) {
	h := a.partial[c]
	if h == 0 {
		span := a.descSpan(c)
		u, ok := a.ext.Alloc(span / a.unit)
		if !ok {
			return 0, 0, false
		}
		id := a.newSlabLocked(slab{off: u * a.unit, span: span, slot: classes[c], class: uint8(c), live: true, nslots: uint32(span / classes[c])})
		// No slot of the new slab may look committed to a restarted service:
		// the memory held something else before.
		for o := u*a.unit + classes[c]; o <= u*a.unit+span; o += classes[c] {
			a.clearCheck(o)
		}
		a.setUnit(u, umWord(umSlab(c), span/a.unit))
		a.pushPartial(id)
		h = id + 1
	}
	id := h - 1
	s := &a.slabs[id]
	var slot uint32
	if s.free != 0 {
		slot = s.free - 1
		s.free = binary.LittleEndian.Uint32(a.mem[s.off+int64(slot)*s.slot:])
	} else {
		slot = s.carved
		s.carved++
	}
	s.used++
	if s.descs > 0 {
		a.descFree -= s.slot
	}
	if s.used == s.nslots {
		a.removePartial(id)
	}
	return id, s.off + int64(slot)*s.slot, true
}

// slotFreeLocked returns the slot at off to slab id, and the slab to the
// allocator when it was the last object in it.
func (a *Arena) slotFreeLocked(id uint32, off int64) {
	s := &a.slabs[id]
	slot := uint32((off - s.off) / s.slot)
	if !s.live || off < s.off || off >= s.off+s.span || (off-s.off)%s.slot != 0 || slot >= s.carved || s.used == 0 {
		panic(fmt.Sprintf("arena: freeing slot at %d of slab %d [%d, +%d): not one of its slots in use", off, id, s.off, s.span)) // a bookkeeping bug
	}
	s.used--
	if s.descs > 0 {
		a.descFree += s.slot
	}
	if s.used == 0 {
		if s.onList {
			a.removePartial(id)
		}
		a.dropSlabLocked(id)
		return
	}
	binary.LittleEndian.PutUint32(a.mem[off:], s.free)
	s.free = slot + 1
	if !s.onList {
		a.pushPartial(id)
	}
}

// markDescLocked counts a descriptor more (d = 1) or less (-1) in slab id.
// The free space of slabs holding descriptors is left out of the fill that
// region eviction works on (Arena.regionFillLocked): region eviction never
// frees such a slab, so evicting other regions to make up for it would only
// evict recent objects.
func (a *Arena) markDescLocked(id uint32, d int) {
	s := &a.slabs[id]
	free := s.span - int64(s.used)*s.slot
	switch {
	case d > 0 && s.descs == 0:
		a.descFree += free
	case d < 0 && s.descs == 1:
		a.descFree -= free
	}
	s.descs = uint32(int(s.descs) + d)
}

// newSlabLocked gives s an id and records it as its extent's owner.
func (a *Arena) newSlabLocked(s slab) uint32 {
	var id uint32
	if k := len(a.freeSlabs); k > 0 {
		id = a.freeSlabs[k-1]
		a.freeSlabs = a.freeSlabs[:k-1]
	} else {
		id = uint32(len(a.slabs))
		a.slabs = append(a.slabs, slab{})
	}
	a.slabs[id] = s
	a.owner[s.off/a.unit] = slabOwner | id
	return id
}

// dropSlabLocked returns slab id's extent to the allocator and its id to the
// free list.
func (a *Arena) dropSlabLocked(id uint32) {
	s := &a.slabs[id]
	u := s.off / a.unit
	delete(a.owner, u)
	a.setUnit(u, 0)
	if err := a.ext.Free(u, s.span/a.unit); err != nil {
		panic(fmt.Sprintf("arena: freeing slab %d: %v", id, err)) // a bookkeeping bug
	}
	*s = slab{}
	a.freeSlabs = append(a.freeSlabs, id)
}

func (a *Arena) pushPartial(id uint32) {
	s := &a.slabs[id]
	c := s.class
	s.prev, s.next, s.onList = 0, a.partial[c], true
	if s.next != 0 {
		a.slabs[s.next-1].prev = id + 1
	}
	a.partial[c] = id + 1
}

func (a *Arena) removePartial(id uint32) {
	s := &a.slabs[id]
	if s.prev != 0 {
		a.slabs[s.prev-1].next = s.next
	} else {
		a.partial[s.class] = s.next
	}
	if s.next != 0 {
		a.slabs[s.next-1].prev = s.prev
	}
	s.prev, s.next, s.onList = 0, 0, false
}

// slabObjects calls fn with the record of every object in slab id: the record
// index in each carved slot's trailer, if that record says it lies there.
func (a *Arena) slabObjects(id uint32, fn func(idx uint32) bool) {
	s := &a.slabs[id]
	for slot := range int64(s.carved) {
		off := s.off + slot*s.slot
		idx := a.slotRec(off + s.slot)
		if idx == 0 || idx >= a.recs.Len() {
			continue
		}
		r := a.recs.Get(idx)
		if r.state != freed && r.ref == id+1 && r.off == off {
			if !fn(idx) {
				return
			}
		}
	}
}
