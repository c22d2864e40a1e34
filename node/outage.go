package node

import (
	"log/slog"
	"strings"
	"sync"
	"time"
)

// outage turns a dependency's failures into two log lines: one when it stops
// answering, one when it answers again with how many failures and how long it
// was gone. A Redis that is down otherwise wrote a line per attempt (six in
// three seconds), each with the whole error.
type outage struct {
	log  *slog.Logger
	what string // "Redis"
	gone string // what the service does meanwhile, for the first line

	mu       sync.Mutex
	down     bool
	since    time.Time
	failures int64
}

func newOutage(log *slog.Logger, what, gone string) *outage {
	return &outage{log: log, what: what, gone: gone}
}

// fail records a failure; the first of an outage is logged, with args.
func (o *outage) fail(err error, args ...any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.failures++
	if o.down {
		return
	}
	o.down, o.since = true, time.Now()
	o.log.Warn("node service: "+o.what+" does not answer; "+o.gone, append(args, "err", oneLine(err))...)
}

// ok records an answer; the first after an outage is logged.
func (o *outage) ok(args ...any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.down {
		return
	}
	o.log.Info("node service: "+o.what+" answers again", append(args, "failures", o.failures, "after", time.Since(o.since).Round(time.Millisecond))...)
	o.down, o.failures = false, 0
}

// oneLine is err's message on one line: joined errors are separated by "; ".
func oneLine(err error) string {
	if err == nil {
		return ""
	}
	return strings.ReplaceAll(err.Error(), "\n", "; ")
}
