package arena

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Stats is a snapshot of an arena's fill and counters.
type Stats struct {
	// SizeBytes is the memory objects can use: Config.SizeBytes rounded down to the
	// alignment.
	SizeBytes int64 `json:"sizeBytes"`
	// UsedBytes is the memory in allocated extents: those of objects of at least the
	// alignment (committed, pending, and removed but still leased), and whole
	// slabs of smaller objects.
	UsedBytes int64 `json:"usedBytes"`
	// HeldBytes is the memory objects hold: their extents, or their slots. The
	// watermarks apply to it; UsedBytes - HeldBytes is the free slots of slabs.
	HeldBytes int64 `json:"heldBytes"`
	// Objects is the number of committed objects, ObjectBytes their exact sizes.
	Objects     int64 `json:"objects"`
	ObjectBytes int64 `json:"objectBytes"`
	// PendingObjects is the number of reserved, uncommitted writes, PendingBytes
	// their allocated bytes.
	PendingObjects int64 `json:"pendingObjects"`
	PendingBytes   int64 `json:"pendingBytes"`
	// LeasedObjects is the number of objects with at least one lease (removed ones
	// included), Leases the number of leases held.
	LeasedObjects int64 `json:"leasedObjects"`
	Leases        int64 `json:"leases"`
	// Slabs is the number of slabs of small objects.
	Slabs int64 `json:"slabs"`
	// IndexBytes is the memory the index has mapped outside the Go heap: object
	// records, key blocks and the hash table; its pages become resident as they
	// are first used.
	IndexBytes int64 `json:"indexBytes"`
	// FreeExtents is the number of free extents, LargestFreeExtent the bytes of
	// the largest: the largest object a Reserve can place without evicting.
	FreeExtents       int64 `json:"freeExtents"`
	LargestFreeExtent int64 `json:"largestFreeExtent"`
	// Fragmentation is 1 - LargestFreeExtent / free bytes, 0 when nothing is free.
	Fragmentation float64 `json:"fragmentation"`
	// Evictions counts objects evicted, EvictedBytes their bytes; Spilled counts
	// those OnEvict kept elsewhere and Dropped the others (OnEvict returned false,
	// or there is none).
	Evictions    int64 `json:"evictions"`
	EvictedBytes int64 `json:"evictedBytes"`
	Spilled      int64 `json:"spilled"`
	Dropped      int64 `json:"dropped"`
	// EvictSkipped counts victims read during their OnEvict and therefore kept.
	EvictSkipped int64 `json:"evictSkipped"`
	// RegionEvictions counts regions (an object's extent, or a slab) Reserves
	// evicted because least recently used victims did not make room.
	RegionEvictions int64 `json:"regionEvictions"`
	// NoSpace counts Reserves that failed with ErrNoSpace.
	NoSpace int64 `json:"noSpace"`
	// Removals counts committed objects removed; RemovedWhileWritten, pending
	// writes a removal doomed (their Commit dropped them); RemoveWaits, the
	// times a removal waited for an eviction of its object in flight to end.
	Removals            int64 `json:"removals"`
	RemovedWhileWritten int64 `json:"removedWhileWritten"`
	RemoveWaits         int64 `json:"removeWaits"`
}

// Stats returns the arena's fill and counters. It is safe to call at any time,
// also after Close.
func (a *Arena) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return Stats{
		SizeBytes:         a.size,
		UsedBytes:         a.ext.UsedUnits() * a.unit,
		HeldBytes:         a.held,
		Objects:           a.committed,
		ObjectBytes:       a.committedBytes,
		PendingObjects:    a.pending,
		PendingBytes:      a.pendingBytes,
		LeasedObjects:     a.leased,
		Leases:            a.leases,
		Slabs:             int64(len(a.slabs) - len(a.freeSlabs)),
		IndexBytes:        a.recs.Bytes() + a.keys.Bytes() + a.tab.Bytes(),
		FreeExtents:       int64(a.ext.FreeExtents()),
		LargestFreeExtent: a.ext.LargestFree() * a.unit,
		Fragmentation:     a.ext.Fragmentation(),
		Evictions:         a.evictions,
		EvictedBytes:      a.evictedBytes,
		Spilled:           a.spilled,
		Dropped:           a.dropped,
		EvictSkipped:      a.skipped,
		RegionEvictions:   a.regionEvictions,
		NoSpace:           a.noSpace,

		Removals:            a.removals,
		RemovedWhileWritten: a.removedPending,
		RemoveWaits:         a.removeWaits,
	}
}

