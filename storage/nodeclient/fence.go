package nodeclient

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/node/wire"
)

// A call that gave up must leave the engine's memory alone. The engine reuses
// the pages of a Get or a Put that failed at once; a service that went on
// copying afterwards (stopped, swapped out, slow) would store the new bytes of
// a reused page under the old key, or write an old object over the pages of
// another request. So each Put and Get carries the call's deadline in the
// service's clock, and a Get names a slot of the connection's fence page,
// where the service counts the copies into the client's memory it has under
// way (node/wire's Put doc). A call that ends without its reply returns only
// once that counter is 0, or once the service closed the connection (which it
// does only after every request of it ended): from then on the service starts
// no copy for it, and none runs. A Put needs no wait: the service does not
// store an item whose copy ended past the deadline.
//
// A service that is stopped in the middle of a copy (SIGSTOP, a debugger) keeps
// such a call waiting until it resumes or dies; a stopped service that has not
// begun copying costs the call nothing beyond its deadline. A service that
// predates deadlines (HelloReply.ClockNS 0) gets none, and the client logs once
// that calls that time out may still be copied.

// link is what the client knows of one connection besides the connection.
type link struct {
	conn *wire.Conn
	// deadlines: the service keeps client deadlines; clockOff is its clock
	// minus ours, taken so that a converted deadline is never late.
	deadlines bool
	clockOff  int64
	fence     []atomic.Uint32 // nil: no fence page
	fenceMem  *hostmem.Region
	slots     chan uint32 // free fence slots
	// peerClosed is closed when the reader saw the service end the connection.
	peerClosed chan struct{}
	// runs: the connection's revision is 2 or later, and requests on it
	// name a part of equally spaced ranges as one wire.Run.
	runs bool
	// calls counts the calls that took the link (callOn, under Backend.mu
	// while the link was live): the fence page is unmapped after the last.
	calls sync.WaitGroup
}

// clockNow is CLOCK_MONOTONIC in nanoseconds, the clock of deadlines.
func clockNow() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) // cannot fail for this clock
	return ts.Nano()
}

// newLink sets up deadlines and the fence page on conn, whose Hello took from
// sent to got (our clock) and was answered with reply.
func newLink(ctx context.Context, conn *wire.Conn, reply *wire.HelloReply, got int64, log *slog.Logger, socket string) *link {
	l := &link{conn: conn, peerClosed: make(chan struct{})}
	if reply.ClockNS == 0 {
		log.Warn("node client: the node service keeps no client deadlines (an older strata serve): a call that times out may still be copied afterwards; upgrade it",
			"socket", socket, "serverVersion", reply.ServerVersion)
		return l
	}
	// The reply's clock was read before got: taking it as read at got makes
	// the offset, and every deadline converted with it, early by at most the
	// round trip.
	l.deadlines, l.clockOff = true, int64(reply.ClockNS)-got
	a, err := hostmem.New(hostmem.Config{Kind: hostmem.Shm, Logger: log})
	var region *hostmem.Region
	if err == nil {
		region, err = a.Allocate("strata-fence", wire.FenceBytes)
	}
	if err == nil {
		_, err = roundTrip(ctx, conn, wire.TypeRegisterSegment, wire.RegisterSegment{Size: wire.FenceBytes, Name: "fence", Fence: true}, region.Fd())
		if err != nil {
			_ = region.Close()
		}
	}
	if err != nil {
		log.Warn("node client: no fence page on this connection: a get that times out while the service copies may still be written afterwards",
			"socket", socket, "err", err)
		return l
	}
	l.fenceMem = region
	l.fence = unsafe.Slice((*atomic.Uint32)(unsafe.Pointer(unsafe.SliceData(region.Bytes()))), wire.FenceSlots)
	l.slots = make(chan uint32, wire.FenceSlots)
	for i := uint32(1); i <= wire.FenceSlots; i++ {
		l.slots <- i
	}
	return l
}

// stamp gives a Put or Get the call's deadline and, for a Get, a fence slot
// (0 when it has none), which the caller gives back with release.
func (l *link) stamp(ctx context.Context, msg wire.Message) (wire.Message, uint32, error) {
	if l == nil || !l.deadlines {
		return msg, 0, nil
	}
	dl, ok := ctx.Deadline()
	if !ok {
		return msg, 0, nil
	}
	deadline := uint64(max(clockNow()+int64(time.Until(dl))+l.clockOff, 1))
	switch m := msg.(type) {
	case wire.Put:
		m.DeadlineNS = deadline
		return m, 0, nil
	case wire.Get:
		m.DeadlineNS = deadline
		if l.fence == nil {
			return m, 0, nil
		}
		select {
		case m.FenceSlot = <-l.slots:
		case <-ctx.Done():
			return nil, 0, ctxErr(ctx.Err())
		}
		return m, m.FenceSlot, nil
	}
	return msg, 0, nil
}

// release gives slot back once its request is over: answered, or waited for.
func (l *link) release(slot uint32) {
	if slot != 0 {
		l.slots <- slot
	}
}

// settle returns once the service can no longer copy for a Put or Get that
// ended without its reply (see the comment on gave-up calls above): the
// service closed the connection, or the call's deadline has passed (the
// service starts no copy after it) and, for a Get, its fence counter reads 0
// (no copy runs). A call that lost its connection, or whose context ended,
// before its deadline waits for it: until then the service may still copy.
// done (the backend's Close) ends the wait. It logs once when a copy keeps it
// waiting a second past the deadline.
func (l *link) settle(slot uint32, deadline time.Time, done <-chan struct{}, log *slog.Logger, socket string) {
	if l == nil || !l.deadlines {
		return
	}
	warned := false
	for pause := 20 * time.Microsecond; ; pause = min(2*pause, 10*time.Millisecond) {
		late := time.Since(deadline)
		if late >= 0 && (slot == 0 || l.fence[slot-1].Load() == 0) {
			return
		}
		if late > time.Second && !warned {
			warned = true
			log.Warn("node client: a get past its deadline waits for the node service to finish copying into the engine's memory (the service is stalled mid-copy); it returns when the copy ends or the service goes",
				"socket", socket)
		}
		wait := pause
		if late < 0 {
			wait = min(-late, 10*time.Millisecond)
		}
		select {
		case <-l.peerClosed:
			return
		case <-done:
			return
		case <-time.After(wait):
		}
	}
}

// closedByPeer reports whether err, the reader's, means the service ended the
// connection (a clean end of stream, or a reset): not a protocol error of ours.
func closedByPeer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// gone ends the link once its reader has stopped and no new call can take it
// (Backend.links no longer holds it): peer tells whether the service closed
// the connection. The fence page is unmapped once the calls that took the link
// have ended.
func (l *link) gone(peer bool) {
	if peer {
		close(l.peerClosed)
	}
	if l.fenceMem != nil {
		go func() {
			l.calls.Wait()
			_ = l.fenceMem.Close()
		}()
	}
}
