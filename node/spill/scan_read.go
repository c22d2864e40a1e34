package spill

import (
	"fmt"
	"io"

	"github.com/zeebo/xxh3"
)

// Reading a segment for the scan (scan.go): windows of scanWindow bytes,
// front to back, the next one read while the one before is parsed, so that
// the device reads at its sequential rate; after a record of bigRecord bytes
// or more, only the next header is read.

// scanRecords indexes seg's records, a window at a time, and returns where
// its good records end, with why the next one is bad. An error is the
// index's (out of memory), errScanStopped or errSegmentGone. While it parses
// a window, the next one is read (scanAhead), so that the device never waits
// for the parsing.
func (s *Store) scanRecords(seg *segment, size, base int64, verify bool) (int64, string, error) {
	var ra scanAhead
	ra.bufs[0], ra.bufs[1] = s.getScratch(scanPad+scanWindow), s.getScratch(scanPad+scanWindow)
	defer s.putScratch(ra.bufs[1])
	defer s.putScratch(ra.bufs[0])
	defer ra.wait() // before the buffers go back
	var batch []hint
	flush := func(at int64) error {
		if len(batch) > 0 {
			if err := s.applyScanned(seg, batch, true); err != nil {
				return err
			}
			batch = batch[:0]
		}
		s.progress(base + at)
		if s.scan.ctx.Err() != nil {
			return errScanStopped
		}
		return nil
	}
	off, last := int64(0), int64(0)
	for off < size {
		if len(batch) >= scanBatch {
			if err := flush(off); err != nil {
				return off, "", err
			}
		}
		// A header and its key lie within fixedHeader+maxKey bytes.
		if off < ra.lo || min(off+fixedHeader+maxKey, size) > ra.hi {
			if err := flush(off); err != nil {
				return off, "", err
			}
			if why := ra.next(seg.fd, off, size, last >= bigRecord); why != "" {
				return off, why, flush(off)
			}
		}
		h, why := s.nextRecord(seg, off, size, verify, ra.win, ra.lo)
		if why != "" {
			return off, why, flush(off)
		}
		if h.kind != kindPad {
			batch = append(batch, hint{kind: h.kind, hdrLen: uint32(h.hdrLen), off: off, size: h.dataLen, format: h.format, hash: hashKey(h.key)})
		}
		last = h.recLen
		off += h.recLen
	}
	return off, "", flush(off)
}

// scanPad is the room before a window for the end of the one before it: a
// header that starts there runs on into the window.
const scanPad = 2 * block

// scanAhead reads a segment for the scan, a window at a time, each read
// started while the window before it is parsed. win holds the file's bytes
// [lo, hi), in bufs[cur] after scanPad (or a little before, for the end of
// the window before); the read in flight, if any, fills bufs[1-cur] with the
// bytes from aheadLo.
type scanAhead struct {
	bufs    [2]*[]byte
	cur     int
	win     []byte
	lo, hi  int64
	ahead   chan readResult
	aheadLo int64
}

type readResult struct {
	n   int
	err error
}

// wait ends the read in flight and returns what it read.
func (ra *scanAhead) wait() readResult {
	if ra.ahead == nil {
		return readResult{}
	}
	r := <-ra.ahead
	ra.ahead = nil
	return r
}

