package spill

import (
	"context"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/storage"
)

// begin admits a call; the caller defers s.end.
func (s *Store) begin(op, key string) error {
	if err := checkKey(op, key); err != nil {
		return err
	}
	return s.admit(op, key)
}

func checkKey(op, key string) error {
	if key == "" || len(key) > maxKey {
		return fmt.Errorf("spill: %s: key of %d bytes: want 1 to %d: %w", op, len(key), maxKey, storage.ErrBatch)
	}
	return nil
}

// admit counts a call in flight, unless the spill is closed or unusable.
func (s *Store) admit(op, what string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("spill %s: %s %s: %w", s.dir, op, what, storage.ErrClosed)
	}
	if s.poisoned.Load() {
		return errPoisoned(s.dir, op)
	}
	s.inflight.Add(1)
	return nil
}

func errPoisoned(dir, op string) error {
	return fmt.Errorf("spill %s: %s: an earlier call panicked (a bug: see the log), and the spill is unusable until the service restarts: %w", dir, op, storage.ErrIO)
}

// end ends a call that begin admitted. A call that panics leaves the spill
// poisoned: what it held (a write buffer being filled, an index entry) may
// never be released, so later calls fail fast and Close does not wait for
// it. Every critical section defers its unlock, so the mutex is free again by
// then.
func (s *Store) end() {
	if r := recover(); r != nil {
		s.poisoned.Store(true)
		s.log.Error("spill: a call panicked; the spill refuses calls until the service restarts", "dir", s.dir, "panic", r)
		go s.wake() // waits that check poisoned; the lock may be contended
		s.inflight.Done()
		panic(r)
	}
	s.inflight.Done()
}

// locked runs fn with s.mu held.
func (s *Store) locked(fn func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fn()
}

// wake wakes everyone waiting on s.cond.
func (s *Store) wake() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cond.Broadcast()
}

// usableLocked is the error of a wait that must end: the caller's context
// ended, or the spill is poisoned or abandoned.
func (s *Store) usableLocked(ctx context.Context, op string) error {
	if err := ctx.Err(); err != nil {
		return ctxError(op, err)
	}
	if s.poisoned.Load() || s.abandon {
		return errPoisoned(s.dir, op)
	}
	return nil
}

// testHook calls the test hook at point, if one is set.
func (s *Store) testHook(point, key string) {
	if h := s.hook.Load(); h != nil {
		(*h)(point, key)
	}
}

// wakeOnDone wakes the waits on s.cond when ctx ends; the caller calls the
// returned stop.
func (s *Store) wakeOnDone(ctx context.Context) (stop func() bool) {
	return context.AfterFunc(ctx, s.wake)
}

// ctxError is the error of a call whose context ended.
func ctxError(op string, err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("spill: %s: %w: %w", op, err, storage.ErrTimeout)
	}
	return fmt.Errorf("spill: %s: %w", op, err)
}

// ioError classifies a failed syscall: device or quota full is
// storage.ErrNoSpace, anything else storage.ErrIO. The errno stays in the chain.
func ioError(op, path string, err error) error {
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
		return fmt.Errorf("spill: %s %s: %w; free space on the device or lower --spill-capacity below its free space: %w",
			op, path, err, storage.ErrNoSpace)
	}
	return fmt.Errorf("spill: %s %s: %w: %w", op, path, err, storage.ErrIO)
}
