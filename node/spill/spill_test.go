package spill

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stratakv/strata/storage"
)

// Objects of every size class come back whole: from the write buffer before
// it is written, from the segment file after, written straight from the
// caller's memory when larger than a buffer (aligned or not), and in runs.
func TestPutGet(t *testing.T) {
	s := open(t, testConfig(t.TempDir()))
	sizes := []int{1, 511, 4096, 10_000, 64 << 10, 200 << 10, 1<<20 + 3}
	for i, n := range sizes {
		put(t, s, fmt.Sprintf("k%d", i), data(n, i))
		mustGet(t, s, fmt.Sprintf("k%d", i), data(n, i)) // maybe from the buffer
	}
	// An unaligned large object goes through the bounce buffer.
	big := make([]byte, 300<<10+1)
	copy(big, data(len(big), 99))
	put(t, s, "unaligned", big[1:])
	// In runs.
	a, b := data(100_000, 5), data(3, 6)
	if err := s.PutObject(bg, "runs", 7, a, b); err != nil {
		t.Fatal(err)
	}
	s.flush()
	for i, n := range sizes {
		mustGet(t, s, fmt.Sprintf("k%d", i), data(n, i))
	}
	mustGet(t, s, "unaligned", big[1:])
	// A direct record straight into aligned memory, and through the window.
	last := len(sizes) - 1
	for _, dst := range [][]byte{alignedBytes(int64(sizes[last])), alignedBytes(int64(sizes[last]) + 1)[1:]} {
		if err := s.GetObject(bg, fmt.Sprintf("k%d", last), 7, dst); err != nil || string(dst) != string(data(sizes[last], last)) {
			t.Fatalf("get of a direct record: %v", err)
		}
	}
	mustGet(t, s, "runs", append(append([]byte(nil), a...), b...))
	ra, rb := make([]byte, 50), make([]byte, 100_003-50)
	if err := s.GetObject(bg, "runs", 7, ra, rb); err != nil || string(append(ra, rb...)) != string(append(a, b...)) {
		t.Fatalf("get into runs: %v", err)
	}
	st := s.Stats()
	if st.Objects != int64(len(sizes)+2) || st.Writes != st.Objects || st.DirectWrites == 0 || st.Flushes == 0 || st.BufferReads == 0 {
		t.Fatalf("stats %+v", st)
	}
	if !st.DirectIO {
		t.Logf("the filesystem of %s refuses O_DIRECT; buffered I/O", s.Dir())
	}
}

// Write-once, formats and sizes: a put of a key the spill holds is skipped,
// in any format; ObjectSize says ErrOtherFormat for another format's object;
// a get of the wrong size is a batch error; a miss is not found.
func TestWriteOnceAndFormats(t *testing.T) {
	s := open(t, testConfig(t.TempDir()))
	put(t, s, "a", data(1000, 1))
	put(t, s, "a", data(1000, 2)) // skipped
	if err := s.PutObject(bg, "a", 9, data(10, 3)); err != nil {
		t.Fatalf("put in another format: %v", err)
	}
	mustGet(t, s, "a", data(1000, 1))
	if n, err := s.ObjectSize(bg, "a", 7); n != 1000 || err != nil {
		t.Fatalf("size %d, %v", n, err)
	}
	if _, err := s.ObjectSize(bg, "a", 9); !errors.Is(err, ErrOtherFormat) || !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("size in another format: %v", err)
	}
	if _, err := s.ObjectSize(bg, "b", 7); !errors.Is(err, storage.ErrNotFound) || errors.Is(err, ErrOtherFormat) {
		t.Fatalf("size of a missing key: %v", err)
	}
	if err := s.GetObject(bg, "a", 9, make([]byte, 1000)); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("get in another format: %v", err)
	}
	if _, err := get(s, "a", 999); !errors.Is(err, storage.ErrBatch) {
		t.Fatalf("get of the wrong size: %v", err)
	}
	if err := s.PutObject(bg, "", 7, data(1, 1)); !errors.Is(err, storage.ErrBatch) {
		t.Fatalf("put of an empty key: %v", err)
	}
	if err := s.PutObject(bg, "e", 7); !errors.Is(err, storage.ErrBatch) {
		t.Fatalf("put of no bytes: %v", err)
	}
	mustMiss(t, s, "b", 10)
	if st := s.Stats(); st.WritesSkipped != 1 || st.FormatConflicts != 1 || st.Writes != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// A removed object is gone, and stays gone after a restart (its tombstone);
