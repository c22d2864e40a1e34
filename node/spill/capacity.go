package spill

import (
	"fmt"
	"math"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/storage"
)

// deviceFree is the bytes an unprivileged writer may still use on the spill's
// device (statfs f_bavail); a device that cannot say is taken to have room.
func (s *Store) deviceFree() int64 {
	if s.freeBytes != nil {
		return s.freeBytes()
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(s.dirfd, &st); err != nil || st.Bsize <= 0 || st.Blocks == 0 {
		return math.MaxInt64 / 4
	}
	if st.Bavail > uint64(math.MaxInt64/4)/uint64(st.Bsize) {
		return math.MaxInt64 / 4
	}
	return int64(st.Bavail) * st.Bsize
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
	if err := s.unlinkAt(segmentName(seg.id)); err != nil {
		s.log.Warn("spill: cannot remove a dropped segment file; remove it by hand", "file", seg.path, "err", err)
	}
	_ = s.unlinkAt(hintName(seg.id))
	seg.hints = nil
	seg.dropped = true
	if seg.refs == 0 {
		_ = unix.Close(seg.fd)
	}
	return objects, bytes
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
