package spill

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// crashedSpill leaves in a new directory what a killed service leaves: the
// objects model holds across several segments, and no hint file. Besides
// objects "k<i>" it holds "removed" (put in the first segment, its tombstone
// in a later one) and "again" (put, removed, then put again with new bytes
// in a later segment), so that a scan stopped half-way would serve bytes the
// earlier run removed.
func crashedSpill(t *testing.T, n int) (Config, map[string][]byte) {
	t.Helper()
	cfg := testConfig(privateTempDir(t))
	s := open(t, cfg)
	model := map[string][]byte{}
	put(t, s, "removed", data(30_000, -1))
	put(t, s, "again", data(30_000, -2))
	for i := 0; i < n; i++ {
		k := fmt.Sprintf("k%d", i)
		model[k] = data(30_000, i)
		put(t, s, k, model[k])
		if i == n/2 {
			for _, k := range []string{"removed", "again"} {
				if had, err := s.RemoveObject(bg, k); !had || err != nil {
					t.Fatalf("remove %s: %v %v", k, had, err)
				}
			}
			model["again"] = data(30_000, -3)
			put(t, s, "again", model["again"])
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s.Stats().Files < 5 {
		t.Fatalf("%d segments; the test needs 5", s.Stats().Files)
	}
	crash(t, cfg.Dir)
	return cfg, model
}

// With ScanInBackground, New returns before the segments a crash left are
// indexed, and the spill is usable while they are: the earlier run's objects
// are misses (never bytes a segment not yet scanned removed or replaced), and
// puts and removes made meanwhile win over what the scan finds later, after a
// restart too. The scan is held at its third segment by the test hook; a
// Remove there of keys whose records it has not reached (and of one it has)
// must keep them removed.
func TestScanInBackground(t *testing.T) {
	cfg, model := crashedSpill(t, 200)
	cfg.ScanInBackground = true
	hook, reached, release := holdAt("scan", segmentName(3))
	releaseOnce := sync.OnceFunc(func() { close(release) })
	defer releaseOnce()
	var s *Store
	within(t, 10*time.Second, "New with the scan held", func() {
		var err error
		if s, err = newHooked(cfg, hook); err != nil {
			t.Fatal(err)
		}
	})
	t.Cleanup(func() { releaseOnce(); closeWithin(t, s, time.Minute) })
	wait(t, reached, "the scan at segment 3")
	if st := s.Stats(); st.Ready || st.ScannedBytes == 0 || st.ScannedBytes >= st.ScanBytes {
		t.Fatalf("stats while the scan is held: ready %v, %d of %d bytes scanned", st.Ready, st.ScannedBytes, st.ScanBytes)
	}
	select {
	case <-s.Ready():
		t.Fatal("Ready before the scan is done")
	default:
	}
	// Segments 1 and 2 are indexed: still misses, like the rest.
	for _, k := range []string{"k0", "k199", "removed", "again"} {
		mustMiss(t, s, k, 30_000)
	}
	// A remove of keys in segments scanned and not yet; a put of new bytes
	// under a key the scan has not reached, and of a new key.
	gone := []string{"k0", "k150", "k198"}
	if _, err := s.RemoveObjects(bg, gone); err != nil {
		t.Fatal(err)
	}
	model["k180"] = data(30_000, 1000)
	put(t, s, "k180", model["k180"])
	model["fresh"] = data(30_000, 1001)
	put(t, s, "fresh", model["fresh"])
	mustGet(t, s, "k180", model["k180"])
	mustGet(t, s, "fresh", model["fresh"])
	for _, k := range gone {
		delete(model, k)
	}

	releaseOnce()
	wait(t, s.Ready(), "the scan to end")
	check := func(s *Store) {
		t.Helper()
		for k, want := range model {
			mustGet(t, s, k, want)
		}
		for _, k := range append(gone, "removed") {
			mustMiss(t, s, k, 30_000)
		}
	}
	check(s)
	if st := s.Stats(); !st.Ready || st.ScannedBytes != st.ScanBytes || st.Recovered == 0 {
		t.Fatalf("stats once scanned: %+v", st)
	}
	// Durable: the tombstones were written, the puts once flushed.
	s.flush()
	s.crash()
	cfg.ScanInBackground = false
	check(open(t, cfg))
}

// newHooked is New with the test hook set before the scan starts.
func newHooked(cfg Config, hook func(point, key string)) (*Store, error) {
	var s *Store
	held := make(chan struct{})
	var once sync.Once
	cfg.OnScan = func(int64, int64) { once.Do(func() { <-held }) }
	s, err := New(cfg)
	if err != nil {
		return nil, err
	}
	s.setHook(hook)
	close(held)
	return s, nil
}

// Close during the scan stops it at its next window; the next start scans
// again and finds everything.
func TestCloseDuringScan(t *testing.T) {
	cfg, model := crashedSpill(t, 200)
	cfg.ScanInBackground = true
	hook, reached, release := holdAt("scan", segmentName(2))
	s, err := newHooked(cfg, hook)
	if err != nil {
		t.Fatal(err)
	}
	wait(t, reached, "the scan at segment 2")
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	time.Sleep(10 * time.Millisecond) // Close waits for the scan
	close(release)
	if err := wait(t, closed, "Close during the scan"); err != nil {
		t.Fatal(err)
	}
	cfg.ScanInBackground = false
	s = open(t, cfg)
	for k, want := range model {
		mustGet(t, s, k, want)
	}
}

// A segment dropped for room while the scan holds it, or before the scan
// reaches it, leaves the scan consistent: its objects are gone, the rest are
// served once the scan is done.
func TestDropDuringScan(t *testing.T) {
	cfg, model := crashedSpill(t, 200)
	cfg.ScanInBackground = true
	hook, reached, release := holdAt("scan-held", segmentName(2))
	s, err := newHooked(cfg, hook)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeWithin(t, s, time.Minute) })
	wait(t, reached, "the scan at segment 2")
	s.mu.Lock()
	for i := 0; i < 3; i++ { // segments 1 to 3: scanned, being scanned, not yet
		if !s.dropOldestLocked() {
			s.mu.Unlock()
			t.Fatal("no segment to drop")
		}
	}
	s.mu.Unlock()
	close(release)
	wait(t, s.Ready(), "the scan to end")
	served := 0
	for k, want := range model {
		if b, err := get(s, k, len(want)); err == nil {
			if string(b) != string(want) {
				t.Fatalf("%s: wrong bytes", k)
			}
			served++
		}
	}
	if served == 0 || served == len(model) {
		t.Fatalf("%d of %d objects served after dropping 3 segments", served, len(model))
	}
	for id := uint32(1); id <= 3; id++ {
		if _, err := os.Stat(filepath.Join(cfg.Dir, segmentName(id))); !os.IsNotExist(err) {
			t.Fatalf("dropped segment %d: %v", id, err)
		}
	}
	if st := s.Stats(); st.Objects != int64(served) {
		t.Fatalf("%d objects indexed, %d served", st.Objects, served)
	}
}