// next makes win hold the file's bytes from off on (of a file of size
// bytes): from the read in flight where it has them, else from a read now,
// of only two blocks after a large record (small), since the next header is
// all the scan needs of what follows. It returns why it cannot ("" when it
// did), and starts the read of the window after.
func (ra *scanAhead) next(fd int, off, size int64, small bool) string {
	start := roundDown(off, block)
	nb := 1 - ra.cur
	buf := *ra.bufs[nb]
	if ra.ahead != nil {
		aheadLo := ra.aheadLo
		r := ra.wait()
		// From the window read ahead, and the end of this one when the
		// header starts there.
		tail := max(aheadLo-start, 0)
		if (r.err == nil || r.err == io.ErrUnexpectedEOF) && start >= ra.lo && tail <= scanPad && off < aheadLo+int64(r.n) {
			if tail > 0 {
				copy(buf[scanPad-tail:scanPad], ra.win[start-ra.lo:])
			}
			ra.win, ra.lo, ra.hi, ra.cur = buf[scanPad-tail:scanPad+r.n], aheadLo-tail, min(aheadLo+int64(r.n), size), nb
			if !small {
				ra.readAhead(fd, size)
			}
			return ""
		}
		// Not of use: the scan jumped past it (a large record), or it failed
		// (and is tried again, alone).
	}
	n := min(scanWindow, roundUp(size, block)-start)
	if small {
		n = min(n, 2*block)
	}
	got, err := preadFull(fd, buf[scanPad:scanPad+n], start)
	if err != nil && err != io.ErrUnexpectedEOF {
		return err.Error()
	}
	ra.win, ra.lo, ra.hi, ra.cur = buf[scanPad:scanPad+got], start, min(start+int64(got), size), nb
	if ra.hi <= off {
		return "the file ends before its length"
	}
	if !small {
		ra.readAhead(fd, size)
	}
	return ""
}

// readAhead starts the read of the window after win, if the file goes on.
func (ra *scanAhead) readAhead(fd int, size int64) {
	from := ra.lo + int64(len(ra.win))
	if from >= size || from%block != 0 {
		return
	}
	n := min(scanWindow, roundUp(size, block)-from)
	buf := (*ra.bufs[1-ra.cur])[scanPad : scanPad+n]
	ch := make(chan readResult, 1)
	ra.ahead, ra.aheadLo = ch, from
	go func() {
		n, err := preadFull(fd, buf, from)
		ch <- readResult{n, err}
	}()
}

// nextRecord decodes and checks the record at off of seg, a file of size
// bytes whose bytes from lo are in win, or says why it is bad.
func (s *Store) nextRecord(seg *segment, off, size int64, verify bool, win []byte, lo int64) (header, string) {
	h, err := decodeHeader(win[off-lo : min(int64(len(win)), off-lo+maxHeader)])
	switch {
	case err != nil:
		return h, err.Error()
	case h.segment != seg.id:
		return h, fmt.Sprintf("a record of segment %d", h.segment)
	case off+h.recLen > size:
		return h, fmt.Sprintf("a record of %d bytes past the end of the file", h.recLen)
	case h.hdrLen == block && off%block != 0:
		return h, "a direct record at an unaligned offset"
	}
	if verify && h.kind == kindObject {
		return h, s.verifyRecord(seg, off, h, win, lo)
	}
	return h, ""
}

// verifyRecord checks the data checksum of the record h at off: in win, the
// file's bytes from lo, where they are all there, else read from the file.
func (s *Store) verifyRecord(seg *segment, off int64, h header, win []byte, lo int64) string {
	start, end := off+h.hdrLen-lo, off+h.hdrLen+h.dataLen-lo
	if end > int64(len(win)) {
		return s.verifyData(seg, off, h)
	}
	if xxh3.Hash(win[start:end]) != h.dataSum {
		return "data checksum mismatch"
	}
	return ""
}

// verifyData checks the data checksum of the record h at off.
func (s *Store) verifyData(seg *segment, off int64, h header) string {
	lo := roundDown(off+h.hdrLen, block)
	hi := roundUp(off+h.hdrLen+h.dataLen, block)
	sc := s.getScratch(hi - lo)
	defer s.putScratch(sc)
	win := *sc
	n, err := preadFull(seg.fd, win, lo)
	if err != nil && err != io.ErrUnexpectedEOF {
		return "data unreadable: " + err.Error()
	}
	if int64(n) < off+h.hdrLen+h.dataLen-lo {
		return "the file ends inside the data"
	}
	start := off + h.hdrLen - lo
	if xxh3.Hash(win[start:start+h.dataLen]) != h.dataSum {
		return "data checksum mismatch"
	}
	return ""
}
