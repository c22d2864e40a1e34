package spill

import (
	"errors"
	"fmt"
	"io"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/internal/vecio"
	"github.com/stratakv/strata/storage"
)

// write is the writer goroutine: it writes sealed buffers, in order, and the
// hint files of finished segments, until Close; then it writes the active
// segment's hint file too, so that the next start reads no segment at all.
// Abandoned (after a panic, or a test's crash), it ends at once.
func (s *Store) write() {
	defer s.writer.Done()
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		for len(s.queue) == 0 && len(s.hintSegs) == 0 && !s.stopping {
			s.cond.Wait()
		}
		if s.abandon {
			return
		}
		if len(s.queue) == 0 && len(s.hintSegs) > 0 {
			seg := s.hintSegs[0]
			s.hintSegs = s.hintSegs[1:]
			s.mu.Unlock()
			s.writeHints(seg)
			s.mu.Lock()
			continue
		}
		if len(s.queue) == 0 {
			if a := s.active; a != nil && a.pending == 0 && !a.hinted && !a.broken {
				a.hinted = true
				s.mu.Unlock()
				s.writeHints(a)
				s.mu.Lock()
			}
			return
		}
		b := s.queue[0]
		for b.copying > 0 && !s.abandon {
			s.cond.Wait()
		}
		if s.abandon {
			return
		}
		seg := b.seg
		seg.refs++
		s.mu.Unlock()
		err := s.writeRetry(seg, [][]byte{b.mem[:b.n]}, b.start)
		s.mu.Lock()
		s.queue = s.queue[1:]
		if err != nil {
			s.failBufLocked(b, err)
		} else {
			s.st.flushes.Add(1)
		}
		for _, w := range b.waiters {
			if err != nil && w.err == nil {
				w.err = err
			}
			w.bufs--
		}
		clear(b.waiters)
		b.waiters = b.waiters[:0]
		s.doneWriteLocked(seg, b.n)
		b.state, b.seg = bufFree, nil
		s.cond.Broadcast()
	}
}

// failBufLocked forgets the objects of a buffer whose write failed: they were
// never stored.
func (s *Store) failBufLocked(b *stageBuf, err error) {
	b.seg.broken = true
	b.seg.hints = nil // New reads a broken segment
	lost := 0
	for _, h := range b.keys {
		if e, ok := s.idx.get(h); ok && e.seg == b.seg.id && e.off >= b.start && e.off < b.start+b.n {
			s.unindexLocked(h)
			lost++
		}
	}
	s.st.writeErrors.Add(1)
	s.st.lost.Add(int64(lost))
	s.log.Warn("spill: writing a buffer of evicted objects failed; they are dropped, and a new segment starts",
		"segment", b.seg.path, "objects", lost, "bytes", b.n, "err", err)
}

// writeRetry writes iovs at off in seg. A full device drops the oldest
// segment and tries again, as long as there is one to drop.
func (s *Store) writeRetry(seg *segment, iovs [][]byte, off int64) error {
	for {
		err := s.writeAll(seg.fd, iovs, off)
		if err == nil {
			return nil
		}
		if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
			if s.dropOldest() {
				s.st.noSpaceRetries.Add(1)
				continue
			}
		}
		if errors.Is(err, unix.EINVAL) && s.clearDirect(seg) {
			continue
		}
		return ioError("write", seg.path, err)
	}
}

// clearDirect switches seg's fd to buffered I/O after the filesystem refused
// an O_DIRECT write, and reports whether it did.
func (s *Store) clearDirect(seg *segment) bool {
	flags, err := unix.FcntlInt(uintptr(seg.fd), unix.F_GETFL, 0)
	if err != nil || flags&unix.O_DIRECT == 0 {
		return false
	}
	if _, err := unix.FcntlInt(uintptr(seg.fd), unix.F_SETFL, flags&^unix.O_DIRECT); err != nil {
		return false
	}
	s.locked(func() { s.directRefused(seg.path, unix.EINVAL) })
	return true
}

// writeAll writes every byte of iovs at off, resuming after short writes.
func (s *Store) writeAll(fd int, iovs [][]byte, off int64) error {
	iovs = append([][]byte(nil), iovs...)
	for len(iovs) > 0 {
		batch := iovs[:min(len(iovs), 1024)]
		var n int
		var err error
		if s.pwritev != nil {
			n, err = s.pwritev(fd, batch, off)
		} else {
			n, err = vecio.Pwritev(fd, batch, off)
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return io.ErrShortWrite
		}
		off += int64(n)
		iovs = vecio.Advance(iovs, n)
	}
	return nil
}

// writeDirect writes a record larger than a write buffer straight from the
// caller's memory: its 4 KiB header block, the data's whole blocks where they
// lie at block-aligned addresses, and the rest through a bounce buffer.
func (s *Store) writeDirect(p placement, hd header, runs [][]byte) error {
	sc := s.getScratch(directChunk)
	defer s.putScratch(sc)
	buf := *sc
	hd.encode(buf[:block])
	iovs := [][]byte{buf[:block]}
	used := int64(block) // bytes of buf queued in iovs
	off, queued := p.off, int64(block)
	flush := func() error {
		if err := s.writeRetry(p.seg, iovs, off); err != nil {
			return err
		}
		off += queued
		iovs, queued, used = iovs[:0], 0, 0
		return nil
	}
	// pend is data copied into buf that is not yet a whole block; buffers
	// are flushed only between blocks, so pend never moves.
	var pend []byte
	for _, r := range runs {
		for len(r) > 0 {
			if len(pend) == 0 {
				if len(iovs) >= 1000 || used == int64(len(buf)) {
					if err := flush(); err != nil {
						return err
					}
				}
				if len(r) >= block && uintptr(unsafe.Pointer(unsafe.SliceData(r)))%block == 0 {
					n := roundDown(int64(len(r)), block)
					iovs = append(iovs, r[:n:n])
					queued += n
					r = r[n:]
					continue
				}
				pend = buf[used:used]
			}
			k := min(len(r), block-len(pend))
			pend = append(pend, r[:k]...)
			r = r[k:]
			if len(pend) == block {
				iovs = append(iovs, pend)
				queued += block
				used += block
				pend = nil
			}
		}
	}
	if len(pend) > 0 {
		tail := buf[used : used+block]
		clear(tail[len(pend):])
		iovs = append(iovs, tail)
		queued += block
		used += block
	}
	if len(iovs) > 0 {
		if err := flush(); err != nil {
			return err
		}
	}
	if end := p.off + p.rec; off != end {
		return fmt.Errorf("spill: record of %s ends at %d, placed to end at %d (a bug): %w", hd.key, off, end, storage.ErrIO)
	}
	return nil
}
