package spill

import (
	"fmt"
	"io"
)

// tombRef is a tombstone of a segment being compacted: where it is, its key's
// hash, the segment its remove was first written to (0: its own), and its
// key where it is known already.
type tombRef struct {
	off    int64
	hdrLen int64
	h      [16]byte
	origin uint32
	key    string
}

// compactTombstones copies forward the tombstones of seg that may still
// shadow an older record of their key.
func (s *Store) compactTombstones(seg *segment, w *flushWait) error {
	tombs, err := s.tombstonesOf(seg)
	if err != nil {
		return err
	}
	for _, t := range tombs {
		if err := s.carryTombstone(seg, t, w); err != nil {
			return err
		}
	}
	return nil
}

// tombstonesOf lists seg's tombstones: from its hints (in memory until its
// hint file is written, then in that file), or, where neither says where
// they are, from its records' headers.
func (s *Store) tombstonesOf(seg *segment) ([]tombRef, error) {
	var hs []hint
	var n int
	var size int64
	s.locked(func() {
		n, size = seg.tombs, seg.size
		if seg.hints != nil {
			hs = append([]hint(nil), seg.hints...)
		}
	})
	if n == 0 {
		return nil, nil
	}
	if hs == nil {
		if b, err := s.readOwnFile(hintName(seg.id), maxHintFile(size)); err == nil {
			hs, _ = decodeHints(b, seg.id, size)
		}
	}
	var tombs []tombRef
	for _, h := range hs {
		if h.kind != kindTombstone {
			continue
		}
		if h.hdrLen == 0 { // a hint file of a version that did not say where
			tombs = nil
			break
		}
		tombs = append(tombs, tombRef{off: h.off, hdrLen: int64(h.hdrLen), h: h.hash, origin: uint32(h.format)})
	}
	if len(tombs) == n {
		return tombs, nil
	}
	return s.scanTombstones(seg, size)
}

// scanTombstones reads the headers of seg's records, first to last, for its
// tombstones.
func (s *Store) scanTombstones(seg *segment, size int64) ([]tombRef, error) {
	if !s.holdSeg(seg) {
		return nil, errCompactStopped
	}
	defer s.unhold(nil, seg)
	sc := s.getScratch(2 * block)
	defer s.putScratch(sc)
	win := *sc
	var tombs []tombRef
	for off := int64(0); off < size; {
		lo := roundDown(off, block)
		n := min(int64(len(win)), roundUp(size, block)-lo)
		if err := s.pace(n); err != nil {
			return nil, err
		}
		if _, err := preadFull(seg.fd, win[:n], lo); err != nil && err != io.ErrUnexpectedEOF {
			return nil, ioError("read", seg.path, err)
		}
		h, err := decodeHeader(win[off-lo : off-lo+min(min(n, size-lo)-(off-lo), maxHeader)])
		if err == nil && (h.segment != seg.id || off+h.recLen > size) {
			err = fmt.Errorf("a record of segment %d, %d bytes long, in %d bytes: %w", h.segment, h.recLen, size-off, errRecord)
		}
		if err != nil {
			s.locked(func() { seg.noCompact = true })
			return nil, fmt.Errorf("spill: segment %s at %d: %w", seg.path, off, err)
		}
		if h.kind == kindTombstone {
			tombs = append(tombs, tombRef{off: off, hdrLen: h.hdrLen, h: hashKey(h.key), origin: uint32(h.format), key: h.key})
		}
		off += h.recLen
	}
	return tombs, nil
}

// holdSeg holds seg's fd, unless seg was dropped.
func (s *Store) holdSeg(seg *segment) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if seg.dropped {
		return false
	}
	seg.refs++
	return true
}

// carryTombstone copies the tombstone t of seg to the end of the spill,
// unless its key has a live object (newer than the tombstone), or no segment
// older than its remove's is left (nothing it could shadow).
func (s *Store) carryTombstone(seg *segment, t tombRef, w *flushWait) error {
	origin := t.origin
	if origin == 0 {
		origin = seg.id
	}
	decide := func(e entry, ok bool) tombAction {
		switch {
		case ok && (e.pending || s.bufferOfLocked(e) != nil):
			// Newer, but not on disk yet: its write could still fail.
			return tombWait
		case ok:
			return tombSkip
		case len(s.segs) == 0 || s.segs[0].id >= origin:
			return tombSkip
		case s.bufWaiters > 0:
			return tombWait // puts and removes first
		}
		return tombPlace
	}
	if !s.tombNeeded(t.h, decide) {
		return nil
	}
	key := t.key
	if key == "" {
		if err := s.pace(roundUp(t.off+t.hdrLen, block) - roundDown(t.off, block)); err != nil {
			return err
		}
		var err error
		if key, err = s.readTombKey(seg, t); err != nil {
			return err
		}
	}
	if err := s.pace(t.hdrLen); err != nil {
		return err
	}
	placed, _, err := s.stageTombstone(s.compactCtx, key, t.h, origin, w, decide, false)
	if placed {
		s.st.compactCopied.Add(t.hdrLen)
	}
	if err != nil && s.compactCtx.Err() != nil {
		return errCompactStopped
	}
	return err
}

// tombNeeded is decide's answer now, without waiting: whether the tombstone
// may need a copy.
func (s *Store) tombNeeded(h [16]byte, decide func(e entry, ok bool) tombAction) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.idx.get(h)
	return decide(e, ok) != tombSkip
}

// readTombKey reads the key of the tombstone t of seg from its header.
func (s *Store) readTombKey(seg *segment, t tombRef) (string, error) {
	if !s.holdSeg(seg) {
		return "", errCompactStopped
	}
	defer s.unhold(nil, seg)
	lo, hi := roundDown(t.off, block), roundUp(t.off+t.hdrLen, block)
	sc := s.getScratch(hi - lo)
	defer s.putScratch(sc)
	win := (*sc)[:hi-lo]
	n, err := preadFull(seg.fd, win, lo)
	if err != nil && err != io.ErrUnexpectedEOF {
		return "", ioError("read", seg.path, err)
	}
	if int64(n) >= t.off+t.hdrLen-lo {
		h, err := decodeHeader(win[t.off-lo : t.off-lo+t.hdrLen])
		if err == nil && h.kind == kindTombstone && h.segment == seg.id && hashKey(h.key) == t.h {
			return h.key, nil
		}
	}
	s.locked(func() { seg.noCompact = true })
	return "", fmt.Errorf("spill: the tombstone at %d of %s is not there as its hint says: %w", t.off, seg.path, errRecord)
}
