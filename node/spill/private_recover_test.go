package spill

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Segment files that are not regular files of the service's user are refused
// at recovery, counted and logged in one line, never served, and left where
// they are; new segments skip their ids. Before, a segment another user's
// service wrote (or a link to one) was served as the service's own keys, and
// a FIFO under a segment's name hung New.
func TestForeignSegmentsRefused(t *testing.T) {
	needRoot(t)
	// Another user's spill, whose segment is planted in ours.
	other := privateTempDir(t)
	o := open(t, testConfig(other))
	put(t, o, "planted", data(20_000, 66))
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}

	dir := privateTempDir(t)
	cfg := testConfig(dir)
	s := open(t, cfg)
	for i := 0; i < 90; i++ {
		put(t, s, fmt.Sprintf("k%d", i), data(30_000, i))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	files := s.Stats().Files
	if files < 3 {
		t.Fatalf("%d segments; the test needs 3", files)
	}
	// Segment 2 of another user, a copy of the other spill's segment under
	// id 10 owned by it, a link to it under id 11, a FIFO under id 12.
	chown(t, filepath.Join(dir, segmentName(2)))
	b, err := os.ReadFile(filepath.Join(other, segmentName(1)))
	if err != nil {
		t.Fatal(err)
	}
	planted := filepath.Join(dir, segmentName(10))
	if err := os.WriteFile(planted, b, 0o600); err != nil {
		t.Fatal(err)
	}
	chown(t, planted)
	if err := os.Symlink(filepath.Join(other, segmentName(1)), filepath.Join(dir, segmentName(11))); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(dir, segmentName(12)), 0o600); err != nil {
		t.Fatal(err)
	}

	log := logTo(&cfg)
	within(t, 20*time.Second, "New with a FIFO under a segment's name", func() { s = open(t, cfg) })
	st := s.Stats()
	if st.RefusedFiles != 4 || st.Files != files-1 {
		t.Fatalf("stats: %d files refused, %d segments; want 4 refused, %d segments", st.RefusedFiles, st.Files, files-1)
	}
	if n := log.count("not regular files of this service's user"); n != 1 {
		t.Fatalf("%d log lines about refused files, want 1:\n%s", n, log.b.String())
	}
	mustMiss(t, s, "planted", 20_000)
	served := 0
	for i := 0; i < 90; i++ {
		key := fmt.Sprintf("k%d", i)
		if b, err := get(s, key, 30_000); err == nil {
			if string(b) != string(data(30_000, i)) {
				t.Fatalf("%s: wrong bytes", key)
			}
			served++
		}
	}
	if served == 0 || served == 90 {
		t.Fatalf("%d of 90 objects served; want those outside the refused segment", served)
	}
	// New segments go past the refused names, which stay.
	put(t, s, "new", data(100_000, 1))
	s.flush()
	mustGet(t, s, "new", data(100_000, 1))
	for id := uint32(10); id <= 12; id++ {
		if _, err := os.Lstat(filepath.Join(dir, segmentName(id))); err != nil {
			t.Fatalf("refused %s: %v", segmentName(id), err)
		}
	}
	if s.nextID <= 12 {
		t.Fatalf("next segment id %d reuses a refused name", s.nextID)
	}
}

// Files an earlier version left 0644 that are the service's own are made
// 0600 at recovery, with one log line, and their objects are served.
func TestEarlierFilesMadePrivate(t *testing.T) {
	dir := privateTempDir(t)
	cfg := testConfig(dir)
	s := open(t, cfg)
	for i := 0; i < 60; i++ {
		put(t, s, fmt.Sprintf("k%d", i), data(30_000, i))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	names, _ := filepath.Glob(filepath.Join(dir, "*"))
	for _, p := range names {
		if err := os.Chmod(p, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	log := logTo(&cfg)
	s = open(t, cfg)
	for i := 0; i < 60; i++ {
		mustGet(t, s, fmt.Sprintf("k%d", i), data(30_000, i))
	}
	for _, p := range names {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v, mode %v; want 0600", p, err, fi.Mode())
		}
	}
	if n := log.count("are now private (mode 0600)"); n != 1 || !strings.Contains(log.b.String(), fmt.Sprintf("files=%d", len(names))) {
		t.Fatalf("%d log lines about files made private (of %d), want 1:\n%s", n, len(names), log.b.String())
	}
}
