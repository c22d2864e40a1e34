package redisstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/stratakv/strata/storage"
)

// begin admits a call on poolName: the store is open and the pool registered with
// live memory. The caller calls done when the call ends.
func (s *Store) begin(poolName, what string) (ps *poolState, done func(), err error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, nil, fmt.Errorf("redis store: %s: %w", what, storage.ErrClosed)
	}
	ps = s.pools[poolName]
	if ps == nil {
		return nil, nil, fmt.Errorf("redis store: %s on pool %q, which is not registered; call RegisterPool first: %w", what, poolName, storage.ErrNotRegistered)
	}
	if ps.spec.Region.Closed() {
		return nil, nil, fmt.Errorf("redis store: %s on pool %q, whose memory region was closed; register the pool's new memory: %w", what, poolName, storage.ErrNotRegistered)
	}
	s.inflight.Add(1)
	return ps, s.inflight.Done, nil
}

// admit is begin for a call on poolName's pages, followed by check, the call's
// own check of its arguments against the pool: an error of either ends the
// call before it starts (check's named with what and the pool).
func (s *Store) admit(poolName, what string, check func(*poolState) error) (*poolState, func(), error) {
	return storage.Admit(s.begin, poolName, what, func(ps *poolState) error {
		if err := check(ps); err != nil {
			return fmt.Errorf("redis store: %s in pool %q: %w", what, poolName, err)
		}
		return nil
	})
}

// enter admits an object API call.
func (s *Store) enter(what string) (func(), error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, fmt.Errorf("redis store: %s: %w", what, storage.ErrClosed)
	}
	s.inflight.Add(1)
	return s.inflight.Done, nil
}

// ctxError is the error of a call whose context ended before it began: it wraps
// the context's error, and storage.ErrTimeout for a deadline.
func ctxError(what string, err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("redis store: %s: %w: %w", what, err, storage.ErrTimeout)
	}
	return fmt.Errorf("redis store: %s: %w", what, err)
}

// callTimeout returns ctx bounded by CallTimeout.
func (s *Store) callTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= s.cfg.CallTimeout {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, s.cfg.CallTimeout)
}
