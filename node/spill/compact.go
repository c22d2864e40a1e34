package spill

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/stratakv/strata/storage"
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
	return below > 0 && seg != s.active && seg.pending == 0 && !seg.dropped && !seg.broken && !seg.compacting &&
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

// liveRef is a live object of a segment being compacted, as the index had it.
type liveRef struct {
	h [16]byte
	e entry
}

// compactObjects moves seg's live objects, a batch of them at a time.
func (s *Store) compactObjects(seg *segment, w *flushWait) error {
	var from uint32
	for first := true; first || from != 0; first = false {
		batch, next, err := s.liveBatch(seg, from, first)
		if err != nil {
			return err
		}
		for _, it := range batch {
			if err := s.moveObject(seg, it, w); err != nil {
				return err
			}
		}
		from = next
	}
	return nil
}

// liveBatch lists up to 256 live objects of seg's records, from record from
// (or its first), and where the next batch starts (0: none). The list does not
// change while seg is compacted, and its records stay until seg is dropped.
func (s *Store) liveBatch(seg *segment, from uint32, first bool) ([]liveRef, uint32, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.compactCtx.Err() != nil || seg.dropped {
		return nil, 0, errCompactStopped
	}
	if first {
		from = seg.head
	}
	var batch []liveRef
	next := s.idx.live(from, 256, func(_ uint32, h [16]byte, e entry) { batch = append(batch, liveRef{h, e}) })
	return batch, next, nil
}

// moveObject copies the live object it of seg to the end of the spill and
// points the index at the copy, if the index still names it there once the
// copy is in.
func (s *Store) moveObject(seg *segment, it liveRef, w *flushWait) error {
	e := it.e
	rec := recLen(e)
	if err := s.pace(2 * rec); err != nil {
		return err
	}
	if !s.holdLive(seg, it) {
		return nil // gone meanwhile: nothing to move
	}
	lo, hi := roundDown(e.off, block), roundUp(e.off+rec, block)
	sc := s.getScratch(hi - lo)
	defer s.putScratch(sc)
	hd, data, err := s.readForMove(seg, e, it.h, (*sc)[:hi-lo], lo)
	s.unhold(nil, seg)
	if err != nil {
		if !errors.Is(err, storage.ErrCorrupt) {
			return err
		}
		if hd.key == "" {
			// Without the key there can be no tombstone, and deleting the
			// segment could bring back an older record of the key: the
			// segment stays, and a read after the next start drops the
			// record for good.
			s.forget(it.h, &it.e)
			s.locked(func() { seg.noCompact = true })
			return err
		}
		s.dropBad(s.compactCtx, hd.key, it.h, e, err)
		s.log.Warn("spill: compaction found a corrupt record; it is dropped", "err", err)
		return nil
	}
	p, err := s.placeMove(seg, it, hd.key, e.size, w)
	if err != nil || p.seg == nil {
		return err
	}
	hd.segment, hd.hdrLen, hd.recLen = p.seg.id, p.hdrLen, p.rec
	err = func() error {
		defer s.release(p)
		if p.buf != nil {
			p.fill(hd, [][]byte{data})
			return nil
		}
		return s.writeDirect(p, hd, [][]byte{data})
	}()
	if err != nil {
		return err
	}
	s.testHook("compact-copy", hd.key)
	evicted, err := s.repoint(seg, it, p, w)
	if err != nil || !evicted {
		return err
	}
	// The old segment was dropped (the spill was full) while the copy was
	// made: the object is gone, and a tombstone after the copy keeps it gone
	// after a restart, unless a newer put of the key came in.
	_, _, err = s.stageTombstone(s.compactCtx, hd.key, it.h, 0, w, func(_ entry, ok bool) tombAction {
		if ok {
			return tombSkip
		}
		return tombPlace
	}, false)
	return err
}

// holdLive holds seg's fd for a read of its record, if the index still
// names it.
func (s *Store) holdLive(seg *segment, it liveRef) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur, ok := s.idx.get(it.h); !ok || cur != it.e || seg.dropped {
		return false
	}
	seg.refs++
	return true
}

