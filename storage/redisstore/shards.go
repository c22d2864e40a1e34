package redisstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stratakv/strata/storage"
)

// shard is one server that owns keys: the standalone server, or a cluster master.
// A shard that failed is skipped until retryAt.
type shard struct {
	addr    string
	skipped atomic.Int64

	mu        sync.Mutex
	failures  int // consecutive
	retryAt   time.Time
	downSince time.Time
	lastErr   string
}

// ShardStats is one shard's state.
type ShardStats struct {
	// Addr is the shard's address (a cluster master's as the cluster announces it).
	Addr string `json:"addr"`
	// Up is false while the shard is being skipped after a failure.
	Up bool `json:"up"`
	// Failures counts the failures since the shard last answered.
	Failures int `json:"failures"`
	// DownSince and RetryAt are when the shard first failed and when it will be
	// tried again; zero while it is up.
	DownSince time.Time `json:"downSince,omitzero"`
	RetryAt   time.Time `json:"retryAt,omitzero"`
	// LastError is the last failure, for people.
	LastError string `json:"lastError,omitempty"`
	// Skipped counts the objects failed fast because the shard was down.
	Skipped int64 `json:"skipped"`
}

// shards tracks every shard the store has talked to.
type shards struct {
	backoff time.Duration
	log     *slog.Logger
	// now is the clock of backoffs: time.Now, or a test's clock that moves only
	// when the test says, so that a shard's state does not depend on how fast a
	// busy machine runs the test.
	now func() time.Time

	mu  sync.Mutex
	all map[string]*shard
}

func (ss *shards) get(addr string) *shard {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	sh := ss.all[addr]
	if sh == nil {
		sh = &shard{addr: addr}
		ss.all[addr] = sh
	}
	return sh
}

// down returns the error that fails a key of sh fast, or nil when sh may be tried.
func (sh *shard) down(now time.Time) error {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.failures == 0 || !now.Before(sh.retryAt) {
		return nil
	}
	sh.skipped.Add(1)
	return fmt.Errorf("redis store: shard %s is down since %s (%s); skipped until %s: %w",
		sh.addr, sh.downSince.Format(time.TimeOnly), sh.lastErr, sh.retryAt.Format("15:04:05.000"), storage.ErrUnavailable)
}

// failed records a failure of sh: it is skipped for the backoff, doubled for
// each failure in a row up to 10 times.
func (ss *shards) failed(sh *shard, err error) {
	now := ss.now()
	sh.mu.Lock()
	sh.failures++
	wait := ss.backoff
	for i := 1; i < sh.failures && wait < 10*ss.backoff; i++ {
		wait *= 2
	}
	wait = min(wait, 10*ss.backoff)
	first := sh.failures == 1
	if first {
		sh.downSince = now
	}
	sh.retryAt = now.Add(wait)
	sh.lastErr = err.Error()
	sh.mu.Unlock()
	if first {
		ss.log.Warn("redis store: shard is down; its keys are misses until it answers again", "shard", sh.addr, "retry_in", wait, "err", err)
	}
}

// answered records that sh answered.
func (ss *shards) answered(sh *shard) {
	sh.mu.Lock()
	was := sh.failures
	since := sh.downSince
	sh.failures, sh.retryAt, sh.downSince, sh.lastErr = 0, time.Time{}, time.Time{}, ""
	sh.mu.Unlock()
	if was > 0 {
		ss.log.Info("redis store: shard is back", "shard", sh.addr, "down_for", ss.now().Sub(since).Round(time.Millisecond), "failures", was)
	}
}

func (ss *shards) stats() []ShardStats {
	ss.mu.Lock()
	list := make([]*shard, 0, len(ss.all))
	for _, sh := range ss.all {
		list = append(list, sh)
	}
	ss.mu.Unlock()
	out := make([]ShardStats, 0, len(list))
	now := ss.now()
	for _, sh := range list {
		sh.mu.Lock()
		out = append(out, ShardStats{
			Addr: sh.addr, Up: sh.failures == 0 || !now.Before(sh.retryAt), Failures: sh.failures,
			DownSince: sh.downSince, RetryAt: sh.retryAt, LastError: sh.lastErr, Skipped: sh.skipped.Load(),
		})
		sh.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b ShardStats) int { return strings.Compare(a.Addr, b.Addr) })
	return out
}

// classify turns an error of a Redis command into the store's error for it: the
// storage error kind it wraps, and whether it says the shard is down (so that it
// is skipped for a while). caller is the context the caller passed, to tell its
// own deadline or cancellation from a shard that stopped answering.
func classify(caller context.Context, err error) (kind error, shardDown bool) {
	var rerr redis.Error
	var nerr net.Error
	switch {
	case errors.Is(err, context.Canceled):
		return nil, false
	case errors.Is(err, context.DeadlineExceeded):
		return storage.ErrTimeout, caller.Err() == nil
	case errors.Is(err, redis.ErrClosed):
		return storage.ErrClosed, false
	case errors.Is(err, redis.ErrPoolTimeout), errors.Is(err, redis.ErrPoolExhausted):
		// Every connection is busy with other batches: congestion here, not a
		// shard that is down.
		return storage.ErrTimeout, false
	case errors.As(err, &rerr):
		msg := strings.TrimPrefix(rerr.Error(), "ERR ")
		switch {
		case strings.HasPrefix(msg, "OOM "):
			return storage.ErrNoSpace, false
		case hasAnyPrefix(msg, "CLUSTERDOWN", "TRYAGAIN", "LOADING", "MASTERDOWN", "MOVED", "ASK", "READONLY", "BUSY", "MAXCLIENTS", "max number of clients"):
			return storage.ErrUnavailable, true
		}
		return storage.ErrIO, false
	case errors.As(err, &nerr) && nerr.Timeout():
		return storage.ErrTimeout, caller.Err() == nil
	}
	// Connection refused or reset, EOF, a dial that failed: the shard cannot be
	// reached.
	return storage.ErrUnavailable, true
}

func hasAnyPrefix(s string, prefixes ...string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}
