package spill

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"unsafe"

	"github.com/zeebo/xxh3"
	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/internal/vecio"
	"github.com/stratakv/strata/storage"
)

// GetObject reads key's object in format into runs, whose total length must be
// the object's (ObjectSize tells it). A record on disk is checked before its
// bytes are handed over: its header (the key in it included) and the data's
// checksum. A missing object, or one of another format, is storage.ErrNotFound;
// a record that fails a check is storage.ErrCorrupt and is dropped, with a
// tombstone so that it stays dropped after a restart. On error runs hold
// undefined bytes.
func (s *Store) GetObject(ctx context.Context, key string, format storage.Format, runs ...[]byte) error {
	if err := ctx.Err(); err != nil {
		return ctxError("get", err)
	}
	if err := s.begin("get", key); err != nil {
		return err
	}
	defer s.end()
	err := s.get(ctx, key, uint64(format), runs)
	s.st.faults.Add(err)
	return err
}

func (s *Store) get(ctx context.Context, key string, format uint64, runs [][]byte) error {
	h := hashKey(key)
	size := runsLen(runs)
	e, b, seg, err := s.hold(key, h, format, size)
	if err != nil {
		return err
	}
	if b != nil {
		// Not written yet: the buffer's bytes are the record, and they stay
		// while this read holds the buffer.
		defer s.unhold(b, nil)
		at := e.off - b.start + int64(e.hdrLen)
		src := b.mem[at : at+e.size]
		for _, r := range runs {
			src = src[copy(r, src):]
		}
		s.st.reads.Add(1)
		s.st.bufferReads.Add(1)
		s.st.readBytes.Add(size)
		return nil
	}
	err = func() error {
		defer s.unhold(nil, seg)
		s.testHook("get-read", key)
		return s.readRecord(seg, e, key, runs)
	}()
	if err != nil {
		s.dropBad(ctx, key, h, e, err)
		return err
	}
	s.st.reads.Add(1)
	s.st.readBytes.Add(size)
	return nil
}

// hold finds key's object and holds where it is: the write buffer it is in
// (b), or its segment (seg), whose fd stays open while held.
func (s *Store) hold(key string, h [16]byte, format uint64, size int64) (e entry, b *stageBuf, seg *segment, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.getLocked(h)
	switch {
	case !ok || e.pending:
		s.st.misses.Add(1)
		return e, nil, nil, fmt.Errorf("spill: object %s: %w", key, storage.ErrNotFound)
	case e.format != format:
		s.st.misses.Add(1)
		return e, nil, nil, fmt.Errorf("spill: object %s is stored in another format (another layout, geometry or page size): %w", key, storage.ErrNotFound)
	case e.size != size:
		return e, nil, nil, fmt.Errorf("spill: object %s holds %d bytes, %d were asked for: %w", key, e.size, size, storage.ErrBatch)
	}
	if b := s.bufferOfLocked(e); b != nil {
		b.readers++
		return e, b, nil, nil
	}
	seg = s.byID[e.seg]
	seg.refs++
	return e, nil, seg, nil
}

// unhold lets go of what hold held.
func (s *Store) unhold(b *stageBuf, seg *segment) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b != nil {
		if b.readers--; b.readers == 0 {
			s.cond.Broadcast()
		}
	}
	if seg != nil {
		s.releaseLocked(seg)
	}
}

