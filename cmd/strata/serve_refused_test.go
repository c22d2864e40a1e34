package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/node"
	"github.com/stratakv/strata/node/spill"
	"github.com/stratakv/strata/storage"
)

// fileTree is what a walk of some directories finds: every path with its type,
// permissions and, for a regular file, its size and a digest of its bytes.
type fileTree map[string]string

func snapshotTree(t *testing.T, roots ...string) fileTree {
	t.Helper()
	tree := fileTree{}
	for _, root := range roots {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			desc := fmt.Sprintf("%v", fi.Mode())
			if fi.Mode().IsRegular() {
				b, err := os.ReadFile(path)
				if err != nil {
					return err
				}
				desc += fmt.Sprintf(" %d bytes %x", len(b), sha256.Sum256(b))
			}
			tree[path] = desc
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return tree
}

// diff says how after differs from t, one line per path.
func (t fileTree) diff(after fileTree) string {
	var lines []string
	for p, was := range t {
		switch now, ok := after[p]; {
		case !ok:
			lines = append(lines, "removed: "+p+" ("+was+")")
		case now != was:
			lines = append(lines, "changed: "+p+": "+was+" -> "+now)
		}
	}
	for p, now := range after {
		if _, ok := t[p]; !ok {
			lines = append(lines, "left behind: "+p+" ("+now+")")
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// warmArenaFile leaves at path the arena file of a service that ran on it
// and stopped cleanly: what a restart would find warm.
func warmArenaFile(t *testing.T, path string) {
	t.Helper()
	cfg := node.DefaultConfig(filepath.Join(shortDir(t), "w.sock"))
	cfg.ArenaBytes, cfg.ArenaFile, cfg.Admin = 8<<20, path, ""
	srv, err := node.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
}

// spillBefore leaves in base/spill the spill of a service that spilled an
// object and stopped, and returns its directory.
func spillBefore(t *testing.T, base string) string {
	t.Helper()
	dir := filepath.Join(base, "spill")
	sp, err := spill.New(spill.DefaultConfig(dir))
	if err != nil {
		t.Fatal(err)
	}
	if err := sp.PutObject(context.Background(), "k", storage.Format(7), []byte("an object the service before spilled")); err != nil {
		t.Fatal(err)
	}
	if err := sp.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

// lockFile holds an flock on path (created if missing) until the test ends,
// as another service would.
func lockFile(t *testing.T, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
}

// A start that is refused, whatever refuses it, leaves the file system as it
// found it: what it created (directories, the spill's lock file, the socket,
// an arena file) is removed, and nothing that was there is touched: not an
// arena file holding the cache of the service before (byte for byte), not a
// directory or a lock file that was there.
func TestServeRefusedStartLeavesNothingBehind(t *testing.T) {
	shm, err := os.MkdirTemp("/dev/shm", "strata-refused-")
	if err != nil {
		t.Skipf("no /dev/shm for arena files: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(shm) })
	for _, c := range []struct {
		name string
		// setup prepares base (a directory on the test's temporary file
		// system) and shm (one on tmpfs) and returns the flags to add and
		// the words the refusal must say.
		setup func(t *testing.T, base, shm string) (args []string, want string)
	}{
		{"bad config", func(t *testing.T, base, shm string) ([]string, string) {
			return []string{"--high-watermark", "2", "--spill-dir", filepath.Join(base, "spill"), "--arena-file", filepath.Join(shm, "new", "arena")}, "--high-watermark"
		}},
		{"ambiguous size", func(t *testing.T, base, shm string) ([]string, string) {
			return []string{"--arena", "4GB", "--spill-dir", filepath.Join(base, "spill")}, "write 4GiB"
		}},
		{"spill dir under a file", func(t *testing.T, base, shm string) ([]string, string) {
			write(t, filepath.Join(base, "file"), "not a directory")
			return []string{"--spill-dir", filepath.Join(base, "file", "spill"), "--arena-file", filepath.Join(shm, "new", "arena")}, "--spill-dir"
		}},
		{"spill dir open to others", func(t *testing.T, base, shm string) ([]string, string) {
			dir := filepath.Join(base, "spill")
			mkdir(t, dir, 0o777)
			return []string{"--spill-dir", dir, "--arena-file", filepath.Join(shm, "new", "arena")}, "chmod 700"
		}},
		{"spill dir in use", func(t *testing.T, base, shm string) ([]string, string) {
			dir := filepath.Join(base, "spill")
			mkdir(t, dir, 0o700)
			lockFile(t, filepath.Join(dir, "spill.lock"))
			return []string{"--spill-dir", dir, "--arena-file", filepath.Join(shm, "new", "arena")}, "in use by another process"
		}},
		{"socket in use, new spill dir", func(t *testing.T, base, shm string) ([]string, string) {
			sock := filepath.Join(base, "s.sock")
			ln, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ln.Close() })
			return []string{"--socket", sock, "--spill-dir", filepath.Join(base, "new", "spill"), "--arena-file", filepath.Join(shm, "new", "arena")}, "--socket"
		}},
		{"socket in use, spill dir there before", func(t *testing.T, base, shm string) ([]string, string) {
			sock := filepath.Join(base, "s.sock")
			ln, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ln.Close() })
			dir := filepath.Join(base, "spill")
			mkdir(t, dir, 0o700)
			return []string{"--socket", sock, "--spill-dir", dir}, "--socket"
		}},
		{"socket in use, spill of the service before kept", func(t *testing.T, base, shm string) ([]string, string) {
			sock := filepath.Join(base, "s.sock")
			ln, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ln.Close() })
			return []string{"--socket", sock, "--spill-dir", spillBefore(t, base)}, "--socket"
		}},
		{"arena too big, spill of the service before kept", func(t *testing.T, base, shm string) ([]string, string) {
			return []string{"--arena", "1TiB", "--spill-dir", spillBefore(t, base), "--arena-file", filepath.Join(shm, "arena")}, "more memory"
		}},
		{"socket path too long", func(t *testing.T, base, shm string) ([]string, string) {
			sock := filepath.Join(base, "run", strings.Repeat("d", 100), "s.sock")
			return []string{"--socket", sock, "--spill-dir", filepath.Join(base, "spill")}, "--socket"
		}},
		{"admin port taken", func(t *testing.T, base, shm string) ([]string, string) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ln.Close() })
			return []string{"--admin", ln.Addr().String(), "--spill-dir", filepath.Join(base, "spill"), "--arena-file", filepath.Join(shm, "new", "arena")}, "--admin"
		}},
		{"arena too big, new arena file", func(t *testing.T, base, shm string) ([]string, string) {
			return []string{"--arena", "1TiB", "--spill-dir", filepath.Join(base, "spill"), "--arena-file", filepath.Join(shm, "new", "arena")}, "more memory"
		}},
		{"arena too big, warm arena file kept", func(t *testing.T, base, shm string) ([]string, string) {
			path := filepath.Join(shm, "arena")
			warmArenaFile(t, path)
			return []string{"--arena", "1TiB", "--spill-dir", filepath.Join(base, "spill"), "--arena-file", path}, "more memory"
		}},
		{"arena too big, arena file of no arena kept", func(t *testing.T, base, shm string) ([]string, string) {
			path := filepath.Join(shm, "arena")
			write(t, path, strings.Repeat("not an arena, and not the service's to empty on a refusal\n", 1000))
			return []string{"--arena", "1TiB", "--arena-file", path}, "more memory"
		}},
		{"arena file locked", func(t *testing.T, base, shm string) ([]string, string) {
			path := filepath.Join(shm, "arena")
			warmArenaFile(t, path)
			lockFile(t, path)
			return []string{"--spill-dir", filepath.Join(base, "spill"), "--arena-file", path}, "locked by another process"
		}},
		{"arena file off tmpfs", func(t *testing.T, base, shm string) ([]string, string) {
			var st unix.Statfs_t
			if err := unix.Statfs(base, &st); err != nil || st.Type == unix.TMPFS_MAGIC || st.Type == unix.RAMFS_MAGIC {
				t.Skipf("%s is on tmpfs here: no disk to refuse an arena file on", base)
			}
			return []string{"--spill-dir", filepath.Join(base, "spill"), "--arena-file", filepath.Join(base, "new", "arena")}, "not on tmpfs"
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			base, shm := shortDir(t), filepath.Join(shm, fmt.Sprintf("%x", sha256.Sum256([]byte(t.Name())))[:12])
			mkdir(t, shm, 0o700)
			t.Cleanup(func() { os.RemoveAll(shm) })
			args, want := c.setup(t, base, shm)
			before := snapshotTree(t, base, shm)
			args = append([]string{"--socket", filepath.Join(base, "run", "strata", "s.sock"), "--arena", "8MiB", "--admin", ""}, args...)
			code, errs := runServeCLI(t, args...)
			if code == 0 || !strings.Contains(errs, want) {
				t.Fatalf("serve %s: exit %d, want a refusal saying %q; stderr:\n%s", strings.Join(args, " "), code, want, errs)
			}
			if d := before.diff(snapshotTree(t, base, shm)); d != "" {
				t.Errorf("serve %s, refused, changed the file system:\n%s\nstderr:\n%s", strings.Join(args, " "), d, errs)
			}
		})
	}
}

func write(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

func mkdir(t *testing.T, dir string, mode os.FileMode) {
	t.Helper()
	if err := os.Mkdir(dir, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, mode); err != nil { // past the umask
		t.Fatal(err)
	}
}
