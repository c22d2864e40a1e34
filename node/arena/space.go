package arena

import "fmt"

// nextSeqLocked is the next commit sequence: the start's epoch in the top 24
// bits, a counter in the low 40; a counter that runs out starts a new epoch,
// recorded before it is used.
func (a *Arena) nextSeqLocked() uint64 {
	if a.seq == 1<<40 {
		a.epoch++
		a.seq = 0
		if a.back != nil {
			a.back.sb.epoch = a.epoch
			a.back.writeSuperblock()
		}
	}
	a.seq++
	return a.epoch<<40 | a.seq
}

// placeLocked finds space for a new pending object and indexes it; false when
// there is no room (a class without a free slot and no extent for a new slab,
// or no extent for the object).
func (a *Arena) placeLocked(key string, h, format uint64, size int64, class int, into *Pending) (bool, error) {
	var off, ext int64
	var ref uint32
	var flags uint8
	large := class < 0
	if large {
		class = a.descClass(len(key))
		units := a.extUnits(size)
		u, ok := a.ext.Alloc(units)
		if !ok {
			return false, nil
		}
		id, o, ok := a.slotAllocLocked(class)
		if !ok {
			_ = a.ext.Free(u, units)
			return false, nil
		}
		ext, off, ref, flags = u*a.unit, o, id+1, flagLarge
		a.markDescLocked(id, 1)
	} else {
		id, o, ok := a.slotAllocLocked(class)
		if !ok {
			return false, nil
		}
		off, ref = o, id+1
	}
	idx, err := a.recs.Alloc()
	if err == nil {
		err = a.tab.Insert(idx, uint32(h))
		if err != nil {
			a.recs.Release(idx)
		}
	}
	if err != nil {
		if large {
			a.markDescLocked(ref-1, -1)
			_ = a.ext.Free(ext/a.unit, a.extUnits(size))
		}
		a.slotFreeLocked(ref-1, off)
		return false, indexErr(err)
	}
	r := a.rec(idx)
	*r = record{hash: h, format: format, off: off, size: size, ref: ref, keyLen: uint16(len(key)), state: pending, flags: flags}
	end := a.slotEnd(r)
	t := trailer{format: format, keyLen: uint16(len(key)), kind: kindSmall, rec: idx}
	if large {
		t.kind = kindLarge
		copy(a.mem[off:], key)
		a.writeDescriptor(end, ext, size)
		a.owner[ext/a.unit] = idx
		a.setUnit(ext/a.unit, umWord(umLarge, a.extUnits(size)))
	} else {
		t.size = uint16(size)
		copy(a.mem[off+size:], key)
	}
	a.writeTrailer(end, t)
	span := a.spanOf(r)
	a.pending++
	a.pendingBytes += span
	a.held += span
	a.kickLocked()
	bo := a.bytesOff(r)
	into.a, into.idx, into.key, into.b = a, idx, key, a.mem[bo:bo+size:bo+size]
	into.done.Store(false)
	return true, nil
}

// unindexLocked takes a committed object out of the index and the LRU list,
// and clears its commit mark: a restarted service will not find it.
func (a *Arena) unindexLocked(idx uint32) {
	r := a.rec(idx)
	a.clearCheck(a.slotEnd(r))
	a.tab.Remove(idx, uint32(r.hash))
	a.lruRemove(idx)
	r.state = gone
	a.committed--
	a.committedBytes -= r.size
}

// freeLocked returns a gone object's space to the allocator and its record to
// the free list, unless something still pins it, in which case the last pin to
// go calls it again.
func (a *Arena) freeLocked(idx uint32) {
	r := a.rec(idx)
	if r.state != gone || leasesOf(r) > 0 || r.flags&flagEvicting != 0 || a.broken() {
		return // a broken arena frees nothing: its records may point at zeros (fault.go)
	}
	span := a.spanOf(r)
	if r.flags&flagLarge != 0 {
		u := a.bytesOff(r) / a.unit
		delete(a.owner, u)
		a.setUnit(u, 0)
		if err := a.ext.Free(u, a.extUnits(r.size)); err != nil {
			panic(fmt.Sprintf("arena: freeing object at %d: %v", u*a.unit, err)) // a bookkeeping bug: never outside input
		}
		a.markDescLocked(r.ref-1, -1)
	}
	a.slotFreeLocked(r.ref-1, r.off)
	a.held -= span
	*r = record{state: freed}
	a.recs.Release(idx)
}

// usedLocked is the bytes objects hold, in extents of their own or in slots: the
// fill the watermarks apply to. Committed, pending, and removed but still leased
// objects count.
func (a *Arena) usedLocked() int64 { return a.held }

// extentsUsedLocked is the bytes in allocated extents, less memory withheld
// for the warm-up or that could not be populated: what the objects and their
// slabs take.
func (a *Arena) extentsUsedLocked() int64 {
	return (a.ext.UsedUnits() - a.warm.withheld - a.warm.failed) * a.unit
}

// regionFillLocked is the fill region eviction works on: the allocated
// extents, less the free space of slabs that hold descriptors (which region
// eviction never frees).
func (a *Arena) regionFillLocked() int64 { return a.extentsUsedLocked() - a.descFree }

// kickLocked wakes the background evictor when the fill, or the allocated
// extents, are past the high watermark.
func (a *Arena) kickLocked() {
	if a.usedLocked() > a.high || a.regionFillLocked() > a.high {
		select {
		case a.wake <- struct{}{}:
		default:
		}
	}
}
