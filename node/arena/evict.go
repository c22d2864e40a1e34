package arena

import (
	"runtime/debug"
	"time"
)

// Eviction. Victims are the least recently used committed objects that no lease
// pins; recency is the last Commit, or the end of the last lease (a read that just
// finished makes its object the most recent). Leased objects are out of the LRU
// list while leased and pending ones are never in it, so picking a victim is O(1)
// and never walks past objects that cannot go.
//
// Region eviction. Victims in LRU order free space wherever they happen to lie; in
// a fragmented arena a Reserve of a large object (or of a new slab) could evict
// object after object without two free extents ever touching. So a Reserve tries
// lruVictims least recently used objects, and then evicts regions: the
// allocated extents (an object's own, or a whole slab) next to the largest free
// extents that do not fit yet, growing one of them until it does. Each region
// evicted widens a free extent that is already the largest, so the work is
// bounded by the size needed plus one region on either side, whatever the
// fragmentation. A free extent hemmed in by leased or pending objects is passed
// over for the next largest (up to regionCandidates of them), and when none has
// an evictable neighbour (or nothing is free at all) the region of the least
// recently used object goes.
//
// A victim is marked evicting and taken off the list, the lock is dropped, and
// OnEvict reads its bytes (spilling them to SSD) while other goroutines carry on;
// readers may still Acquire it. Then, under the lock again, it is freed, unless it
// was acquired meanwhile: then it is hot after all, stays, and becomes the most
// recent when its leases end. A victim removed meanwhile is freed as removed.

// background evicts down to the low watermark whenever a Commit or Release leaves
// the fill (or the extents, slabs whole) past the high watermark.
func (a *Arena) background() {
	defer a.done.Done()
	defer a.guard(debug.SetPanicOnFault(true), nil) // once for the goroutine: OnEvict's copies too
	for {
		select {
		case <-a.stop:
			return
		case <-a.wake:
		}
		a.evictToLow()
	}
}

// lruVictims is how many least recently used victims a Reserve tries before it
// evicts regions instead.
const lruVictims = 4

// regionCandidates is how many of the largest free extents a step of region
// eviction looks at for an evictable neighbour.
const regionCandidates = 8

// evictToLow evicts least recently used objects until the held bytes, less those
// of evictions already in flight, are at or below the low watermark, and then
// regions until the allocated extents are too, or nothing more can be evicted.
func (a *Arena) evictToLow() {
	start := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	var n, bytes int64
	// Victims read during OnEvict go back to the front; the budget ends a pass
	// that readers keep defeating, until the next Commit or Release wakes it.
	budget := 2*int64(a.recs.Live()) + 2
	for ; !a.closed && !a.broken() && a.usedLocked()-a.inflightBytes > a.low; budget-- {
		v := a.lruBack()
		if v == 0 || budget == 0 {
			// Everything left is leased or being written (or was read during its
			// OnEvict); the Release or Commit that changes that wakes us again.
			a.cfg.Logger.Debug("arena: eviction stopped above the low watermark: the rest is leased or being written",
				"usedBytes", a.usedLocked(), "lowWatermarkBytes", a.low, "leasedObjects", a.leased, "pendingBytes", a.pendingBytes)
			break
		}
		span := a.spanOf(a.rec(v))
		if a.evictLocked(v) {
			n++
			bytes += span
		}
	}
	// Objects may hold little while their slabs, mostly free slots, fill the
	// extents: then a large object or a new slab finds no room, and every such
	// Reserve would evict regions itself. Free whole regions here instead, next
	// to the largest free extent, until the extents are back at the low
	// watermark, once they are past the high one: the extents always exceed
	// what objects hold by the free slots of partly used slabs (the slab of
	// large objects' descriptors among them), and that alone is no reason to
	// evict out of LRU order.
	regions := int64(0)
	if a.regionFillLocked()-a.inflightBytes <= a.high {
		budget = 0
	}
	for ; !a.closed && !a.broken() && a.regionFillLocked()-a.inflightBytes > a.low && budget > 0; budget-- {
		if !a.evictRegionLocked(a.ext.Size() + 1) {
			break
		}
		regions++
	}
	if n > 0 || regions > 0 {
		a.cfg.Logger.Debug("arena: evicted to the low watermark", "objects", n, "bytes", bytes, "regions", regions,
			"usedBytes", a.usedLocked(), "took", time.Since(start))
	}
}

