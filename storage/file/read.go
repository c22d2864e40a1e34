package file

import (
	"fmt"
	"io"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/internal/vecio"
	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/storage"
)

// presence is what a probe found under an object part's name.
type presence uint8

const (
	absent  presence = iota // no file (or a corrupt one, now removed)
	stored                  // a sound header of the pool's format and the right length
	foreign                 // a sound header of another format
)

// probe reads the header of an object part file and says whether it holds the
// part in the pool's format. A corrupt file is removed and is absent.
func (s *Store) probe(o objSpec, rel, name string, b *ioBuf) (presence, error) {
	path := s.path(rel)
	fd, err := vecio.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err == unix.ENOENT {
		s.idx.forget(rel)
		return absent, nil
	}
	if err != nil {
		return absent, ioError("open", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return absent, ioError("stat", path, err)
	}
	n, err := preadAt(fd, b.hdr, 0)
	if err != nil {
		return absent, ioError("read", path, err)
	}
	h, err := decodeHeader(b.hdr[:n])
	switch {
	case err != nil:
		_ = s.corrupt(path, rel, &st, err.Error())
		return absent, nil
	case h.format != o.format:
		return foreign, nil
	case h.name == name && h.bodyLen != uint64(o.bodyLen) && st.Size == headerSize+int64(h.bodyLen):
		return foreign, nil // a sound object of another length: leave it
	case h.name != name || h.bodyLen != uint64(o.bodyLen) || st.Size != o.fileSize:
		_ = s.corrupt(path, rel, &st, fmt.Sprintf("header of %q with a body of %d bytes in a file of %d bytes, want %q, %d and %d",
			h.name, h.bodyLen, st.Size, name, o.bodyLen, o.fileSize))
		return absent, nil
	}
	s.idx.note(rel, fileBytes(o.bodyLen), st.Atim.Nano())
	return stored, nil
}

// preadAt reads up to len(buf) bytes at off, stopping early only at the end of the file.
func preadAt(fd int, buf []byte, off int64) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := unix.Pread(fd, buf[n:], off+int64(n))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return n, err
		}
		if m == 0 {
			break
		}
		n += m
	}
	return n, nil
}

// corrupt removes a file that failed its checks (if it is still the file that was
// checked) and returns the per-key error.
func (s *Store) corrupt(path, rel string, st *unix.Stat_t, reason string) error {
	s.idx.forget(rel)
	var now unix.Stat_t
	if err := unix.Lstat(path, &now); err != nil || now.Ino != st.Ino || now.Dev != st.Dev {
		return fmt.Errorf("file store: object %s: %s; already replaced or removed: %w", path, reason, storage.ErrCorrupt)
	}
	if err := unix.Unlink(path); err != nil && err != unix.ENOENT {
		return fmt.Errorf("file store: object %s: %s; cannot remove it (%v): %w", path, reason, err, storage.ErrCorrupt)
	}
	s.stats.corrupt.Add(1)
	return fmt.Errorf("file store: object %s: %s; removed it: %w", path, reason, storage.ErrCorrupt)
}

// getPart reads one object part into host memory and verifies it.
func (s *Store) getPart(ps *poolState, key pagekey.Key, page pool.PageID, part int, mem []byte, b *ioBuf) error {
	name := ps.names.Object(key, ps.spec.Name, part)
	b.body.setSpan(mem, ps.spec.Layout.PageBufferSpan(part, int(page)))
	return s.readObj(ps.obj(), relPath(key, name), name, b)
}

