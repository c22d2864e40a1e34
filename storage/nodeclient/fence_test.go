package nodeclient

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stratakv/strata/node/wire"
)

// A call that gave up waits while its fence counter says the service copies
// into the engine's memory, and returns once the counter is 0 or the service
// closed the connection. (That it waits cannot fail on a correct client; that
// it returns is what the test bounds.)
func TestWaitFenceWaitsForTheCopyUnderWay(t *testing.T) {
	for _, end := range []string{"copy ends", "service closes"} {
		t.Run(end, func(t *testing.T) {
			l := &link{fence: make([]atomic.Uint32, wire.FenceSlots), peerClosed: make(chan struct{})}
			l.fence[4].Store(1)
			done := make(chan struct{})
			go func() {
				l.waitFence(5, quiet, "test")
				close(done)
			}()
			select {
			case <-done:
				t.Fatal("returned with a copy under way")
			case <-time.After(50 * time.Millisecond):
			}
			if end == "copy ends" {
				l.fence[4].Store(0)
			} else {
				close(l.peerClosed)
			}
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatalf("did not return after the %s", end)
			}
		})
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
