package arena

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Whose file. The arena file holds every tenant's objects and the secret that
// keys their check words, so whoever can read it reads every tenant's KV, and
// whoever can write it changes live objects or forges ones that a warm restart
// serves under any key. So the service uses only a file of its own: one it
// creates (O_EXCL, mode 0600), or one that is a regular file owned by its
// user with no group or other permission bits, reached through directories
// that no other user can change (owned by the service's user or root, and
// not writable by others unless sticky, as /dev/shm is). Anything else is
// refused with ErrUnsafe, naming the fix; nothing in such a file is read.

// openOwn opens the arena file at path for the service's user, creating it
// when it is missing; created reports whether it did.
func openOwn(path string) (fd int, created bool, err error) {
	if err := checkDirs(path); err != nil {
		return -1, false, err
	}
	// A file removed between the two opens is created on the next round; one
	// that keeps coming and going is someone else's game.
	for range 3 {
		fd, err = unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err == nil {
			return fd, true, nil
		}
		if err != unix.EEXIST {
			return -1, false, openErr(path, err)
		}
		// Looked at before it is opened: opening a device or a FIFO that
		// someone put there could block or have effects of its own.
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err == unix.ENOENT {
			continue
		} else if err != nil {
			return -1, false, openErr(path, err)
		}
		if err := ownFile(path, &st); err != nil {
			return -1, false, err
		}
		fd, err = unix.Open(path, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err == unix.ENOENT {
			continue
		}
		if err != nil {
			return -1, false, openErr(path, err)
		}
		var now unix.Stat_t
		err = unix.Fstat(fd, &now)
		if err == nil && (now.Dev != st.Dev || now.Ino != st.Ino) {
			err = fmt.Errorf("arena file %s was replaced while it was opened: %w", path, ErrUnsafe)
		} else if err == nil {
			err = ownFile(path, &now)
		}
		if err != nil {
			_ = unix.Close(fd)
			return -1, false, err
		}
		return fd, false, nil
	}
	return -1, false, fmt.Errorf("arena file %s keeps appearing and disappearing while it is opened: another process is creating and removing it: %w", path, ErrUnsafe)
}

func openErr(path string, err error) error {
	return fmt.Errorf("arena file %s: %v; give --arena-file a path on a tmpfs this user can write, or '' for an anonymous arena: %w", path, err, ErrFile)
}

// ownFile refuses a file that is not a regular file of the service's user
// with no group or other permission bits.
func ownFile(path string, st *unix.Stat_t) error {
	uid := uint32(os.Geteuid())
	switch {
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		return fmt.Errorf("arena file %s is a symbolic link; the service follows none there: remove it, or name the file itself: %w", path, ErrUnsafe)
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return fmt.Errorf("arena file %s is not a regular file: remove it, or give --arena-file another path: %w", path, ErrFile)
	case st.Uid != uid:
		return fmt.Errorf("arena file %s belongs to uid %d, not to this service's user (uid %d): its owner could read and change every object in it; "+
			"remove it (the service then creates its own, mode 0600), or chown it to uid %d if this service made it: %w", path, st.Uid, uid, uid, ErrUnsafe)
	case st.Mode&0o077 != 0:
		return fmt.Errorf("arena file %s has mode %#o: other users may read or write it, and may hold it open already; "+
			"remove it (the service then creates a new one, mode 0600), or chmod 600 it if no other user can have opened it: %w", path, st.Mode&0o7777, ErrUnsafe)
	}
	return nil
}

// checkDirs refuses a path whose directories another user could change: one
// who can write a directory on the way can put a file of their own, or a
// symbolic link, where the arena file is looked for. Both the path as given
// and the directories it resolves to are checked, up to the root.
func checkDirs(path string) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return openErr(path, err)
	}
	dir := filepath.Dir(abs)
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return fmt.Errorf("arena file %s: its directory: %v; create it (mode 0700), or give --arena-file a path on a tmpfs this user can write: %w", path, err, ErrFile)
	}
	if err := checkChain(path, dir); err != nil || real == dir {
		return err
	}
	return checkChain(path, real)
}

// checkChain checks dir and every directory above it.
func checkChain(path, dir string) error {
	uid := uint32(os.Geteuid())
	for d := dir; ; d = filepath.Dir(d) {
		var st unix.Stat_t
		if err := unix.Lstat(d, &st); err != nil {
			return fmt.Errorf("arena file %s: directory %s: %v: %w", path, d, err, ErrFile)
		}
		kind := "directory"
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			kind = "symbolic link"
		}
		switch {
		case st.Uid != uid && st.Uid != 0:
			return fmt.Errorf("arena file %s: the %s %s belongs to uid %d, neither this service's user (uid %d) nor root: its owner could put a file of their own where the arena file is; "+
				"give --arena-file a path in a directory of this user's (e.g. its runtime directory), or chown %s to uid %d: %w", path, kind, d, st.Uid, uid, d, uid, ErrUnsafe)
		case kind == "directory" && st.Mode&0o022 != 0 && st.Mode&unix.S_ISVTX == 0:
			return fmt.Errorf("arena file %s: the directory %s has mode %#o: other users can write it (and it is not sticky), so they could replace the arena file; "+
				"chmod go-w %s, or give --arena-file a path in a directory only this user can write: %w", path, d, st.Mode&0o7777, d, ErrUnsafe)
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

// lockHolder names the process that holds the flock on the file of st (from
// /proc/locks): its pid and command, or 0 when none is found (no /proc, or
// another pid namespace).
func lockHolder(st *unix.Stat_t) (pid int, comm string) {
	f, err := os.Open("/proc/locks")
	if err != nil {
		return 0, ""
	}
	defer f.Close()
	id := fmt.Sprintf("%02x:%02x:%d", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	lines := bufio.NewScanner(f)
	for lines.Scan() {
		// "1: FLOCK  ADVISORY  WRITE 4242 00:1a:1234 0 EOF"; waiters have "->".
		f := strings.Fields(lines.Text())
		if len(f) < 6 || f[1] != "FLOCK" || f[5] != id {
			continue
		}
		if pid, err = strconv.Atoi(f[4]); err != nil || pid <= 0 {
			return 0, ""
		}
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		return pid, strings.TrimSpace(string(b))
	}
	return 0, ""
}
