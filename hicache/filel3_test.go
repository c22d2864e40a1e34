package hicache

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/storage/file"
)

func newFileStore(t *testing.T, dir string, capacity int64) *file.Store {
	t.Helper()
	cfg := file.DefaultConfig(dir)
	cfg.Sync = false
	if capacity > 0 {
		cfg.CapacityBytes = capacity
	}
	s, err := file.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// Every object file in L3 has flipped bytes on disk: the next engine gets misses
// (and the faults are counted), never the damaged bytes, and keeps serving. (Torn
// files are misses already at Exists; the file backend's own tests cover them.)
func TestCorruptedFilesAreMissesNeverServed(t *testing.T) {
	dir := t.TempDir()
	a := seq(1, 10*testPS)
	warm(t, newFileStore(t, dir, 0), a)
	damaged := 0
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasPrefix(d.Name(), ".") {
			return err
		}
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		st, _ := f.Stat()
		// Flip bytes at the tail of the body: the file still looks whole (Exists
		// finds it), only its checksum can tell.
		old := make([]byte, 3)
		if _, err := f.ReadAt(old, st.Size()-3); err != nil {
			return err
		}
		_, err = f.WriteAt([]byte{^old[0], ^old[1], ^old[2]}, st.Size()-3)
		damaged++
		return err
	})
	if err != nil || damaged == 0 {
		t.Fatalf("damaged %d files: %v", damaged, err)
	}
	e := newEnvWith(t, l3Config(), 32, 64, Options{Storage: newFileStore(t, dir, 0)}, hostmem.Mmap)
	r := e.serveWith(t, a, pagekey.Namespace{}) // verifies whatever it served
	if r.HitTokens != 0 {
		t.Fatalf("hit %d tokens from damaged files", r.HitTokens)
	}
	if err := e.cache.Sync(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	if s := e.cache.Stats(); s.L3.Faults["corrupt"] == 0 || s.L3.ReservedPages != 0 {
		t.Fatalf("L3 stats %+v", s.L3)
	}
	// The cache recomputed and cached the prefix again; L3 heals as it backs up.
	if r := e.serveWith(t, a, pagekey.Namespace{}); r.L1Tokens != 10*testPS {
		t.Fatalf("after recompute: %+v", r)
	}
}

// An L3 too small for one object: backups fail with no space, counted, and L1/L2
// keep serving.
func TestFullL3KeepsServing(t *testing.T) {
	e := newEnvWith(t, l3Config(), 8, 32, Options{Storage: newFileStore(t, t.TempDir(), 4096)}, hostmem.Mmap)
	a := seq(1, 6*testPS)
	e.serve(t, a)
	e.serve(t, seq(2, 6*testPS))
	if r := e.serve(t, a); r.HitTokens != 6*testPS {
		t.Fatalf("L2 hit with a full L3: %+v", r)
	}
	if err := e.cache.Sync(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	if s := e.cache.Stats(); s.L3.Faults["no_space"] == 0 || s.L3.BackedUpTokens != 0 {
		t.Fatalf("L3 stats %+v", s.L3)
	}
}
