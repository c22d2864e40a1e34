package file

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stratakv/strata/storage"
)

func TestObjectAPI(t *testing.T) {
	dir := t.TempDir()
	s := newStore(t, testConfig(dir, nil))
	ctx := context.Background()
	a := bytes.Repeat([]byte("abcdefgh"), 1000)
	b := bytes.Repeat([]byte{7}, 5000)
	if err := s.PutObject(ctx, "obj:1_0_k", 42, a, b); err != nil {
		t.Fatal(err)
	}
	if n, err := s.ObjectSize(ctx, "obj:1_0_k", 42); err != nil || n != int64(len(a)+len(b)) {
		t.Fatalf("ObjectSize = %d, %v", n, err)
	}
	if _, err := s.ObjectSize(ctx, "obj:1_0_k", 43); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("size in another format: %v", err)
	}
	// Read into differently split runs.
	got := make([]byte, len(a)+len(b))
	if err := s.GetObject(ctx, "obj:1_0_k", 42, got[:3], got[3:7777], got[7777:]); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, append(append([]byte(nil), a...), b...)) {
		t.Fatal("object bytes differ")
	}
	// Write-once, even for a put of another length.
	if err := s.PutObject(ctx, "obj:1_0_k", 42, b); err != nil {
		t.Fatalf("second put: %v", err)
	}
	if err := s.GetObject(ctx, "obj:1_0_k", 42, got); err != nil || got[0] != 'a' {
		t.Fatalf("object changed by a second put: %v", err)
	}
	if err := s.GetObject(ctx, "obj:1_0_k", 42, got[:10]); !errors.Is(err, storage.ErrBatch) {
		t.Fatalf("get with the wrong length: %v", err)
	}
	if err := s.GetObject(ctx, "obj:missing", 42, got); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("missing object: %v", err)
	}
	// A flipped byte on disk is corrupt, removed.
	path := filepath.Join(dir, objRel("obj:1_0_k"))
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	raw[len(raw)-1] ^= 0xff
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.GetObject(ctx, "obj:1_0_k", 42, got); !errors.Is(err, storage.ErrCorrupt) {
		t.Fatalf("flipped object: %v", err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatal("corrupt object not removed")
	}
	if err := s.PutObject(ctx, "obj:2", 1, a); err != nil {
		t.Fatal(err)
	}
	if existed, err := s.RemoveObject(ctx, "obj:2"); err != nil || !existed {
		t.Fatalf("remove: %v, %v", existed, err)
	}
	if existed, err := s.RemoveObject(ctx, "obj:2"); err != nil || existed {
		t.Fatalf("second remove: %v, %v", existed, err)
	}
	if _, err := s.ObjectSize(ctx, "obj:2", 1); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("removed object: %v", err)
	}
	for _, bad := range []string{"", strings.Repeat("n", MaxObjectName+1)} {
		if err := s.PutObject(ctx, bad, 1, a); !errors.Is(err, storage.ErrBatch) {
			t.Errorf("name %q: %v", bad, err)
		}
	}
}

// Any name the node service's wire accepts (printable ASCII, up to 512 bytes)
// is a valid object name: the file is named by a hash of it, and the header
// holds the name. Names that are not valid file names were refused before, and
// the node service lost every evicted object under such a key.
func TestObjectNamesAreAnyBytes(t *testing.T) {
	dir := t.TempDir()
	s := newStore(t, testConfig(dir, nil))
	ctx := context.Background()
	names := []string{".hidden", "a/b", "x y", "../../etc/passwd", "meta-llama/Llama-3.1-8B:0123_0_k",
		strings.Repeat("/", 512), strings.Repeat("k", 300), "\x00\xff binary", ".tmp-looks-temporary"}
	for i, name := range names {
		body := bytes.Repeat([]byte{byte(i + 1)}, 100+i)
		if err := s.PutObject(ctx, name, 7, body); err != nil {
			t.Fatalf("put %q: %v", name, err)
		}
		got := make([]byte, len(body))
		if err := s.GetObject(ctx, name, 7, got); err != nil || !bytes.Equal(got, body) {
			t.Fatalf("get %q: %v", name, err)
		}
		if _, err := s.ObjectSize(ctx, name, 8); !errors.Is(err, storage.ErrNotFound) || !errors.Is(err, ErrOtherFormat) {
			t.Fatalf("size of %q in another format: %v, want ErrNotFound and ErrOtherFormat", name, err)
		}
	}
	// Everything stays inside the directory, in the fan-out subdirectories.
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if rel, _ := filepath.Rel(dir, path); len(rel) != 2+1+32 || !isFanout(rel[:2]) {
			t.Errorf("file %s outside the object layout", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if had, err := s.RemoveObject(ctx, name); err != nil || !had {
			t.Fatalf("remove %q: %v, %v", name, had, err)
		}
	}
}
