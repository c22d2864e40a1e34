package node

import (
	"context"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stratakv/strata/node/wire"
)

// memBudget is the node-wide budget for the memory of requests in flight: every
// client's received frames, decoded items and replies together. Without it, a
// few clients sending the largest Gets the protocol allows at once drive the
// service past a gigabyte, and the Go heap keeps much of it after the burst.
type memBudget struct {
	limit int64

	mu   sync.Mutex
	used int64
	peak int64
	wake chan struct{} // closed (and replaced) whenever memory is released

	// lastFree is when memory was last handed back to the OS (unix nanoseconds).
	lastFree atomic.Int64
	frees    atomic.Int64
}

func newMemBudget(limit int64) *memBudget {
	return &memBudget{limit: limit, wake: make(chan struct{})}
}

// requestCost estimates the memory a request of h holds while it is handled: its
// body as received, the decoded message (keys, items, ranges: about twice the
// encoding) and the reply's results. It is an estimate of the order of the real
// cost, which is what a budget needs; it never exceeds the budget's minimum.
func requestCost(h wire.Header) int64 { return 4*int64(h.Len) + 4<<10 }

// acquire takes n bytes, waiting until ctx ends or done is closed for others to
// release them.
func (b *memBudget) acquire(ctx context.Context, done <-chan struct{}, n int64) error {
	n = min(n, b.limit)
	for {
		b.mu.Lock()
		if b.used+n <= b.limit {
			b.used += n
			b.peak = max(b.peak, b.used)
			b.mu.Unlock()
			return nil
		}
		wake := b.wake
		b.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return ctx.Err()
		case <-done:
			return ErrClosed
		}
	}
}

// release gives back n bytes taken by acquire. When a burst that used more than
// half the budget has drained, the heap it grew is handed back to the OS (at
// most every few seconds): the Go runtime would otherwise keep it until its
// next collection, which an idle service may not run for a long time.
func (b *memBudget) release(n int64) {
	if n == 0 {
		return
	}
	n = min(n, b.limit)
	b.mu.Lock()
	b.used -= n
	drained := b.used == 0 && b.peak > b.limit/2
	if drained {
		b.peak = 0
	}
	close(b.wake)
	b.wake = make(chan struct{})
	b.mu.Unlock()
	if drained {
		now, last := time.Now().UnixNano(), b.lastFree.Load()
		if now-last >= int64(5*time.Second) && b.lastFree.CompareAndSwap(last, now) {
			debug.FreeOSMemory()
			b.frees.Add(1)
		}
	}
}

// RequestMemoryStats is the request memory budget.
type RequestMemoryStats struct {
	// LimitBytes is the budget, UsedBytes what requests in flight hold now.
	LimitBytes int64 `json:"limitBytes"`
	UsedBytes  int64 `json:"usedBytes"`
	// Freed counts the bursts after which the heap was handed back to the OS.
	Freed int64 `json:"freed"`
}

func (b *memBudget) stats() RequestMemoryStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return RequestMemoryStats{LimitBytes: b.limit, UsedBytes: b.used, Freed: b.frees.Load()}
}
