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
//
// The budget is charged per user (the uid the kernel reports, SO_PEERCRED),
// because it is charged from a frame's declared length before its body
// arrives: a user that declares large frames and sends them slowly (or not at
// all, until the frame timeout) holds that memory without using it, and with one
// pool and no shares it kept every other user's requests waiting until they
// were answered busy. Three rules keep one user from doing that to the others
// and still let a user that is alone use the whole budget:
//
//   - A user's share is the budget divided by the users holding or waiting for
//     memory. While another user holds or waits for some, a user may take
//     memory only within its share (or for its one request, if it holds
//     nothing); alone, it may take all of it. So once memory frees up, the
//     users under their share get it before the one over it takes more.
//   - Beyond the budget, a reserve of an eighth of it serves the users that
//     hold little (at most their part of the reserve) when another user holds
//     the budget already: a hold cannot be taken back, and the one over its
//     share may keep its memory for as long as a frame may take to arrive
//     (--frame-timeout) or a request to be handled, so without it a
//     newcomer's small requests would wait that long. The memory of requests
//     in flight peaks at the budget plus the reserve.
//   - A request that waits while its user holds more than its share is counted
//     (RequestMemoryStats.HeldBack) and logged, one line per user a minute: it
//     names the user an operator should look at when others are answered busy.
//
// Whoever controls several uids gets a share for each; the uids of a tenant
// group (Config.TenantGroups) share a namespace, not a share.
type memBudget struct {
	limit   int64
	reserve int64

	mu   sync.Mutex
	used int64
	peak int64
	wake chan struct{} // closed (and replaced) whenever memory is released or a waiter leaves
	// users are the users holding or waiting for memory; one with neither is
	// removed, so len(users) is the number its share divides the budget by.
	users map[int]*userCharge
	// logged rate-limits the over-share line per user.
	logged map[int]*shareLog

	// lastFree is when memory was last handed back to the OS (unix nanoseconds).
	lastFree atomic.Int64
	frees    atomic.Int64
	// heldBack counts requests that waited while their user held more than
	// its share; fromReserve, requests admitted from the reserve.
	heldBack, fromReserve atomic.Int64
}

// userCharge is what one user holds of the budget and how many of its
// requests wait for some.
type userCharge struct {
	held    int64
	waiting int
}

// shareLog is the last over-share line of a user, and how many were left out
// since.
type shareLog struct {
	at         time.Time
	suppressed int64
}

// shareLogEvery is the most often the over-share line is logged for one user.
const shareLogEvery = time.Minute

// maxShareLogs bounds the users whose last over-share line is remembered: past
// it, users whose line is older than shareLogEvery are forgotten, and while
// all are newer a new one is not logged.
const maxShareLogs = 1024

func newMemBudget(limit int64) *memBudget {
	return &memBudget{limit: limit, reserve: limit / 8, wake: make(chan struct{}),
		users: map[int]*userCharge{}, logged: map[int]*shareLog{}}
}

// requestCost estimates the memory a request of h holds while it is handled: its
// body as received, the decoded message (keys, items, ranges: about twice the
// encoding) and the reply's results. It is an estimate of the order of the real
// cost, which is what a budget needs; it never exceeds the budget's minimum.
func requestCost(h wire.Header) int64 { return 4*int64(h.Len) + 4<<10 }

// overShare is a user that held more than its share of the budget while
// another user wanted memory: what the over-share line says.
type overShare struct {
	uid         int
	held, share int64
	users       int
	suppressed  int64
}

// acquire takes n bytes for user uid, waiting until ctx ends or done is closed
// for others to release them. It calls over, outside the budget's lock, for
// each user over its share whose line is due: acquire's own user when it
// waits for that reason, the users that hold the budget when it takes from the
// reserve.
func (b *memBudget) acquire(ctx context.Context, done <-chan struct{}, uid int, n int64, over func(overShare)) error {
	if n <= 0 {
		return nil
	}
	n = min(n, b.limit)
	b.mu.Lock()
	u := b.users[uid]
	if u == nil {
		u = &userCharge{}
		b.users[uid] = u
	}
	u.waiting++
	counted := false
	for {
		ok, reserved, overs := b.admitsLocked(u, n)
		if ok {
			u.waiting--
			u.held += n
			b.used += n
			b.peak = max(b.peak, b.used)
			var notes []overShare
			if reserved {
				b.fromReserve.Add(1)
				notes = b.hogsLocked(uid)
			}
			b.mu.Unlock()
			for _, note := range notes {
				over(note)
			}
			return nil
		}
		var note overShare
		due := false
		if overs && !counted {
			counted = true
			b.heldBack.Add(1)
			note, due = b.noteLocked(uid, u.held, len(b.users))
		}
		wake := b.wake
		b.mu.Unlock()
		if due {
			over(note)
		}
		var err error
		select {
		case <-wake:
		case <-ctx.Done():
			err = ctx.Err()
		case <-done:
			err = ErrClosed
		}
		b.mu.Lock()
		if err != nil {
			// Leaving may raise the others' shares, or leave another user
			// alone: they look again.
			u.waiting--
			b.dropIdleLocked(uid, u)
			b.wakeLocked()
			b.mu.Unlock()
			return err
		}
	}
}

