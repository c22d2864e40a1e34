package spill

import (
	"context"
	"fmt"

	"github.com/zeebo/xxh3"

	"github.com/stratakv/strata/storage"
)

// PutObject stores the concatenation of runs as key's object in format,
// write-once: when the spill holds key already (in any format), or another
// put of it is storing it now, nothing is written and the put is a success.
// The bytes are copied into a write buffer (or, for an object larger than
// one, written) before it returns: the caller may reuse runs at once, and a
// get finds the object from then on. Puts are not durable by themselves: a
// crash loses what was staged and not yet written.
func (s *Store) PutObject(ctx context.Context, key string, format storage.Format, runs ...[]byte) error {
	size := runsLen(runs)
	if size == 0 || size > maxData {
		return fmt.Errorf("spill: put %s: %d bytes: want 1 to %d: %w", key, size, int64(maxData), storage.ErrBatch)
	}
	if err := ctx.Err(); err != nil {
		return ctxError("put", err)
	}
	if err := s.begin("put", key); err != nil {
		return err
	}
	defer s.end()
	defer s.wakeOnDone(ctx)()
	err := s.putObject(ctx, key, hashKey(key), uint64(format), runs)
	s.st.faults.Add(err)
	return err
}

// placement is where a record was placed.
type placement struct {
	seg    *segment
	off    int64
	hdrLen int64
	rec    int64
	buf    *stageBuf // nil: written straight from the caller's memory
	idx    uint32    // a put's pending index record; 0 when none
}

// putObject stores an object (PutObject). Its index entry is added pending
// in the critical section that places its record and committed once the
// bytes are copied: until then a read misses it and another put of the key
// is skipped, and a remove cancels it (the remove's tombstone comes after the
// record; the put then succeeds with its object removed).
func (s *Store) putObject(ctx context.Context, key string, h [16]byte, format uint64, runs [][]byte) (err error) {
	size := runsLen(runs)
	p, err := s.placeObject(ctx, key, h, format, size)
	if p.seg == nil {
		return err // skipped, or nothing placed
	}
	done := false
	defer func() { err = s.finishObject(p, h, key, size, format, done, err) }()
	if err != nil {
		// Placed, but the index refused it: the record becomes padding.
		s.padRecord(p)
		return err
	}
	s.testHook("put-copy", key)
	hd := header{kind: kindObject, hdrLen: p.hdrLen, segment: p.seg.id, recLen: p.rec, dataLen: size, format: format, key: key, dataSum: sumRuns(runs)}
	if p.buf != nil {
		p.fill(hd, runs)
	} else if err := s.writeDirect(p, hd, runs); err != nil {
		return err
	}
	done = true
	return nil
}

// placeObject places the record of a put and indexes it pending. A zero
// placement is a put with nothing to write (the key is held or being put) or
// one that failed; a placement with an error is one the index refused.
func (s *Store) placeObject(ctx context.Context, key string, h [16]byte, format uint64, size int64) (placement, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var p placement
	for {
		if err := s.usableLocked(ctx, "put"); err != nil {
			return placement{}, err
		}
		if e, ok := s.getLocked(h); ok {
			if e.format != format {
				s.st.conflicts.Add(1)
			} else {
				s.st.skipped.Add(1)
			}
			return placement{}, nil
		}
		var wait bool
		var err error
		p, wait, err = s.placeLocked(key, size)
		if err != nil {
			return placement{}, err
		}
		if !wait {
			break
		}
		s.bufWaiters++
		s.cond.Wait()
		s.bufWaiters--
	}
	s.testHook("put-placed-locked", key)
	// An entry the index still has is an earlier run's that the scan hides
	// (getLocked): the new record comes after it, and wins.
	i, old, replaced, err := s.idx.add(&p.seg.head, h, entry{seg: p.seg.id, hdrLen: uint32(p.hdrLen), off: p.off, size: size, format: format, pending: true})
	if replaced {
		s.deadLocked(old)
	}
	if err != nil {
		return p, err
	}
	p.idx = i
	s.pendingPuts++
	return p, nil
}

