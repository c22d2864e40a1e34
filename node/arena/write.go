package arena

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"runtime/debug"
	"sync/atomic"

	"github.com/stratakv/strata/hostmem"
)

// Pending is a reserved, unpublished object: its writer fills Bytes, then Commits
// or Aborts. Until then the object is invisible to readers and never evicted. A
// Pending is used by one goroutine.
//
// Every Reserve must end in Commit or Abort, also when the writer fails: a
// server's connection goroutine that ends with writes in flight must Abort them,
// or their space stays taken until the arena is closed. `defer p.Abort()` right
// after Reserve does it, since Abort after Commit does nothing.
type Pending struct {
	a    *Arena
	idx  uint32 // the object's record: it is not freed while pending
	key  string
	b    []byte
	done atomic.Bool
}

// Reserve allocates size bytes for the object key of the given format. It fails
// with ErrExists if the key is committed or being written (objects are
// write-once, and a writer treats that as success; errors.Is(err, ErrFormat) also
// holds when the existing object has another format), and with ErrNoSpace when
// no free extent fits even after evicting every object that can be evicted (the
// rest is leased or pending). When the free space does not fit the object it
// evicts synchronously, calling OnEvict for each victim: least recently used
// first and, when a few of those have not made room, whole regions next to the
// largest free extents, so that the objects it evicts are in proportion to the
// size it needs however fragmented the free space is (evict.go). It does not
// wait for leases to end, so it never blocks for long; it only waits for
// evictions that other goroutines have in flight.
//
// The Pending must end in Commit or Abort, whatever happens to the writer: see
// Pending.
func (a *Arena) Reserve(key string, format uint64, size int64) (_ *Pending, err error) {
	if err := a.checkKey(key); err != nil {
		return nil, fmt.Errorf("reserve: %w", err)
	}
	if size <= 0 {
		return nil, fmt.Errorf("reserve %q: size %d must be positive: %w", key, size, ErrSize)
	}
	h := maphash.String(a.seed, key)
	defer a.guard(debug.SetPanicOnFault(true), &err)
	a.mu.Lock()
	defer a.mu.Unlock()
	if size > a.size {
		a.noSpace++
		return nil, fmt.Errorf("reserve %q: %s is larger than the whole arena (%s); raise the arena size: %w",
			key, hostmem.FormatBytes(size), hostmem.FormatBytes(a.size), ErrNoSpace)
	}
	if a.extUnits(size) > maxExtentUnits {
		return nil, fmt.Errorf("reserve %q: %s is more than the %d units of %d bytes an object may span: %w",
			key, hostmem.FormatBytes(size), maxExtentUnits, a.unit, ErrSize)
	}
	class := a.smallClass(size, len(key))
	// units is the extent a new allocation needs: the object's own, or a new slab's.
	units := (size + a.unit - 1) / a.unit
	if class >= 0 {
		units = a.slabSpan(class) / a.unit
	}
	// Each eviction tried frees its victim or, if it was read during OnEvict,
	// moves it to the front; trying twice as many as there are objects is more
	// than enough to go round.
	budget := 2*int64(a.recs.Live()) + 2
	lruTries := 0
	p := new(Pending)
	for {
		ok, err := a.reserveOnceLocked(key, h, format, size, class, p)
		if err != nil {
			return nil, err
		}
		if ok {
			return p, nil
		}
		if a.warm.withheld > 0 {
			// Memory not populated yet is not given out (warm.go): wait for
			// the warm-up's next chunk rather than evict.
			a.warm.waits++
			a.cond.Wait()
			continue
		}
		if budget > 0 {
			budget--
			// The least recently used first; when a few of them have not made
			// room the free space is fragmented, and whole regions beside the
			// largest free extents go instead (evict.go).
			if v := a.lruBack(); v != 0 && lruTries < lruVictims {
				lruTries++
				a.evictLocked(v)
				continue
			}
			if a.evictRegionLocked(units) {
				continue
			}
		}
		if a.inflight > 0 {
			// Another goroutine's OnEvict runs; its victim's space may fit.
			a.cond.Wait()
			continue
		}
		a.noSpace++
		return nil, fmt.Errorf("reserve %q: no free extent fits %s; %s free in %d extents (largest %s), %d objects leased, %s being written: %w",
			key, hostmem.FormatBytes(units*a.unit), hostmem.FormatBytes(a.ext.FreeUnits()*a.unit), a.ext.FreeExtents(),
			hostmem.FormatBytes(a.ext.LargestFree()*a.unit), a.leased, hostmem.FormatBytes(a.pendingBytes), ErrNoSpace)
	}
}

