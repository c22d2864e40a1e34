package node

import (
	"context"
	"errors"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// tryAcquire takes n bytes for uid if the budget admits them now: a canceled
// context makes acquire look once and give up.
func tryAcquire(b *memBudget, uid int, n int64) bool {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return b.acquire(ctx, nil, uid, n, func(overShare) {}) == nil
}

// The budget's shares: alone, a user takes all of it; another user's small
// request comes from the reserve, a large one waits, and is served before the
// user over its share takes more.
func TestBudgetSharesBetweenUsers(t *testing.T) {
	const limit = 64 << 20
	b := newMemBudget(limit)
	for range 4 {
		if !tryAcquire(b, 1, 16<<20) {
			t.Fatalf("a lone user was refused with %d of %d used", b.stats().UsedBytes, int64(limit))
		}
	}
	if tryAcquire(b, 1, 4<<10) {
		t.Fatal("a lone user took memory beyond the budget")
	}
	var lines []overShare
	note := func(o overShare) { lines = append(lines, o) }
	now, cancelNow := context.WithCancel(context.Background())
	cancelNow()
	if err := b.acquire(now, nil, 2, 4<<10, note); err != nil {
		t.Fatalf("another user's small request was refused while the first held the budget: %v", err)
	}
	// The user holding the budget is named, once.
	if len(lines) != 1 || lines[0].uid != 1 || lines[0].held != limit || lines[0].share != limit/2 || lines[0].users != 2 {
		t.Fatalf("over-share lines %+v", lines)
	}
	if tryAcquire(b, 2, 8<<20) {
		t.Fatal("another user took more than its part of the reserve")
	}
	if st := b.stats(); st.FromReserve != 1 || st.UsedBytes != limit+4<<10 || st.Users != 2 {
		t.Fatalf("stats %+v", st)
	}

	// User 2 waits for 8 MiB; user 1, over its share, waits for more too.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	got1, got2 := make(chan error, 1), make(chan error, 1)
	go func() { got1 <- b.acquire(ctx, nil, 1, 8<<20, note) }()
	waitFor(t, "user 1 to be held back", func() bool { return b.stats().HeldBack == 1 })
	go func() { got2 <- b.acquire(ctx, nil, 2, 8<<20, func(overShare) {}) }()
	time.Sleep(10 * time.Millisecond)
	b.release(1, 16<<20)
	if err := <-got2; err != nil {
		t.Fatalf("the user under its share: %v", err)
	}
	select {
	case err := <-got1:
		t.Fatalf("the user over its share took more while the other waited: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	b.release(2, 8<<20)
	b.release(2, 4<<10)
	// Alone again, user 1 takes what it waited for.
	if err := <-got1; err != nil {
		t.Fatal(err)
	}
	// Its wait was counted, and not logged again within the minute.
	if st := b.stats(); len(lines) != 1 || st.HeldBack != 1 {
		t.Fatalf("over-share lines %+v, held back %d", lines, st.HeldBack)
	}
	for range 3 {
		b.release(1, 16<<20)
	}
	b.release(1, 8<<20)
	if st := b.stats(); st.UsedBytes != 0 || st.Users != 0 {
		t.Fatalf("after every release: %+v", st)
	}
}

// A waiter that gives up lets the others look again: a user over its share
// that waited only because another user waited takes its memory.
func TestBudgetWaiterLeavingWakesTheOthers(t *testing.T) {
	const limit = 64 << 20
	b := newMemBudget(limit)
	if !tryAcquire(b, 1, 48<<20) {
		t.Fatal("a lone user was refused")
	}
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	gave := make(chan error, 1)
	go func() { gave <- b.acquire(short, nil, 2, 32<<20, func(overShare) {}) }() // does not fit
	waitFor(t, "user 2 to wait", func() bool { return b.stats().Users == 2 })
	ctx, cancel2 := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel2()
	if err := b.acquire(ctx, nil, 1, 8<<20, func(overShare) {}); err != nil {
		t.Fatal(err)
	}
	if err := <-gave; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("user 2: %v", err)
	}
}

// The budget's invariants under any sequence of requests and releases: it
// never holds more than the budget plus the reserve; a user alone, or holding
// nothing, gets what fits in the budget; beyond the budget only a user holding
// at most its part of the reserve is served; while others hold memory a user
// that holds some stays within its share.
func TestBudgetInvariants(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		limit := rapid.Int64Range(16<<20, 256<<20).Draw(t, "limit")
		b := newMemBudget(limit)
		type grant struct {
			uid int
			n   int64
		}
		var grants []grant
		held := map[int]int64{}
		var used int64
		t.Repeat(map[string]func(*rapid.T){
			"acquire": func(t *rapid.T) {
				uid := rapid.IntRange(0, 3).Draw(t, "uid")
				n := rapid.Int64Range(1, limit/2).Draw(t, "n")
				others := 0
				for id, h := range held {
					if id != uid && h > 0 {
						others++
					}
				}
				users := int64(others + 1)
				ok := tryAcquire(b, uid, n)
				fits := used+n <= limit
				switch {
				case (others == 0 || held[uid] == 0) && fits && !ok:
					t.Fatalf("user %d (holding %d, %d others) refused %d with %d of %d used", uid, held[uid], others, n, used, limit)
				case ok && !fits && held[uid]+n > b.reserve/users:
					t.Fatalf("user %d holding %d served %d beyond the budget (%d used of %d), over its part of the reserve", uid, held[uid], n, used, limit)
				case ok && fits && others > 0 && held[uid] > 0 && held[uid]+n > limit/users:
					t.Fatalf("user %d holding %d took %d past its share %d", uid, held[uid], n, limit/users)
				}
				if ok {
					grants = append(grants, grant{uid, n})
					held[uid] += n
					used += n
				}
			},
			"release": func(t *rapid.T) {
				if len(grants) == 0 {
					t.Skip("nothing held")
				}
				i := rapid.IntRange(0, len(grants)-1).Draw(t, "grant")
				g := grants[i]
				grants = append(grants[:i], grants[i+1:]...)
				b.release(g.uid, g.n)
				held[g.uid] -= g.n
				if held[g.uid] == 0 {
					delete(held, g.uid)
				}
				used -= g.n
			},
			"": func(t *rapid.T) {
				st := b.stats()
				if st.UsedBytes != used || st.UsedBytes > limit+b.reserve || st.Users != len(held) {
					t.Fatalf("stats %+v, want %d used by %d users", st, used, len(held))
				}
			},
		})
	})
}
