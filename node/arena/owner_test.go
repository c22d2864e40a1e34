package arena

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Whose arena file (owner.go). The tests run as root, so "another user" is
// uid 65534: files and directories chowned to it, or a child process running
// as it.

const otherUID = 65534

// requireRoot skips (fails under CI) where the test cannot chown or run as
// another user.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("the ownership tests chown files to another user: run them as root")
	}
	t.Skip("the ownership tests chown files to another user: run them as root")
}

// newTimed is New, failing the test if it takes more than 20 s: a refusal
// must never be a hang.
func newTimed(t *testing.T, cfg Config) (*Arena, error) {
	t.Helper()
	type result struct {
		a   *Arena
		err error
	}
	ch := make(chan result, 1)
	go func() { a, err := New(cfg); ch <- result{a, err} }()
	select {
	case r := <-ch:
		if r.a != nil {
			t.Cleanup(func() { _ = r.a.Close() })
		}
		return r.a, r.err
	case <-time.After(20 * time.Second):
		t.Fatal("New did not return within 20 s")
		return nil, nil
	}
}

// asOther runs the command as uid and gid 65534, and returns its combined output.
func asOther(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: otherUID, Gid: otherUID}}
	return cmd
}

// An arena file, or a directory above it, that another user made or can
// change is refused, naming the fix, and nothing in it is read or changed.
func TestFileNotOwnRefused(t *testing.T) {
	requireRoot(t)
	for _, c := range []struct {
		name  string
		setup func(t *testing.T, dir string) string // returns the arena file's path
		want  []string                              // in the error
	}{
		{"another user's file", func(t *testing.T, dir string) string {
			p := oldArenaFile(t, dir)
			must(t, os.Chown(p, otherUID, otherUID))
			return p
		}, []string{"belongs to uid 65534", "remove it", "chown it to uid 0"}},
		{"a file others can read", func(t *testing.T, dir string) string {
			p := oldArenaFile(t, dir)
			must(t, os.Chmod(p, 0o644))
			return p
		}, []string{"mode 0644", "remove it", "chmod 600"}},
		{"a symbolic link to our own file", func(t *testing.T, dir string) string {
			p := oldArenaFile(t, dir)
			link := filepath.Join(dir, "link")
			must(t, os.Symlink(p, link))
			return link
		}, []string{"symbolic link", "remove it"}},
		{"a directory of another user", func(t *testing.T, dir string) string {
			d := filepath.Join(dir, "theirs")
			must(t, os.Mkdir(d, 0o755))
			must(t, os.Chown(d, otherUID, otherUID))
			return filepath.Join(d, "arena")
		}, []string{"belongs to uid 65534", "/theirs to uid 0"}},
		{"a directory above it of another user", func(t *testing.T, dir string) string {
			d := filepath.Join(dir, "theirs")
			must(t, os.Mkdir(d, 0o755))
			must(t, os.Mkdir(filepath.Join(d, "ours"), 0o700))
			must(t, os.Chown(d, otherUID, otherUID))
			return filepath.Join(d, "ours", "arena")
		}, []string{"belongs to uid 65534"}},
		{"a directory all can write, not sticky", func(t *testing.T, dir string) string {
			d := filepath.Join(dir, "open")
			must(t, os.Mkdir(d, 0o700))
			must(t, os.Chmod(d, 0o777))
			return filepath.Join(d, "arena")
		}, []string{"mode 0777", "chmod go-w"}},
		{"a symbolic link of another user on the way", func(t *testing.T, dir string) string {
			d := filepath.Join(dir, "ours")
			must(t, os.Mkdir(d, 0o700))
			link := filepath.Join(dir, "via")
			must(t, os.Symlink(d, link))
			must(t, os.Lchown(link, otherUID, otherUID))
			return filepath.Join(link, "arena")
		}, []string{"symbolic link ", "/via belongs to uid 65534"}},
		{"a link to a directory of another user", func(t *testing.T, dir string) string {
			d := filepath.Join(dir, "theirs")
			must(t, os.Mkdir(d, 0o755))
			must(t, os.Chown(d, otherUID, otherUID))
			must(t, os.Symlink(d, filepath.Join(dir, "via")))
			return filepath.Join(dir, "via", "arena")
		}, []string{"belongs to uid 65534"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := shmDir(t)
			path := c.setup(t, dir)
			before := fileBytes(t, path)
			_, err := newTimed(t, fileConfig(t, path, 4<<20))
			if !errors.Is(err, ErrUnsafe) || !errors.Is(err, ErrFile) {
				t.Fatalf("New: %v, want ErrUnsafe", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the error does not say %q: %v", w, err)
				}
			}
			if after := fileBytes(t, path); !bytes.Equal(before, after) {
				t.Fatalf("the refused file changed: %d bytes before, %d after", len(before), len(after))
			}
		})
	}
}