// evictRegionLocked evicts one region towards a free extent of units, as the
// package comment on eviction describes, and reports whether it found one to
// evict.
func (a *Arena) evictRegionLocked(units int64) bool {
	var start int64 // the region's first unit
	var victims []uint32
	checked := 0
	a.ext.FreeListDescending(func(off, n int64) bool {
		if n >= units {
			return true // fits already: taken by the time the caller looks, or a slot's class is full
		}
		for _, nb := range [2]int64{off + n, a.ext.AllocatedBefore(off)} {
			if nb < 0 || nb >= a.ext.Size() {
				continue
			}
			if victims, start = a.regionVictims(nb); len(victims) > 0 {
				return false
			}
		}
		checked++
		return checked < regionCandidates
	})
	if len(victims) == 0 {
		v := a.lruBack()
		if v == 0 {
			return false
		}
		u := a.placeOf(a.rec(v))
		if victims, start = a.regionVictims(u); len(victims) == 0 {
			victims, start = []uint32{v}, u // a slab with a pinned object: its victim alone
		}
	}
	a.regionEvictions++
	for _, v := range victims {
		// The lock was dropped during the last OnEvict: the record may have
		// been freed, or reused for an object elsewhere, meanwhile.
		if r := a.rec(v); r.state == committed && r.flags&flagInLRU != 0 && !a.closed && !a.broken() && a.inRegion(r, start) {
			a.evictLocked(v)
		}
	}
	return true
}

// inRegion reports whether r lies in the region that starts at unit u: its
// extent, or the slab its slot is in.
func (a *Arena) inRegion(r *record, u int64) bool {
	return a.slabOf(r).off/a.unit == u || r.flags&flagLarge != 0 && a.bytesOff(r)/a.unit == u
}

// regionVictims is the objects of the allocated extent that starts at unit u,
// and u, if every one of them can be evicted; nil otherwise. Memory not warmed
// yet, what recovery has not read yet, and a slab holding large objects'
// descriptors are no region to evict.
func (a *Arena) regionVictims(u int64) ([]uint32, int64) {
	o, ok := a.owner[u]
	if !ok || o == ownerWithheld || o == ownerOrphan {
		return nil, 0
	}
	if o&slabOwner == 0 {
		r := a.rec(o)
		if r.flags&flagInLRU == 0 {
			return nil, 0
		}
		return []uint32{o}, u
	}
	id := o &^ slabOwner
	if a.slabs[id].unscanned {
		return nil, 0
	}
	var victims []uint32
	all := true
	a.slabObjects(id, func(idx uint32) bool {
		// A large object's descriptor pins its slab: evicting the slab would
		// evict objects whose bytes lie elsewhere, and free little.
		if r := a.rec(idx); r.flags&flagInLRU == 0 || r.flags&flagLarge != 0 {
			all = false
			return false
		}
		victims = append(victims, idx)
		return true
	})
	if !all || len(victims) == 0 {
		return nil, 0
	}
	return victims, u
}

// evictLocked evicts v, an object on the LRU list, calling OnEvict without the
// lock held, and reports whether v's space was freed as an eviction.
func (a *Arena) evictLocked(v uint32) bool {
	a.lruRemove(v)
	r := a.rec(v) // records never move: r stays valid while the lock is dropped
	r.flags |= flagEvicting
	span := a.spanOf(r)
	a.inflight++
	a.inflightBytes += span
	ev := Evicted{Key: a.keyString(r), Format: r.format, Bytes: a.bytesOf(r)}

	a.mu.Unlock()
	finished := false
	defer func() {
		if !finished {
			// OnEvict panicked: take the lock back for the caller's deferred
			// unlock and keep the victim, so the arena stays consistent.
			a.mu.Lock()
			a.endEvictLocked(v, span)
			r.flags &^= flagTouched
			if a.broken() {
				return
			}
			if r.state == gone {
				a.freeLocked(v)
			} else if leasesOf(r) == 0 && !a.closed {
				a.lruPushFront(v)
			}
		}
	}()
	spilled := false
	if a.evict != nil {
		spilled = a.evict(ev)
	}
	a.mu.Lock()
	finished = true

	a.endEvictLocked(v, span)
	defer func() {
		if err := a.unmapLocked(); err != nil { // the arena closed during OnEvict
			a.cfg.Logger.Warn("arena: releasing memory after close", "err", err)
		}
	}()
	if a.broken() {
		if spilled {
			// The memory may have been replaced by zeros while OnEvict copied
			// it (fault.go): what it kept is not to be trusted.
			a.cfg.Logger.Warn("arena: an object was evicted while the arena broke; the copy its eviction kept may be zeros: remove the key",
				"key", ev.Key, "format", ev.Format)
		}
		return false
	}
	switch {
	case r.state == gone: // removed during OnEvict: freed as removed, not evicted
		a.freeLocked(v)
		return false
	case leasesOf(r) > 0 || r.flags&flagTouched != 0:
		r.flags &^= flagTouched
		a.skipped++
		if leasesOf(r) == 0 && !a.closed {
			a.lruPushFront(v)
		}
		return false
	}
	size := r.size
	if spilled {
		// Kept elsewhere, maybe in a buffer a kill loses: the file says so
		// before the object leaves it (evictlog.go).
		a.appendLogLocked(logEvicted, ev.Key, ev.Format)
	}
	a.unindexLocked(v)
	a.freeLocked(v)
	a.evictions++
	a.evictedBytes += size
	if spilled {
		a.spilled++
	} else {
		a.dropped++
	}
	return true
}

// endEvictLocked ends v's eviction in flight.
func (a *Arena) endEvictLocked(v uint32, span int64) {
	a.rec(v).flags &^= flagEvicting
	a.inflight--
	a.inflightBytes -= span
	a.cond.Broadcast()
}
