package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "r.json")
	for _, data := range []string{"first\n", "second, longer\n"} {
		if err := Write(path, []byte(data)); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != data {
			t.Fatalf("read back %q, %v; want %q", got, err, data)
		}
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o644 {
		t.Fatalf("mode %v, %v", st.Mode(), err)
	}
	// A directory that does not exist: an error naming the path, nothing left.
	bad := filepath.Join(dir, "missing", "r.json")
	if err := Write(bad, []byte("x")); err == nil {
		t.Fatal("write into a missing directory succeeded")
	}
	// A directory in the way of the rename: the error, and no temporary file left.
	if err := os.Mkdir(filepath.Join(dir, "taken"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Write(filepath.Join(dir, "taken"), []byte("x")); err == nil {
		t.Fatal("rename over a directory succeeded")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Fatalf("left in the directory: %v", entries)
	}
}
