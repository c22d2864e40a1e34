package arena

import (
	"context"
	"errors"
	"testing"
)

// A pending write that a removal of its key lands on is doomed: its Commit
// publishes nothing and says so, and the key is free again afterwards.
func TestRemoveDoomsAPendingWrite(t *testing.T) {
	a := newArena(t, testConfig(t, 1<<20))
	p, err := a.Reserve("k", 1, 5000)
	if err != nil {
		t.Fatal(err)
	}
	copy(p.Bytes(), pattern("k", 5000))
	if !a.Remove("k") {
		t.Fatal("remove of a key being written reported nothing removed")
	}
	if err := p.Commit(); !errors.Is(err, ErrRemoved) {
		t.Fatalf("commit of a write removed meanwhile: %v, want ErrRemoved", err)
	}
	if _, err := a.Acquire("k", 1); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a doomed write is readable: %v", err)
	}
	if st := a.Stats(); st.RemovedWhileWritten != 1 || st.Objects != 0 || st.PendingObjects != 0 || st.HeldBytes != 0 {
		t.Fatalf("stats after a doomed commit: %+v", st)
	}
	put(t, a, "k", 1, 5000) // the key can be written again
	read(t, a, "k", 1, 5000)
	mustCheck(t, a)
}

// While a removal is in progress, no new copy of its key can enter the arena:
// Reserve says the key exists, Await waits for the removal's end, and after it
// the key can be written again. This is what keeps a promotion from the spill
// (or Redis) from bringing back an object the service is still removing from
// those tiers.
func TestRemovalIsABarrierOnItsKey(t *testing.T) {
	a := newArena(t, testConfig(t, 1<<20))
	put(t, a, "k", 1, 5000)
	removed, end := a.BeginRemove("k")
	if !removed {
		t.Fatal("BeginRemove of a committed object reported nothing removed")
	}
	if a.Contains("k", 1) {
		t.Fatal("the object is still there during its removal")
	}
	if _, err := a.Reserve("k", 1, 5000); !errors.Is(err, ErrExists) {
		t.Fatalf("reserve during a removal: %v, want ErrExists", err)
	}
	ended := a.pendingWrite("k") // what Await waits on
	if ended == nil || isClosed(ended) {
		t.Fatal("Await would not wait for the removal in progress")
	}
	// A second removal of the key joins the first; the barrier stands until
	// both have ended.
	if again, end2 := a.BeginRemove("k"); again {
		t.Fatal("a second removal found the object again")
	} else {
		end2()
	}
	if _, err := a.Reserve("k", 1, 5000); !errors.Is(err, ErrExists) {
		t.Fatalf("reserve after the second removal ended, the first still running: %v", err)
	}
	if isClosed(ended) {
		t.Fatal("the barrier ended with the second removal, the first still running")
	}
	end()
	if !isClosed(ended) {
		t.Fatal("Await's waiters not woken at the removal's end")
	}
	if w, err := a.Await(context.Background(), "k"); w || err != nil {
		t.Fatalf("Await after the removal = %v, %v; want false, nil", w, err)
	}
	put(t, a, "k", 1, 5000)
	read(t, a, "k", 1, 5000)
	if st := a.Stats(); st.Removals != 1 {
		t.Fatalf("removals %d, want 1", st.Removals)
	}
	mustCheck(t, a)
}

// Await on a removal ends with its context.
func TestAwaitOfARemovalEndsWithItsContext(t *testing.T) {
	a := newArena(t, testConfig(t, 1<<20))
	_, end := a.BeginRemove("k")
	defer end()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if w, err := a.Await(ctx, "k"); !w || !errors.Is(err, context.Canceled) {
		t.Fatalf("Await with a canceled context during a removal = %v, %v", w, err)
	}
}
