package arena

import (
	"hash/maphash"
	"runtime/debug"
)

// Removal. A Remove must win over everything else in flight on its key, or
// the object comes back: an eviction copying it to the spill would leave the
// spill a copy that the service's remove of the spill (which runs after the
// arena's) does not find yet; a promotion reading it back from the spill, or a
// write-through fetch from Redis, would commit it into the arena again after
// the spill's copy was removed. So a removal is a barrier on its key, from
// BeginRemove until its end function is called:
//
//   - the committed object leaves the index at once (leases keep its bytes
//     until they end), and BeginRemove returns only once an eviction of it in
//     flight has ended, so whatever OnEvict stored is there for the caller to
//     remove from the next tier;
//   - a write of the key still pending (a put, or a promotion) is doomed: its
//     Commit drops it and answers ErrRemoved;
//   - while the barrier stands, Reserve of the key answers ErrExists and Await
//     waits for the barrier's end, so no new copy of the key can enter the
//     arena while the caller removes it from the spill and Redis.
//
// Removals of one key may overlap (two clients, or one batch naming a key
// twice): the barrier ends when the last of them ends, so they never wait on
// each other.

// removal is the barrier of removals in progress on one key.
type removal struct {
	n    int           // removals in progress
	done chan struct{} // closed when the last ends
}

// BeginRemove removes key's object, as the package comment on removal says,
// and holds key removed until end is called, which must happen (defer it).
// removed reports whether there was a committed object or a pending write to
// remove. It waits for an eviction of the key in flight (OnEvict's
// duration), never for leases or writers; and while the arena recovers the
// objects of its file, until recovery ends (recover.go): a copy of the key in
// a slab not read yet would come back after the removal. A caller with a
// deadline waits in AwaitRecovered first.
//
// A broken arena (fault.go) holds nothing to remove: removed is false.
func (a *Arena) BeginRemove(key string) (removed bool, end func()) {
	h := maphash.String(a.seed, key)
	defer func() {
		if end == nil { // a fault before the barrier stood
			end = func() {}
		}
	}()
	defer a.guard(debug.SetPanicOnFault(true), nil)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.awaitRecoveredLocked()
	if a.closed || a.broken() {
		return false, func() {}
	}
	a.appendLogLocked(logRemoved, key, 0) // whatever a recent eviction kept of it goes too
	rm := a.removing[key]
	if rm == nil {
		rm = &removal{done: make(chan struct{})}
		a.removing[key] = rm
	}
	rm.n++
	end = func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		if rm.n--; rm.n == 0 {
			delete(a.removing, key)
			close(rm.done)
		}
	}
	idx := a.lookupLocked(key, h)
	if idx == 0 {
		return false, end
	}
	r := a.rec(idx)
	switch r.state {
	case pending:
		r.flags |= flagDoomed
		a.removedPending++
		return true, end
	case committed:
		evicting := r.flags&flagEvicting != 0
		a.unindexLocked(idx)
		a.freeLocked(idx) // deferred while leased or evicting
		a.removals++
		// The record is not freed while OnEvict runs (flagEvicting); the
		// eviction's end frees it as removed (evictLocked). Were the record
		// reused and evicted again before this wakes, it would wait for that
		// eviction too: longer, never wrong.
		for evicting && r.flags&flagEvicting != 0 {
			a.removeWaits++
			a.cond.Wait()
		}
		return true, end
	}
	return false, end
}

// Remove deletes key's object: BeginRemove and its end at once, for callers
// with no other tier to remove the key from.
func (a *Arena) Remove(key string) bool {
	removed, end := a.BeginRemove(key)
	end()
	return removed
}

// removingLocked returns the barrier on key, nil when no removal is in
// progress.
func (a *Arena) removingLocked(key string) *removal {
	if len(a.removing) == 0 {
		return nil
	}
	return a.removing[key]
}
