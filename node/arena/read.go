package arena

import (
	"fmt"
	"sync/atomic"
)

// Lease pins an object for reading: until Release it is neither evicted nor
// freed, even if it is removed meanwhile. A Lease is used by one goroutine at a
// time; every Acquire must end in Release, also when the reader fails.
type Lease struct {
	a        *Arena
	obj      *object
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
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, fmt.Errorf("acquire %q: %w", key, ErrClosed)
	}
	o := a.objects[key]
	if o == nil || o.state != committed {
		return nil, ErrNotFound // a miss is common and not worth a message
	}
	if o.format != format {
		return nil, fmt.Errorf("acquire %q: the object has format %#x, not %#x: %w", key, o.format, format, ErrFormat)
	}
	if o.leases == 0 {
		a.leased++
		a.lru.remove(o)
	}
	o.leases++
	a.leases++
	if o.evicting {
		o.touched = true
	}
	return &Lease{a: a, obj: o, b: a.bytesOf(o)}, nil
}

// Key is the leased object's key.
func (l *Lease) Key() string { return l.obj.key }

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
	a, o := l.a, l.obj
	a.mu.Lock()
	defer a.mu.Unlock()
	o.leases--
	a.leases--
	if o.leases == 0 {
		a.leased--
		switch {
		case o.state == gone:
			a.freeLocked(o)
		case o.state == committed && !o.evicting && !a.closed:
			a.lru.pushFront(o)
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
	a.mu.Lock()
	defer a.mu.Unlock()
	o := a.objects[key]
	return !a.closed && o != nil && o.state == committed && o.format == format
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
		if o := a.objects[k]; o == nil || o.state != committed || o.format != format {
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
	a.mu.Lock()
	defer a.mu.Unlock()
	o := a.objects[key]
	if a.closed || o == nil || o.state != committed {
		return false
	}
	a.unindexLocked(o)
	a.freeLocked(o)
	return true
}
