package arena

import (
	"encoding/binary"
	"hash/maphash"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Reading one slab at recovery (recover.go's step 2): its slots' trailers
// and check words, the seals of the large objects it describes (seal.go),
// and indexing what holds. The slab is recovery's alone until indexed, so
// everything but the indexing runs without the lock.
// indexSlab indexes what readSlab found in slab id, unless the arena broke
// meanwhile (what it read may be zeros).
func (a *Arena) indexSlab(id uint32, rs *slabRead) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.broken() {
		return
	}
	a.indexSlabLocked(id, rs)
	a.rcv.read++
}

// slabRead is what readSlab found in a slab: the objects to index, the ends
// of the slots that failed their checks (badSeals of them large objects
// whose bytes did not match their seal), and of large objects with no seal.
type slabRead struct {
	found              []slotFind
	damaged            []int64
	badSeals, unsealed []lostLarge
	large              []slotFind // large objects whose seals are to check
	sealOK             []bool
}

// lostLarge is a large object recovery drops for its seal: the end of its
// descriptor slot and its extent.
type lostLarge struct{ end, at, size int64 }

func (rs *slabRead) reset() {
	rs.found, rs.damaged, rs.badSeals, rs.unsealed = rs.found[:0], rs.damaged[:0], rs.badSeals[:0], rs.unsealed[:0]
	rs.large = rs.large[:0]
}

// slotFind is a slot that holds what looks like a committed object: its
// trailer, sizes and key's hash all check.
type slotFind struct {
	off, end, size, bytesAt int64
	h                       uint64
	t                       trailer
}

// readSlab reads the slots of slab s, which recovery has not read (so nothing
// else touches them, and no lock is needed), into rs: the slots whose check
// word holds, and for a large object whose bytes match its seal (seal.go);
// the ends of those with a nonzero check word that does not hold, or whose
// bytes do not match; and of large objects never sealed.
func (a *Arena) readSlab(s *slab, rs *slabRead) {
	for slot := range int64(s.nslots) {
		off := s.off + slot*s.slot
		end := off + s.slot
		t := a.readTrailer(end)
		if t.check == 0 {
			continue
		}
		kl := int64(t.keyLen)
		f := slotFind{off: off, end: end, t: t}
		keyAt := off
		ok := kl >= 1 && kl <= MaxKeyBytes
		switch {
		case !ok:
		case t.kind == kindSmall:
			f.size, f.bytesAt, keyAt = int64(t.size), off, off+int64(t.size)
			ok = f.size >= 1 && f.size < a.unit && f.size+kl+trailerBytes <= s.slot
		case t.kind == kindLarge:
			ok = kl+descBytes <= s.slot
			if ok {
				f.bytesAt, f.size = a.descriptor(end)
				ok = f.size >= 1 && f.size <= a.size && f.bytesAt >= 0 && f.bytesAt%a.unit == 0 && f.bytesAt <= a.size-f.size
			}
		default:
			ok = false
		}
		if !ok || a.checkOf(off, end) != t.check {
			rs.damaged = append(rs.damaged, end)
			continue
		}
		f.h = maphash.Bytes(a.seed, a.mem[keyAt:keyAt+kl])
		if t.kind == kindLarge {
			if *a.sealWord(end) == 0 {
				rs.unsealed = append(rs.unsealed, lostLarge{end, f.bytesAt, f.size})
				continue
			}
			rs.large = append(rs.large, f)
			continue
		}
		rs.found = append(rs.found, f)
	}
	a.checkSeals(rs)
}

// checkSeals hashes the bytes of the large objects readSlab found against
// their seals, moving each to found or badSeals. The extents are the unit
// map's and nobody else's until they are indexed (or their descriptors are
// damaged, which the check words rule out): hashing them needs no lock. A
// slab of descriptors can name gigabytes, so its objects are hashed by
// hashWorkers goroutines, not only the one reading the slab.
func (a *Arena) checkSeals(rs *slabRead) {
	if len(rs.large) == 0 {
		return
	}
	ok := slices.Grow(rs.sealOK[:0], len(rs.large))[:len(rs.large)]
	rs.sealOK = ok
	check := func(i int) {
		f := &rs.large[i]
		ok[i] = a.sealOf(f.bytesAt, a.mem[f.bytesAt:f.bytesAt+f.size:f.bytesAt+f.size]) == *a.sealWord(f.end)
	}
	var total int64
	for i := range rs.large {
		total += rs.large[i].size
	}
	if workers := hashWorkers(); workers > 1 && len(rs.large) > 1 && total >= 8<<20 {
		var next atomic.Int64
		var wg sync.WaitGroup
		for range min(workers, len(rs.large)) - 1 {
			wg.Go(func() {
				defer a.guard(debug.SetPanicOnFault(true), nil)
				for i := int(next.Add(1) - 1); i < len(rs.large); i = int(next.Add(1) - 1) {
					check(i)
				}
			})
		}
		for i := int(next.Add(1) - 1); i < len(rs.large); i = int(next.Add(1) - 1) {
			check(i)
		}
		wg.Wait()
	} else {
		for i := range rs.large {
			check(i)
		}
	}
	for i := range rs.large {
		f := rs.large[i]
		if ok[i] {
			rs.found = append(rs.found, f)
		} else {
			rs.badSeals = append(rs.badSeals, lostLarge{f.end, f.bytesAt, f.size})
		}
	}
}

// hashWorkers is how many goroutines hash one slab's large objects at
// recovery: half the CPUs, from recoverWorkers to eight.
func hashWorkers() int { return min(max(runtime.GOMAXPROCS(0)/2, recoverWorkers), 8) }

// indexSlabLocked indexes the objects readSlab found in slab id, clears the
// damaged slots, frees the rest, and frees the slab if it holds nothing.
func (a *Arena) indexSlabLocked(id uint32, rs *slabRead) {
	for _, end := range rs.damaged {
		a.clearCheck(end)
		a.rcv.lost++
	}
	for _, l := range rs.unsealed {
		a.dropLargeLocked(l)
		a.rcv.unsealed++
	}
	for _, l := range rs.badSeals {
		a.dropLargeLocked(l)
		a.rcv.lost++
		a.rcv.badSeals++
	}
	found := rs.found
	s := &a.slabs[id]
	s.unscanned = false
	used := make([]bool, s.nslots)
	var n, descs uint32
	// The hash table's slots for the slab's keys, loaded at once: their
	// cache misses overlap, and the lookups below hit.
	var touched uint64
	for i := range found {
		touched |= a.tab.Touch(uint32(found[i].h))
	}
	a.rcv.touched ^= touched
	for i := range found {
		if a.indexSlotLocked(id, &found[i]) {
			used[(found[i].off-s.off)/s.slot] = true
			n++
			if found[i].t.kind == kindLarge {
				descs++
			}
		}
	}
	s = &a.slabs[id]
	var free uint32
	for slot := int64(s.nslots) - 1; slot >= 0; slot-- {
		if !used[slot] {
			binary.LittleEndian.PutUint32(a.mem[s.off+slot*s.slot:], free)
			free = uint32(slot) + 1
		}
	}
	s.carved, s.used, s.free = s.nslots, n, free
	if descs > 0 {
		a.markDescLocked(id, 1)
		s.descs = descs
	}
	switch {
	case n == 0:
		a.dropSlabLocked(id)
	case n < s.nslots:
		a.pushPartial(id)
	}
}

// dropLargeLocked clears the slot of a large object recovery drops for its
// seal and frees its extent (not an unfinished write's: it was committed).
func (a *Arena) dropLargeLocked(l lostLarge) {
	a.clearCheck(l.end)
	u, n := l.at/a.unit, a.extUnits(l.size)
	if a.owner[u] != ownerOrphan || a.umap[u] != umWord(umLarge, n) {
		return // not where the unit map says: freed with the orphans, if at all
	}
	delete(a.owner, u)
	a.setUnit(u, 0)
	if err := a.ext.Free(u, n); err != nil {
		panic("arena: freeing a dropped object's extent: " + err.Error()) // a bookkeeping bug
	}
	a.rcv.orphans--
}

// indexSlotLocked indexes the object readSlab found in f, in slab id, and
// reports whether it did: a large object's extent must be the one the unit
// map has for it, and of two copies of a key the newer commit stays.
func (a *Arena) indexSlotLocked(id uint32, f *slotFind) bool {
	drop := func(count *int64) bool {
		a.clearCheck(f.end)
		*count++
		return false
	}
	t, kl := f.t, int64(f.t.keyLen)
	u := f.bytesAt / a.unit
	if t.kind == kindLarge && (a.owner[u] != ownerOrphan || a.umap[u] != umWord(umLarge, a.extUnits(f.size))) {
		return drop(&a.rcv.lost) // its extent is not where the unit map says, or is another's
	}
	keyAt := f.off
	if t.kind == kindSmall {
		keyAt += f.size
	}
	key := a.mem[keyAt : keyAt+kl : keyAt+kl]
	ks := unsafe.String(&key[0], len(key)) // compared only, while the lock holds the slot
	if idx := a.lookupLocked(ks, f.h); idx != 0 {
		// Another copy of the key: one put while recovery ran (newer), or a
		// second copy in the file, which only a kill during an earlier
		// recovery leaves. The newer commit stays.
		r := a.rec(idx)
		if r.flags&flagRecovered == 0 || r.state != committed || r.flags&flagInLRU == 0 ||
			a.readTrailer(a.slotEnd(r)).seq > t.seq {
			return drop(&a.rcv.duplicates)
		}
		a.rcv.recovered--
		a.rcv.recoveredBytes -= r.size
		a.rcv.duplicates++
		a.unindexLocked(idx)
		a.freeLocked(idx)
	}
	idx, err := a.recs.Alloc()
	if err == nil {
		if err = a.tab.Insert(idx, uint32(f.h)); err != nil {
			a.recs.Release(idx)
		}
	}
	if err != nil {
		// Out of memory for the index: the object cannot be served, and its
		// slot is given out again.
		return drop(&a.rcv.lost)
	}
	flags := uint8(flagRecovered)
	if t.kind == kindLarge {
		flags |= flagLarge
		a.owner[u] = idx
		a.rcv.orphans--
	}
	r := a.rec(idx)
	*r = record{hash: f.h, format: t.format, off: f.off, size: f.size, ref: id + 1, keyLen: uint16(kl), state: committed, flags: flags}
	binary.LittleEndian.PutUint32(a.mem[trailerAt(f.end)+24:], idx)
	a.committed++
	a.committedBytes += f.size
	a.held += a.spanOf(r)
	a.lruPushBack(idx)
	a.rcv.recovered++
	a.rcv.recoveredBytes += f.size
	a.rcv.order.add(seqIdx{seq: t.seq, idx: idx})
	return true
}
