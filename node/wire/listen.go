package wire

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// maxSocketPath is the longest socket path the kernel takes (sun_path less its NUL).
const maxSocketPath = 107

// Dial connects to the node service listening on the socket at path.
func Dial(ctx context.Context, path string) (*Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("connect to node service at %s: %w", path, err)
	}
	return NewConn(c.(*net.UnixConn)), nil
}

// Listen creates the node service's socket at path and listens on it. The socket
// file gets mode's permission bits (0600 when mode is 0) and, when gid >= 0, group
// gid, before the socket accepts its first connection: so a mode of 0660 and the
// group of the engines' users lets them in and no one else. A socket file left by
// a service that is gone is replaced; one that a running service answers on is an
// error wrapping ErrInUse, and a path that is not a socket is never removed. The
// listener removes the socket file when it is closed.
func Listen(path string, mode os.FileMode, gid int) (*net.UnixListener, error) {
	if mode == 0 {
		mode = 0o600
	}
	if path == "" || path[0] == '@' {
		return nil, fmt.Errorf("listen on %q: give a file path (abstract sockets have no permissions): %w", path, ErrSocketPath)
	}
	if len(path) > maxSocketPath {
		return nil, fmt.Errorf("listen on %s: socket path is %d bytes, the kernel takes at most %d; use a shorter directory: %w", path, len(path), maxSocketPath, ErrSocketPath)
	}
	if err := removeStale(path); err != nil {
		return nil, err
	}
	fail := func(what string, err error, fd int) (*net.UnixListener, error) {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("listen on %s: %s: %w", path, what, err)
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: socket: %w", path, err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		switch {
		case errors.Is(err, unix.EROFS), errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM),
			errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR):
			_ = unix.Close(fd)
			return nil, fmt.Errorf("listen on %s: bind: %v; this user cannot create a socket in %s: choose a socket path "+
				"in a directory it can write (--socket; /run/strata under systemd's RuntimeDirectory, or $XDG_RUNTIME_DIR): %w",
				path, err, filepath.Dir(path), ErrSocketPath)
		}
		return fail("bind", err, fd)
	}
	// Until listen(2), connections are refused, so nobody gets in under the
	// umask's permissions.
	if err := os.Chmod(path, mode.Perm()); err != nil {
		_ = os.Remove(path)
		return fail("chmod", err, fd)
	}
	if gid >= 0 {
		if err := os.Lchown(path, -1, gid); err != nil {
			_ = os.Remove(path)
			return fail(fmt.Sprintf("chown to group %d", gid), err, fd)
		}
	}
	if err := unix.Listen(fd, unix.SOMAXCONN); err != nil {
		_ = os.Remove(path)
		return fail("listen", err, fd)
	}
	f := os.NewFile(uintptr(fd), path)
	l, err := net.FileListener(f)
	_ = f.Close() // FileListener holds its own descriptor
	if err != nil {
		_ = os.Remove(path)
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	ul := l.(*net.UnixListener)
	ul.SetUnlinkOnClose(true)
	return ul, nil
}

// removeStale removes a socket file at path that no service answers on.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("listen on %s: %w", path, err)
	}
	if fi.Mode().Type() != os.ModeSocket {
		return fmt.Errorf("listen on %s: the path exists and is not a socket (%s); remove it or choose another path: %w", path, fi.Mode().Type(), ErrSocketPath)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err == nil {
		_ = c.Close()
		return fmt.Errorf("listen on %s: another process is serving on it; stop it or choose another path: %w", path, ErrInUse)
	}
	if !errors.Is(err, unix.ECONNREFUSED) {
		return fmt.Errorf("listen on %s: probe the existing socket: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("listen on %s: remove stale socket: %w", path, err)
	}
	return nil
}
