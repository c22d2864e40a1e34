package undo

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// MkdirAll records the directories it made, not those there before; Undo
// removes them, the newest first, and leaves what was there.
func TestUndoRemovesWhatWasCreatedOnly(t *testing.T) {
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "old"), 0o700); err != nil {
		t.Fatal(err)
	}
	var l Log
	if err := l.MkdirAll(filepath.Join(root, "old", "a", "b"), 0o700); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(root, "old", "a", "b", "f")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	l.Created(file)
	want := []string{filepath.Join(root, "old", "a"), filepath.Join(root, "old", "a", "b"), file}
	if got := l.Paths(); !slices.Equal(got, want) {
		t.Fatalf("recorded %q, want %q", got, want)
	}
	if err := l.Undo(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "old", "a")); !os.IsNotExist(err) {
		t.Errorf("created directory left: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "old")); err != nil {
		t.Errorf("directory that was there removed: %v", err)
	}
	if len(l.Paths()) != 0 {
		t.Error("Undo left the log full")
	}
}

// A path replaced since it was recorded, and a directory someone else put a
// file in, are left alone.
func TestUndoLeavesWhatOthersChanged(t *testing.T) {
	root := t.TempDir()
	var l Log
	dir := filepath.Join(root, "d")
	if err := l.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(root, "f")
	if err := os.WriteFile(file, []byte("mine"), 0o600); err != nil {
		t.Fatal(err)
	}
	l.Created(file)
	// Another process replaces the file and writes into the directory.
	if err := os.WriteFile(file+".new", []byte("theirs"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(file+".new", file); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "theirs"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := l.Undo(); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "theirs" {
		t.Errorf("the file another process put in place: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "theirs")); err != nil {
		t.Errorf("a directory holding another's file was removed: %v", err)
	}
}

// MkdirAll refuses what os.MkdirAll refuses, and records nothing for it.
func TestMkdirAllUnderAFile(t *testing.T) {
	root := t.TempDir()
	file := filepath.Join(root, "f")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var l Log
	if err := l.MkdirAll(filepath.Join(file, "d"), 0o700); err == nil {
		t.Fatal("MkdirAll under a file succeeded")
	}
	if err := l.MkdirAll(file, 0o700); err == nil {
		t.Fatal("MkdirAll of a file succeeded")
	}
	if p := l.Paths(); len(p) != 0 {
		t.Fatalf("recorded %q", p)
	}
}
