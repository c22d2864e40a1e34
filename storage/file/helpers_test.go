package file

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/kvlayout"
	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/storage"
	"github.com/stratakv/strata/storage/storagetest"
)

var bg = context.Background()

// fixture is a store with a registered pool group and a chain of keys.
type fixture struct {
	t    *testing.T
	s    *Store
	g    *storagetest.Group
	keys []pagekey.Key
}

var (
	mhaPools = []pool.PoolSpec{{Name: pagekey.TargetPool, Geometry: storagetest.TargetGeometry}, {Name: pagekey.DraftPool, Geometry: storagetest.DraftGeometry}}
	// bigGeometry has 32 KiB object parts.
	bigGeometry = kvlayout.Geometry{Layers: 8, KVHeads: 8, HeadDim: 64, DTypeBytes: 2}
)

func newFixture(t *testing.T, cfg Config, pools []pool.PoolSpec) *fixture {
	t.Helper()
	s := newStore(t, cfg)
	g := storagetest.NewGroup(t, s, kvlayout.PageFirst, storagetest.PageSize, pools)
	storagetest.Register(t, s, g)
	f := &fixture{t: t, s: s, g: g, keys: storagetest.Keys(t, 42, 16)}
	for _, p := range g.Pools() {
		for i := 0; i < 16; i++ {
			storagetest.Fill(g.Spec(p.Name()), pool.PageID(i), i, 0)
		}
	}
	return f
}

// put stores keys[i] from page i for each i in idx, all in one batch, and fails on any error.
func (f *fixture) put(poolName string, idx ...int) {
	f.t.Helper()
	for i, err := range f.s.Put(bg, poolName, f.pick(idx), pages(idx)) {
		if err != nil {
			f.t.Fatalf("put %s key %d: %v", poolName, idx[i], err)
		}
	}
}

// get reads keys[i] for each i in idx into pages 32+i and checks what came back.
func (f *fixture) get(poolName string, idx ...int) []error {
	f.t.Helper()
	dst := make([]int, len(idx))
	for i, k := range idx {
		dst[i] = 32 + k
	}
	errs := f.s.Get(bg, poolName, f.pick(idx), pages(dst))
	for i, err := range errs {
		if err == nil {
			if cerr := storagetest.Check(f.g.Spec(poolName), pool.PageID(dst[i]), idx[i], 0); cerr != nil {
				f.t.Fatal(cerr)
			}
		}
	}
	return errs
}

func (f *fixture) exists(poolName string, idx ...int) int {
	f.t.Helper()
	n, err := f.s.Exists(bg, poolName, f.pick(idx))
	if err != nil {
		f.t.Fatalf("Exists: %v", err)
	}
	return n
}

func (f *fixture) pick(idx []int) []pagekey.Key {
	out := make([]pagekey.Key, len(idx))
	for i, k := range idx {
		out[i] = f.keys[k]
	}
	return out
}

// file is the path of part of key i's object in pool poolName.
func (f *fixture) file(poolName string, i, part int) string {
	spec := f.g.Spec(poolName)
	name := storage.ObjectNames(spec, f.keys[i])[part]
	return filepath.Join(f.s.Dir(), relPath(f.keys[i], name))
}

func pages(idx []int) []pool.PageID {
	out := make([]pool.PageID, len(idx))
	for i, p := range idx {
		out[i] = pool.PageID(p)
	}
	return out
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// walk lists the files under dir: object files and temporary files.
func walk(t *testing.T, dir string) (objects, temps []string) {
	t.Helper()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			if strings.HasPrefix(d.Name(), tempPrefix) {
				temps = append(temps, path)
			} else {
				objects = append(objects, path)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return objects, temps
}

// skipOrFail skips a test that cannot run here, except in CI, where it fails.
func skipOrFail(t *testing.T, reason string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(reason)
	}
	t.Skip(reason)
}

// mount mounts a filesystem at target for the rest of the test, or skips. Mounting
// needs CAP_SYS_ADMIN, which a CI container may lack even as root; the faults these
// tests stage on a real filesystem (a full tmpfs, a read-only directory, ramfs
// without O_DIRECT) are staged without mounts too (a capacity limit, forced
// fallbacks), so a missing capability skips rather than fails, in CI as well.
func mount(t *testing.T, source, target, fstype string, flags uintptr, data string) {
	t.Helper()
	if err := unix.Mount(source, target, fstype, flags, data); err != nil {
		if err == unix.EPERM || err == unix.EACCES {
			t.Skipf("cannot mount %s at %s (%v): needs CAP_SYS_ADMIN", fstype, target, err)
		}
		skipOrFail(t, fmt.Sprintf("cannot mount %s at %s (%v)", fstype, target, err))
	}
	t.Cleanup(func() {
		if err := unix.Unmount(target, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", target, err)
		}
	})
}

func expectErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: %v, want %v", what, err, want)
	}
}
