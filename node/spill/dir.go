package spill

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/internal/undo"
	"github.com/stratakv/strata/storage"
)

// The spill directory holds every tenant's evicted objects and their keys, and
// the service, often root, reads, writes and removes the files in it: it must
// be private to the service's user. New creates it 0700 and refuses one that
// another user owns or that the group or others may enter, read or write (a
// user who can write it could plant a link under a name the service writes
// through, or a segment it would serve as its own keys). The spill then works
// on the directory through a descriptor, so a rename of the path after New
// changes nothing; every open is relative to it with O_NOFOLLOW, and every
// file is created 0600, temporaries with O_EXCL. A segment file that is not a
// regular file of the service's user is refused at recovery, never read;
// files an earlier version left 0644 are made 0600.

// privateDir is the mode New creates the directory with; privateFile, its files.
const (
	privateDir  = 0o700
	privateFile = 0o600
)

// openDir creates dir (0700, with any missing parents, recorded in made) if it is missing,
// opens it and checks that it is private to this user. It returns the
// directory's descriptor, and the mode it had when it had to be made private.
func openDir(dir string, made *undo.Log) (fd int, tightened uint32, err error) {
	if err := made.MkdirAll(dir, privateDir); err != nil {
		return -1, 0, fmt.Errorf("spill: cannot create directory %s (%v); create it (mode 0700), or point --spill-dir at a directory this user can write: %w", dir, err, storage.ErrConfig)
	}
	// A link in the last place is followed only if it is this user's or
	// root's: another user's could point the service at any directory of
	// its user's.
	var lst unix.Stat_t
	if err := unix.Lstat(dir, &lst); err == nil && lst.Mode&unix.S_IFMT == unix.S_IFLNK && lst.Uid != uint32(os.Geteuid()) && lst.Uid != 0 {
		return -1, 0, fmt.Errorf("spill %s: the path is a symbolic link of uid %d, which could point this service at any directory of its user's: %w; "+
			"remove it, or give --spill-dir the directory itself: %w", dir, lst.Uid, ErrUnsafeDir, storage.ErrConfig)
	}
	fd, err = openRetry(func() (int, error) { return unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0) })
	if err != nil {
		return -1, 0, fmt.Errorf("spill: cannot open directory %s (%v); point --spill-dir at a directory this user can read and write: %w", dir, err, storage.ErrConfig)
	}
	if tightened, err = checkDir(fd, dir); err != nil {
		_ = unix.Close(fd)
		return -1, 0, err
	}
	return fd, tightened, nil
}

// checkDir checks that the directory open at fd belongs to this user and
// that the group and others may not write it. One they may only read or
// enter is made 0700 when it holds nothing but the spill's files, as the
// directories earlier versions created (0755) and empty ones do: nobody but
// this user and root could have put anything in it, and nothing else in it
// loses access. Else it is refused: the fix is the operator's. It returns
// the mode it changed, 0 when it changed none.
func checkDir(fd int, dir string) (uint32, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, fmt.Errorf("spill: cannot stat directory %s (%v): %w", dir, err, storage.ErrConfig)
	}
	uid := uint32(os.Geteuid())
	mode := st.Mode & 0o7777
	switch {
	case st.Uid != uid:
		return 0, fmt.Errorf("spill %s: the directory belongs to uid %d, not to this service's user (uid %d), who would then read and serve files another user controls: %w; "+
			"chown %d %s (and chmod 700 it), or point --spill-dir at a directory of this user's: %w", dir, st.Uid, uid, ErrUnsafeDir, uid, dir, storage.ErrConfig)
	case mode&0o022 != 0:
		return 0, fmt.Errorf("spill %s: the directory has mode %04o: the group or others may write it, and so plant files and links the service would read, serve or write through: %w; "+
			"check what is in it, then chmod 700 %s: %w", dir, mode, ErrUnsafeDir, dir, storage.ErrConfig)
	case mode&0o077 == 0:
		return 0, nil
	}
	if other := otherFile(fd); other != "" {
		return 0, fmt.Errorf("spill %s: the directory has mode %04o: the group or others may list it and read what is in it (every tenant's evicted objects and keys), "+
			"and it holds %q, which is not the spill's, so the service leaves its mode alone: %w; chmod 700 %s, or point --spill-dir at a directory of the spill's own: %w",
			dir, mode, other, ErrUnsafeDir, dir, storage.ErrConfig)
	}
	if err := unix.Fchmod(fd, privateDir); err != nil {
		return 0, fmt.Errorf("spill %s: the directory has mode %04o, readable by the group or others, and cannot be made 0700 (%v): %w; chmod 700 %s: %w",
			dir, mode, err, ErrUnsafeDir, dir, storage.ErrConfig)
	}
	return mode, nil
}

// otherFile returns the name of an entry of the directory open at fd that is
// not a file the spill (or an earlier version of it, or a filesystem's own
// root) keeps there, "" when there is none.
func otherFile(fd int) string {
	dfd, err := openRetry(func() (int, error) { return unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0) })
	if err != nil {
		return "."
	}
	f := os.NewFile(uintptr(dfd), ".")
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return "."
	}
	for _, name := range names {
		_, seg := parseSegmentName(name)
		switch {
		case seg, name == lockName, name == "lost+found", len(name) == 2 && isHex(name),
			strings.HasSuffix(name, ".hint"), strings.HasSuffix(name, ".hint.tmp"), strings.HasPrefix(name, ".strata-probe-"):
		default:
			return name
		}
	}
	return ""
}

