package spill

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/storage"
)

// openSegments finds the segment files an earlier run left in the directory
// and opens them, oldest first; the scan (scan.go) then indexes their records.
// Only regular files of this user are taken: anything else under a segment's
// name (a link, a FIFO, a file of another user) is refused, counted and
// logged once, never read, and its id is skipped by new segments. Files an
// earlier version left readable to others are made 0600. Hint files of
// segments that are gone, temporaries and anything untrustworthy under a hint
// file's name are removed: they are names the spill owns in its own directory.
func (s *Store) openSegments(lockFixed bool) error {
	names, err := s.readDirNames()
	if err != nil {
		return fmt.Errorf("spill: cannot list directory %s (%v); give this user read permission or point --spill-dir elsewhere: %w", s.dir, err, storage.ErrConfig)
	}
	var ids []uint32
	var hintFiles, refused []string
	oldLayout, fixed := 0, 0
	if lockFixed {
		fixed++
	}
	for _, name := range names {
		if id, ok := parseSegmentName(name); ok {
			ids = append(ids, id)
		}
		if strings.HasSuffix(name, ".hint") || strings.HasSuffix(name, ".hint.tmp") {
			hintFiles = append(hintFiles, name)
		}
		if len(name) == 2 && isHex(name) {
			if st, err := s.statAt(name); err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
				oldLayout++
			}
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
		s.nextID = max(s.nextID, id+1) // a refused file keeps its name
		seg, why, chmodded, err := s.openOld(id)
		switch {
		case err != nil:
			return err
		case why != "":
			refused = append(refused, segmentName(id)+" ("+why+")")
			continue
		case seg == nil:
			continue // gone meanwhile
		}
		if chmodded {
			fixed++
		}
		s.segs = append(s.segs, seg)
		s.byID[id] = seg
		s.used += seg.size
	}
	// Hint files of segments that are gone (dropped while their hint was
	// written, or by hand) must not describe a later segment of their id.
	for _, name := range hintFiles {
		var id uint32
		if n, err := fmt.Sscanf(name, "%08x.hint", &id); n == 1 && err == nil && hintName(id) == name && s.byID[id] != nil {
			ok, why, chmodded := s.checkHintFile(name)
			if chmodded {
				fixed++
			}
			if ok {
				continue
			}
			if why != "" {
				refused = append(refused, name+" ("+why+")")
			}
		}
		_ = s.unlinkAt(name)
	}
	s.firstNew = s.nextID
	s.st.refused.Store(int64(len(refused)))
	if len(refused) > 0 {
		s.log.Warn("spill: files in the directory that are not regular files of this service's user are never read or served; remove them (or, if they are this service's own, chown them to its user)",
			"dir", s.dir, "files", len(refused), "first", refused[:min(len(refused), 5)])
	}
	if fixed > 0 {
		s.log.Info("spill: files an earlier version left readable to the group or others are now private (mode 0600)", "dir", s.dir, "files", fixed)
	}
	return nil
}

// readDirNames lists the spill's directory.
func (s *Store) readDirNames() ([]string, error) {
	fd, err := s.openAt(".", unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), s.dir)
	defer f.Close()
	return f.Readdirnames(-1)
}

// openOld opens segment id of an earlier run. why says why it is refused; a
// nil segment without a reason is one that went meanwhile.
func (s *Store) openOld(id uint32) (seg *segment, why string, chmodded bool, err error) {
	name := segmentName(id)
	st, err := s.statAt(name)
	if err == unix.ENOENT {
		return nil, "", false, nil
	}
	if err != nil {
		return nil, "", false, ioError("stat segment", s.path(name), err)
	}
	// Checked before the open: opening a device or a FIFO planted under
	// the name could block or act on the device.
	if why := ownRegular(&st); why != "" {
		return nil, why, false, nil
	}
	fd, err := s.openSegment(name, unix.O_RDWR)
	if err == unix.ELOOP {
		return nil, "a symbolic link", false, nil
	}
	if err != nil {
		return nil, "", false, ioError("open segment", s.path(name), err)
	}
	var fst unix.Stat_t
	if err := unix.Fstat(fd, &fst); err != nil {
		_ = unix.Close(fd)
		return nil, "", false, ioError("stat segment", s.path(name), err)
	}
	if why := ownRegular(&fst); why != "" || fst.Ino != st.Ino || fst.Dev != st.Dev {
		_ = unix.Close(fd)
		return nil, "replaced while it was opened", false, nil
	}
	chmodded = s.makePrivate(fd, &fst, name)
	// Until the scan has read it, it counts whole; hinted keeps the writer
	// from writing its hint file: the scan does.
	return &segment{id: id, path: s.path(name), fd: fd, size: fst.Size, hinted: true, unscanned: true}, "", chmodded, nil
}

// checkHintFile reports whether the hint file name may be read: a regular
// file of this user (made 0600 if it was not), and else why not.
func (s *Store) checkHintFile(name string) (ok bool, why string, chmodded bool) {
	st, err := s.statAt(name)
	if err != nil {
		return false, "", false
	}
	if why := ownRegular(&st); why != "" {
		return false, why, false
	}
	if st.Mode&0o077 == 0 {
		return true, "", false
	}
	fd, err := s.openAt(name, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return false, "", false
	}
	defer unix.Close(fd)
	if err := unix.Fstat(fd, &st); err != nil || ownRegular(&st) != "" {
		return false, "", false
	}
	return true, "", s.makePrivate(fd, &st, name)
}

func isHex(name string) bool {
	for i := 0; i < len(name); i++ {
		if c := name[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
