package arena

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime/debug"
	"time"
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
	// records, key blocks, the hash table and the extent allocator's two words
	// a unit; its pages become resident as they are first used.
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
	// Ready is true once the arena is done starting: its memory is warmed up
	// (Config.Warmup) and the objects of its file are recovered. Until then it
	// serves what it has: ReadyBytes of memory populated and given out, the
	// objects recovered so far.
	Ready      bool  `json:"ready"`
	ReadyBytes int64 `json:"readyBytes"`
	// ReadyAfter is the time from New to ready, once ready.
	ReadyAfter time.Duration `json:"readyAfter,omitempty"`
	// UnusableBytes is memory the warm-up could not populate (the arena file's
	// file system or huge page pool is full): never given out.
	UnusableBytes int64 `json:"unusableBytes,omitempty"`
	// WarmupTook is how long populating the memory took, once it is done.
	WarmupTook time.Duration `json:"warmupTook,omitempty"`
	// Recovery is what this start found in the arena file.
	Recovery RecoveryStats `json:"recovery"`
	// Sealed counts the large objects sealed since the start (SealedBytes
	// their bytes, SealTook the time spent hashing them); Unsealed, those
	// committed and not sealed yet, which a kill now would lose (seal.go);
	// SealSkipped, those removed or evicted before their turn. An anonymous
	// arena seals nothing.
	Sealed      int64         `json:"sealed"`
	SealedBytes int64         `json:"sealedBytes"`
	Unsealed    int64         `json:"unsealed"`
	SealSkipped int64         `json:"sealSkipped"`
	SealTook    time.Duration `json:"sealTook"`
	// Broken, when set, says why the arena's memory is gone (its file was
	// truncated while it served): it serves nothing and takes nothing until
	// the service restarts (fault.go). BrokenAt is when it broke.
	Broken   string    `json:"broken,omitempty"`
	BrokenAt time.Time `json:"brokenAt,omitzero"`
}

// RecoveryStats is what an arena's start found and recovered.
type RecoveryStats struct {
	// File is the arena file, "" for an anonymous arena.
	File string `json:"file,omitempty"`
	// Warm is true when this start found the objects of the file (a restart on
	// the same arena file); otherwise the arena started empty and Cold says
	// why (a new file, another geometry, a damaged superblock, anonymous).
	Warm bool   `json:"warm"`
	Cold string `json:"cold,omitempty"`
	// PreviousClean is true when the service before shut down cleanly, false
	// after a crash or a kill (whose objects are recovered just the same).
	PreviousClean bool `json:"previousClean"`
	// DroppedAtStart is, for a cold start on a file that held an arena of
	// another geometry, the objects it held at its last clean close (0 when it
	// was not closed cleanly: the count was not recorded).
	DroppedAtStart int64 `json:"droppedAtStart,omitempty"`
	// ContentID names the arena's contents: random when it starts empty, the
	// same across warm restarts. A client that sees it change knows the
	// objects it stored are gone.
	ContentID uint64 `json:"contentId"`
	// Starts counts the services started on the arena file, this one included
	// (kept across a cold start on an old file whose superblock was valid); 1
	// for an anonymous arena.
	Starts uint64 `json:"starts"`
	// Recovering is true while the slabs are being read; SlabsRead of Slabs.
	Recovering bool  `json:"recovering"`
	SlabsRead  int64 `json:"slabsRead"`
	Slabs      int64 `json:"slabs"`
	// Recovered counts the committed objects found (RecoveredBytes their
	// bytes); Lost, slots that looked committed but failed their checks
	// (damage: dropped, never served); Duplicates, copies of a key dropped
	// for a newer one; UnfinishedWrites, large objects whose write was in
	// flight at the kill (their space freed); BadUnitMapWords, damaged words
	// of the unit map, cleared.
	Recovered        int64 `json:"recovered"`
	RecoveredBytes   int64 `json:"recoveredBytes"`
	Lost             int64 `json:"lost"`
	Duplicates       int64 `json:"duplicates"`
	UnfinishedWrites int64 `json:"unfinishedWrites"`
	BadUnitMapWords  int64 `json:"badUnitMapWords"`
	// BadSeals counts the large objects of Lost whose bytes did not match
	// their seal (a flipped bit, a write by someone else); Unsealed, large
	// objects dropped because the service before was killed before it
	// sealed them (seal.go): not damage, but not checkable either.
	BadSeals int64 `json:"badSeals"`
	Unsealed int64 `json:"unsealed"`
	// IndexTook is how long rebuilding the allocator took (inside New);
	// Took, the whole recovery from New on, once it is over.
	IndexTook time.Duration `json:"indexTook"`
	Took      time.Duration `json:"took,omitempty"`
}

