package arena

import (
	"fmt"
	"hash/maphash"
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
func (a *Arena) Acquire(key string, format uint64) (*Lease, error) {
	h := maphash.String(a.seed, key)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, fmt.Errorf("acquire %q: %w", key, ErrClosed)
	}
	l, err := a.acquireLocked(key, h, format)
	if err != nil && err != ErrNotFound {
		return nil, fmt.Errorf("acquire %q: %w", key, err)
	}
	return l, err
}

// AcquireAll leases the committed objects keys of the given format under one
// lock, as a batch of Acquire calls would: leases[i] is keys[i]'s lease, or nil
// with errs[i] saying why (ErrNotFound, ErrFormat). Every lease returned must be
// released. It fails as a whole only when the arena is closed.
func (a *Arena) AcquireAll(keys []string, format uint64) (leases []*Lease, errs []error, err error) {
	hs := make([]uint64, len(keys))
	for i, k := range keys {
		hs[i] = maphash.String(a.seed, k)
	}
	leases, errs = make([]*Lease, len(keys)), make([]error, len(keys))
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, nil, fmt.Errorf("acquire %d objects: %w", len(keys), ErrClosed)
	}
	for i, k := range keys {
		leases[i], errs[i] = a.acquireLocked(k, hs[i], format)
	}
	return leases, errs, nil
}

// acquireLocked leases key, whose hash is h. Its ErrNotFound is bare: a miss is
// common and not worth a message.
func (a *Arena) acquireLocked(key string, h, format uint64) (*Lease, error) {
	idx := a.lookupLocked(key, h)
	if idx == 0 {
		return nil, ErrNotFound
	}
	r := a.rec(idx)
	if r.state != committed {
		return nil, ErrNotFound
	}
	if r.format != format {
		return nil, fmt.Errorf("the object has format %#x, not %#x: %w", r.format, format, ErrFormat)
	}
	if r.flags&flagInLRU != 0 {
		a.lruRemove(idx)
	}
	if r.prev == 0 {
		a.leased++
	}
	r.prev++ // leasesOf: the object is off the LRU list now
	a.leases++
	if r.flags&flagEvicting != 0 {
		r.flags |= flagTouched
	}
	return &Lease{a: a, idx: idx, key: key, b: a.mem[r.off : r.off+r.size : r.off+r.size]}, nil
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
	a.mu.Lock()
	defer a.mu.Unlock()
	r := a.rec(l.idx)
	r.prev--
	a.leases--
	if r.prev == 0 {
		a.leased--
		switch {
		case r.state == gone:
			a.freeLocked(l.idx)
		case r.state == committed && r.flags&flagEvicting == 0 && !a.closed:
			a.lruPushFront(l.idx)
			a.kickLocked()
		}
	}
	if err := a.unmapLocked(); err != nil {
		a.cfg.Logger.Warn("arena: releasing memory after close", "err", err)
	}
}

// Contains reports whether the committed object key has the given format. It does
// not count as a use for eviction.
func (a *Arena) Contains(key string, format uint64) bool {
	h := maphash.String(a.seed, key)
	a.mu.Lock()
	defer a.mu.Unlock()
	return !a.closed && a.committedLocked(key, h, format)
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
func (a *Arena) ContainsPrefix(keys []string, format uint64) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return 0
	}
	for i, k := range keys {
		if !a.committedLocked(k, maphash.String(a.seed, k), format) {
			return i
		}
	}
	return len(keys)
}

// Remove deletes the committed object key and reports whether there was one. A
// leased object disappears from the index at once (the key can be written again)
// and its space is freed when the last lease ends. An object still being written
// is not removed: it does not exist yet.
func (a *Arena) Remove(key string) bool {
	h := maphash.String(a.seed, key)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return false
	}
	idx := a.lookupLocked(key, h)
	if idx == 0 || a.rec(idx).state != committed {
		return false
	}
	a.unindexLocked(idx)
	a.freeLocked(idx)
	return true
}
