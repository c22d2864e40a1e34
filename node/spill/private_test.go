package spill

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/storage"
)

// nobody is the uid (and gid) the tests act as another local user with.
const nobody = 65534

// needRoot skips t where it cannot act as another user (outside CI).
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		skipOutsideCI(t, "acting as another user (chown, setuid) needs root; CI runs as root")
	}
}

// logBuf is a slog handler's output that tests read while the spill writes.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// count is how many lines hold s.
func (l *logBuf) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), s)
}

func logTo(cfg *Config) *logBuf {
	l := &logBuf{}
	cfg.Logger = slog.New(slog.NewTextHandler(l, nil))
	return l
}

// traversable makes the directories above dir (up to the test's temporary
// root) enterable by everyone, as /var/lib or a mount point are, so that
// only the spill's own modes stand between another user and its files.
func traversable(t *testing.T, dir string) {
	t.Helper()
	for d := filepath.Dir(dir); d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// asNobody runs argv as uid and gid 65534 and returns its combined output
// and whether it succeeded.
func asNobody(t *testing.T, argv ...string) (string, bool) {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	out, err := cmd.CombinedOutput()
	return string(out), err == nil
}

// A spill New creates is private: the directory 0700, every file in it 0600,
// and another local user can neither list it nor read a segment, a hint file
// or the lock. Before, segments were 0644 in a 0755 directory: every local
// user read every tenant's evicted objects and key names.
func TestSpillIsPrivate(t *testing.T) {
	needRoot(t)
	dir := filepath.Join(t.TempDir(), "spill")
	traversable(t, dir)
	cfg := testConfig(dir)
	s := open(t, cfg)
	for i := 0; i < 40; i++ {
		put(t, s, fmt.Sprintf("tenant-a/secret-%d", i), data(30_000, i))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dir)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("the spill directory: %v, mode %v; want 0700", err, fi.Mode())
	}
	names, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, d := range names {
		fi, err := d.Info()
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 || !fi.Mode().IsRegular() {
			t.Errorf("%s: mode %v; want a regular file, 0600", d.Name(), fi.Mode())
		}
		kinds[filepath.Ext(d.Name())]++
	}
	if kinds[".seg"] < 2 || kinds[".hint"] < 2 || kinds[".lock"] != 1 {
		t.Fatalf("files of the spill: %v", kinds)
	}
	if out, ok := asNobody(t, "ls", dir); ok || !strings.Contains(out, "Permission denied") {
		t.Errorf("another user lists the spill directory: %q", out)
	}
	for _, name := range []string{segmentName(1), hintName(1), lockName} {
		if out, ok := asNobody(t, "cat", filepath.Join(dir, name)); ok || !strings.Contains(out, "Permission denied") {
			t.Errorf("another user reads %s: %q", name, out)
		}
	}
	// With the directory opened up by hand, the files still say no.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	defer os.Chmod(dir, 0o700)
	if out, ok := asNobody(t, "cat", filepath.Join(dir, segmentName(1))); ok || !strings.Contains(out, "Permission denied") {
		t.Errorf("another user reads a segment of a 0755 directory: %q", out)
	}
}