// Stats returns the arena's fill and counters. It is safe to call at any time,
// also after Close.
func (a *Arena) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return Stats{
		SizeBytes:         a.size,
		UsedBytes:         a.extentsUsedLocked(),
		HeldBytes:         a.held,
		Objects:           a.committed,
		ObjectBytes:       a.committedBytes,
		PendingObjects:    a.pending,
		PendingBytes:      a.pendingBytes,
		LeasedObjects:     a.leased,
		Leases:            a.leases,
		Slabs:             int64(len(a.slabs) - len(a.freeSlabs)),
		IndexBytes:        a.recs.Bytes() + a.tab.Bytes() + a.ext.WordBytes(),
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

		Ready:         a.readyDone,
		ReadyBytes:    a.warm.readyBytes,
		ReadyAfter:    a.readyAfter,
		UnusableBytes: a.warm.failed * a.unit,
		WarmupTook:    a.warm.took,
		Recovery:      a.recoveryStatsLocked(),
		Sealed:        a.seal.sealed,
		SealedBytes:   a.seal.sealedBytes,
		Unsealed:      int64(len(a.seal.queue) + a.seal.hashing),
		SealSkipped:   a.seal.skipped,
		SealTook:      a.seal.took,
		Broken:        a.brokenWhyLocked(),
		BrokenAt:      a.brk.at,
	}
}

// brokenWhyLocked is Stats.Broken.
func (a *Arena) brokenWhyLocked() string {
	if !a.broken() {
		return ""
	}
	return a.brokenErrLocked().Error()
}

func (a *Arena) recoveryStatsLocked() RecoveryStats {
	r := &a.rcv
	st := RecoveryStats{File: r.file, Warm: r.warm, PreviousClean: r.prevClean, ContentID: r.contentID, Starts: r.starts,
		Recovering: r.active, SlabsRead: int64(r.read), Slabs: int64(len(r.unscanned)),
		Recovered: r.recovered, RecoveredBytes: r.recoveredBytes, Lost: r.lost, Duplicates: r.duplicates,
		UnfinishedWrites: r.orphansFreed, BadUnitMapWords: r.badUnits, BadSeals: r.badSeals, Unsealed: r.unsealed,
		IndexTook: r.indexTook}
	if !r.warm {
		st.Cold, st.DroppedAtStart = r.why, r.prevObjs
	}
	if !r.active {
		st.Took = r.took
	}
	return st
}

