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
// While the objects of an earlier run are being indexed (Ready not yet
// closed), every key gets a tombstone, and one of theirs that the scan has not
// reached yet counts as not found, but is removed all the same: the scan
// leaves the key alone.
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
	// While the scan of an earlier run's segments is on, a key that is not
	// found may be in one not scanned yet: its tombstone must reach the
	// disk all the same.
	decide := func(_ entry, ok bool) tombAction {
		if ok || s.scanning {
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

// tombAction is what stageTombstone does for a key, given its index entry.
type tombAction uint8

const (
	tombSkip  tombAction = iota // no tombstone
	tombPlace                   // place one now
	tombWait                    // wait (for the key's newest record to be written, or for puts to go first), then ask again
)

// stageTombstone appends a tombstone of key when decide, given h's index
// entry, says so; with forget it also unindexes that entry, in the critical
// section that places the tombstone, so that no put of the key can be placed
// between the two. origin is the segment of the remove whose tombstone
// compaction carries forward, 0 for a new remove. A tombstone is registered
// with w, when given, so that the caller can wait for it to be written. The
// caller has the spill wake its waits when ctx ends (wakeOnDone). It reports
// whether it placed a tombstone and whether it forgot an object.
func (s *Store) stageTombstone(ctx context.Context, key string, h [16]byte, origin uint32, w *flushWait,
	decide func(e entry, ok bool) tombAction, forget bool) (placed, forgot bool, err error) {
	p, forgot, err := s.placeTombstone(ctx, key, h, origin, w, decide, forget)
	if err != nil || p.seg == nil {
		return false, forgot, err
	}
	defer s.release(p)
	s.testHook("remove-copy", key)
	p.fill(header{kind: kindTombstone, hdrLen: p.hdrLen, segment: p.seg.id, recLen: p.rec, format: uint64(origin), key: key}, nil)
	return true, forgot, nil
}

func (s *Store) placeTombstone(ctx context.Context, key string, h [16]byte, origin uint32, w *flushWait,
	decide func(e entry, ok bool) tombAction, forget bool) (placement, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		if err := s.usableLocked(ctx, "remove"); err != nil {
			return placement{}, false, err
		}
		e, ok := s.getLocked(h)
		switch decide(e, ok) {
		case tombSkip:
			return placement{}, false, nil
		case tombWait:
			if b := s.cur; ok && b != nil && s.bufferOfLocked(e) == b {
				s.sealLocked()
			}
			s.commitWaiters++
			s.cond.Wait()
			s.commitWaiters--
			continue
		}
		p, wait, err := s.placeLocked(key, 0)
		if err != nil {
			return placement{}, false, err
		}
		if wait {
			if forget { // a remove or a drop, not compaction
				s.bufWaiters++
			}
			s.cond.Wait()
			if forget {
				s.bufWaiters--
			}
			continue
		}
		forgot := false
		if forget && ok {
			forgot = s.forgetLocked(h, e)
		}
		if forget {
			s.shadowLocked(h)
		}
		p.seg.hints = append(p.seg.hints, hint{kind: kindTombstone, hdrLen: uint32(p.hdrLen), off: p.off, format: uint64(origin), hash: h})
		p.seg.tombs++
		p.seg.tombBytes += p.rec
		if w != nil {
			w.add(p.buf) // a tombstone always fits a buffer
		}
		return p, forgot, nil
	}
}
