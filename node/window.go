package node

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/node/wire"
)

// Client deadlines. An engine that gives up on a request reuses the pages it
// named at once: a Put's page gets another prefix's KV, a Get's page goes to
// another request. Had the service gone on copying after that (it was stopped,
// swapped out, or just slow), it would store the new bytes under the old key or
// overwrite the other request's KV. So a request carries the client's deadline
// (wire.Put's doc), and:
//
//   - a Put copies an item out of the client's memory, then looks at the clock:
//     an item whose copy ended past the deadline is not stored (its bytes may
//     have changed under the copy), and one whose deadline passed is not
//     started;
//   - a Get raises its fence slot's counter in the client's fence page, then
//     looks at the clock, and copies into the client's memory only before the
//     deadline, lowering the counter after the copy. A client whose deadline
//     passed reads the counter: 0 means no copy runs and none can start (one
//     raising it now finds the deadline passed); otherwise a copy that started
//     in time still runs, and the client waits for it to end.
//
// The deadline is in the service's CLOCK_MONOTONIC, which a client learns from
// HelloReply.ClockNS (it converts its own with the reply's round trip, erring
// early). deadlineMargin is how long before it the service stops starting
// copies, so that a copy that starts in time ends in time.

// deadlineMargin is how long before a client's deadline the service starts no
// more copies for it: more than one item's copy takes (8 MiB at a few GB/s).
const deadlineMargin = 5 * time.Millisecond

// errDeadline is an item refused because the client's deadline passed.
var errDeadline = errors.New("the client's deadline passed before the object was copied; nothing was stored or written: retry")

// errFenceFault is an item refused because the client's fence page faulted
// (it shrank the memfd): the service cannot tell the client what it copies.
var errFenceFault = errors.New("the connection's fence page faulted (its memfd was shrunk); nothing was written: reconnect with a new fence page")

// monoNow is CLOCK_MONOTONIC in nanoseconds, the clock of client deadlines.
// It is read per item, so not with a system call (unix.ClockGettime is one):
// Go's own monotonic clock is CLOCK_MONOTONIC read through the vDSO, so the
// time since one reading of both, added to that reading, is the same clock.
func monoNow() uint64 {
	return monoBase.at + uint64(time.Since(monoBase.t))
}

// monoBase is one reading of CLOCK_MONOTONIC and of Go's clock, taken once.
var monoBase = func() (b struct {
	t  time.Time
	at uint64
}) {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) // cannot fail for this clock
	b.t, b.at = time.Now(), uint64(ts.Nano())
	return b
}()

// window is what a client's deadline allows one request; nil allows
// everything (a client that sends none).
type window struct {
	deadline uint64         // the service's monotonic ns; 0: none
	slot     *atomic.Uint32 // the request's fence counter; nil: none
	hook     func()         // tests: hooks.copying
}

// newWindow is the window of a Put or Get with the given deadline and fence
// slot, or nil when it has neither.
func (c *session) newWindow(deadline uint64, slot uint32) *window {
	if deadline == 0 && slot == 0 {
		return nil
	}
	w := &window{deadline: deadline}
	if h := c.srv.cfg.hooks; h != nil {
		w.hook = h.copying
	}
	if slot > 0 {
		if f := c.fence.Load(); f != nil {
			w.slot = f.slot(slot)
		}
	}
	return w
}

// context is ctx ending at the client's deadline too, so that waits for
// another request's write end when the client has gone.
func (w *window) context(ctx context.Context) (context.Context, context.CancelFunc) {
	if w == nil || w.deadline == 0 {
		return ctx, func() {}
	}
	left := time.Duration(int64(w.deadline) - int64(monoNow()))
	return context.WithTimeout(ctx, left)
}

// open reports whether a copy may start: the deadline is more than
// deadlineMargin away.
func (w *window) open() bool {
	return w == nil || w.deadline == 0 || monoNow()+uint64(deadlineMargin) < w.deadline
}

// copyOut copies src into the client's runs under the window (the package
// comment on client deadlines): errDeadline when the deadline passed first, a
// *copyFault when the client's memory faulted.
func (w *window) copyOut(runs [][]byte, src []byte) error {
	if w == nil {
		return copyToRuns(runs, src)
	}
	if w.slot == nil {
		if !w.open() {
			return errDeadline
		}
		return copyToRuns(runs, src)
	}
	// One fault guard for the counter and the copy: a guard per step cost a
	// tenth of a 1 KiB get.
	expired := false
	err := guard(func() {
		w.slot.Add(1)
		defer w.slot.Add(^uint32(0))
		if !w.open() {
			expired = true
			return
		}
		if w.hook != nil {
			w.hook()
		}
		for _, r := range runs {
			src = src[copy(r, src):]
		}
	})
	var cf *copyFault
	switch {
	case errors.As(err, &cf) && w.inFence(cf.Addr):
		return errFenceFault
	case err != nil:
		return err
	case expired:
		return errDeadline
	}
	return nil
}

// inFence reports whether addr lies in the fence page of w's slot.
func (w *window) inFence(addr uintptr) bool {
	base := uintptr(unsafe.Pointer(w.slot)) &^ (wire.FenceBytes - 1)
	return addr >= base && addr < base+wire.FenceBytes
}

// copyIn copies the client's runs into dst under the window: errDeadline when
// the deadline passed before the copy started or while it ran (then dst holds
// what the client may have changed meanwhile, and must not be stored).
func (w *window) copyIn(dst []byte, runs [][]byte) error {
	if !w.open() {
		return errDeadline
	}
	if err := copyFromRuns(dst, runs); err != nil {
		return err
	}
	if !w.open() {
		return errDeadline
	}
	return nil
}

// copyFailed answers item it, whose copy to or from the client's ranges r
// failed with err: the deadline, the fence page, or a fault in the client's
// memory (segmentFault).
func (c *session) copyFailed(it wire.Item, r resolved, err error) wire.Result {
	switch {
	case errors.Is(err, errDeadline):
		c.srv.st.pastDeadline.Add(1)
		return wire.Result{Status: wire.Busy, Message: errDeadline.Error()}
	case errors.Is(err, errFenceFault):
		c.srv.logs.warn("a client's fence page faulted; its gets fail until it reconnects", "client", c.id, "name", c.name)
		return wire.Result{Status: wire.BadRange, Message: errFenceFault.Error()}
	}
	return c.segmentFault(it, r, err)
}

// fence is a connection's fence page, mapped from the client's memfd.
type fence struct {
	mem []byte
	fd  int
}

// mapFence checks and maps a fence page (wire.RegisterSegment.Fence).
func mapFence(fd int, size uint64) (*fence, error) {
	if size != wire.FenceBytes {
		return nil, fmt.Errorf("a fence page of %d bytes: it must be %d", size, wire.FenceBytes)
	}
	mem, err := mapSegment(fd, size)
	if err != nil {
		return nil, err
	}
	return &fence{mem: mem, fd: fd}, nil
}

// slot returns counter i (1-based) of the page.
func (f *fence) slot(i uint32) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&f.mem[(i-1)*4]))
}

// release unmaps the page; no request may use it any more.
func (f *fence) release() {
	_ = unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(f.mem)), uintptr(len(f.mem)))
	_ = unix.Close(f.fd)
}
