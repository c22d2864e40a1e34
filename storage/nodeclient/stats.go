package nodeclient

import (
	"sync/atomic"
	"time"
)

// Connection statistics. A cache turns the client's failures into misses and
// counts the faults of the calls it made; an outage that fell between its
// calls, or one its breaker skipped calls through, shows there as nothing at
// all. So the client counts what it saw of the connection itself: each loss
// and reconnect, every call that failed for want of one, and how long it was
// without one, for a bench report or an operator to say the L3 was away.

// ConnStats is what the client saw of its connection to the service.
type ConnStats struct {
	// Connected is true while a connection is up with every pool registered.
	Connected bool `json:"connected"`
	// Connects counts those connections; Reconnects the ones after the
	// first, and Disconnects the ones lost (Close excepted).
	Connects    int64 `json:"connects"`
	Reconnects  int64 `json:"reconnects"`
	Disconnects int64 `json:"disconnects"`
	// DialFailures counts the attempts to connect that failed: nothing
	// listening, a refusal, or no answer to Hello within the call timeout.
	DialFailures int64 `json:"dialFailures"`
	// RefusedCalls failed at once, with no connection to send them on;
	// LostCalls were sent, or about to be, when the connection failed under
	// them. Both fail with storage.ErrUnavailable.
	RefusedCalls int64 `json:"refusedCalls"`
	LostCalls    int64 `json:"lostCalls"`
	// Unreachable is the time without a connection since the first one:
	// from each loss to the next connection with every pool registered, the
	// outage still under way included; LongestUnreachable is the longest of
	// those outages.
	Unreachable        time.Duration `json:"unreachable"`
	LongestUnreachable time.Duration `json:"longestUnreachable"`
}

// connCounters are the counts behind ConnStats. The outage times are kept
// under Backend.mu, where the connection's state changes.
type connCounters struct {
	disconnects, dialFailures, refused, lost atomic.Int64
	// downSince is when the ready connection was lost (zero while one is up,
	// or before the first); unreachable and longest sum and bound the
	// outages over.
	downSince            time.Time
	unreachable, longest time.Duration
}

// Stats returns what the client saw of its connection so far.
func (b *Backend) Stats() ConnStats {
	c := &b.conns
	b.mu.Lock()
	st := ConnStats{Connected: b.ready, Unreachable: c.unreachable, LongestUnreachable: c.longest}
	if !c.downSince.IsZero() {
		cur := time.Since(c.downSince)
		st.Unreachable += cur
		st.LongestUnreachable = max(st.LongestUnreachable, cur)
	}
	b.mu.Unlock()
	st.Connects = int64(b.epoch.Load())
	st.Reconnects = max(st.Connects-1, 0)
	st.Disconnects = c.disconnects.Load()
	st.DialFailures = c.dialFailures.Load()
	st.RefusedCalls = c.refused.Load()
	st.LostCalls = c.lost.Load()
	return st
}

// lostLocked notes that the ready connection failed; b.mu is held.
func (b *Backend) lostLocked(now time.Time) {
	b.conns.disconnects.Add(1)
	b.conns.downSince = now
}

// backLocked notes that a connection is ready again; b.mu is held.
func (b *Backend) backLocked(now time.Time) {
	c := &b.conns
	if c.downSince.IsZero() {
		return
	}
	d := now.Sub(c.downSince)
	c.unreachable += d
	c.longest = max(c.longest, d)
	c.downSince = time.Time{}
}
