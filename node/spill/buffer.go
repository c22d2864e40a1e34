package spill

import (
	"context"
	"slices"
)

// bufState is where a write buffer is in its cycle.
type bufState uint8

const (
	bufFree    bufState = iota
	bufFilling          // the current buffer: puts copy records into it
	bufSealed           // queued for the writer, or being written
)

// stageBuf is a write buffer: a run of its segment from start, n bytes long.
type stageBuf struct {
	mem     []byte
	state   bufState
	seg     *segment
	start   int64
	n       int64
	copying int        // puts copying into it now: the writer waits for them
	readers int        // gets copying out of it now: it is reused after them
	keys    [][16]byte // object records in it, unindexed if its write fails
	waiters []*flushWait
}

// flushWait follows the write buffers that a batch of records (a remove's
// tombstones, a compaction's copies) was staged in, until each is written.
type flushWait struct {
	bufs int   // buffers not yet written
	err  error // the first failed write of one
}

// add registers w with b, once per fill of b.
func (w *flushWait) add(b *stageBuf) {
	if n := len(b.waiters); n > 0 && b.waiters[n-1] == w {
		return
	}
	b.waiters = append(b.waiters, w)
	w.bufs++
}

// waitWritten seals the current buffer if w has records in it and waits
// until every buffer of w is written: one seal and one wait for a batch. It
// returns the first failed write, or why the wait ended first.
func (s *Store) waitWritten(ctx context.Context, w *flushWait, op string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for w.bufs > 0 {
		if b := s.cur; b != nil && slices.Contains(b.waiters, w) {
			s.sealLocked()
		}
		if err := s.usableLocked(ctx, op); err != nil {
			return err
		}
		s.cond.Wait()
	}
	return w.err
}

// placeLocked finds the room for a record of key with size data bytes: in the
// current write buffer, or straight in the active segment when it is larger
// than a buffer. wait asks the caller to wait for a buffer to be written and
// try again.
func (s *Store) placeLocked(key string, size int64) (p placement, wait bool, err error) {
	direct := headerLen(key, false)+size > s.bufBytes
	p.hdrLen = headerLen(key, direct)
	if direct {
		p.rec = roundUp(p.hdrLen+size, block)
	} else {
		p.rec = roundUp(p.hdrLen+size, sector)
	}
	if a := s.active; a == nil || a.broken || (a.size > 0 && a.size+p.rec > s.segBytes) {
		if err := s.rotateLocked(); err != nil {
			return p, false, err
		}
	}
	if !direct && (s.cur == nil || s.cur.n+p.rec > s.bufBytes) && s.freeBufLocked() == nil {
		if s.cur != nil {
			s.sealLocked()
		}
		return p, true, nil
	}
	if err := s.roomLocked(p.rec); err != nil {
		return p, false, err
	}
	seg := s.active
	if direct {
		s.sealLocked() // the record goes after what the buffer holds
		p.seg, p.off = seg, seg.size
		seg.size += p.rec
		seg.pending++
		seg.refs++
		s.used += p.rec
		s.unwritten += p.rec
		return p, false, nil
	}
	if s.cur != nil && s.cur.n+p.rec > s.bufBytes {
		s.sealLocked()
	}
	if s.cur == nil {
		b := s.freeBufLocked()
		b.state, b.seg, b.start, b.n, b.keys = bufFilling, seg, seg.size, 0, b.keys[:0]
		seg.pending++
		s.cur = b
	}
	b := s.cur
	p.seg, p.off, p.buf = seg, b.start+b.n, b
	b.n += p.rec
	b.copying++
	seg.size += p.rec
	s.used += p.rec
	s.unwritten += p.rec
	return p, false, nil
}

// freeBufLocked returns a buffer that can be filled, or nil.
func (s *Store) freeBufLocked() *stageBuf {
	for _, b := range s.bufs {
		if b.state == bufFree && b.readers == 0 {
			return b
		}
	}
	return nil
}

// sealLocked pads the current buffer to a whole block with a padding record
// and queues it for the writer.
func (s *Store) sealLocked() {
	b := s.cur
	if b == nil {
		return
	}
	s.cur = nil
	if pad := roundUp(b.n, block) - b.n; pad > 0 {
		header{kind: kindPad, hdrLen: sector, segment: b.seg.id, recLen: pad}.encode(b.mem[b.n : b.n+pad])
		clear(b.mem[b.n+sector : b.n+pad])
		b.n += pad
		b.seg.size += pad
		s.used += pad
		s.unwritten += pad
	}
	b.state = bufSealed
	s.queue = append(s.queue, b)
	s.cond.Broadcast()
}
