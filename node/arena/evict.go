package arena

import "time"

// Eviction. Victims are the least recently used committed objects that no lease
// pins; recency is the last Commit, or the end of the last lease (a read that just
// finished makes its object the most recent). Leased objects are out of the LRU
// list while leased and pending ones are never in it, so picking a victim is O(1)
// and never walks past objects that cannot go.
//
// A victim is marked evicting and taken off the list, the lock is dropped, and
// OnEvict reads its bytes (spilling them to SSD) while other goroutines carry on;
// readers may still Acquire it. Then, under the lock again, it is freed, unless it
// was acquired meanwhile: then it is hot after all, stays, and becomes the most
// recent when its leases end. A victim removed meanwhile is freed as removed.

// background evicts down to the low watermark whenever a Commit or Release leaves
// the fill past the high watermark.
func (a *Arena) background() {
	defer a.done.Done()
	for {
		select {
		case <-a.stop:
			return
		case <-a.wake:
		}
		a.evictToLow()
	}
}

// evictToLow evicts least recently used objects until the used bytes, less those
// of evictions already in flight, are at or below the low watermark, or nothing
// more can be evicted.
func (a *Arena) evictToLow() {
	start := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	var n, bytes int64
	// Victims read during OnEvict go back to the front; the budget ends a pass
	// that readers keep defeating, until the next Commit or Release wakes it.
	budget := 2*len(a.objects) + 2
	for ; !a.closed && a.usedLocked()-a.inflightBytes > a.low; budget-- {
		v := a.lru.back()
		if v == nil || budget == 0 {
			// Everything left is leased or being written (or was read during its
			// OnEvict); the Release or Commit that changes that wakes us again.
			a.cfg.Logger.Debug("arena: eviction stopped above the low watermark: the rest is leased or being written",
				"usedBytes", a.usedLocked(), "lowWatermarkBytes", a.low, "leasedObjects", a.leased, "pendingBytes", a.pendingBytes)
			break
		}
		span := v.span
		if a.evictLocked(v) {
			n++
			bytes += span
		}
	}
	if n > 0 {
		a.cfg.Logger.Debug("arena: evicted to the low watermark", "objects", n, "bytes", bytes,
			"usedBytes", a.usedLocked(), "took", time.Since(start))
	}
}

// evictLocked evicts v, the back of the LRU list, calling OnEvict without the lock
// held, and reports whether v's space was freed as an eviction.
func (a *Arena) evictLocked(v *object) bool {
	a.lru.remove(v)
	v.evicting = true
	a.inflight++
	a.inflightBytes += v.span
	ev := Evicted{Key: v.key, Format: v.format, Bytes: a.bytesOf(v)}

	a.mu.Unlock()
	finished := false
	defer func() {
		if !finished {
			// OnEvict panicked: take the lock back for the caller's deferred
			// unlock and keep the victim, so the arena stays consistent.
			a.mu.Lock()
			a.endEvictLocked(v)
			v.touched = false
			if v.state == gone {
				a.freeLocked(v)
			} else if v.leases == 0 && !a.closed {
				a.lru.pushFront(v)
			}
		}
	}()
	spilled := false
	if a.evict != nil {
		spilled = a.evict(ev)
	}
	a.mu.Lock()
	finished = true

	a.endEvictLocked(v)
	defer func() {
		if err := a.unmapLocked(); err != nil { // the arena closed during OnEvict
			a.cfg.Logger.Warn("arena: releasing memory after close", "err", err)
		}
	}()
	switch {
	case v.state == gone: // removed during OnEvict: freed as removed, not evicted
		a.freeLocked(v)
		return false
	case v.leases > 0 || v.touched:
		v.touched = false
		a.skipped++
		if v.leases == 0 && !a.closed {
			a.lru.pushFront(v)
		}
		return false
	}
	a.unindexLocked(v)
	a.freeLocked(v)
	a.evictions++
	a.evictedBytes += v.size
	if spilled {
		a.spilled++
	} else {
		a.dropped++
	}
	return true
}

// endEvictLocked ends v's eviction in flight.
func (a *Arena) endEvictLocked(v *object) {
	v.evicting = false
	a.inflight--
	a.inflightBytes -= v.span
	a.cond.Broadcast()
}
