package spill

import (
	"context"
	"fmt"
)

// RemoveObject forgets key's object and reports whether there was one: the
// one-key RemoveObjects.
func (s *Store) RemoveObject(ctx context.Context, key string) (bool, error) {
	had, err := s.RemoveObjects(ctx, []string{key})
	if len(had) == 0 {
		return false, err
	}
	return had[0], err
}

// RemoveObjects forgets the objects of keys and reports, key by key, whether
// there was one. For each it appends a tombstone, and it returns once every
// tombstone it appended is written to its segment file (one write of the
// current write buffer for the whole batch, with the pwrite the writer uses,
// O_DIRECT where the filesystem takes it): the objects stay removed after the
// service is killed, even with SIGKILL, though not necessarily after a power
// loss (there is no fsync).
//
// An object that a put is still copying in (placed, not yet readable: in the
// node service, an object being evicted from the arena) is removed too: the
// remove's tombstone follows the put's record, and the put returns success
// with its object removed, after a restart too. A put placed after the
// remove's tombstone stores the key again.
//
// Where a tombstone cannot be written (the device is full or failing, or ctx
// ends first), the object is forgotten all the same, so that no read serves
// it, and the error, which wraps ErrRemoveNotDurable and the cause, says it
// may be back after a restart.
func (s *Store) RemoveObjects(ctx context.Context, keys []string) ([]bool, error) {
	had := make([]bool, len(keys))
	if err := ctx.Err(); err != nil {
		return had, ctxError("remove", err)
	}
	for _, k := range keys {
		if err := checkKey("remove", k); err != nil {
			return had, err
		}
	}
	if len(keys) == 0 {
		return had, nil
	}
	if err := s.admit("remove", fmt.Sprintf("of %d keys", len(keys))); err != nil {
		return had, err
	}
	defer s.end()
	defer s.wakeOnDone(ctx)()
	w := &flushWait{}
	var firstErr error
	failed, removed := 0, 0
	decide := func(_ entry, ok bool) tombAction {
		if ok {
			return tombPlace
		}
		return tombSkip
	}
	for i, k := range keys {
		h := hashKey(k)
		_, forgot, err := s.stageTombstone(ctx, k, h, 0, w, decide, true)
		if err != nil {
			// Forgotten all the same: only a restart could bring it back.
			forgot = s.forget(h, nil)
			if forgot {
				failed++
				if firstErr == nil {
					firstErr = err
				}
			}
		}
		had[i] = forgot
		if forgot {
			removed++
		}
	}
	if err := s.waitWritten(ctx, w, "remove"); err != nil && firstErr == nil {
		firstErr, failed = err, removed
	}
	s.st.removed.Add(int64(removed))
	if firstErr != nil {
		s.st.removesNotDurable.Add(int64(failed))
		s.log.Warn("spill: tombstones of removed objects could not be written; they are removed, but may be back after a restart",
			"dir", s.dir, "objects", failed, "err", firstErr)
		return had, fmt.Errorf("spill %s: remove: the tombstones of up to %d of %d removed objects may not be written (%w): %w; "+
			"they are removed, but may be back after a restart: remove them again once the device has room or works", s.dir, failed, removed, firstErr, ErrRemoveNotDurable)
	}
	return had, nil
}
