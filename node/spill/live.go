package spill

// forget forgets h's object, or (without want) cancels the put storing it,
// when it is (still) want, and reports whether it did. Without want it is a
// remove, which also wins over the scan of an earlier run's segments.
func (s *Store) forget(h [16]byte, want *entry) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if want == nil {
		s.shadowLocked(h)
	}
	e, ok := s.getLocked(h)
	if !ok || want != nil && e != *want {
		return false
	}
	return s.forgetLocked(h, e)
}

// forgetLocked forgets h, whose entry is e: it unindexes an object, and
// cancels a put still copying (its commit then finds it gone).
func (s *Store) forgetLocked(h [16]byte, e entry) bool {
	if !e.pending {
		return s.unindexLocked(h)
	}
	s.idx.abort(s.idx.find(h))
	s.pendingPuts--
	return true
}

// unindexLocked forgets h, an object (not a pending one), and reports
// whether it was indexed.
func (s *Store) unindexLocked(h [16]byte) bool {
	e, ok := s.idx.remove(h)
	if ok {
		s.deadLocked(e)
	}
	return ok
}

// indexLocked records e, a record in seg, for h, replacing an older entry.
func (s *Store) indexLocked(seg *segment, h [16]byte, e entry) error {
	_, old, replaced, err := s.idx.add(&seg.head, h, e)
	if replaced {
		s.deadLocked(old)
	}
	if err == nil {
		s.liveLocked(seg, e)
	}
	return err
}

// liveLocked counts e, a record in seg, as a live object.
func (s *Store) liveLocked(seg *segment, e entry) {
	n := recLen(e)
	seg.liveRec += n
	s.liveRec += n
	s.liveBytes += e.size
}

// deadLocked counts e as dead, and wakes the compactor when e's segment fell
// below CompactBelow.
func (s *Store) deadLocked(e entry) {
	n := recLen(e)
	s.liveRec -= n
	s.liveBytes -= e.size
	if seg := s.byID[e.seg]; seg != nil {
		seg.liveRec -= n
		seg.compactFailed = false
		s.kickLocked(seg)
	}
}