// An existing directory that is not private to the service's user is
// refused, with the chown or chmod that fixes it: another user's directory
// (its owner plants segments the service serves as its own keys), one the
// group or others may write (links and files planted under the spill's
// names), one they may read that holds files not the spill's (its mode is
// the operator's to change), and a link to the directory that another user
// owns. Before, every one of them was used.
func TestUnsafeDirRefused(t *testing.T) {
	needRoot(t)
	other := func(t *testing.T, dir string) {
		if err := os.WriteFile(filepath.Join(dir, "notes.txt"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name, fix string
		prepare   func(t *testing.T, dir string) string
	}{
		{"another user's", "chown", func(t *testing.T, dir string) string { chown(t, dir); return dir }},
		{"world-writable", "chmod 700", func(t *testing.T, dir string) string { chmod(t, dir, 0o777); return dir }},
		{"sticky like /tmp", "chmod 700", func(t *testing.T, dir string) string { chmod(t, dir, 0o1777); return dir }},
		{"group-writable", "chmod 700", func(t *testing.T, dir string) string { chmod(t, dir, 0o770); return dir }},
		{"world-readable and shared", "chmod 700", func(t *testing.T, dir string) string { other(t, dir); chmod(t, dir, 0o755); return dir }},
		{"group-readable and shared", "chmod 700", func(t *testing.T, dir string) string { other(t, dir); chmod(t, dir, 0o750); return dir }},
		{"another user's link", "remove it", func(t *testing.T, dir string) string {
			link := dir + ".link"
			if err := os.Symlink(dir, link); err != nil {
				t.Fatal(err)
			}
			if err := os.Lchown(link, nobody, nobody); err != nil {
				t.Fatal(err)
			}
			return link
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := privateTempDir(t)
			cfg := testConfig(dir)
			cfg.Dir = c.prepare(t, dir)
			fi, _ := os.Lstat(dir)
			s, err := New(cfg)
			if err == nil {
				s.Close()
				t.Fatalf("New on a %s directory: accepted", c.name)
			}
			if !errors.Is(err, ErrUnsafeDir) || !errors.Is(err, storage.ErrConfig) || !strings.Contains(err.Error(), c.fix) {
				t.Fatalf("New on a %s directory: %v; want ErrUnsafeDir and ErrConfig, naming the fix %q", c.name, err, c.fix)
			}
			if _, err := os.Lstat(filepath.Join(dir, lockName)); !os.IsNotExist(err) {
				t.Fatalf("New created its lock file in a refused directory: %v", err)
			}
			if now, _ := os.Lstat(dir); now.Mode() != fi.Mode() {
				t.Fatalf("New changed a refused directory's mode from %v to %v", fi.Mode(), now.Mode())
			}
		})
	}
	// A link of this user's to a private directory is fine.
	dir := privateTempDir(t)
	if err := os.Symlink(dir, dir+".link"); err != nil {
		t.Fatal(err)
	}
	open(t, testConfig(dir+".link"))
}

// A directory of this user's that the group or others may only read or
// enter, and that holds nothing but the spill's files (an earlier version
// created it 0755; t.TempDir's are), is made 0700 with one log line, and its
// objects are served.
func TestReadableDirMadePrivate(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	chmod(t, dir, 0o755)
	s := open(t, cfg)
	put(t, s, "k", data(30_000, 1))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []os.FileMode{0o755, 0o750, 0o711} {
		chmod(t, dir, mode)
		log := logTo(&cfg)
		s := open(t, cfg)
		mustGet(t, s, "k", data(30_000, 1))
		if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
			t.Fatalf("a %v directory of the spill's files: %v, now %v; want 0700", mode, err, fi.Mode())
		}
		if n := log.count("it is now private (mode 0700)"); n != 1 || !strings.Contains(log.b.String(), fmt.Sprintf("was=%04o", mode)) {
			t.Fatalf("%d log lines about the directory made private, want 1:\n%s", n, log.b.String())
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func chown(t *testing.T, path string) {
	t.Helper()
	if err := os.Chown(path, nobody, nobody); err != nil {
		t.Fatal(err)
	}
}

func chmod(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	if err := os.Chmod(path, mode|os.FileMode(0)); err != nil {
		t.Fatal(err)
	}
	if mode&0o1000 != 0 {
		if err := unix.Chmod(path, uint32(mode.Perm())|unix.S_ISVTX); err != nil {
			t.Fatal(err)
		}
	}
}

// Links planted under the names the spill writes are never followed: a
// symlinked spill.lock makes New fail instead of creating the file it names,
// and a symlinked temporary of a hint file is replaced, not written through.
// Before, root created and overwrote whatever file the links named.
func TestPlantedLinksNotFollowed(t *testing.T) {
	dir := privateTempDir(t)
	victim := filepath.Join(t.TempDir(), "victim")
	cfg := testConfig(dir)
	if err := os.Symlink(victim, filepath.Join(dir, lockName)); err != nil {
		t.Fatal(err)
	}
	if s, err := New(cfg); err == nil || !errors.Is(err, ErrUnsafeDir) || !strings.Contains(err.Error(), "rm ") {
		if s != nil {
			s.Close()
		}
		t.Fatalf("New with spill.lock a link: %v; want ErrUnsafeDir naming the rm", err)
	}
	if _, err := os.Lstat(victim); !os.IsNotExist(err) {
		t.Fatalf("New created the file the lock link names: %v", err)
	}
	if err := os.Remove(filepath.Join(dir, lockName)); err != nil {
		t.Fatal(err)
	}

	const want = "not the spill's"
	if err := os.WriteFile(victim, []byte(want), 0o600); err != nil {
		t.Fatal(err)
	}
	// The first segment's hint file is written once the second starts, and
	// the rest at Close; a stale temporary of the spill's own is replaced too.
	for id := uint32(1); id <= 8; id++ {
		tmp := filepath.Join(dir, hintName(id)+".tmp")
		if id%2 == 0 {
			if err := os.WriteFile(tmp, []byte("stale"), 0o600); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.Symlink(victim, tmp); err != nil {
			t.Fatal(err)
		}
	}
	s := open(t, cfg)
	// Planted after New, as a user who could write the directory would: a
	// link, and a stale temporary (O_EXCL must not trip on it).
	if err := os.Symlink(victim, filepath.Join(dir, hintName(3)+".tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, hintName(2)+".tmp"), []byte("stale"), 0o600); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 120; i++ {
		put(t, s, fmt.Sprintf("k%d", i), data(30_000, i))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(victim); err != nil || string(b) != want {
		t.Fatalf("the file a link named: %q, %v; want it untouched", b, err)
	}
	hints, _ := filepath.Glob(filepath.Join(dir, "*.hint"))
	if int64(len(hints)) != s.Stats().Files || len(hints) < 4 {
		t.Fatalf("%d hint files for %d segments", len(hints), s.Stats().Files)
	}
	for _, h := range hints {
		if fi, err := os.Lstat(h); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v; want a regular file, 0600", h, fi.Mode(), err)
		}
	}
	if tmps, _ := filepath.Glob(filepath.Join(dir, "*.tmp")); len(tmps) != 0 {
		t.Fatalf("temporaries left: %v", tmps)
	}
	s = open(t, cfg)
	for i := 0; i < 120; i++ {
		mustGet(t, s, fmt.Sprintf("k%d", i), data(30_000, i))
	}
}