// finishObject ends a put that placed p: it releases the buffer or the
// segment and commits the object when its bytes are in (done), or forgets it.
// It runs deferred, so that a put that panicked releases what it held.
func (s *Store) finishObject(p placement, h [16]byte, key string, size int64, format uint64, done bool, err error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.endCopyLocked(p)
	if p.idx == 0 {
		return err // the index refused it; it is padding
	}
	if !s.idx.isPending(p.idx) {
		// A remove cancelled it meanwhile: the put is done, and its object
		// removed (its tombstone follows the record).
		if done {
			s.st.writes.Add(1)
			s.st.writeBytes.Add(size)
		}
		return err
	}
	s.pendingPuts--
	if !done {
		s.idx.abort(p.idx)
		if err != nil {
			s.st.writeErrors.Add(1)
		}
		return err
	}
	s.testHook("put-commit-locked", key)
	s.idx.commit(p.idx)
	if s.commitWaiters > 0 {
		s.cond.Broadcast()
	}
	e := entry{seg: p.seg.id, hdrLen: uint32(p.hdrLen), off: p.off, size: size, format: format}
	s.liveLocked(p.seg, e)
	p.seg.hints = append(p.seg.hints, hint{kind: kindObject, hdrLen: e.hdrLen, off: e.off, size: e.size, format: e.format, hash: h})
	if p.buf != nil {
		p.buf.keys = append(p.buf.keys, h)
	} else {
		s.st.directWrites.Add(1)
	}
	s.st.writes.Add(1)
	s.st.writeBytes.Add(size)
	return nil
}

// endCopyLocked ends the copy into p: the buffer may be written once every
// copy into it ended; a direct record's write is done.
func (s *Store) endCopyLocked(p placement) {
	if p.buf != nil {
		if p.buf.copying--; p.buf.copying == 0 {
			s.cond.Broadcast()
		}
		return
	}
	s.doneWriteLocked(p.seg, p.rec)
}

// fill copies a record, hd and runs, into its place in a write buffer: the
// buffer's bytes there are the placer's alone until it releases them.
func (p placement) fill(hd header, runs [][]byte) {
	at := p.off - p.buf.start
	dst := p.buf.mem[at : at+p.rec]
	hd.encode(dst)
	n := p.hdrLen
	for _, r := range runs {
		n += int64(copy(dst[n:], r))
	}
	clear(dst[n:])
}

// padRecord makes the placed record p a padding record, for a put that
// placed a record and then could not go on: a hole would end the segment at
// the next start.
func (s *Store) padRecord(p placement) {
	hd := header{kind: kindPad, hdrLen: sector, segment: p.seg.id, recLen: p.rec}
	if p.buf != nil {
		p.fill(hd, nil)
		return
	}
	sc := s.getScratch(min(p.rec, directChunk))
	defer s.putScratch(sc)
	buf := *sc
	clear(buf)
	hd.encode(buf)
	for off := int64(0); off < p.rec; {
		n := min(int64(len(buf)), p.rec-off)
		if err := s.writeRetry(p.seg, [][]byte{buf[:n]}, p.off+off); err != nil {
			s.log.Warn("spill: cannot pad a record that could not be indexed; the segment ends there at the next start", "segment", p.seg.path, "err", err)
			return
		}
		if off == 0 {
			clear(buf[:sector])
		}
		off += n
	}
}

// release ends the copy into p.
func (s *Store) release(p placement) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.endCopyLocked(p)
}

func sumRuns(runs [][]byte) uint64 {
	if len(runs) == 1 {
		return xxh3.Hash(runs[0])
	}
	h := xxh3.New()
	for _, r := range runs {
		_, _ = h.Write(r)
	}
	return h.Sum64()
}

func runsLen(runs [][]byte) int64 {
	var n int64
	for _, r := range runs {
		n += int64(len(r))
	}
	return n
}
