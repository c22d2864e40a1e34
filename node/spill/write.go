package spill

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"unsafe"

	"github.com/zeebo/xxh3"
	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/internal/vecio"
	"github.com/stratakv/strata/storage"
)

// PutObject stores the concatenation of runs as key's object in format,
// write-once: when the spill holds key already (in any format) nothing is
// written and the put is a success. The bytes are copied into a write buffer
// (or, for an object larger than one, written) before it returns: the caller
// may reuse runs at once, and a get finds the object from then on.
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
	defer s.inflight.Done()
	_, err := s.stage(ctx, kindObject, key, hashKey(key), uint64(format), runs)
	s.st.faults.Add(err)
	return err
}

// placement is where stage put a record.
type placement struct {
	seg    *segment
	off    int64
	hdrLen int64
	rec    int64
	buf    *stageBuf // nil: written straight from the caller's memory
}

// stage appends a record: an object (runs) or a tombstone. For an object it
// reports false, without writing, when the index holds h already; for a
// tombstone it forgets h and reports whether it was there.
func (s *Store) stage(ctx context.Context, kind uint8, key string, h [16]byte, format uint64, runs [][]byte) (bool, error) {
	size := runsLen(runs)
	stop := context.AfterFunc(ctx, func() {
		s.mu.Lock()
		s.cond.Broadcast()
		s.mu.Unlock()
	})
	defer stop()
	s.mu.Lock()
	var p placement
	had := false
	for {
		if err := ctx.Err(); err != nil {
			s.mu.Unlock()
			return false, ctxError("put", err)
		}
		e, ok := s.idx.get(h)
		if kind == kindObject && ok {
			if e.format != format {
				s.st.conflicts.Add(1)
			} else {
				s.st.skipped.Add(1)
			}
			s.mu.Unlock()
			return false, nil
		}
		if kind == kindTombstone && !ok {
			s.mu.Unlock()
			return false, nil
		}
		var wait bool
		var err error
		p, wait, err = s.placeLocked(key, size)
		if err != nil {
			s.mu.Unlock()
			return false, err
		}
		if !wait {
			if kind == kindTombstone {
				s.unindexLocked(h)
				p.seg.hints = append(p.seg.hints, hint{kind: kindTombstone, hash: h})
				had = true
			}
			break
		}
		s.cond.Wait()
	}
	s.mu.Unlock()

	hd := header{kind: kind, hdrLen: p.hdrLen, segment: p.seg.id, recLen: p.rec, dataLen: size, format: format, key: key}
	if size > 0 {
		hd.dataSum = sumRuns(runs)
	}
	var err error
	if p.buf != nil {
		// The buffer's bytes at [off, off+rec) are this put's alone until it
		// says it is done copying.
		at := p.off - p.buf.start
		dst := p.buf.mem[at : at+p.rec]
		hd.encode(dst)
		n := p.hdrLen
		for _, r := range runs {
			n += int64(copy(dst[n:], r))
		}
		clear(dst[n:])
	} else {
		err = s.writeDirect(p, hd, runs)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if p.buf != nil {
		if p.buf.copying--; p.buf.copying == 0 {
			s.cond.Broadcast()
		}
	} else {
		s.doneWriteLocked(p.seg, p.rec)
	}
	if err != nil {
		s.st.writeErrors.Add(1)
		return false, err
	}
	if kind != kindObject {
		return had, nil
	}
	e := entry{seg: p.seg.id, hdrLen: uint32(p.hdrLen), off: p.off, size: size, format: format}
	if s.idx.find(h) != 0 || p.seg.dropped {
		// Another put of the key won the race, or the segment went meanwhile:
		// this record is dead bytes.
		s.st.skipped.Add(1)
		return false, nil
	}
	if err := s.indexLocked(p.seg, h, e); err != nil {
		// Written, but never to be found: dead bytes.
		return false, err
	}
	p.seg.hints = append(p.seg.hints, hint{kind: kindObject, hdrLen: e.hdrLen, off: e.off, size: e.size, format: e.format, hash: h})
	if p.buf != nil {
		p.buf.keys = append(p.buf.keys, h)
	} else {
		s.st.directWrites.Add(1)
	}
	s.st.writes.Add(1)
	s.st.writeBytes.Add(size)
	return true, nil
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

// rotateLocked seals the current buffer and starts a new segment file.
func (s *Store) rotateLocked() error {
	s.sealLocked()
	id := s.nextID
	path := s.dir + "/" + segmentName(id)
	_ = unix.Unlink(s.dir + "/" + hintName(id)) // a stale one must not describe the new segment
	fd, err := s.openSegment(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL)
	if err != nil {
		return ioError("create segment", path, err)
	}
	s.nextID++
	seg := &segment{id: id, path: path, fd: fd}
	s.segs = append(s.segs, seg)
	s.byID[id] = seg
	if old := s.active; old != nil && old.pending == 0 {
		s.hintLocked(old)
	}
	s.active = seg
	return nil
}

// hintLocked queues a finished segment for its hint file.
func (s *Store) hintLocked(seg *segment) {
	if seg.hinted || seg.broken || seg.dropped {
		return
	}
	seg.hinted = true
	s.hintSegs = append(s.hintSegs, seg)
	s.cond.Broadcast()
}

// statfsEvery is how far the spill's bytes move between two looks at the
// device's free space while it is below its capacity.
const statfsEvery = 4 << 20

// refreshLimitLocked looks at the device's free space again.
func (s *Store) refreshLimitLocked() {
	s.devLimit = s.used - s.unwritten + s.deviceFree()
	s.statfsUsed = s.used
}

func (s *Store) limitLocked() int64 { return min(s.cfg.CapacityBytes, s.devLimit) }

// roomLocked makes room for rec more bytes by dropping the oldest segments.
func (s *Store) roomLocked(rec int64) error {
	if d := s.used - s.statfsUsed; d >= statfsEvery || d <= -statfsEvery || s.used+rec > s.devLimit {
		s.refreshLimitLocked()
	}
	for s.used+rec > s.limitLocked() {
		if !s.dropOldestLocked() {
			return fmt.Errorf("spill %s: full (%d bytes, %d more needed, capacity %d, device room %d) with no segment that can go: "+
				"raise --spill-capacity or free space on the device: %w", s.dir, s.used, rec, s.cfg.CapacityBytes, s.devLimit, storage.ErrNoSpace)
		}
		s.refreshLimitLocked()
	}
	return nil
}

// dropOverLocked drops the oldest segments while the spill is over its limit.
func (s *Store) dropOverLocked() {
	for s.used > s.limitLocked() && s.dropOldestLocked() {
		s.refreshLimitLocked()
	}
}

// dropOldestLocked drops the oldest segment and its objects, unless it is the
// active one or has writes to come; it reports whether it dropped one.
func (s *Store) dropOldestLocked() bool {
	if len(s.segs) == 0 {
		return false
	}
	seg := s.segs[0]
	if seg == s.active || seg.pending > 0 {
		return false
	}
	s.segs = s.segs[1:]
	delete(s.byID, seg.id)
	n, bytes := s.idx.dropSegment(seg.head)
	seg.head = 0
	s.liveBytes -= bytes
	s.used -= seg.size
	s.st.evictions.Add(n)
	s.st.segmentsDropped.Add(1)
	if err := unix.Unlink(seg.path); err != nil && err != unix.ENOENT {
		s.log.Warn("spill: cannot remove a dropped segment file; remove it by hand", "file", seg.path, "err", err)
	}
	_ = unix.Unlink(s.dir + "/" + hintName(seg.id))
	seg.hints = nil
	seg.dropped = true
	if seg.refs == 0 {
		_ = unix.Close(seg.fd)
	}
	return true
}

// releaseLocked ends a read or write on seg's fd.
func (s *Store) releaseLocked(seg *segment) {
	if seg.refs--; seg.refs == 0 && seg.dropped {
		_ = unix.Close(seg.fd)
	}
}

// doneWriteLocked ends a write of rec bytes to seg, written or not.
func (s *Store) doneWriteLocked(seg *segment, rec int64) {
	seg.pending--
	s.unwritten -= rec
	s.releaseLocked(seg)
	if seg.pending == 0 && seg != s.active {
		s.hintLocked(seg)
	}
	s.cond.Broadcast()
}

// write is the writer goroutine: it writes sealed buffers, in order, and the
// hint files of finished segments, until Close; then it writes the active
// segment's hint file too, so that the next start reads no segment at all.
func (s *Store) write() {
	defer s.writer.Done()
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		for len(s.queue) == 0 && len(s.hintSegs) == 0 && !s.stopping {
			s.cond.Wait()
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
		for b.copying > 0 {
			s.cond.Wait()
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
			s.mu.Lock()
			dropped := s.dropOldestLocked()
			s.refreshLimitLocked()
			s.mu.Unlock()
			if dropped {
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
	s.mu.Lock()
	s.directRefused(seg.path, unix.EINVAL)
	s.mu.Unlock()
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

// directChunk is the bounce buffer of a direct write.
const directChunk = 1 << 20

// scratchPools hold block-aligned buffers by power-of-two size class. The
// Go heap does not move objects, so the alignment holds for a buffer's life.
type scratchPools [48]sync.Pool

func sizeClass(n int64) int {
	c := 16 // 64 KiB at least
	for int64(1)<<c < n {
		c++
	}
	return c
}

func (s *Store) getScratch(n int64) *[]byte {
	c := sizeClass(n)
	if v := s.scratch[c].Get(); v != nil {
		b := v.(*[]byte)
		*b = (*b)[:n]
		return b
	}
	b := vecio.AlignedBytes(1<<c, block)
	b = b[:n]
	return &b
}

func (s *Store) putScratch(b *[]byte) {
	c := sizeClass(int64(cap(*b)))
	*b = (*b)[:cap(*b)]
	s.scratch[c].Put(b)
}
