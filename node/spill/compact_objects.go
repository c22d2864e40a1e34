package spill

import (
	"errors"
	"fmt"
	"io"

	"github.com/zeebo/xxh3"

	"github.com/stratakv/strata/storage"
)

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
