package nodeclient

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stratakv/strata/node/wire"
)

// A call that gave up past its deadline waits while its fence counter says the
// service copies into the engine's memory, and returns once the counter is 0,
// the service closed the connection, or the backend closed. (That it waits
// cannot fail on a correct client; that it returns is what the test bounds.)
func TestSettleWaitsForTheCopyUnderWay(t *testing.T) {
	for _, end := range []string{"copy ends", "service closes", "backend closes"} {
		t.Run(end, func(t *testing.T) {
			l := &link{deadlines: true, fence: make([]atomic.Uint32, wire.FenceSlots), peerClosed: make(chan struct{})}
			l.fence[4].Store(1)
			closing := make(chan struct{})
			done := make(chan struct{})
			go func() {
				l.settle(5, time.Now().Add(-time.Millisecond), closing, quiet, "test")
				close(done)
			}()
			select {
			case <-done:
				t.Fatal("returned with a copy under way")
			case <-time.After(50 * time.Millisecond):
			}
			switch end {
			case "copy ends":
				l.fence[4].Store(0)
			case "service closes":
				close(l.peerClosed)
			default:
				close(closing)
			}
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatalf("did not return after the %s", end)
			}
		})
	}
}

// A call that lost its connection before its deadline (or whose context
// ended early) waits for the deadline even with no copy under way: until then
// the service may start one. A put too.
func TestSettleWaitsForTheDeadline(t *testing.T) {
	l := &link{deadlines: true, fence: make([]atomic.Uint32, wire.FenceSlots), peerClosed: make(chan struct{})}
	for _, slot := range []uint32{0, 3} {
		deadline := time.Now().Add(100 * time.Millisecond)
		l.settle(slot, deadline, nil, quiet, "test")
		if now := time.Now(); now.Before(deadline) {
			t.Fatalf("slot %d: returned %v before the deadline", slot, deadline.Sub(now))
		}
	}
	// Unless the service closed the connection: then nothing can copy.
	close(l.peerClosed)
	start := time.Now()
	l.settle(3, time.Now().Add(time.Hour), nil, quiet, "test")
	if time.Since(start) > 10*time.Second {
		t.Fatal("waited for the deadline on a connection the service closed")
	}
}

// A Put and a Get carry the call's deadline in the service's clock, and a Get
// a fence slot that is handed out once at a time.
func TestStampCarriesTheDeadline(t *testing.T) {
	l := &link{deadlines: true, clockOff: 1 << 40, fence: make([]atomic.Uint32, wire.FenceSlots), slots: make(chan uint32, 2)}
	l.slots <- 7
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	now := clockNow()
	m, slot, err := l.stamp(ctx, wire.Get{})
	if err != nil || slot != 7 || m.(wire.Get).FenceSlot != 7 {
		t.Fatalf("get stamped %+v, slot %d, %v", m, slot, err)
	}
	if d := int64(m.(wire.Get).DeadlineNS) - now - 1<<40; d <= 0 || d > int64(time.Second) {
		t.Fatalf("deadline %v from now in the service's clock, want within 1 s", time.Duration(d))
	}
	if m, slot, _ := l.stamp(ctx, wire.Put{}); slot != 0 || m.(wire.Put).DeadlineNS == 0 || m.(wire.Put).FenceSlot != 0 {
		t.Fatalf("put stamped %+v, slot %d", m, slot)
	}
	short, cancel2 := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel2()
	if _, _, err := l.stamp(short, wire.Get{}); err == nil {
		t.Fatal("a get stamped with no free slot and its context ending")
	}
	l.release(7)
	if _, slot, _ := l.stamp(ctx, wire.Get{}); slot != 7 {
		t.Fatalf("slot %d after the release, want 7", slot)
	}
}
