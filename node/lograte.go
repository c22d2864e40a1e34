package node

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// logLimiter rate-limits repeated log lines: of each kind (its message), the
// first burst lines of every interval go through and the rest are counted; the
// next line of that kind that goes through says how many were suppressed. A
// client looping through refused registrations or broken connections would
// otherwise write a line per attempt, without bound. The kinds are the
// service's own constant messages, so the map stays small.
type logLimiter struct {
	log      *slog.Logger
	interval time.Duration
	burst    int

	mu    sync.Mutex
	kinds map[string]*logWindow
}

type logWindow struct {
	start      time.Time
	n          int
	suppressed int64
}

func newLogLimiter(log *slog.Logger, interval time.Duration, burst int) *logLimiter {
	return &logLimiter{log: log, interval: interval, burst: burst, kinds: map[string]*logWindow{}}
}

// logAt logs msg at level unless its kind already used its lines this interval.
func (l *logLimiter) logAt(level slog.Level, msg string, args ...any) {
	if !l.log.Enabled(context.Background(), level) {
		return
	}
	now := time.Now()
	l.mu.Lock()
	w := l.kinds[msg]
	if w == nil {
		w = &logWindow{start: now}
		l.kinds[msg] = w
	}
	if now.Sub(w.start) >= l.interval {
		w.start, w.n = now, 0
	}
	if w.n >= l.burst {
		w.suppressed++
		l.mu.Unlock()
		return
	}
	w.n++
	suppressed := w.suppressed
	w.suppressed = 0
	l.mu.Unlock()
	if suppressed > 0 {
		args = append(args, "suppressed", suppressed)
	}
	l.log.Log(context.Background(), level, msg, args...)
}

func (l *logLimiter) warn(msg string, args ...any) { l.logAt(slog.LevelWarn, msg, args...) }
func (l *logLimiter) info(msg string, args ...any) { l.logAt(slog.LevelInfo, msg, args...) }
