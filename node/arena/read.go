package arena

import (
	"fmt"
	"hash/maphash"
	"runtime/debug"
	"sync/atomic"
)

// Lease pins an object for reading: until Release it is neither evicted nor
// freed, even if it is removed meanwhile. A Lease is used by one goroutine at a
// time; every Acquire must end in Release, also when the reader fails.
type Lease struct {
	a        *Arena
	idx      uint32 // the object's record: it is not freed while leased
	key      string
	b        []byte
	released atomic.Bool
}

// Acquire leases the committed object key of the given format. While leased it
// cannot be evicted, and when its last lease ends it becomes the most recently
// used. It fails with ErrNotFound when no committed object has the key (one
// being written is not found yet), and with ErrFormat when the key's object has
// another format. An object whose OnEvict is running can be leased; it is then
// kept.
func (a *Arena) Acquire(key string, format uint64) (_ *Lease, err error) {
	h := maphash.String(a.seed, key)
	defer a.guard(debug.SetPanicOnFault(true), &err)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, fmt.Errorf("acquire %q: %w", key, ErrClosed)
	}
	if a.broken() {
		return nil, ErrNotFound
	}
	l, err := a.acquireLocked(key, h, format)
	if err != nil && err != ErrNotFound {
		return nil, fmt.Errorf("acquire %q: %w", key, err)
	}
	return l, err
}

// AcquireInto leases the committed objects keys of the given format under one
// lock, as a batch of Acquire calls would, into leases[i] instead of a Lease
// allocated per key: a batch of small objects spent as much on those
// allocations as on copying them. When errs[i] is nil, &leases[i] is keys[i]'s lease, to be ended by
// ReleaseAll or its own Release; otherwise errs[i] says why (ErrNotFound,
// ErrFormat) and leases[i] holds nothing. leases and errs need len(keys)
// elements; what they held before is overwritten, so a caller can reuse them
// once every lease in them has been released. It fails as a whole only when the
// arena is closed or its memory faults meanwhile (ErrBroken), and then leases
// nothing; a broken arena misses every key.
func (a *Arena) AcquireInto(keys []string, format uint64, leases []Lease, errs []error) (err error) {
	if len(leases) < len(keys) || len(errs) < len(keys) {
		panic(fmt.Sprintf("arena: AcquireInto of %d keys into %d leases and %d errors", len(keys), len(leases), len(errs)))
	}
	// Hashed before the lock: other readers and writers wait on it.
	var small [256]uint64
	hs := small[:0]
	if len(keys) > len(small) {
		hs = make([]uint64, 0, len(keys))
	}
	for _, k := range keys {
		hs = append(hs, maphash.String(a.seed, k))
	}
	// Deferred before guard, so it runs after it: a fault leases nothing (what
	// it leased so far stays counted; a broken arena frees nothing anyway).
	defer func() {
		if err != nil {
			for i := range keys {
				leases[i].clear()
			}
		}
	}()
	defer a.guard(debug.SetPanicOnFault(true), &err)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return fmt.Errorf("acquire %d objects: %w", len(keys), ErrClosed)
	}
	if a.broken() {
		for i := range keys {
			leases[i].clear()
			errs[i] = ErrNotFound
		}
		return nil
	}
	for i, k := range keys {
		l := &leases[i]
		idx, b, err := a.leaseLocked(k, hs[i], format)
		if err != nil {
			l.clear()
			errs[i] = err
			continue
		}
		l.a, l.idx, l.key, l.b = a, idx, k, b
		l.released.Store(false)
		errs[i] = nil
	}
	return nil
}

// clear leaves l holding nothing: Release and ReleaseAll skip it.
func (l *Lease) clear() {
	l.a, l.idx, l.key, l.b = nil, 0, "", nil
	l.released.Store(true)
}

// ReleaseAll ends every lease of leases that AcquireInto took and that was not
// released yet, under one lock, as a Release of each would; elements that hold
// nothing (a key AcquireInto did not lease) are skipped. Afterwards every
// element holds nothing, not even its key, so that a slice kept for the next
// batch does not keep this batch's keys alive. The leases must be this
// arena's.
func (a *Arena) ReleaseAll(leases []Lease) {
	defer a.guard(debug.SetPanicOnFault(true), nil)
	a.mu.Lock()
	defer a.mu.Unlock()
	lru := false
	for i := range leases {
		l := &leases[i]
		if l.a == nil {
			continue
		}
		if l.a != a {
			panic("arena: ReleaseAll of another arena's lease")
		}
		if l.released.CompareAndSwap(false, true) {
			lru = a.releaseLocked(l.idx) || lru
		}
		l.a, l.idx, l.key, l.b = nil, 0, "", nil
	}
	if lru {
		a.kickLocked()
	}
	if err := a.unmapLocked(); err != nil {
		a.cfg.Logger.Warn("arena: releasing memory after close", "err", err)
	}
}

