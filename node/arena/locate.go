package arena

// rec is record i.
func (a *Arena) rec(i uint32) *record { return a.recs.Get(i) }

// slabOf is the slab r's slot is in.
func (a *Arena) slabOf(r *record) *slab { return &a.slabs[r.ref-1] }

// slotEnd is the end of r's slot: its trailer ends there.
func (a *Arena) slotEnd(r *record) int64 { return r.off + a.slabOf(r).slot }

// bytesOff is where r's bytes lie: in its slot, or in its extent.
func (a *Arena) bytesOff(r *record) int64 {
	if r.flags&flagLarge == 0 {
		return r.off
	}
	off, _ := a.descriptor(a.slotEnd(r))
	return off
}

// bytesOf is r's bytes.
func (a *Arena) bytesOf(r *record) []byte {
	off := a.bytesOff(r)
	return a.mem[off : off+r.size : off+r.size]
}

// keyOff is where r's key lies: after its bytes in its slot, or at the start
// of its descriptor slot.
func (a *Arena) keyOff(r *record) int64 {
	if r.flags&flagLarge == 0 {
		return r.off + r.size
	}
	return r.off
}

// extUnits is the units of a large object's extent.
func (a *Arena) extUnits(size int64) int64 { return (size + a.unit - 1) / a.unit }

// spanOf is the space r holds: its slot, and a large object's extent.
func (a *Arena) spanOf(r *record) int64 {
	span := a.slabOf(r).slot
	if r.flags&flagLarge != 0 {
		span += a.extUnits(r.size) * a.unit
	}
	return span
}

// placeOf is the first unit of the region r lies in, for region eviction: its
// extent, or its slab.
func (a *Arena) placeOf(r *record) int64 {
	if r.flags&flagLarge != 0 {
		return a.bytesOff(r) / a.unit
	}
	return a.slabOf(r).off / a.unit
}

// leasesOf is r's lease count. It lives in r.prev, which the LRU list does not
// use while the object is off it, and an object is off it while leased: the
// count of the few objects leased at once needs no table of its own.
func leasesOf(r *record) uint32 {
	if r.flags&flagInLRU != 0 {
		return 0
	}
	return r.prev
}

// lookupLocked is the record of the indexed object key, 0 when there is none.
func (a *Arena) lookupLocked(key string, h uint64) uint32 {
	return a.tab.Find(uint32(h), func(idx uint32) bool {
		r := a.rec(idx)
		return r.hash == h && int(r.keyLen) == len(key) && a.keyEqual(r, key)
	})
}

// keyEqual reports whether r's key is key, comparing the stored bytes.
func (a *Arena) keyEqual(r *record, key string) bool {
	k := a.keyOff(r)
	return string(a.mem[k:k+int64(r.keyLen)]) == key
}

// keyString is r's key.
func (a *Arena) keyString(r *record) string {
	k := a.keyOff(r)
	return string(a.mem[k : k+int64(r.keyLen)])
}
