package spill

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/zeebo/xxh3"
	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/storage"
)

// recover rebuilds the index from the segment files in the directory, oldest
// first, so that a later record of a key (or its tombstone) overrides an
// earlier one. A segment ends at its first bad record: the rest is a write
// torn by a crash (or damage) and is cut off. Only the data of the two newest
// segments is verified here, because a crash tears the segment being written
// (and the one before it may still have had a buffer on its way); every read
// verifies the data it serves. The newest by id: after compaction deleted the
// ones before them, older segments are among the last files, but no write of
// theirs was on its way.
func (s *Store) recover() error {
	names, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("spill: cannot list directory %s (%v); give this user read permission or point --spill-dir elsewhere: %w", s.dir, err, storage.ErrConfig)
	}
	var ids []uint32
	var hintFiles []string
	oldLayout := 0
	for _, d := range names {
		if id, ok := parseSegmentName(d.Name()); ok && d.Type().IsRegular() {
			ids = append(ids, id)
		}
		if strings.HasSuffix(d.Name(), ".hint") || strings.HasSuffix(d.Name(), ".hint.tmp") {
			hintFiles = append(hintFiles, d.Name())
		}
		if d.IsDir() && len(d.Name()) == 2 && isHex(d.Name()) {
			oldLayout++
		}
	}
	if oldLayout > 0 {
		// The spill before segment files kept a file per object in 256
		// subdirectories. Their space counts against the device's free space
		// but nothing reads them.
		s.log.Warn("spill: the directory holds objects of the earlier file-per-object spill, which are not read; remove its two-hex-digit subdirectories to free their space",
			"dir", s.dir, "subdirectories", oldLayout)
	}
	slices.Sort(ids)
	for _, id := range ids {
		if err := s.recoverSegment(id, id+1 >= ids[len(ids)-1]); err != nil {
			return err
		}
		s.nextID = id + 1
	}
	// Hint files of segments that are gone (dropped while their hint was
	// written, or by hand) must not describe a later segment of their id.
	for _, name := range hintFiles {
		var id uint32
		if n, err := fmt.Sscanf(name, "%08x.hint", &id); n == 1 && err == nil && hintName(id) == name && s.byID[id] != nil {
			continue
		}
		_ = os.Remove(s.dir + "/" + name)
	}
	// Segments read whole get a hint file now, for the next start.
	for _, seg := range s.segs {
		if seg.hints != nil {
			s.writeHints(seg)
		}
		seg.hinted = true
	}
	if n := s.idx.n; n > 0 || s.st.tornTails.Load() > 0 {
		s.log.Info("spill: recovered the objects of an earlier run", "dir", s.dir, "objects", n, "segments", len(s.segs),
			"bytes", s.used, "tornTails", s.st.tornTails.Load())
	}
	s.st.recovered.Store(int64(s.idx.n))
	return nil
}

// recoverSegment reads the record headers of segment id into the index.
func (s *Store) recoverSegment(id uint32, newest bool) error {
	path := s.dir + "/" + segmentName(id)
	fd, err := s.openSegment(path, unix.O_RDWR)
	if err != nil {
		return ioError("open segment", path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		_ = unix.Close(fd)
		return ioError("stat segment", path, err)
	}
	seg := &segment{id: id, path: path, fd: fd}
	// In byID while its records are indexed: a tombstone in it may remove an
	// object of its own.
	s.byID[id] = seg
	if hs := s.readHints(id, st.Size); hs != nil {
		if err := s.applyHints(seg, hs); err != nil {
			_ = unix.Close(fd)
			return err
		}
		seg.hints = nil // its hint file stands
		seg.size = st.Size
		s.segs = append(s.segs, seg)
		s.used += st.Size
		s.st.hintsRead.Add(1)
		return nil
	}
	end, why, err := s.scanSegment(seg, st.Size, newest)
	if err != nil {
		_ = unix.Close(fd)
		return err
	}
	if end < st.Size {
		s.st.tornTails.Add(1)
		s.log.Warn("spill: a segment ends in a bad record (a write torn by a crash, or damage); the rest of it is dropped",
			"segment", path, "at", end, "bytes", st.Size-end, "why", why)
		if err := unix.Ftruncate(fd, end); err != nil {
			s.log.Warn("spill: cannot cut a segment's bad tail; it stays unread", "segment", path, "err", err)
		}
	}
	if end == 0 {
		delete(s.byID, id)
		_ = unix.Close(fd)
		_ = unix.Unlink(path)
		return nil
	}
	seg.size = end
	s.segs = append(s.segs, seg)
	s.used += end
	return nil
}

// scanSegment indexes seg's records and returns where its good records end,
// with why the next one is bad. An error is the index's: out of memory.
func (s *Store) scanSegment(seg *segment, size int64, verify bool) (int64, string, error) {
	sc := s.getScratch(2 * block)
	defer s.putScratch(sc)
	win := *sc
	off := int64(0)
	for off < size {
		// The header lies within two blocks of the block it starts in.
		lo := roundDown(off, block)
		n := min(int64(len(win)), roundUp(size, block)-lo)
		if _, err := preadFull(seg.fd, win[:n], lo); err != nil && err != io.ErrUnexpectedEOF {
			return off, err.Error(), nil
		}
		avail := min(n, size-lo) - (off - lo)
		h, err := decodeHeader(win[off-lo : off-lo+min(avail, maxHeader)])
		switch {
		case err != nil:
			return off, err.Error(), nil
		case h.segment != seg.id:
			return off, fmt.Sprintf("a record of segment %d", h.segment), nil
		case off+h.recLen > size:
			return off, fmt.Sprintf("a record of %d bytes past the end of the file", h.recLen), nil
		case h.hdrLen == block && off%block != 0:
			return off, "a direct record at an unaligned offset", nil
		}
		if verify && h.kind == kindObject {
			if why := s.verifyData(seg, off, h); why != "" {
				return off, why, nil
			}
		}
		if h.kind != kindPad {
			if err := s.applyHints(seg, []hint{{kind: h.kind, hdrLen: uint32(h.hdrLen), off: off, size: h.dataLen, format: h.format, hash: hashKey(h.key)}}); err != nil {
				return off, "", err
			}
		}
		off += h.recLen
	}
	return off, "", nil
}

// applyHints indexes seg's records, in order, and keeps them as its hints.
func (s *Store) applyHints(seg *segment, hs []hint) error {
	for _, h := range hs {
		switch h.kind {
		case kindObject:
			if err := s.indexLocked(seg, h.hash, entry{seg: seg.id, hdrLen: h.hdrLen, off: h.off, size: h.size, format: h.format}); err != nil {
				return err
			}
		case kindTombstone:
			s.unindexLocked(h.hash)
			seg.tombs++
			seg.tombBytes += tombLen(h)
		}
		seg.hints = append(seg.hints, h)
	}
	return nil
}

// tombLen is the record length of the tombstone h: its header's, or, in a
// hint file of a version that did not keep it, a sector (most keys' size).
func tombLen(h hint) int64 {
	if h.hdrLen == 0 {
		return sector
	}
	return int64(h.hdrLen)
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

func isHex(name string) bool {
	for i := 0; i < len(name); i++ {
		if c := name[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
