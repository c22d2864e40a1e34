package spill

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Compaction gives back the bytes of removed objects without waiting for
// their segment to age out, as Bitcask's merge does. A finished segment whose
// live objects and tombstones take less than Config.CompactBelow of it is
// compacted: its live objects, found on the index's list of its records, are
// read, checked and appended to the end of the spill like new records, and
// the index is pointed at the copy only if it still names the record in the
// old segment (a remove, a newer put or a drop while it was being copied wins:
// their records come after the copy in the files too). Its tombstones are
// copied forward while they may still shadow an older record of their key,
// that is, while a segment older than the one their remove was first written
// to is there and the key has no live object (a live object is always newer
// than any tombstone of its key: copying the tombstone past it would delete it
// at the next start). Once every copy is written, the segment's file and hint
// file are deleted; a segment with nothing live and no tombstones is deleted
// without reading it. Reads still on the old segment's fd finish first: it is
// closed when the last one ends.
//
// A crash at any point leaves a consistent spill: before the copies are
// written the old segment is whole; after, both the old record and its copy
// are there, and the copy, newer, wins at the next start (whose compaction
// then deletes the old segment).
//
// One compaction runs at a time, on the compactor goroutine, reading and
// writing at most Config.CompactBytesPerSec; it waits while puts or removes
// wait for a write buffer.

// compactLoop is the compactor goroutine: each time a segment may have
// fallen below CompactBelow, it compacts the segments that did, least live
// first, until none is left or the spill closes.
func (s *Store) compactLoop() {
	defer s.compactor.Done()
	// The scan of an earlier run's segments first: until it is done they
	// hold records it has not indexed yet.
	select {
	case <-s.compactCtx.Done():
		return
	case <-s.scan.ready:
	}
	for {
		select {
		case <-s.compactCtx.Done():
			return
		case <-s.compactKick:
		}
		for s.compactNext(s.cfg.CompactBelow) {
		}
	}
}

// kickLocked wakes the compactor when seg is one to compact.
func (s *Store) kickLocked(seg *segment) {
	if s.compactKick != nil && s.compactableLocked(seg, s.cfg.CompactBelow) {
		select {
		case s.compactKick <- struct{}{}:
		default:
		}
	}
}

// compactableLocked reports whether seg is a finished segment whose live
// objects and tombstones take less than below of it.
func (s *Store) compactableLocked(seg *segment, below float64) bool {
	return below > 0 && seg != s.active && seg.pending == 0 && !seg.dropped && !seg.broken && !seg.compacting && !seg.unscanned &&
		!seg.noCompact && !seg.compactFailed && float64(seg.liveRec+seg.tombBytes) < below*float64(seg.size)
}

// compactNext compacts the segment with the smallest live share under below,
// and reports whether there was one (and the spill goes on).
func (s *Store) compactNext(below float64) bool {
	seg := s.pickCompaction(below)
	if seg == nil {
		return false
	}
	s.compactSegment(seg)
	return true
}

func (s *Store) pickCompaction(below float64) *segment {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.compactCtx.Err() != nil || s.compacting != nil {
		return nil
	}
	var best *segment
	var share float64
	for _, seg := range s.segs {
		if !s.compactableLocked(seg, below) {
			continue
		}
		if sh := float64(seg.liveRec+seg.tombBytes) / float64(seg.size); best == nil || sh < share {
			best, share = seg, sh
		}
	}
	if best != nil {
		best.compacting = true
		s.compacting = best
	}
	return best
}

// errCompactStopped ends a compaction that has no reason to go on: the spill
// is closing, or the segment went meanwhile.
var errCompactStopped = errors.New("compaction stopped")

// compactSegment copies seg's live objects and the tombstones still needed
// to the end of the spill, waits until they are written, and deletes seg. A
// compaction that stops short keeps seg; what it copied is then a newer copy
// of live objects, which the index points at already.
func (s *Store) compactSegment(seg *segment) {
	w := &flushWait{}
	err := s.compactObjects(seg, w)
	if err == nil {
		err = s.compactTombstones(seg, w)
	}
	if err == nil {
		err = s.waitWritten(s.compactCtx, w, "compact")
	}
	s.testHook("compact-delete", "")
	if s.endCompaction(seg, err) {
		s.testHook("compact-deleted", "")
	}
}

// endCompaction deletes seg after a compaction without error that left
// nothing live in it, and reports whether it did.
func (s *Store) endCompaction(seg *segment, err error) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	seg.compacting = false
	s.compacting = nil
	s.cond.Broadcast()
	switch {
	case err != nil:
	case s.compactCtx.Err() != nil || seg.dropped:
		err = errCompactStopped
	case seg.liveRec != 0:
		err = fmt.Errorf("%d bytes of objects are still live in it", seg.liveRec)
	}
	if err != nil {
		if !errors.Is(err, errCompactStopped) && !errors.Is(err, context.Canceled) {
			seg.compactFailed = true
			s.log.Warn("spill: a segment's compaction stopped short; it stays until more of it is dead, or it ages out",
				"segment", seg.path, "err", err)
		}
		return false
	}
	size := seg.size
	s.removeSegmentLocked(seg)
	s.st.compactions.Add(1)
	s.st.compacted.Add(size)
	return true
}

// pace waits until compaction may read or write n more bytes.
func (s *Store) pace(n int64) error {
	if s.compactCtx.Err() != nil {
		return errCompactStopped
	}
	d := s.pacer.delay(time.Now(), n)
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-s.compactCtx.Done():
		return errCompactStopped
	}
}

// pacer spaces out I/O to rate bytes per second (0: no bound): each call's
// bytes wait until the previous calls' have had their time.
type pacer struct {
	rate int64
	next time.Time
}

// delay is how long n bytes wait at now.
func (p *pacer) delay(now time.Time, n int64) time.Duration {
	if p.rate <= 0 {
		return 0
	}
	t := p.next
	if t.Before(now) {
		t = now
	}
	p.next = t.Add(time.Duration(float64(n) / float64(p.rate) * float64(time.Second)))
	return t.Sub(now)
}