// readObj reads the object part at rel into b.body (already pointing at its runs)
// and verifies it.
func (s *Store) readObj(o objSpec, rel, name string, b *ioBuf) error {
	path := s.path(rel)
	fd, direct, err := s.open(path, unix.O_RDONLY, 0)
	if err == unix.ENOENT {
		s.idx.forget(rel)
		s.stats.misses.Add(1)
		return fmt.Errorf("file store: object %s: %w", name, storage.ErrNotFound)
	}
	if err != nil {
		return ioError("open", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return ioError("stat", path, err)
	}
	if st.Size != o.fileSize {
		return s.wrongLength(o, fd, path, rel, name, &st, b)
	}
	err = readFile(fd, b, st.Size, direct)
	if direct && err == unix.EINVAL {
		s.directRefused(path, err)
		if err = clearDirect(fd); err == nil {
			err = readFile(fd, b, st.Size, false)
		}
	}
	if err == io.ErrUnexpectedEOF {
		return s.corrupt(path, rel, &st, "file ends early")
	}
	if err != nil {
		return ioError("read", path, err)
	}
	h, err := decodeHeader(b.hdr)
	switch {
	case err != nil:
		return s.corrupt(path, rel, &st, err.Error())
	case h.format != o.format:
		s.stats.misses.Add(1)
		return fmt.Errorf("file store: object %s is stored in another format (another layout, geometry or page size): %w", name, storage.ErrNotFound)
	case h.name != name:
		return s.corrupt(path, rel, &st, fmt.Sprintf("header names object %q", h.name))
	case h.bodyLen != uint64(o.bodyLen):
		return s.corrupt(path, rel, &st, fmt.Sprintf("header says %d body bytes, want %d", h.bodyLen, o.bodyLen))
	case b.body.sum() != h.bodySum:
		return s.corrupt(path, rel, &st, "body checksum mismatch")
	}
	s.touch(path, &st)
	s.idx.note(rel, fileBytes(o.bodyLen), time.Now().UnixNano())
	s.stats.reads.Add(1)
	s.stats.readBytes.Add(o.bodyLen)
	return nil
}

// wrongLength judges a file whose length is not the part's: another format's
// object is a miss and stays, anything else is corrupt.
func (s *Store) wrongLength(o objSpec, fd int, path, rel, name string, st *unix.Stat_t, b *ioBuf) error {
	n, err := preadAt(fd, b.hdr, 0)
	if err == unix.EINVAL {
		// A direct descriptor: the header block is aligned, so this is a refusal.
		s.directRefused(path, err)
		if err = clearDirect(fd); err == nil {
			n, err = preadAt(fd, b.hdr, 0)
		}
	}
	if err != nil {
		return ioError("read", path, err)
	}
	h, err := decodeHeader(b.hdr[:n])
	if err != nil {
		return s.corrupt(path, rel, st, fmt.Sprintf("file of %d bytes: %v", st.Size, err))
	}
	if h.format != o.format {
		s.stats.misses.Add(1)
		return fmt.Errorf("file store: object %s is stored in another format (another layout, geometry or page size): %w", name, storage.ErrNotFound)
	}
	if h.name == name && st.Size == headerSize+int64(h.bodyLen) {
		// A sound object of another length: the caller asked for the wrong size (a
		// pool's format fixes the length, so only the object API can get here).
		return fmt.Errorf("file store: object %s holds %d bytes, %d were asked for: %w", name, h.bodyLen, o.bodyLen, storage.ErrBatch)
	}
	return s.corrupt(path, rel, st, fmt.Sprintf("file of %d bytes, want %d", st.Size, o.fileSize))
}

// touchEvery is how stale a file's atime must be before a read refreshes it: LRU
// across processes needs no finer grain, and hot objects then cost no inode write
// per read.
const touchEvery = time.Second

// touch marks path as read now (atime only), so that other processes' scans see
// the use. Errors do not matter: the file may have been evicted meanwhile, or the
// directory be read-only.
func (s *Store) touch(path string, st *unix.Stat_t) {
	if time.Since(time.Unix(0, st.Atim.Nano())) < touchEvery {
		return
	}
	ts := []unix.Timespec{{Nsec: unix.UTIME_NOW}, {Nsec: unix.UTIME_OMIT}}
	_ = unix.UtimesNanoAt(unix.AT_FDCWD, path, ts, 0)
}