// readForMove reads e's record, of hash h, into win (the blocks from lo that
// hold it) and checks it as a get does. A corrupt record's error comes with
// its header when the header is sound and of h's key.
func (s *Store) readForMove(seg *segment, e entry, h [16]byte, win []byte, lo int64) (header, []byte, error) {
	n, err := preadFull(seg.fd, win, lo)
	if err != nil && err != io.ErrUnexpectedEOF {
		return header{}, nil, ioError("read", seg.path, err)
	}
	const unknown = "(unknown)"
	if int64(n) < e.off+int64(e.hdrLen)+e.size-lo {
		return header{}, nil, corrupt(seg, e, unknown, "the segment file ends inside the record")
	}
	rec := win[e.off-lo:]
	hd, err := decodeHeader(rec[:e.hdrLen])
	switch {
	case err != nil:
		return header{}, nil, corrupt(seg, e, unknown, err.Error())
	case hd.kind != kindObject || hashKey(hd.key) != h:
		return header{}, nil, corrupt(seg, e, unknown, fmt.Sprintf("the record there is of key %q", hd.key))
	case hd.segment != seg.id || hd.hdrLen != int64(e.hdrLen) || hd.dataLen != e.size || hd.format != e.format:
		return hd, nil, corrupt(seg, e, hd.key, fmt.Sprintf("the header says segment %d, header %d, data %d, format %#x", hd.segment, hd.hdrLen, hd.dataLen, hd.format))
	}
	data := rec[e.hdrLen : int64(e.hdrLen)+e.size]
	if xxh3.Hash(data) != hd.dataSum {
		return hd, nil, corrupt(seg, e, hd.key, "data checksum mismatch")
	}
	return hd, data, nil
}

// placeMove places the copy of it, while the index still names it, after
// the puts and removes waiting for a write buffer. A zero placement: it is
// gone, nothing to copy.
func (s *Store) placeMove(seg *segment, it liveRef, key string, size int64, w *flushWait) (placement, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		if err := s.compactCtx.Err(); err != nil {
			return placement{}, errCompactStopped
		}
		if s.poisoned.Load() || s.abandon {
			return placement{}, errPoisoned(s.dir, "compact")
		}
		if cur, ok := s.idx.get(it.h); !ok || cur != it.e || seg.dropped {
			return placement{}, nil
		}
		if s.bufWaiters > 0 {
			s.cond.Wait()
			continue
		}
		p, wait, err := s.placeLocked(key, size)
		if err != nil {
			return placement{}, err
		}
		if wait {
			s.cond.Wait()
			continue
		}
		if p.buf != nil {
			w.add(p.buf)
		}
		return p, nil
	}
}

// repoint points the index at the copy p of it, if it still names it. It
// reports evicted when it found it gone with its segment, dropped to make
// room, rather than removed, replaced or dropped as corrupt (whose records
// come after the copy).
func (s *Store) repoint(seg *segment, it liveRef, p placement, w *flushWait) (evicted bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w.err != nil {
		return false, w.err // the copy's buffer was not written
	}
	cur, ok := s.idx.get(it.h)
	if !ok {
		return seg.dropped, nil
	}
	if cur != it.e {
		return false, nil
	}
	e := entry{seg: p.seg.id, hdrLen: uint32(p.hdrLen), off: p.off, size: it.e.size, format: it.e.format}
	if err := s.indexLocked(p.seg, it.h, e); err != nil {
		return false, err
	}
	p.seg.hints = append(p.seg.hints, hint{kind: kindObject, hdrLen: e.hdrLen, off: e.off, size: e.size, format: e.format, hash: it.h})
	if p.buf != nil && s.bufferOfLocked(e) == p.buf {
		p.buf.keys = append(p.buf.keys, it.h)
	}
	s.st.compactCopied.Add(p.rec)
	return false, nil
}

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
		if b, err := os.ReadFile(s.dir + "/" + hintName(seg.id)); err == nil {
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