// admitsLocked reports whether u may take n bytes now, whether they come from
// the reserve, and, when it may not, whether u holds more than its share.
func (b *memBudget) admitsLocked(u *userCharge, n int64) (ok, reserved, over bool) {
	users := int64(len(b.users)) // u among them
	share := b.limit / users
	alone := users == 1
	within := u.held == 0 || u.held+n <= share || alone
	if b.used+n <= b.limit && within {
		return true, false, false
	}
	if b.used+n <= b.limit+b.reserve && u.held+n <= b.reserve/users {
		return true, true, false
	}
	return false, false, !alone && u.held > 0 && u.held+n > share
}

// hogsLocked returns the lines due of the users other than uid that hold more
// than their share.
func (b *memBudget) hogsLocked(uid int) []overShare {
	var notes []overShare
	share := b.limit / int64(len(b.users))
	for id, o := range b.users {
		if id != uid && o.held > share {
			if note, due := b.noteLocked(id, o.held, len(b.users)); due {
				notes = append(notes, note)
			}
		}
	}
	return notes
}

// noteLocked returns the over-share line of user uid, holding held of the
// budget among users users, when one is due.
func (b *memBudget) noteLocked(uid int, held int64, users int) (overShare, bool) {
	now := time.Now()
	l := b.logged[uid]
	if l == nil {
		if len(b.logged) >= maxShareLogs {
			for id, old := range b.logged {
				if now.Sub(old.at) >= shareLogEvery {
					delete(b.logged, id)
				}
			}
		}
		if len(b.logged) >= maxShareLogs {
			return overShare{}, false
		}
		b.logged[uid] = &shareLog{at: now}
		return overShare{uid: uid, held: held, share: b.limit / int64(users), users: users}, true
	}
	if now.Sub(l.at) < shareLogEvery {
		l.suppressed++
		return overShare{}, false
	}
	note := overShare{uid: uid, held: held, share: b.limit / int64(users), users: users, suppressed: l.suppressed}
	l.at, l.suppressed = now, 0
	return note, true
}

// dropIdleLocked forgets u (of uid) once it neither holds nor waits.
func (b *memBudget) dropIdleLocked(uid int, u *userCharge) {
	if u.held <= 0 && u.waiting == 0 {
		delete(b.users, uid)
	}
}

func (b *memBudget) wakeLocked() {
	close(b.wake)
	b.wake = make(chan struct{})
}

// release gives back n bytes that acquire took for uid. When a burst that used
// more than half the budget has drained, the heap it grew is handed back to
// the OS (at most every few seconds): the Go runtime would otherwise keep it
// until its next collection, which an idle service may not run for a long
// time.
func (b *memBudget) release(uid int, n int64) {
	if n <= 0 {
		return
	}
	n = min(n, b.limit)
	b.mu.Lock()
	b.used -= n
	if u := b.users[uid]; u != nil {
		u.held -= n
		b.dropIdleLocked(uid, u)
	}
	drained := b.used == 0 && b.peak > b.limit/2
	if drained {
		b.peak = 0
	}
	b.wakeLocked()
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
	// ReserveBytes is the memory beyond the budget that serves users holding
	// little while another holds the budget (see memBudget).
	ReserveBytes int64 `json:"reserveBytes"`
	// Users counts the users (uids) holding or waiting for request memory now.
	Users int `json:"users"`
	// HeldBack counts requests that waited while their user held more than its
	// share; FromReserve, requests admitted from the reserve. Either growing
	// says one user holds the memory others want: the service logs which.
	HeldBack    int64 `json:"heldBack"`
	FromReserve int64 `json:"fromReserve"`
	// Freed counts the bursts after which the heap was handed back to the OS.
	Freed int64 `json:"freed"`
}

func (b *memBudget) stats() RequestMemoryStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return RequestMemoryStats{LimitBytes: b.limit, UsedBytes: b.used, ReserveBytes: b.reserve, Users: len(b.users),
		HeldBack: b.heldBack.Load(), FromReserve: b.fromReserve.Load(), Freed: b.frees.Load()}
}
