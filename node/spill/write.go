package spill

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"unsafe"

	"github.com/zeebo/xxh3"
	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/internal/vecio"
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
		if e, ok := s.idx.get(h); ok {
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
	i, _, _, err := s.idx.add(&p.seg.head, h, entry{seg: p.seg.id, hdrLen: uint32(p.hdrLen), off: p.off, size: size, format: format, pending: true})
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
		e, ok := s.idx.get(h)
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
		p.seg.hints = append(p.seg.hints, hint{kind: kindTombstone, hdrLen: uint32(p.hdrLen), off: p.off, format: uint64(origin), hash: h})
		p.seg.tombs++
		p.seg.tombBytes += p.rec
		if w != nil {
			w.add(p.buf) // a tombstone always fits a buffer
		}
		return p, forgot, nil
	}
}

// release ends the copy into p.
func (s *Store) release(p placement) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.endCopyLocked(p)
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
	old := s.active
	s.active = seg
	if old != nil && old.pending == 0 {
		s.hintLocked(old)
		s.kickLocked(old)
	}
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
	n, _ := s.removeSegmentLocked(seg)
	s.st.evictions.Add(n)
	s.st.segmentsDropped.Add(1)
	return true
}

// removeSegmentLocked takes seg out of the spill: its objects out of the
// index, its file and hint file off the disk. Its fd is closed once the reads
// on it end. It returns the objects and data bytes that were live in it.
func (s *Store) removeSegmentLocked(seg *segment) (objects, bytes int64) {
	s.segs = slices.DeleteFunc(s.segs, func(x *segment) bool { return x == seg })
	delete(s.byID, seg.id)
	objects, bytes = s.idx.dropSegment(seg.head)
	seg.head = 0
	s.liveBytes -= bytes
	s.liveRec -= seg.liveRec
	seg.liveRec = 0
	s.used -= seg.size
	if err := unix.Unlink(seg.path); err != nil && err != unix.ENOENT {
		s.log.Warn("spill: cannot remove a dropped segment file; remove it by hand", "file", seg.path, "err", err)
	}
	_ = unix.Unlink(s.dir + "/" + hintName(seg.id))
	seg.hints = nil
	seg.dropped = true
	if seg.refs == 0 {
		_ = unix.Close(seg.fd)
	}
	return objects, bytes
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
		s.kickLocked(seg)
	}
	s.cond.Broadcast()
}

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

// dropOldest drops the oldest segment, if it can, after the device said it
// was full.
func (s *Store) dropOldest() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	dropped := s.dropOldestLocked()
	s.refreshLimitLocked()
	return dropped
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