// Check verifies the arena's invariants and returns every violation found: the
// allocator's own; every allocated extent belonging to exactly one object or
// slab; every live record (indexed, or removed but pinned) lying where its extent
// or slot says, the indexed ones found by their key; the slabs' counts and free
// lists; the LRU list holding exactly the committed objects nothing pins; and the
// counters agreeing with a walk of the records. It walks everything under the
// lock; tests and debugging use it. After the memory is released at Close there
// is nothing to check.
func (a *Arena) Check() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.region == nil {
		return nil
	}
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if err := a.ext.Check(); err != nil {
		bad("extents: %w", err)
	}
	allocated := map[int64]int64{}
	a.ext.Allocated(func(off, n int64) bool { allocated[off] = n; return true })
	var nCommitted, committedBytes, pendingN, pendingBytes, leases, leased, inflight, inflightBytes, held, lruWant, indexed int64
	slabUsed := map[uint32]uint32{}
	for idx := uint32(1); idx < a.recs.Len(); idx++ {
		r := a.rec(idx)
		if r.state == freed {
			continue
		}
		key := a.keyString(r)
		span := a.spanOf(r)
		held += span
		nl := int64(leasesOf(r))
		evicting := r.flags&flagEvicting != 0
		leases += nl
		if nl > 0 {
			leased++
		}
		if evicting {
			inflight++
			inflightBytes += span
		}
		switch r.state {
		case pending:
			pendingN++
			pendingBytes += span
			if nl > 0 || evicting {
				bad("pending object %q is leased or evicting", key)
			}
			if a.settled[idx] == nil {
				bad("pending object %q has no settled channel", key)
			}
		case committed:
			nCommitted++
			committedBytes += r.size
		case gone:
			if nl == 0 && !evicting {
				bad("removed object %q (state %d) is pinned by nothing and should have been freed", key, r.state)
			}
		default:
			bad("record %d has state %d", idx, r.state)
		}
		if r.state == pending || r.state == committed {
			indexed++
			if got := a.lookupLocked(key, r.hash); got != idx {
				bad("object %q (record %d) is found as record %d", key, idx, got)
			}
		} else if got := a.lookupLocked(key, r.hash); got == idx {
			bad("removed object %q is still indexed", key)
		}
		inLRU := r.flags&flagInLRU != 0
		if !a.closed && inLRU != (r.state == committed && nl == 0 && !evicting) {
			bad("object %q (state %d, %d leases, evicting %v) in the LRU list: %v", key, r.state, nl, evicting, inLRU)
		}
		if inLRU {
			lruWant++
		}
		if r.flags&flagSlab != 0 {
			id := r.ref - 1
			if int(id) >= len(a.slabs) || !a.slabs[id].live {
				bad("object %q lies in slab %d, which is not live", key, id)
				continue
			}
			s := &a.slabs[id]
			slotOff := r.off - s.off
			if r.off < s.off || r.off >= s.off+s.span || slotOff%s.slot != 0 || slotOff/s.slot >= int64(s.carved) {
				bad("object %q at %d is not in a carved slot of slab %d [%d, +%d)", key, r.off, id, s.off, s.span)
				continue
			}
			if r.size >= a.unit || r.size+int64(r.keyLen)+slotIndexBytes > s.slot {
				bad("object %q of %d bytes (key %d) does not belong in a slot of %d bytes", key, r.size, r.keyLen, s.slot)
			}
			if got := binary.LittleEndian.Uint32(a.mem[r.off+s.slot-slotIndexBytes:]); got != idx {
				bad("slot of object %q names record %d, not %d", key, got, idx)
			}
			slabUsed[id]++
		} else {
			u := r.off / a.unit
			if r.off%a.unit != 0 || allocated[u] != span/a.unit || a.owner[u] != idx {
				bad("object %q at %d (%d bytes) does not own an extent of that length there", key, r.off, span)
			}
		}
	}
	if int64(a.tab.Len()) != indexed {
		bad("hash table holds %d records, %d are indexed", a.tab.Len(), indexed)
	}
	n := 0
	a.tab.Entries(func(idx, bits uint32) {
		n++
		if idx >= a.recs.Len() || uint32(a.rec(idx).hash) != bits {
			bad("hash table holds record %d under another hash", idx)
		}
	})
	if n != a.tab.Len() {
		bad("hash table has %d slots in use, counts %d", n, a.tab.Len())
	}
	var walked int64
	for i := a.rec(0).next; i != 0; i = a.rec(i).next {
		r := a.rec(i)
		if r.flags&flagInLRU == 0 || a.rec(r.next).prev != i {
			bad("LRU list entry %d is not linked right", i)
			break
		}
		if walked++; walked > int64(a.recs.Len()) {
			bad("LRU list longer than the records: a cycle")
			break
		}
	}
	if walked != int64(a.lruN) || !a.closed && walked != lruWant {
		bad("LRU list has %d objects, counts %d, should hold %d", walked, a.lruN, lruWant)
	}
	liveSlabs := 0
	for id := range a.slabs {
		s := &a.slabs[id]
		if !s.live {
			continue
		}
		liveSlabs++
		u := s.off / a.unit
		if allocated[u] != s.span/a.unit || a.owner[u] != slabOwner|uint32(id) {
			bad("slab %d [%d, +%d) does not own its extent", id, s.off, s.span)
		}
		if s.used != slabUsed[uint32(id)] || s.used == 0 || s.used > s.carved || s.carved > s.nslots {
			bad("slab %d: %d slots used, %d objects in it, %d carved of %d", id, s.used, slabUsed[uint32(id)], s.carved, s.nslots)
			continue
		}
		if s.onList != (s.used < s.nslots) {
			bad("slab %d with %d of %d slots used is on the partial list: %v", id, s.used, s.nslots, s.onList)
		}
		free := uint32(0)
		for f := s.free; f != 0; f = binary.LittleEndian.Uint32(a.mem[s.off+int64(f-1)*s.slot:]) {
			if f-1 >= s.carved || free > s.carved {
				bad("slab %d: free list runs past its carved slots", id)
				break
			}
			free++
		}
		if free != s.carved-s.used {
			bad("slab %d: %d slots on the free list, want %d", id, free, s.carved-s.used)
		}
	}
	if liveSlabs+len(a.freeSlabs) != len(a.slabs) {
		bad("%d live slabs and %d free ids of %d", liveSlabs, len(a.freeSlabs), len(a.slabs))
	}
	for c, h := range a.partial {
		for prev := uint32(0); h != 0; prev, h = h, a.slabs[h-1].next {
			if s := &a.slabs[h-1]; !s.live || !s.onList || int(s.class) != c || s.prev != prev {
				bad("partial list of class %d holds slab %d wrongly", c, h-1)
				break
			}
		}
	}
	for u := range a.owner {
		if _, ok := allocated[u]; !ok {
			bad("owner of unit %d has no allocated extent", u)
		}
	}
	if len(a.owner) != len(allocated) {
		bad("%d owners for %d allocated extents: a leak", len(a.owner), len(allocated))
	}
	for _, c := range []struct {
		what      string
		got, want int64
	}{
		{"committed objects", a.committed, nCommitted},
		{"committed bytes", a.committedBytes, committedBytes},
		{"pending objects", a.pending, pendingN},
		{"pending bytes", a.pendingBytes, pendingBytes},
		{"held bytes", a.held, held},
		{"leases", a.leases, leases},
		{"leased objects", a.leased, leased},
		{"evictions in flight", a.inflight, inflight},
		{"bytes in flight", a.inflightBytes, inflightBytes},
		{"settled channels", int64(len(a.settled)), pendingN},
	} {
		if c.got != c.want {
			bad("%s: counter %d, walk %d", c.what, c.got, c.want)
		}
	}
	return errors.Join(errs...)
}