// reserveOnceLocked is one try of Reserve without evicting or waiting: into
// is the new pending object when it reports true; false with no error when
// there is no room for it now.
func (a *Arena) reserveOnceLocked(key string, h, format uint64, size int64, class int, into *Pending) (bool, error) {
	if a.closed {
		return false, fmt.Errorf("reserve %q: %w", key, ErrClosed)
	}
	if a.broken() {
		return false, fmt.Errorf("reserve %q: %w", key, a.brokenErrLocked())
	}
	if a.removingLocked(key) != nil {
		// Being removed: no new copy may enter until the removal ends
		// (remove.go). Await waits for it.
		return false, fmt.Errorf("reserve %q: being removed: %w", key, ErrExists)
	}
	if idx := a.lookupLocked(key, h); idx != 0 {
		if f := a.rec(idx).format; f != format {
			return false, fmt.Errorf("reserve %q: held by an object of format %#x, not %#x: %w (%w)", key, f, format, ErrExists, ErrFormat)
		}
		return false, fmt.Errorf("reserve %q: %w", key, ErrExists)
	}
	ok, err := a.placeLocked(key, h, format, size, class, into)
	if err != nil {
		return false, fmt.Errorf("reserve %q: %w", key, err)
	}
	return ok, nil
}

// Key is the key the object is reserved under.
func (p *Pending) Key() string { return p.key }

// Bytes is the reserved region, exactly the reserved size long; nil after Commit
// or Abort.
func (p *Pending) Bytes() []byte {
	if p.done.Load() {
		return nil
	}
	return p.b
}

// Commit publishes the object: from now on readers find it, and it is the most
// recently used. It fails with ErrDone after Commit or Abort, with ErrClosed
// (dropping the object) after the arena's Close, and with ErrBroken once the
// arena broke (what was copied into it may be zeros): nothing is stored.
func (p *Pending) Commit() (err error) {
	a := p.a
	if a == nil {
		return fmt.Errorf("commit: an element of ReserveInto's that holds nothing: %w", ErrDone)
	}
	defer a.guard(debug.SetPanicOnFault(true), &err)
	a.mu.Lock()
	defer a.mu.Unlock()
	return p.commitLocked()
}

// commitLocked is Commit under the arena's lock.
func (p *Pending) commitLocked() error {
	a := p.a
	if p.done.Load() {
		return fmt.Errorf("commit %q: %w", p.key, ErrDone)
	}
	p.done.Store(true)
	a.settleLocked(p.idx)
	if a.broken() {
		return fmt.Errorf("commit %q: %w", p.key, a.brokenErrLocked())
	}
	if a.closed {
		a.dropLocked(p.idx)
		if err := a.unmapLocked(); err != nil {
			a.cfg.Logger.Warn("arena: releasing memory after close", "err", err)
		}
		return fmt.Errorf("commit %q: %w", p.key, ErrClosed)
	}
	r := a.rec(p.idx)
	if r.flags&flagDoomed != 0 {
		// Removed while it was written (remove.go): it must not appear now.
		a.dropLocked(p.idx)
		return fmt.Errorf("commit %q: %w", p.key, ErrRemoved)
	}
	// The commit mark goes last, after the bytes the writer copied and the
	// trailer: a restarted service finds the object whole or not at all.
	end := a.slotEnd(r)
	seq := a.nextSeqLocked()
	binary.LittleEndian.PutUint64(a.mem[trailerAt(end)+8:], seq)
	a.setCheck(end, a.checkOf(r.off, end))
	r.state = committed
	if a.seal.on && r.flags&flagLarge != 0 {
		a.queueSealLocked(p.idx, seq)
	}
	a.committed++
	a.committedBytes += r.size
	a.lruPushFront(p.idx)
	a.kickLocked()
	return nil
}

