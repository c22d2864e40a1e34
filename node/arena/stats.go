package arena

import (
	"errors"
	"fmt"
)

// Stats is a snapshot of an arena's fill and counters.
type Stats struct {
	// SizeBytes is the memory objects can use: Config.SizeBytes rounded down to the
	// alignment.
	SizeBytes int64 `json:"sizeBytes"`
	// UsedBytes is the memory in allocated extents (objects rounded up to the
	// alignment): committed objects, pending writes, and removed objects that are
	// still leased. The watermarks apply to it.
	UsedBytes int64 `json:"usedBytes"`
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
	// NoSpace counts Reserves that failed with ErrNoSpace.
	NoSpace int64 `json:"noSpace"`
}

// Stats returns the arena's fill and counters. It is safe to call at any time,
// also after Close.
func (a *Arena) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return Stats{
		SizeBytes:         a.size,
		UsedBytes:         a.usedLocked(),
		Objects:           a.committed,
		ObjectBytes:       a.committedBytes,
		PendingObjects:    a.pending,
		PendingBytes:      a.pendingBytes,
		LeasedObjects:     a.leased,
		Leases:            a.leases,
		FreeExtents:       int64(a.ext.FreeExtents()),
		LargestFreeExtent: a.ext.LargestFree() * a.unit,
		Fragmentation:     a.ext.Fragmentation(),
		Evictions:         a.evictions,
		EvictedBytes:      a.evictedBytes,
		Spilled:           a.spilled,
		Dropped:           a.dropped,
		EvictSkipped:      a.skipped,
		NoSpace:           a.noSpace,
	}
}

// Check verifies the arena's invariants and returns every violation found: the
// allocator's own, every allocated extent belonging to exactly one live object
// (indexed or removed but pinned), the LRU list holding exactly the committed
// objects nothing pins, and the counters agreeing with a walk of the objects. It
// walks everything under the lock; tests and debugging use it. After the memory
// is released at Close there is nothing to check.
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
	var nCommitted, committedBytes, pendingN, pendingBytes, leases, leased, inflight, inflightBytes, lruWant int64
	live := map[int64]*object{}
	visit := func(o *object) {
		if prev := live[o.off]; prev != nil {
			bad("objects %q and %q share offset %d", prev.key, o.key, o.off)
		}
		live[o.off] = o
		if o.off%a.unit != 0 || o.span%a.unit != 0 || o.span < o.size || o.span-o.size >= a.unit {
			bad("object %q: offset %d, size %d, span %d do not fit the alignment %d", o.key, o.off, o.size, o.span, a.unit)
		}
		if o.leases < 0 {
			bad("object %q has %d leases", o.key, o.leases)
		}
		leases += int64(o.leases)
		if o.leases > 0 {
			leased++
		}
		if o.evicting {
			inflight++
			inflightBytes += o.span
		}
		if !a.closed && o.inLRU != (o.state == committed && o.leases == 0 && !o.evicting && !a.closed) {
			bad("object %q (state %d, %d leases, evicting %v) in the LRU list: %v", o.key, o.state, o.leases, o.evicting, o.inLRU)
		}
		if o.inLRU {
			lruWant++
		}
	}
	for key, o := range a.objects {
		if o.key != key {
			bad("object %q indexed under %q", o.key, key)
		}
		switch o.state {
		case pending:
			pendingN++
			pendingBytes += o.span
			if o.leases > 0 || o.evicting {
				bad("pending object %q is leased or evicting", key)
			}
		case committed:
			nCommitted++
			committedBytes += o.size
		default:
			bad("object %q in the index has state %d", key, o.state)
		}
		visit(o)
	}
	for o := range a.detached {
		if o.state != gone || o.leases == 0 && !o.evicting {
			bad("detached object %q (state %d, %d leases, evicting %v) should have been freed", o.key, o.state, o.leases, o.evicting)
		}
		if a.objects[o.key] == o {
			bad("detached object %q is still indexed", o.key)
		}
		visit(o)
	}
	n := int64(0)
	for o := a.lru.root.next; o != &a.lru.root; o = o.next {
		if !o.inLRU || o.next.prev != o || a.objects[o.key] != o {
			bad("LRU list entry %q is not linked or indexed right", o.key)
			break
		}
		if n++; n > int64(len(a.objects)) {
			bad("LRU list longer than the index: a cycle")
			break
		}
	}
	if n != int64(a.lru.n) || !a.closed && n != lruWant {
		bad("LRU list has %d objects, counts %d, should hold %d", n, a.lru.n, lruWant)
	}
	a.ext.Allocated(func(off, units int64) bool {
		o := live[off*a.unit]
		if o == nil {
			bad("extent [%d, +%d) belongs to no object: a leak", off*a.unit, units*a.unit)
		} else if o.span != units*a.unit {
			bad("object %q spans %d bytes, its extent %d", o.key, o.span, units*a.unit)
		}
		return true
	})
	if len(live) != a.ext.AllocatedExtents() {
		bad("%d live objects, %d allocated extents", len(live), a.ext.AllocatedExtents())
	}
	for _, c := range []struct {
		what      string
		got, want int64
	}{
		{"committed objects", a.committed, nCommitted},
		{"committed bytes", a.committedBytes, committedBytes},
		{"pending objects", a.pending, pendingN},
		{"pending bytes", a.pendingBytes, pendingBytes},
		{"leases", a.leases, leases},
		{"leased objects", a.leased, leased},
		{"evictions in flight", a.inflight, inflight},
		{"bytes in flight", a.inflightBytes, inflightBytes},
	} {
		if c.got != c.want {
			bad("%s: counter %d, walk %d", c.what, c.got, c.want)
		}
	}
	return errors.Join(errs...)
}