// Check verifies the arena's invariants and returns every violation found: the
// allocator's own; every allocated extent belonging to exactly one object,
// slab, withheld piece or unmatched extent, and the unit map recording exactly
// the slabs and large objects' extents; every live record (indexed, or removed
// but pinned) lying where its slot says, its trailer naming it and its check
// word set exactly while it is committed, the indexed ones found by their key;
// the slabs' counts and free lists; the LRU list holding exactly the committed
// objects nothing pins; and the counters agreeing with a walk of the records.
// It walks everything under the lock; tests and debugging use it. After the
// memory is released at Close there is nothing to check, nor in a broken arena,
// whose bookkeeping is abandoned (fault.go).
func (a *Arena) Check() (err error) {
	defer a.guard(debug.SetPanicOnFault(true), &err)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.back == nil || a.broken() {
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
	slabDescs := map[uint32]uint32{}
	umWant := map[int64]uint32{} // unit → the unit map word it must hold
	for idx := uint32(1); idx < a.recs.Len(); idx++ {
		r := a.rec(idx)
		if r.state == freed {
			continue
		}
		id := r.ref - 1
		if r.ref == 0 || int(id) >= len(a.slabs) || !a.slabs[id].live {
			bad("record %d lies in slab %d, which is not live", idx, id)
			continue
		}
		s := &a.slabs[id]
		slotOff := r.off - s.off
		if r.off < s.off || r.off >= s.off+s.span || slotOff%s.slot != 0 || slotOff/s.slot >= int64(s.carved) {
			bad("record %d at %d is not in a carved slot of slab %d [%d, +%d)", idx, r.off, id, s.off, s.span)
			continue
		}
		slabUsed[id]++
		key := a.keyString(r)
		end := a.slotEnd(r)
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
		tr := a.readTrailer(end)
		switch {
		case tr.rec != idx:
			bad("slot of object %q names record %d, not %d", key, tr.rec, idx)
		case tr.format != r.format || int(tr.keyLen) != len(key):
			bad("trailer of object %q says format %#x and a key of %d bytes", key, tr.format, tr.keyLen)
		case r.state == committed && tr.check != a.checkOf(r.off, end):
			bad("committed object %q has check word %#x, want %#x", key, tr.check, a.checkOf(r.off, end))
		case r.state != committed && tr.check != 0:
			bad("object %q in state %d has its commit mark set", key, r.state)
		}
		if r.flags&flagLarge != 0 {
			bo, size := a.descriptor(end)
			u := bo / a.unit
			if tr.kind != kindLarge || size != r.size || bo%a.unit != 0 || allocated[u] != a.extUnits(r.size) || a.owner[u] != idx {
				bad("large object %q at %d (%d bytes) does not own an extent of that length there", key, bo, r.size)
			}
			if int64(r.keyLen)+descBytes > s.slot {
				bad("descriptor of %q does not fit its slot of %d bytes", key, s.slot)
			}
			umWant[u] = umWord(umLarge, a.extUnits(r.size))
			slabDescs[id]++
		} else if tr.kind != kindSmall || int64(tr.size) != r.size || r.size >= a.unit || r.size+int64(r.keyLen)+trailerBytes > s.slot {
			bad("object %q of %d bytes (key %d) does not belong in a slot of %d bytes", key, r.size, r.keyLen, s.slot)
		}
		switch r.state {
		case pending:
			pendingN++
			pendingBytes += span
			if nl > 0 || evicting {
				bad("pending object %q is leased or evicting", key)
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
	var descFree int64
	for id := range a.slabs {
		s := &a.slabs[id]
		if !s.live {
			continue
		}
		liveSlabs++
		if s.descs != slabDescs[uint32(id)] {
			bad("slab %d counts %d descriptors, holds %d", id, s.descs, slabDescs[uint32(id)])
		}
		if s.descs > 0 {
			descFree += s.span - int64(s.used)*s.slot
		}
		u := s.off / a.unit
		umWant[u] = umWord(umSlab(int(s.class)), s.span/a.unit)
		if allocated[u] != s.span/a.unit || a.owner[u] != slabOwner|uint32(id) {
			bad("slab %d [%d, +%d) does not own its extent", id, s.off, s.span)
		}
		if s.unscanned {
			if s.used != 0 || s.carved != 0 || s.onList || slabUsed[uint32(id)] != 0 {
				bad("slab %d, not read yet, takes objects: %d used, %d carved", id, s.used, s.carved)
			}
			continue
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
			if c := *a.checkWord(s.off + int64(f)*s.slot); c != 0 {
				bad("slab %d: free slot %d has its commit mark set", id, f-1)
			}
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
	var withheld, orphans int64
	for u, o := range a.owner {
		if _, ok := allocated[u]; !ok {
			bad("owner of unit %d has no allocated extent", u)
		}
		switch o {
		case ownerWithheld:
			withheld += allocated[u]
		case ownerOrphan:
			orphans++
			if k, n := umDecode(a.umap[u]); k != umLarge || n != allocated[u] {
				bad("unmatched extent at unit %d is not a large object's in the unit map", u)
			}
			umWant[u] = a.umap[u]
		}
	}
	for idx := range a.settled {
		if a.rec(idx).state != pending {
			bad("a settled channel for object %d, which is not pending", idx)
		}
	}
	if len(a.owner) != len(allocated) {
		bad("%d owners for %d allocated extents: a leak", len(a.owner), len(allocated))
	}
	for u, w := range a.umap {
		if want := umWant[int64(u)]; w != want {
			bad("unit map word %d is %#x, want %#x", u, w, want)
		}
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
		{"withheld units", a.warm.withheld + a.warm.failed, withheld},
		{"unmatched extents", a.rcv.orphans, orphans},
		{"free bytes of descriptor slabs", a.descFree, descFree},
	} {
		if c.got != c.want {
			bad("%s: counter %d, walk %d", c.what, c.got, c.want)
		}
	}
	return errors.Join(errs...)
}
