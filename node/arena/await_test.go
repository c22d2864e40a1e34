package arena

import (
	"context"
	"errors"
	"testing"
	"time"
)

// isClosed reports whether ch is closed, without waiting.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// Await returns at once when nothing is being written under the key, and
// otherwise when the pending write is committed or aborted (or its context ends).
func TestAwaitEndsWithThePendingWrite(t *testing.T) {
	a := newArena(t, testConfig(t, 1<<20))
	ctx := context.Background()
	if w, err := a.Await(ctx, "none"); w || err != nil {
		t.Fatalf("Await of a key nobody writes = %v, %v; want false, nil", w, err)
	}
	for _, end := range []string{"commit", "abort"} {
		key := "k-" + end
		p, err := a.Reserve(key, 1, 100)
		if err != nil {
			t.Fatal(err)
		}
		ended := a.pendingWrite(key)
		if ended == nil || isClosed(ended) {
			t.Fatalf("%s: no pending write of %s to wait for", end, key)
		}
		// A second writer is told the key exists; a reader does not find it yet.
		if _, err := a.Reserve(key, 1, 100); !errors.Is(err, ErrExists) {
			t.Fatalf("%s: second Reserve: %v", end, err)
		}
		if _, err := a.Acquire(key, 1); !errors.Is(err, ErrNotFound) {
			t.Fatalf("%s: Acquire of a pending object: %v", end, err)
		}
		if isClosed(ended) {
			t.Fatalf("%s: the write ended before its writer ended it", end)
		}
		if end == "commit" {
			copy(p.Bytes(), pattern(key, 100))
			if err := p.Commit(); err != nil {
				t.Fatal(err)
			}
		} else {
			p.Abort()
		}
		if !isClosed(ended) {
			t.Fatalf("%s: waiters not woken", end)
		}
		// After it: committed is readable and exists, aborted can be written again.
		if w, err := a.Await(ctx, key); w || err != nil {
			t.Fatalf("%s: Await after the write ended = %v, %v", end, w, err)
		}
		switch end {
		case "commit":
			l, err := a.Acquire(key, 1)
			if err != nil {
				t.Fatalf("Acquire after Commit: %v", err)
			}
			l.Release()
		case "abort":
			p, err := a.Reserve(key, 1, 100)
			if err != nil {
				t.Fatalf("Reserve after Abort: %v", err)
			}
			p.Abort()
		}
	}
	// A write that does not end: Await gives up with the context.
	p, err := a.Reserve("stuck", 1, 100)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Abort()
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if w, err := a.Await(cctx, "stuck"); !w || !errors.Is(err, context.Canceled) {
		t.Fatalf("Await with a canceled context = %v, %v; want true, context.Canceled", w, err)
	}
	// And one that ends while Await waits, however the goroutines interleave.
	done := make(chan error, 1)
	go func() {
		_, err := a.Await(ctx, "stuck")
		done <- err
	}()
	p.Abort()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Await of a write that was aborted: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Await did not return after the write was aborted")
	}
}

// The channel a waiter waits on is made by the first waiter and shared by the
// next; a write nobody waits for makes none, and none is left after a write.
func TestAwaitChannelMadeForTheFirstWaiterOnly(t *testing.T) {
	a := newArena(t, testConfig(t, 1<<20))
	quiet, err := a.Reserve("quiet", 1, 100)
	if err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	n := len(a.settled)
	a.mu.Unlock()
	if n != 0 {
		t.Fatalf("a write nobody waits for made %d channels", n)
	}
	quiet.Abort()
	p, err := a.Reserve("watched", 1, 100)
	if err != nil {
		t.Fatal(err)
	}
	first, second := a.pendingWrite("watched"), a.pendingWrite("watched")
	if first == nil || first != second {
		t.Fatalf("two waiters of one write got channels %v and %v, want one", first, second)
	}
	copy(p.Bytes(), pattern("watched", 100))
	if err := p.Commit(); err != nil {
		t.Fatal(err)
	}
	if !isClosed(first) {
		t.Fatal("the waiters' channel is open after the commit")
	}
	a.mu.Lock()
	n = len(a.settled)
	a.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d channels left after the write ended", n)
	}
	if err := a.Check(); err != nil {
		t.Fatal(err)
	}
}