// Abort frees the reservation. It does nothing after Commit or Abort, so a writer
// can defer it right after Reserve.
func (p *Pending) Abort() {
	a := p.a
	if a == nil || p.done.Load() {
		// Holds nothing (an element of ReserveInto's), or ended: only this
		// Pending's own goroutine ends it, so no lock is needed to know. The
		// deferred Abort after every Commit took the arena's lock for nothing.
		return
	}
	defer a.guard(debug.SetPanicOnFault(true), nil)
	a.mu.Lock()
	defer a.mu.Unlock()
	if p.done.Load() {
		return
	}
	p.done.Store(true)
	a.settleLocked(p.idx)
	a.dropLocked(p.idx)
	if err := a.unmapLocked(); err != nil {
		a.cfg.Logger.Warn("arena: releasing memory after close", "err", err)
	}
}

// settleLocked ends pending object idx's write: its waiters in Await wake
// (at once, when the arena broke: fault.go).
func (a *Arena) settleLocked(idx uint32) {
	a.pending--
	a.pendingBytes -= a.spanOf(a.rec(idx))
	if ch, ok := a.settled[idx]; ok {
		close(ch)
		delete(a.settled, idx)
	}
}

// Await waits until no write of key is pending: the object being written under
// key (by another request) is committed or aborted, and no removal of key is in
// progress (remove.go). It reports whether there was such a write or removal; when there was, the caller looks again (Acquire, or Reserve to
// write it itself if the other writer aborted). Readers and writers that must
// not answer "missing" or "stored" for an object that is half written use it:
// Reserve's ErrExists and Acquire's ErrNotFound do not tell a pending write from
// a committed object or from none. It fails with ctx's error when ctx ends first.
//
// The caller must not hold a Pending of its own while it waits: two writers each
// waiting for the other's key would wait until their contexts end.
func (a *Arena) Await(ctx context.Context, key string) (bool, error) {
	ch := a.pendingWrite(key)
	if ch == nil {
		return false, nil
	}
	select {
	case <-ch:
		return true, nil
	case <-ctx.Done():
		return true, fmt.Errorf("wait for the write of %q: %w", key, ctx.Err())
	}
}

// pendingWrite returns the channel that closes when the pending write of key
// ends, or nil when none is pending.
func (a *Arena) pendingWrite(key string) (ch <-chan struct{}) {
	h := maphash.String(a.seed, key)
	defer a.guard(debug.SetPanicOnFault(true), nil)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed || a.broken() {
		return nil
	}
	if idx := a.lookupLocked(key, h); idx != 0 && a.rec(idx).state == pending {
		// Made for the first waiter only: most writes have none, and a
		// channel and a map entry per object was a fifth of a small
		// put's time under the arena lock.
		ch, ok := a.settled[idx]
		if !ok {
			ch = make(chan struct{})
			a.settled[idx] = ch
		}
		return ch
	}
	if rm := a.removingLocked(key); rm != nil {
		return rm.done
	}
	return nil
}

// dropLocked takes a pending object out of the index and frees its space.
func (a *Arena) dropLocked(idx uint32) {
	r := a.rec(idx)
	a.tab.Remove(idx, uint32(r.hash))
	r.state = gone
	a.freeLocked(idx)
}

func (a *Arena) checkKey(key string) error {
	if key == "" || len(key) > MaxKeyBytes {
		return fmt.Errorf("arena key of %d bytes: want 1 to %d: %w", len(key), MaxKeyBytes, ErrKey)
	}
	return nil
}