// a key put again after its removal is the new object after a restart.
func TestRemove(t *testing.T) {
	cfg := testConfig(t.TempDir())
	s := open(t, cfg)
	put(t, s, "gone", data(5000, 1))
	put(t, s, "again", data(5000, 2))
	put(t, s, "stays", data(5000, 3))
	s.flush()
	for _, k := range []string{"gone", "again"} {
		if had, err := s.RemoveObject(bg, k); !had || err != nil {
			t.Fatalf("remove %s: %v %v", k, had, err)
		}
	}
	if had, err := s.RemoveObject(bg, "gone"); had || err != nil {
		t.Fatalf("second remove: %v %v", had, err)
	}
	mustMiss(t, s, "gone", 5000)
	put(t, s, "again", data(6000, 4))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, cfg)
	mustMiss(t, s, "gone", 5000)
	mustGet(t, s, "again", data(6000, 4))
	mustGet(t, s, "stays", data(5000, 3))
	if st := s.Stats(); st.Recovered != 2 {
		t.Fatalf("recovered %d, want 2", st.Recovered)
	}
}

// Closing writes what the buffers hold; New finds every object again, across
// several segments.
func TestRestart(t *testing.T) {
	cfg := testConfig(t.TempDir())
	s := open(t, cfg)
	const n = 60
	for i := 0; i < n; i++ {
		put(t, s, fmt.Sprintf("obj/%d", i), data(30_000+i*1000, i))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ObjectSize(bg, "obj/1", 7); !errors.Is(err, storage.ErrClosed) {
		t.Fatalf("after close: %v", err)
	}
	s = open(t, cfg)
	for i := 0; i < n; i++ {
		mustGet(t, s, fmt.Sprintf("obj/%d", i), data(30_000+i*1000, i))
	}
	st := s.Stats()
	if st.Recovered != n || st.Files < 2 || st.TornTails != 0 {
		t.Fatalf("stats after restart: %+v", st)
	}
	// New puts go to a new segment after the old ones.
	put(t, s, "new", data(100, 1))
	s.flush()
	mustGet(t, s, "new", data(100, 1))
}

// segmentFiles lists the segment files of dir, oldest first.
func segmentFiles(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "*.seg"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// A crash that tears the last record: New keeps the records before it, drops
// the torn one and cuts the file there.
func TestTornTail(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	cfg.SegmentBytes = 64 << 20 // one segment
	s := open(t, cfg)
	for i := 0; i < 5; i++ {
		put(t, s, fmt.Sprintf("k%d", i), data(20_000, i))
	}
	put(t, s, "last", data(200_000, 9)) // a direct record, last in the file
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	crash(t, dir)
	segs := segmentFiles(t, dir)
	if len(segs) != 1 {
		t.Fatalf("segments %v", segs)
	}
	fi, err := os.Stat(segs[0])
	if err != nil {
		t.Fatal(err)
	}
	// Half of the last record's data made it.
	torn := fi.Size() - 100_000
	if err := os.Truncate(segs[0], torn); err != nil {
		t.Fatal(err)
	}
	s = open(t, cfg)
	for i := 0; i < 5; i++ {
		mustGet(t, s, fmt.Sprintf("k%d", i), data(20_000, i))
	}
	mustMiss(t, s, "last", 200_000)
	if st := s.Stats(); st.TornTails != 1 || st.Recovered != 5 {
		t.Fatalf("stats %+v", st)
	}
	if fi, err := os.Stat(segs[0]); err != nil || fi.Size() >= torn || fi.Size()%block != 0 {
		t.Fatalf("torn segment not cut at its last good record: %v %v", fi.Size(), err)
	}
}

// The data of the last record is torn while its header made it (the blocks
// of a write reach the device in any order): New verifies the newest
// segment's data and drops it.
func TestTornData(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	cfg.SegmentBytes = 64 << 20
	s := open(t, cfg)
	put(t, s, "first", data(20_000, 1))
	put(t, s, "last", data(20_000, 2))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	crash(t, dir)
	seg := segmentFiles(t, dir)[0]
	b, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	at := findRecord(t, b, "last")
	b[at+sector+10_000] ^= 0xff
	if err := os.WriteFile(seg, b, 0o644); err != nil {
		t.Fatal(err)
	}
	s = open(t, cfg)
	mustGet(t, s, "first", data(20_000, 1))
	mustMiss(t, s, "last", 20_000)
	if st := s.Stats(); st.TornTails != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// findRecord returns the offset of key's object record in a segment's bytes.
func findRecord(t *testing.T, b []byte, key string) int {
	t.Helper()
	for off := 0; off < len(b); {
		h, err := decodeHeader(b[off:min(len(b), off+maxHeader)])
		if err != nil {
			t.Fatalf("record at %d: %v", off, err)
		}
		if h.kind == kindObject && h.key == key {
			return off
		}
		off += int(h.recLen)
	}
	t.Fatalf("no record of %s", key)
	return 0
}

// Damage in an older segment: a flipped data byte is caught by the read,
// which drops the object (corrupt, then a miss), never serving it; a flipped
// header byte ends that segment at New, and the records after it go.
func TestCorruptRecord(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	cfg.SegmentBytes = 64 << 20
	s := open(t, cfg)
	put(t, s, "big", data(300_000, 50)) // direct records
	put(t, s, "big2", data(300_000, 51))
	for i := 0; i < 6; i++ {
		put(t, s, fmt.Sprintf("k%d", i), data(20_000, i))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// A newer segment, so that the damaged one is not verified at New.
	s = open(t, cfg)
	put(t, s, "n1", data(100, 1))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, cfg)
	put(t, s, "n2", data(100, 2))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	crash(t, dir) // no hint files: New reads the segments
	seg := segmentFiles(t, dir)[0]
	b, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	b[findRecord(t, b, "big")+block+200_000] ^= 1  // data
	b[findRecord(t, b, "big2")+block+100_000] ^= 1 // data
	b[findRecord(t, b, "k1")+sector+123] ^= 1      // data
	b[findRecord(t, b, "k4")+20] ^= 1              // header: the segment ends there
	if err := os.WriteFile(seg, b, 0o644); err != nil {
		t.Fatal(err)
	}
	s = open(t, cfg)
	if _, err := get(s, "k1", 20_000); !errors.Is(err, storage.ErrCorrupt) {
		t.Fatalf("get of a damaged record: %v, want corrupt", err)
	}
	mustMiss(t, s, "k1", 20_000)
	for _, i := range []int{0, 2, 3} {
		mustGet(t, s, fmt.Sprintf("k%d", i), data(20_000, i))
	}
	mustMiss(t, s, "k4", 20_000)
	mustMiss(t, s, "k5", 20_000)
	mustGet(t, s, "n1", data(100, 1))
	mustGet(t, s, "n2", data(100, 2))
	if st := s.Stats(); st.TornTails != 1 || st.CorruptRemoved != 1 {
		t.Fatalf("stats %+v", st)
	}
	// A damaged direct record read straight into aligned memory, and one
	// read through the window.
	for _, c := range []struct {
		key string
		dst []byte
	}{{"big", alignedBytes(300_000)}, {"big2", alignedBytes(300_001)[1:]}} {
		if err := s.GetObject(bg, c.key, 7, c.dst); !errors.Is(err, storage.ErrCorrupt) {
			t.Fatalf("get of damaged direct record %s: %v, want corrupt", c.key, err)
		}
		mustMiss(t, s, c.key, 300_000)
	}
}

// A record whose header names another key (the index pointed at the wrong
// place, or bytes were moved) is never served: the read compares keys.
func TestWrongKeyInHeader(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	cfg.SegmentBytes = 64 << 20
	s := open(t, cfg)
	put(t, s, "mine", data(20_000, 1))
	put(t, s, "them", data(20_000, 2))
	s.flush()
	seg := segmentFiles(t, dir)[0]
	b, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	mine, them := findRecord(t, b, "mine"), findRecord(t, b, "them")
	f, err := os.OpenFile(seg, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Their record, whole and sound, where mine was.
	if _, err := f.WriteAt(b[them:them+(them-mine)], int64(mine)); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := get(s, "mine", 20_000)
	if !errors.Is(err, storage.ErrCorrupt) {
		t.Fatalf("get of a key whose record names another: %v", err)
	}
	if string(got) == string(data(20_000, 2)) {
		t.Fatal("served the other key's bytes")
	}
	mustGet(t, s, "them", data(20_000, 2))
}

// An unusable directory is a clear error at New.
func TestUnusableDir(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := New(testConfig(file))
	if !errors.Is(err, storage.ErrConfig) {
		t.Fatalf("New on a file: %v", err)
	}
	for _, mod := range []func(*Config){
		func(c *Config) { c.CapacityBytes = 0 },
		func(c *Config) { c.SegmentBytes = 1 },
		func(c *Config) { c.BufferBytes = 5000 },
		func(c *Config) { c.Dir = "" },
	} {
		c := testConfig(t.TempDir())
		mod(&c)
		if _, err := New(c); !errors.Is(err, storage.ErrConfig) {
			t.Fatalf("New(%+v): %v", c, err)
		}
	}
}

// A context that ended fails the call.
func TestContext(t *testing.T) {
	s := open(t, testConfig(t.TempDir()))
	ctx, cancel := context.WithCancel(bg)
	cancel()
	if err := s.PutObject(ctx, "k", 7, data(10, 1)); !errors.Is(err, context.Canceled) {
		t.Fatalf("put: %v", err)
	}
}

// Two spills on one directory would drop each other's segments: the second
// is refused while the first is open.
func TestDirectoryInUse(t *testing.T) {
	cfg := testConfig(t.TempDir())
	s := open(t, cfg)
	if _, err := New(cfg); !errors.Is(err, storage.ErrConfig) {
		t.Fatalf("a second spill on the directory: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	open(t, cfg)
}

// crash removes the hint files a clean Close wrote: after a crash the
// segments being written have none.
func crash(t *testing.T, dir string) {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "*.hint"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range m {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
}

// After a clean close every segment has a hint file and New reads no
// segment; a hint file that does not match its segment (its length, a
// checksum) is ignored, and New reads the segment instead.
func TestHints(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	s := open(t, cfg)
	for i := 0; i < 80; i++ {
		put(t, s, fmt.Sprintf("k%d", i), data(30_000, i))
	}
	put(t, s, "big", data(300_000, 1))
	if had, err := s.RemoveObject(bg, "k3"); !had || err != nil {
		t.Fatal(had, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	files := s.Stats().Files
	check := func(s *Store) {
		t.Helper()
		for i := 0; i < 80; i++ {
			if i == 3 {
				mustMiss(t, s, "k3", 30_000)
				continue
			}
			mustGet(t, s, fmt.Sprintf("k%d", i), data(30_000, i))
		}
		mustGet(t, s, "big", data(300_000, 1))
	}
	s = open(t, cfg)
	if st := s.Stats(); st.HintsRead != files || st.Recovered != 80 || files < 3 {
		t.Fatalf("stats after a clean restart: %+v (%d segments)", st, files)
	}
	check(s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Damage two hint files: one's length, one's bytes.
	hints, _ := filepath.Glob(filepath.Join(dir, "*.hint"))
	if int64(len(hints)) != files {
		t.Fatalf("%d hint files for %d segments", len(hints), files)
	}
	b, _ := os.ReadFile(hints[0])
	if err := os.WriteFile(hints[0], b[:len(b)-1], 0o644); err != nil {
		t.Fatal(err)
	}
	b, _ = os.ReadFile(hints[1])
	b[40] ^= 1
	if err := os.WriteFile(hints[1], b, 0o644); err != nil {
		t.Fatal(err)
	}
	// A stale hint of a segment that is gone.
	if err := os.WriteFile(filepath.Join(dir, hintName(999)), b, 0o644); err != nil {
		t.Fatal(err)
	}
	s = open(t, cfg)
	if st := s.Stats(); st.HintsRead != files-2 || st.Recovered != 80 || st.HintsWritten != 2 {
		t.Fatalf("stats after a restart with damaged hints: %+v", st)
	}
	check(s)
	if _, err := os.Stat(filepath.Join(dir, hintName(999))); !os.IsNotExist(err) {
		t.Fatalf("the stale hint file stayed: %v", err)
	}
}