// acquireLocked leases key, whose hash is h. Its ErrNotFound is bare: a miss is
// common and not worth a message.
func (a *Arena) acquireLocked(key string, h, format uint64) (*Lease, error) {
	idx, b, err := a.leaseLocked(key, h, format)
	if err != nil {
		return nil, err
	}
	return &Lease{a: a, idx: idx, key: key, b: b}, nil
}

// leaseLocked takes a lease on key's object, whose hash is h, and returns its
// record and bytes.
func (a *Arena) leaseLocked(key string, h, format uint64) (uint32, []byte, error) {
	idx := a.lookupLocked(key, h)
	if idx == 0 {
		return 0, nil, ErrNotFound
	}
	r := a.rec(idx)
	if r.state != committed {
		return 0, nil, ErrNotFound
	}
	if r.format != format {
		return 0, nil, fmt.Errorf("the object has format %#x, not %#x: %w", r.format, format, ErrFormat)
	}
	if r.flags&flagInLRU != 0 {
		a.lruRemove(idx)
	}
	b := a.bytesOf(r) // before the counts: it reads the memory, which may fault
	if r.prev == 0 {
		a.leased++
	}
	r.prev++ // leasesOf: the object is off the LRU list now
	a.leases++
	if r.flags&flagEvicting != 0 {
		r.flags |= flagTouched
	}
	return idx, b, nil
}

// Key is the leased object's key.
func (l *Lease) Key() string { return l.key }

// Bytes are the leased object's bytes, valid until Release; nil after it.
func (l *Lease) Bytes() []byte {
	if l.released.Load() {
		return nil
	}
	return l.b
}

// Release ends the lease. An object whose last lease ends becomes the most
// recently used (its read just finished), or is freed if it was removed. Release
// is idempotent.
func (l *Lease) Release() {
	if !l.released.CompareAndSwap(false, true) {
		return
	}
	a := l.a
	defer a.guard(debug.SetPanicOnFault(true), nil)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.releaseLocked(l.idx) {
		a.kickLocked()
	}
	if err := a.unmapLocked(); err != nil {
		a.cfg.Logger.Warn("arena: releasing memory after close", "err", err)
	}
}

// releaseLocked ends a lease on record idx, and reports whether its object went
// back on the LRU list (the caller then kicks the evictor).
func (a *Arena) releaseLocked(idx uint32) bool {
	r := a.rec(idx)
	r.prev--
	a.leases--
	if r.prev != 0 {
		return false
	}
	a.leased--
	switch {
	case a.broken(): // nothing is freed or kept any more (fault.go)
	case r.state == gone:
		a.freeLocked(idx)
	case r.state == committed && r.flags&flagEvicting == 0 && !a.closed:
		a.lruPushFront(idx)
		return true
	}
	return false
}

// Contains reports whether the committed object key has the given format. It does
// not count as a use for eviction.
func (a *Arena) Contains(key string, format uint64) (found bool) {
	h := maphash.String(a.seed, key)
	defer a.guard(debug.SetPanicOnFault(true), nil)
	a.mu.Lock()
	defer a.mu.Unlock()
	return !a.closed && !a.broken() && a.committedLocked(key, h, format)
}

// committedLocked reports whether the committed object key, of hash h, has format.
func (a *Arena) committedLocked(key string, h, format uint64) bool {
	idx := a.lookupLocked(key, h)
	if idx == 0 {
		return false
	}
	r := a.rec(idx)
	return r.state == committed && r.format == format
}

// ContainsPrefix returns how many of keys, from the first, Contains would report:
// a batch's lookups under one lock.
func (a *Arena) ContainsPrefix(keys []string, format uint64) (n int) {
	defer a.guard(debug.SetPanicOnFault(true), nil)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed || a.broken() {
		return 0
	}
	for i, k := range keys {
		if !a.committedLocked(k, maphash.String(a.seed, k), format) {
			return i
		}
	}
	return len(keys)
}
