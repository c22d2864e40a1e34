package arena

import (
	"fmt"
	"os"
	"runtime/debug"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Faults. An arena file can lose its memory under the service: whoever may
// write it (the service's user, root: owner.go keeps everyone else out) can
// truncate it, and every page past the new end then faults (SIGBUS) on its
// next touch, which kills a Go program unless the goroutine asked the runtime
// to panic instead (debug.SetPanicOnFault). So:
//
//   - every call of the arena, and each of its goroutines (eviction, warm-up,
//     recovery), runs with panic-on-fault set, and a fault at an address of
//     the arena file's mapping is recovered where the call returns;
//   - a watcher (inotify) sees the file shrink within microseconds, mostly
//     before anyone touches the lost pages;
//   - either way the arena breaks, once: it maps anonymous memory over the
//     file's mapping at the same address, so that no later touch faults in any
//     goroutine (a caller copying out of a Lease included); it empties the file,
//     so that no restart recovers what is left of it; and it logs one error line.
//
// A broken arena serves nothing and takes nothing: Acquire misses, Reserve and
// Commit fail with ErrBroken, removals find nothing to remove, and the rest of
// the service (its spill, Redis) goes on serving. Keeping on beats exiting:
// the objects are gone either way, and an exit would also drop every client's
// connection and registered memory and the spill's write buffers; the log line
// and Stats().Broken tell the operator to restart when it suits, and the
// restart formats the file anew. Its bookkeeping is abandoned (records may
// point at zeros now), so nothing is freed any more, and a panic of it is
// taken as one of the lost memory, not a bug.
//
// What no arena call can cover is a caller's own copy in the microseconds
// before the memory is replaced: a caller that copies under its own
// panic-on-fault passes the fault's address to HandleFault, and one that
// copied out of a Lease asks Err afterwards, since bytes read after the break
// are zeros.

// breakage is the state of an arena that broke, and what it needs to.
type breakage struct {
	flag   atomic.Bool // set before the memory is replaced, never cleared
	file   *backing    // the arena file's backing; nil for anonymous memory
	lo, hi uintptr     // its mapping: faults there are the arena's
	why    string      // under a.mu, once set
	at     time.Time
}

// broken reports whether the arena broke: from the moment its memory may be
// zeros on.
func (a *Arena) broken() bool { return a.brk.flag.Load() }

// holds reports whether addr lies in the arena file's mapping.
func (a *Arena) holds(addr uintptr) bool { return addr >= a.brk.lo && addr < a.brk.hi }

// guard is deferred first by every call of the arena that touches its memory
// and by each of its goroutines, with the old panic-on-fault setting:
//
//	defer a.guard(debug.SetPanicOnFault(true), &err)
//
// It restores the setting and takes a fault in the arena's memory (breaking
// the arena; *errp, when given, becomes ErrBroken). Every lock an arena call
// takes is released by a deferred Unlock, so it runs with no lock held. It
// costs two stores and a deferred call per call, not per byte.
func (a *Arena) guard(old bool, errp *error) {
	debug.SetPanicOnFault(old)
	if r := recover(); r != nil {
		a.absorb(r)
		if errp != nil {
			*errp = a.Err()
		}
	}
}

// absorb takes a panic recovered by guard: a fault in the arena file's memory
// breaks the arena; in a broken arena any panic is one of the lost memory.
// Anything else is a bug and goes on.
func (a *Arena) absorb(r any) {
	if f, ok := r.(interface{ Addr() uintptr }); ok && a.holds(f.Addr()) {
		a.breakArena(fmt.Sprintf("a touch of its memory faulted at offset %d of the file", f.Addr()-a.brk.lo))
		return
	}
	if !a.broken() {
		panic(r)
	}
	a.cfg.Logger.Debug("arena: a call on the broken arena failed", "panic", r)
}

// HandleFault is for a caller whose own copy into or out of the arena's bytes
// (a Pending's or a Lease's) faulted under its panic-on-fault: it reports
// whether addr lies in the arena file's memory, and when it does it breaks the
// arena, as a truncation the arena found itself would, and the caller fails
// the item. False: the fault is not the arena's.
func (a *Arena) HandleFault(addr uintptr) bool {
	if !a.holds(addr) {
		return false
	}
	a.breakArena(fmt.Sprintf("a caller's copy faulted at offset %d of the file", addr-a.brk.lo))
	return true
}

// Err is nil while the arena serves, and ErrBroken, saying why, once it broke.
// A caller that copied out of a Lease checks it after the copy: bytes read
// after the arena broke are zeros, not the object's.
func (a *Arena) Err() error {
	if !a.broken() {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.brokenErrLocked()
}

func (a *Arena) brokenErrLocked() error {
	why := a.brk.why
	if why == "" {
		why = "its memory faulted"
	}
	return fmt.Errorf("arena file %s: %s: %w; it serves nothing until the service restarts, which formats the file anew", a.cfg.File, why, ErrBroken)
}

// breakArena breaks the arena (the package comment on faults), once. It takes
// the arena's lock: the caller holds none.
func (a *Arena) breakArena(why string) {
	if a.brk.file == nil {
		return
	}
	// The flag flips under the lock with the reason set, so that no Err or
	// Stats in between says "its memory faulted" for what was a truncation.
	a.mu.Lock()
	if !a.brk.flag.CompareAndSwap(false, true) {
		a.mu.Unlock()
		return
	}
	a.brk.why, a.brk.at = why, time.Now()
	a.mu.Unlock()
	err := a.brk.file.replace()
	a.mu.Lock()
	defer a.mu.Unlock()
	// Wake everyone who waits for something that will not happen now: writers
	// of a key (Await), removals waiting for recovery, Reserves waiting for
	// the warm-up or an eviction.
	for idx, ch := range a.settled {
		close(ch)
		delete(a.settled, idx)
	}
	if a.rcv.active {
		a.rcv.finish(a)
	}
	a.cond.Broadcast()
	a.checkReadyLocked()
	args := []any{"file", a.cfg.File, "why", why, "objectsLost", a.committed, "bytesLost", a.committedBytes,
		"fix", "never truncate or write the arena file while the service runs; restart the service when it suits: it formats the file anew"}
	if err != nil {
		args = append(args, "replaceErr", err)
	}
	a.cfg.Logger.Error("arena broken: its memory is gone; it serves nothing and takes nothing until the service restarts", args...)
}

// watchFile starts the watcher of b's file: inotify reports every change of
// its size (truncate, ftruncate, an open with O_TRUNC) as IN_MODIFY, and one
// that leaves it shorter than the arena breaks the arena, usually before
// anyone touches the lost pages. Without inotify (none left to this user)
// faults alone find a truncation. It ends with the arena's goroutines.
func (a *Arena) watchFile(b *backing) {
	if a.cfg.noWatch {
		return
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err == nil {
		// The open file itself, whatever its path names by now.
		_, err = unix.InotifyAddWatch(fd, fmt.Sprintf("/proc/self/fd/%d", b.fd), unix.IN_MODIFY)
		if err != nil {
			_ = unix.Close(fd)
		}
	}
	if err != nil {
		a.cfg.Logger.Debug("arena: no watcher of the arena file; a truncation is found by its faults alone", "file", a.cfg.File, "err", err)
		return
	}
	f := os.NewFile(uintptr(fd), "inotify") // non-blocking: Close ends a Read
	a.done.Add(2)
	go func() {
		defer a.done.Done()
		<-a.stop
		_ = f.Close()
	}()
	go func() {
		defer a.done.Done()
		var buf [4096]byte
		for {
			a.checkSize(b) // also once first: a truncation before the watch began
			if _, err := f.Read(buf[:]); err != nil {
				return
			}
		}
	}()
}

// checkSize breaks the arena when its file is shorter than the arena.
func (a *Arena) checkSize(b *backing) {
	b.mapMu.Lock()
	var st unix.Stat_t
	short := b.fd >= 0 && !b.replaced && unix.Fstat(b.fd, &st) == nil && st.Size < b.geo.fileSize
	b.mapMu.Unlock()
	if short {
		a.breakArena(fmt.Sprintf("its file was truncated to %d of its %d bytes", st.Size, b.geo.fileSize))
	}
}

// replace maps anonymous memory over the file's mapping, at the same address
// (fault.go's package comment), and empties the file.
func (b *backing) replace() error {
	b.mapMu.Lock()
	defer b.mapMu.Unlock()
	if b.fd < 0 || b.replaced || len(b.mapping) == 0 {
		return nil
	}
	b.replaced = true
	_, err := unix.MmapPtr(-1, 0, unsafe.Pointer(unsafe.SliceData(b.mapping)), uintptr(len(b.mapping)),
		unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE|unix.MAP_FIXED)
	if err != nil {
		// Still the file's: emptying it would fault every touch.
		return fmt.Errorf("map anonymous memory over the arena file: %w", err)
	}
	return unix.Ftruncate(b.fd, 0)
}

// faultless runs fn, which touches mem, and reports whether it ran to its end:
// a fault in mem is taken. For the arena file's memory where no arena call
// guards it (opening, closing).
func faultless(mem []byte, fn func()) (ok bool) {
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if r := recover(); r != nil {
			f, fault := r.(interface{ Addr() uintptr })
			lo := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
			if !fault || f.Addr() < lo || f.Addr() >= lo+uintptr(len(mem)) {
				panic(r)
			}
			ok = false
		}
	}()
	fn()
	return true
}
