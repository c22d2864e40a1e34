package storagebench

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// directAlign is the alignment O_DIRECT needs of buffer addresses, lengths and file
// offsets. 4 KiB covers every logical block size in use.
const directAlign = 4096

// probeDirectIO is directIOSupported; tests replace it to take the fallback paths
// on filesystems that accept O_DIRECT.
var probeDirectIO = directIOSupported

// directIOSupported reports whether the filesystem under dir accepts O_DIRECT
// writes (tmpfs, some overlay and network filesystems refuse them with EINVAL).
// dir must exist.
func directIOSupported(dir string) (bool, error) {
	f, err := os.CreateTemp(dir, ".odirect-probe-*")
	if err != nil {
		return false, fmt.Errorf("probe O_DIRECT in %s: %w", dir, err)
	}
	name := f.Name()
	_ = f.Close()
	defer os.Remove(name)
	fd, err := unix.Open(name, unix.O_WRONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.EINVAL) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("probe O_DIRECT in %s: %w", dir, err)
	}
	defer unix.Close(fd)
	// An aligned buffer outside the Go heap: one mapped page.
	buf, err := unix.Mmap(-1, 0, directAlign, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return false, fmt.Errorf("probe O_DIRECT in %s: map a buffer: %w", dir, err)
	}
	defer unix.Munmap(buf)
	if _, err := unix.Write(fd, buf); err != nil {
		if errors.Is(err, unix.EINVAL) {
			return false, nil
		}
		return false, fmt.Errorf("probe O_DIRECT in %s: %w", dir, err)
	}
	return true, nil
}

// aligned reports whether b can be moved with O_DIRECT.
func aligned(b []byte) bool {
	if len(b) == 0 || len(b)%directAlign != 0 {
		return false
	}
	return addrOf(b)%directAlign == 0
}

// dropFileCache writes back and evicts a file's pages from the page cache, so a
// later read comes from the device. The kernel treats it as advice.
func dropFileCache(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Fdatasync(int(f.Fd())); err != nil {
		return fmt.Errorf("fdatasync %s: %w", path, err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("fadvise %s: %w", path, err)
	}
	return nil
}

// dropTreeCache runs dropFileCache over every regular file under dir: how the run
// evicts a file store's objects without knowing their names.
func dropTreeCache(ctx context.Context, dir string) error {
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		return dropFileCache(path)
	})
}

// freeBytes is the space an unprivileged user can still write under dir.
func freeBytes(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}
