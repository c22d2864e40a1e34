package sim

import (
	"fmt"
	"strings"
	"time"

	"github.com/stratakv/strata/storage"
	"github.com/stratakv/strata/storage/nodeclient"
)

// The L3's outages. The cache counts the faults of the L3 calls it makes,
// and makes none for a while after one fails (its breaker), so a node service
// killed and restarted between two calls, or while the breaker was open,
// left the report saying "faults none". The node client sees the connection
// itself: its losses, reconnects, the calls that failed for want of it and
// the time without it, which the report gives on a line of its own.

// L3Outage is what a run's node client saw of its connection to the node
// service: what storage/nodeclient's ConnStats counts, over the run.
type L3Outage struct {
	// Disconnects counts the connections lost, Reconnects the connections
	// made again after the first, DialFailures the attempts to connect that
	// failed meanwhile.
	Disconnects  int64 `json:"disconnects"`
	Reconnects   int64 `json:"reconnects"`
	DialFailures int64 `json:"dial_failures"`
	// RefusedCalls failed at once for want of a connection; LostCalls were
	// under way when it failed. The cache counts both as unavailable
	// faults, and makes no calls for a while after one (they are not here).
	RefusedCalls int64 `json:"refused_calls"`
	LostCalls    int64 `json:"lost_calls"`
	// Unreachable is the time without a connection, in all (an outage still
	// under way at the run's end included), and LongestUnreachable the
	// longest outage. Over several engines, the longest any one saw.
	Unreachable        Duration `json:"unreachable"`
	LongestUnreachable Duration `json:"longest_unreachable"`
}

// connStatser is a backend that says what it saw of its connection
// (nodeclient.Backend).
type connStatser interface {
	Stats() nodeclient.ConnStats
}

var _ connStatser = (*nodeclient.Backend)(nil)

// outageOf is what backend b saw of its connection; nil when it does not say.
func outageOf(b storage.Backend) *L3Outage {
	cs, ok := b.(connStatser)
	if !ok {
		return nil
	}
	st := cs.Stats()
	return &L3Outage{Disconnects: st.Disconnects, Reconnects: st.Reconnects, DialFailures: st.DialFailures,
		RefusedCalls: st.RefusedCalls, LostCalls: st.LostCalls,
		Unreachable: Duration(st.Unreachable), LongestUnreachable: Duration(st.LongestUnreachable)}
}

// happened reports whether the connection ever failed.
func (o *L3Outage) happened() bool {
	return o != nil && (o.Disconnects > 0 || o.DialFailures > 0 || o.RefusedCalls > 0 || o.LostCalls > 0 || o.Unreachable > 0)
}

// add merges another engine's outage into o: the counts add up, the times
// are the longest one engine saw (each saw the same service go).
func (o *L3Outage) add(p *L3Outage) *L3Outage {
	if p == nil {
		return o
	}
	if o == nil {
		o = &L3Outage{}
	}
	o.Disconnects += p.Disconnects
	o.Reconnects += p.Reconnects
	o.DialFailures += p.DialFailures
	o.RefusedCalls += p.RefusedCalls
	o.LostCalls += p.LostCalls
	o.Unreachable = max(o.Unreachable, p.Unreachable)
	o.LongestUnreachable = max(o.LongestUnreachable, p.LongestUnreachable)
	return o
}

// describeOutage is the outage line of a run's report: "" when the
// connection never failed.
func describeOutage(o *L3Outage) string {
	if !o.happened() {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "L3 outage: the node service was unreachable for %s", formatOutage(o.Unreachable))
	if o.LongestUnreachable < o.Unreachable {
		fmt.Fprintf(&b, " in all (longest %s)", formatOutage(o.LongestUnreachable))
	}
	fmt.Fprintf(&b, "; %s lost, %s, %s; %s refused while disconnected, %s lost in flight (the cache took them as misses)",
		plural(o.Disconnects, "connection"), plural(o.Reconnects, "reconnect"), plural(o.DialFailures, "failed attempt")+" to connect",
		plural(o.RefusedCalls, "call"), plural(o.LostCalls, "call"))
	return b.String()
}

// formatOutage renders an outage to a tenth of a millisecond: they last
// tens of milliseconds.
func formatOutage(d Duration) string {
	return fmt.Sprintf("%.1f ms", float64(time.Duration(d))/float64(time.Millisecond))
}

func plural(n int64, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