// dropBad forgets e, h's record, after a read of it failed with err, if h
// still names it. A record that failed a check (storage.ErrCorrupt) is
// dropped for good: a tombstone placed in the critical section that unindexes
// it keeps it dropped after a restart (and no put of the key comes between).
// After another error (the device's) it is forgotten until the next start.
func (s *Store) dropBad(ctx context.Context, key string, h [16]byte, e entry, err error) {
	if !errors.Is(err, storage.ErrCorrupt) {
		if s.forget(h, &e) {
			s.st.corrupt.Add(1)
		}
		return
	}
	defer s.wakeOnDone(ctx)()
	placed, forgot, terr := s.stageTombstone(ctx, key, h, 0, nil, func(cur entry, ok bool) tombAction {
		if ok && cur == e {
			return tombPlace
		}
		return tombSkip
	}, true)
	if terr != nil {
		forgot = s.forget(h, &e)
		s.log.Warn("spill: the tombstone of a corrupt record could not be written; it is dropped, but will be read (and dropped) again after a restart",
			"key", key, "err", terr)
	}
	if forgot {
		s.st.corrupt.Add(1)
	}
	if placed {
		s.st.corruptDropped.Add(1)
	}
}

// bufferOfLocked returns the write buffer that holds e's record, or nil when
// it is in its segment file.
func (s *Store) bufferOfLocked(e entry) *stageBuf {
	for _, b := range s.bufs {
		if b.state != bufFree && b.seg.id == e.seg && e.off >= b.start && e.off < b.start+b.n {
			return b
		}
	}
	return nil
}

// readRecord reads e's record from seg: straight into runs when they are one
// run at an address and a file offset O_DIRECT can read into (readDirect),
// else the blocks that hold it into an aligned window, checked and then
// copied into runs.
func (s *Store) readRecord(seg *segment, e entry, key string, runs [][]byte) error {
	if len(runs) == 1 && s.canReadDirect(e, runs[0]) {
		err := s.readDirect(seg, e, key, runs[0])
		if !errors.Is(err, unix.EINVAL) {
			return err
		}
		// The device refused the alignment after all (statx misled us):
		// the window's 4 KiB alignment always does.
	}
	lo := roundDown(e.off, block)
	hi := roundUp(e.off+int64(e.hdrLen)+e.size, block)
	sc := s.getScratch(hi - lo)
	defer s.putScratch(sc)
	win := *sc
	// The window may run past the end of a segment cut at New.
	n, err := preadFull(seg.fd, win, lo)
	if err != nil && err != io.ErrUnexpectedEOF {
		return ioError("read", seg.path, err)
	}
	if int64(n) < e.off+int64(e.hdrLen)+e.size-lo {
		return corrupt(seg, e, key, "the segment file ends inside the record")
	}
	rec := win[e.off-lo:]
	if err := checkHeader(seg, e, key, rec[:e.hdrLen]); err != nil {
		return err
	}
	data := rec[e.hdrLen : int64(e.hdrLen)+e.size]
	if xxh3.Hash(data) != dataSum(rec) {
		return corrupt(seg, e, key, "data checksum mismatch")
	}
	for _, r := range runs {
		data = data[copy(r, data):]
	}
	return nil
}

// canReadDirect reports whether readDirect can read e's record into dst: the
// header and the data's whole units of the device's O_DIRECT offset alignment
// lie at aligned offsets (always where that is a 512-byte sector, as on most
// devices; only for records written straight from the caller's memory, whose
// header is a block, where it is 4 KiB), and dst is at an address O_DIRECT
// can read into.
func (s *Store) canReadDirect(e entry, dst []byte) bool {
	a := s.dioAlign
	return e.size >= a && e.off%a == 0 && int64(e.hdrLen)%a == 0 &&
		int64(uintptr(unsafe.Pointer(unsafe.SliceData(dst))))%s.dioMem == 0
}

