package spill

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// segment is one segment file.
type segment struct {
	id   uint32
	path string
	fd   int
	// size is the bytes of records placed in the file, written or not.
	size int64
	// head is the first of its records on the index's list of them, for
	// dropping it.
	head uint32
	// refs counts reads and writes on fd in flight; a dropped segment's fd is
	// closed when the last ends.
	refs int
	// pending counts buffers and records placed in it and not yet written: a
	// segment with writes to come is never dropped.
	pending int
	dropped bool
	// broken: a write to it failed, and nothing more is appended to it.
	broken bool
	// liveRec is the record bytes of its indexed objects; tombs and tombBytes
	// count its tombstones. Compaction looks at them.
	liveRec   int64
	tombs     int
	tombBytes int64
	// compacting: the compactor is copying it. noCompact: a record in it
	// could not be read, and it goes only with age; compactFailed: its last
	// compaction stopped short, and it waits for more of it to die.
	compacting, noCompact, compactFailed bool
	// unscanned: an earlier run's segment whose records the scan has not
	// indexed (yet): its live objects are not on its list, so compaction
	// would delete them with it.
	unscanned bool
	// hints are its records in index order, for its hint file, until that is
	// written; hinted says it was queued for that (or needs none).
	hints  []hint
	hinted bool
}

func (s *Store) closeSegments() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, seg := range s.segs {
		if !seg.dropped {
			seg.dropped = true
			_ = unix.Close(seg.fd)
		}
	}
}

// segmentName is the file name of segment id: ids grow, and the names sort
// in their order.
func segmentName(id uint32) string { return fmt.Sprintf("%08x.seg", id) }

// parseSegmentName returns the id of a segment file name.
func parseSegmentName(name string) (uint32, bool) {
	var id uint32
	if len(name) != len("00000000.seg") {
		return 0, false
	}
	if n, err := fmt.Sscanf(name, "%08x.seg", &id); n != 1 || err != nil || segmentName(id) != name {
		return 0, false
	}
	return id, true
}

// dioAlignment returns the file offset and memory alignments that O_DIRECT
// reads of files in the spill's directory need, from statx of fd (a file
// there); a block where the filesystem does not say or asks for more, and no
// alignment without O_DIRECT.
func dioAlignment(fd int, direct bool) (offset, mem int64) {
	if !direct {
		return 1, 1
	}
	var st unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_DIOALIGN, &st); err != nil || st.Mask&unix.STATX_DIOALIGN == 0 {
		return block, block
	}
	offset, mem = int64(st.Dio_offset_align), int64(st.Dio_mem_align)
	if offset == 0 || offset > block || block%offset != 0 || mem == 0 || mem > block || block%mem != 0 {
		return block, block
	}
	return offset, mem
}

// openSegment opens the segment file name (0600, never through a link),
// with O_DIRECT while the spill uses it: a filesystem that refuses it
// (EINVAL) turns it off, with one log line.
func (s *Store) openSegment(name string, flags int) (int, error) {
	if s.direct {
		fd, err := s.openAt(name, flags|unix.O_DIRECT, privateFile)
		if err != unix.EINVAL {
			return fd, err
		}
		if flags&unix.O_CREAT != 0 {
			_ = s.unlinkAt(name) // created before the flag was refused; the name is ours
		}
		s.directRefused(s.path(name), err)
	}
	return s.openAt(name, flags, privateFile)
}

// directRefused turns O_DIRECT off; s.mu is held or the store is being built.
func (s *Store) directRefused(path string, err error) {
	if s.direct {
		s.direct = false
		s.log.Warn("spill: the filesystem refuses O_DIRECT; using buffered I/O", "dir", s.dir, "file", path, "err", err)
	}
}

// rotateLocked seals the current buffer and starts a new segment file.
func (s *Store) rotateLocked() error {
	s.sealLocked()
	id := s.nextID
	name := segmentName(id)
	path := s.path(name)
	_ = s.unlinkAt(hintName(id)) // a stale one must not describe the new segment
	fd, err := s.openSegment(name, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL)
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