// openRetry calls open until it is not interrupted.
func openRetry(open func() (int, error)) (int, error) {
	for {
		fd, err := open()
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// openAt opens name in the spill's directory, never following a symbolic
// link.
func (s *Store) openAt(name string, flags int, mode uint32) (int, error) {
	return openRetry(func() (int, error) {
		return unix.Openat(s.dirfd, name, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
	})
}

// unlinkAt removes name from the spill's directory; a missing one is no
// error. A symbolic link is removed itself, never what it names.
func (s *Store) unlinkAt(name string) error {
	if err := unix.Unlinkat(s.dirfd, name, 0); err != nil && err != unix.ENOENT {
		return err
	}
	return nil
}

// path is name in the spill's directory, for messages.
func (s *Store) path(name string) string { return s.dir + "/" + name }

// ownRegular reports why st is not a regular file of this user ("" when it
// is one).
func ownRegular(st *unix.Stat_t) string {
	switch {
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		return "a symbolic link"
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return fmt.Sprintf("not a regular file (type %#o)", st.Mode&unix.S_IFMT)
	case st.Uid != uint32(os.Geteuid()):
		return fmt.Sprintf("owned by uid %d", st.Uid)
	}
	return ""
}

// statAt is fstatat of name without following a link.
func (s *Store) statAt(name string) (unix.Stat_t, error) {
	var st unix.Stat_t
	err := unix.Fstatat(s.dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	return st, err
}

// makePrivate makes the file open at fd, whose stat is st, mode 0600 where an
// earlier version left it readable to the group or others, and reports
// whether it changed it.
func (s *Store) makePrivate(fd int, st *unix.Stat_t, name string) bool {
	if st.Mode&0o077 == 0 {
		return false
	}
	if err := unix.Fchmod(fd, privateFile); err != nil {
		s.log.Warn("spill: cannot make a file private (mode 0600)", "file", s.path(name), "err", err)
		return false
	}
	return true
}

// readOwnFile returns the bytes of name, a regular file of this user of at
// most max bytes, opened without following a link and without blocking on a
// FIFO planted under its name.
func (s *Store) readOwnFile(name string, max int64) ([]byte, error) {
	fd, err := s.openAt(name, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	if why := ownRegular(&st); why != "" {
		return nil, errors.New(why)
	}
	if st.Size > max {
		return nil, fmt.Errorf("%d bytes, at most %d expected", st.Size, max)
	}
	b := make([]byte, st.Size)
	n, err := preadFull(fd, b, 0)
	if err != nil && err != io.ErrUnexpectedEOF {
		return nil, err
	}
	return b[:n], nil
}

// writeFileAt writes b to name through a temporary created with O_EXCL (a
// stale one, of a run that died writing it, removed first) and renamed over
// name, so that a reader sees the old file or the whole new one.
func (s *Store) writeFileAt(name string, b []byte) error {
	tmp := name + ".tmp"
	if err := s.unlinkAt(tmp); err != nil {
		return err
	}
	fd, err := s.openAt(tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, privateFile)
	if err != nil {
		return err
	}
	err = pwriteFull(fd, b)
	if cerr := unix.Close(fd); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(s.dirfd, tmp, s.dirfd, name)
	}
	if err != nil {
		_ = s.unlinkAt(tmp)
	}
	return err
}

// pwriteFull writes b at the start of fd.
func pwriteFull(fd int, b []byte) error {
	for off := 0; off < len(b); {
		n, err := unix.Pwrite(fd, b[off:], int64(off))
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return err
		case n == 0:
			return io.ErrShortWrite
		}
		off += n
	}
	return nil
}

// lockDir locks the spill's directory: two spills appending to and dropping
// the same segment files would destroy each other's objects. The lock file is
// created 0600 (and recorded in made) and must be a regular file of this user.
func (s *Store) lockDir(made *undo.Log) (fixed bool, err error) {
	path := s.path(lockName)
	// Created with O_EXCL, so that New knows a lock file it made (a refused
	// start removes it) from one that was there, which it leaves.
	fd, err := s.openAt(lockName, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL, privateFile)
	if err == nil {
		made.Created(path)
	} else if err == unix.EEXIST {
		fd, err = s.openAt(lockName, unix.O_RDWR, 0)
	}
	if err == unix.ELOOP {
		return false, fmt.Errorf("spill: %s is a symbolic link, which the service never follows: %w; remove it (rm %s): %w", path, ErrUnsafeDir, path, storage.ErrConfig)
	}
	if err != nil {
		return false, fmt.Errorf("spill: cannot create %s (%v); give this user write permission on the directory, or point --spill-dir at one it can write: %w", path, err, storage.ErrConfig)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		_ = unix.Close(fd)
		return false, fmt.Errorf("spill: cannot stat %s (%v): %w", path, err, storage.ErrConfig)
	}
	if why := ownRegular(&st); why != "" {
		_ = unix.Close(fd)
		return false, fmt.Errorf("spill: %s is %s: %w; remove it (rm %s): %w", path, why, ErrUnsafeDir, path, storage.ErrConfig)
	}
	fixed = s.makePrivate(fd, &st, lockName)
	for {
		err = unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		_ = unix.Close(fd)
		if err == unix.EWOULDBLOCK {
			return false, fmt.Errorf("spill directory %s is in use by another process (another node service?); give each service its own --spill-dir: %w", s.dir, storage.ErrConfig)
		}
		return false, fmt.Errorf("spill: cannot lock %s (%v): %w", path, err, storage.ErrConfig)
	}
	s.lock = fd
	return fixed, nil
}

// lockName is the file a spill holds locked (flock) while it is open.
const lockName = "spill.lock"
