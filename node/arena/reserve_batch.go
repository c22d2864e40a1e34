package arena

import (
	"fmt"
	"hash/maphash"
	"runtime/debug"

	"github.com/stratakv/strata/hostmem"
)

// ReserveInto reserves the objects keys[i] of formats[i] and sizes[i] under
// one lock, into[i] becoming each one's Pending as Reserve's would, without a
// Pending allocated per object: the lock, taken and contended twice an object
// by a service's copy workers and its evictor, was most of what a batch of
// small puts spent beside its copies. It never evicts and never waits: an
// object that does not fit in the free space now gets ErrNotNow, and the caller
// reserves it with Reserve (which evicts) once it holds no Pending it could
// be waited for by. Otherwise errs[i] is what Reserve would have answered
// (ErrExists, ErrFormat, ErrKey, ErrSize, ErrNoSpace for an object larger than
// the arena), and into[i] holds nothing. into and errs need len(keys)
// elements; what into held before is overwritten, so it can be reused once each
// of its Pendings ended in Commit (or CommitAll) or Abort. It fails as a whole,
// reserving nothing, only when the arena is closed or broken.
func (a *Arena) ReserveInto(keys []string, formats []uint64, sizes []int64, into []Pending, errs []error) (err error) {
	n := len(keys)
	if len(formats) < n || len(sizes) < n || len(into) < n || len(errs) < n {
		panic(fmt.Sprintf("arena: ReserveInto of %d keys with %d formats, %d sizes, %d pendings and %d errors", n, len(formats), len(sizes), len(into), len(errs)))
	}
	var small [64]uint64
	hs := small[:0]
	if n > len(small) {
		hs = make([]uint64, 0, n)
	}
	for _, k := range keys {
		hs = append(hs, maphash.String(a.seed, k))
	}
	for i := range n {
		into[i] = Pending{}
		into[i].done.Store(true) // holds nothing: Abort and CommitAll skip it
	}
	defer a.guard(debug.SetPanicOnFault(true), &err)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return fmt.Errorf("reserve %d objects: %w", n, ErrClosed)
	}
	if a.broken() {
		return fmt.Errorf("reserve %d objects: %w", n, a.brokenErrLocked())
	}
	for i, key := range keys {
		errs[i] = a.reserveOneOfLocked(key, hs[i], formats[i], sizes[i], &into[i])
	}
	return nil
}

// reserveOneOfLocked is one object of ReserveInto.
func (a *Arena) reserveOneOfLocked(key string, h, format uint64, size int64, into *Pending) error {
	if err := a.checkKey(key); err != nil {
		return fmt.Errorf("reserve: %w", err)
	}
	switch {
	case size <= 0:
		return fmt.Errorf("reserve %q: size %d must be positive: %w", key, size, ErrSize)
	case size > a.size:
		a.noSpace++
		return fmt.Errorf("reserve %q: %s is larger than the whole arena (%s); raise the arena size: %w",
			key, hostmem.FormatBytes(size), hostmem.FormatBytes(a.size), ErrNoSpace)
	case a.extUnits(size) > maxExtentUnits:
		return fmt.Errorf("reserve %q: %s is more than the %d units of %d bytes an object may span: %w",
			key, hostmem.FormatBytes(size), maxExtentUnits, a.unit, ErrSize)
	}
	ok, err := a.reserveOnceLocked(key, h, format, size, a.smallClass(size, len(key)), into)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("reserve %q: %w", key, ErrNotNow)
	}
	return nil
}

// CommitAll commits every Pending of ps that is not done yet under one lock, as
// a Commit of each would, errs[i] saying what ps[i]'s Commit would have
// answered (nil: published). Elements that hold nothing (a key ReserveInto did
// not reserve, or one committed or aborted already) get ErrDone. errs needs
// len(ps) elements. The Pendings must be this arena's. A fault in the arena's
// memory meanwhile breaks the arena: the objects not committed by then are
// not, their errs say so, and the call returns the fault.
func (a *Arena) CommitAll(ps []Pending, errs []error) (err error) {
	if len(errs) < len(ps) {
		panic(fmt.Sprintf("arena: CommitAll of %d pendings into %d errors", len(ps), len(errs)))
	}
	for i := range ps {
		if ps[i].a != nil && ps[i].a != a {
			panic("arena: CommitAll of another arena's Pending")
		}
		// What an element keeps when a fault ends the loop before it.
		errs[i] = errUncommitted
	}
	defer a.guard(debug.SetPanicOnFault(true), &err)
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := range ps {
		if ps[i].a == nil || ps[i].done.Load() {
			errs[i] = fmt.Errorf("commit %q: %w", ps[i].key, ErrDone)
			continue
		}
		errs[i] = ps[i].commitLocked()
	}
	return nil
}

// errUncommitted is CommitAll's answer for the Pendings a fault left.
var errUncommitted = fmt.Errorf("not committed: the arena's memory faulted first: %w", ErrBroken)