// The scan's windows: with windows of 64 KiB, records of every size (from a
// few bytes to past a window, and past bigRecord, where the scan reads only
// the next header) put headers across window ends, data across them in the
// newest segments (which the scan verifies), and jumps past the window read
// ahead. Every object is found with its bytes, every removed key stays
// removed, and no segment is cut.
func TestScanWindows(t *testing.T) {
	defer func(w int64) { scanWindow = w }(scanWindow)
	scanWindow = 64 << 10
	cfg := testConfig(t.TempDir())
	cfg.SegmentBytes, cfg.CapacityBytes = 4<<20, 256<<20
	s := open(t, cfg)
	model := map[string][]byte{}
	var removed []string
	x := uint32(7)
	next := func(n uint32) int { x ^= x << 13; x ^= x >> 17; x ^= x << 5; return int(x % n) }
	for i := 0; len(model) < 3000; i++ {
		var n int
		switch r := next(100); {
		case r < 70:
			n = 1 + next(2000)
		case r < 96:
			n = 2000 + next(200_000)
		default:
			n = bigRecord + next(300_000)
		}
		k := fmt.Sprintf("key/%d/%s", i, string(make([]byte, next(200))))
		model[k] = data(n, i)
		put(t, s, k, model[k])
		if next(10) == 0 {
			if had, err := s.RemoveObject(bg, k); !had || err != nil {
				t.Fatalf("remove %s: %v %v", k, had, err)
			}
			delete(model, k)
			removed = append(removed, k)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Files < 4 || st.DirectWrites == 0 {
		t.Fatalf("%d segments, %d direct records; the test needs 4 and some", st.Files, st.DirectWrites)
	}
	crash(t, cfg.Dir)
	s = open(t, cfg)
	if st := s.Stats(); st.TornTails != 0 || st.Recovered != int64(len(model)) || st.HintsRead != 0 {
		t.Fatalf("after the scan: %d torn tails, %d objects of %d, %d hint files read", st.TornTails, st.Recovered, len(model), st.HintsRead)
	}
	for k, want := range model {
		mustGet(t, s, k, want)
	}
	for _, k := range removed {
		mustMiss(t, s, k, 1)
	}
}