// What a new arena file is: a regular file of the service's user, mode 0600,
// also in a sticky directory all can write (as /dev/shm is).
func TestFileCreatedOwn(t *testing.T) {
	requireRoot(t)
	dir := filepath.Join(shmDir(t), "sticky")
	must(t, os.Mkdir(dir, 0o700))
	must(t, unix.Chmod(dir, 0o1777))
	must(t, os.Chmod(filepath.Dir(dir), 0o755)) // so that only the file's mode keeps the other user out
	path := filepath.Join(dir, "arena")
	a, err := newTimed(t, fileConfig(t, path, 4<<20))
	if err != nil {
		t.Fatal(err)
	}
	put(t, a, "k", 1, 5000)
	var st unix.Stat_t
	must(t, unix.Stat(path, &st))
	if st.Uid != uint32(os.Geteuid()) || st.Mode&0o777 != 0o600 {
		t.Fatalf("arena file uid %d mode %#o, want %d and 0600", st.Uid, st.Mode&0o777, os.Geteuid())
	}
	// Another user can neither read nor write it.
	for _, cmd := range []*exec.Cmd{asOther("cat", path), asOther("sh", "-c", ": >> "+path)} {
		if out, err := cmd.CombinedOutput(); err == nil {
			t.Fatalf("%v as uid %d succeeded: %s", cmd.Args, otherUID, out)
		}
	}
}

// Another user who creates the arena file first, and holds a lock on it, does
// not get it used (their bytes read, or forged objects served), nor keep the
// service waiting: it is refused at once, naming the fix.
func TestFileMadeFirstByAnotherUser(t *testing.T) {
	requireRoot(t)
	if _, err := exec.LookPath("flock"); err != nil {
		t.Skip("no flock(1)")
	}
	dir := filepath.Join(shmDir(t), "shared")
	must(t, os.Mkdir(dir, 0o700))
	must(t, unix.Chmod(dir, 0o1777))
	must(t, os.Chmod(filepath.Dir(dir), 0o755))
	path := filepath.Join(dir, "arena")
	holder := asOther("flock", path, "sleep", "60")
	must(t, holder.Start())
	t.Cleanup(func() { _ = holder.Process.Kill(); _ = holder.Wait() })
	waitFor(t, "the other user's lock", func() bool { _, err := os.Stat(path); return err == nil })

	_, err := newTimed(t, fileConfig(t, path, 4<<20))
	if !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), "belongs to uid 65534") {
		t.Fatalf("New on a file another user made and locks: %v", err)
	}
	if st, _ := os.Stat(path); st.Size() != 0 {
		t.Fatalf("the other user's file was changed: %d bytes", st.Size())
	}
}

// A lock that another process of the service's user holds is refused at once,
// naming that process.
func TestFileLockedByAnotherProcess(t *testing.T) {
	if _, err := exec.LookPath("flock"); err != nil {
		t.Skip("no flock(1)")
	}
	path := filepath.Join(shmDir(t), "a")
	a := newArena(t, fileConfig(t, path, 4<<20))
	must(t, a.Close())
	holder := exec.Command("flock", path, "sleep", "60")
	must(t, holder.Start())
	t.Cleanup(func() { _ = holder.Process.Kill(); _ = holder.Wait() })
	waitFor(t, "the lock", func() bool {
		b, _ := os.ReadFile("/proc/locks")
		return bytes.Contains(b, []byte(fmt.Sprintf(" %d ", holder.Process.Pid)))
	})
	_, err := newTimed(t, fileConfig(t, path, 4<<20))
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "locked by another process (flock)") ||
		!strings.Contains(err.Error(), fmt.Sprintf("pid %d", holder.Process.Pid)) {
		t.Fatalf("New on a file another process locks: %v", err)
	}
}

// A FIFO or a device where the arena file should be is refused without being
// opened (an open could block).
func TestFileNotRegularRefused(t *testing.T) {
	path := filepath.Join(shmDir(t), "fifo")
	must(t, unix.Mkfifo(path, 0o600))
	if _, err := newTimed(t, fileConfig(t, path, 4<<20)); !errors.Is(err, ErrFile) || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("New on a FIFO: %v", err)
	}
}

// oldArenaFile leaves in dir the file of an arena that held an object and
// closed, and returns its path.
func oldArenaFile(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "arena")
	a := newArena(t, fileConfig(t, p, 4<<20))
	put(t, a, "secret", 1, 3000)
	must(t, a.Close())
	return p
}

// fileBytes is what the file at path holds (nil when there is none).
func fileBytes(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return b
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