// readDirect reads e's record into dst with one read: the header into a
// scratch block, the data's whole units of the O_DIRECT alignment from the
// device into dst with no copy, and its last partial unit through the
// scratch buffer.
func (s *Store) readDirect(seg *segment, e entry, key string, dst []byte) error {
	a := s.dioAlign
	whole := roundDown(e.size, a)
	sc := s.getScratch(2 * block)
	defer s.putScratch(sc)
	hdr, tail := (*sc)[:e.hdrLen], (*sc)[block:block+a]
	iovs := [][]byte{hdr, dst[:whole]}
	if whole < e.size {
		iovs = append(iovs, tail)
	}
	n, err := preadvFull(seg.fd, iovs, e.off)
	if errors.Is(err, unix.EINVAL) {
		return err
	}
	if err != nil && err != io.ErrUnexpectedEOF {
		return ioError("read", seg.path, err)
	}
	if int64(n) < int64(e.hdrLen)+e.size {
		return corrupt(seg, e, key, "the segment file ends inside the record")
	}
	if err := checkHeader(seg, e, key, hdr); err != nil {
		return err
	}
	copy(dst[whole:], tail)
	if xxh3.Hash(dst) != dataSum(hdr) {
		return corrupt(seg, e, key, "data checksum mismatch")
	}
	return nil
}

// dataSum is the data checksum of a header that checkHeader accepted.
func dataSum(hdr []byte) uint64 { return binary.LittleEndian.Uint64(hdr[offDataSum:]) }

// checkHeader checks that hdr is the header of e's record, of key.
func checkHeader(seg *segment, e entry, key string, hdr []byte) error {
	h, err := decodeHeader(hdr)
	switch {
	case err != nil:
		return corrupt(seg, e, key, err.Error())
	case h.kind != kindObject || h.key != key:
		return corrupt(seg, e, key, fmt.Sprintf("the record there is of key %q", h.key))
	case h.segment != seg.id || h.hdrLen != int64(e.hdrLen) || h.dataLen != e.size || h.format != e.format:
		return corrupt(seg, e, key, fmt.Sprintf("the header says segment %d, header %d, data %d, format %#x", h.segment, h.hdrLen, h.dataLen, h.format))
	}
	return nil
}

// preadvFull fills iovs from off and returns how much it read; a file that
// ends first is io.ErrUnexpectedEOF.
func preadvFull(fd int, iovs [][]byte, off int64) (int, error) {
	iovs = append([][]byte(nil), iovs...)
	done := 0
	for len(iovs) > 0 {
		n, err := vecio.Preadv(fd, iovs, off+int64(done))
		if err != nil {
			return done, err
		}
		if n == 0 {
			return done, io.ErrUnexpectedEOF
		}
		done += n
		iovs = vecio.Advance(iovs, n)
	}
	return done, nil
}

// corrupt is the error of a record that failed a check.
func corrupt(seg *segment, e entry, key, why string) error {
	return fmt.Errorf("spill: object %s at offset %d of %s: %s; it is dropped: %w", key, e.off, seg.path, why, storage.ErrCorrupt)
}

// preadFull fills buf from off and returns how much it read; a file that
// ends first is io.ErrUnexpectedEOF.
func preadFull(fd int, buf []byte, off int64) (int, error) {
	done := 0
	for done < len(buf) {
		n, err := unix.Pread(fd, buf[done:], off+int64(done))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return done, err
		}
		if n == 0 {
			return done, io.ErrUnexpectedEOF
		}
		done += n
	}
	return done, nil
}

// ObjectSize returns the data length of key's object in format: an error
// wrapping storage.ErrNotFound when the spill has none, and also ErrOtherFormat
// when it holds one of another format.
func (s *Store) ObjectSize(ctx context.Context, key string, format storage.Format) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, ctxError("stat", err)
	}
	if err := s.begin("stat", key); err != nil {
		return 0, err
	}
	defer s.end()
	e, ok := s.lookup(hashKey(key))
	switch {
	case !ok:
		return 0, fmt.Errorf("spill: object %s: %w", key, storage.ErrNotFound)
	case e.format != uint64(format):
		return 0, fmt.Errorf("spill: object %s is stored in format %#x, not %#x: %w (%w)", key, e.format, uint64(format), storage.ErrNotFound, ErrOtherFormat)
	}
	return e.size, nil
}

// lookup returns h's indexed object; one still being put is not there yet.
func (s *Store) lookup(h [16]byte) (entry, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.getLocked(h)
	return e, ok && !e.pending
}
