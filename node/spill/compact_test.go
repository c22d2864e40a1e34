package spill

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/storage"
)

// manualConfig is testConfig with the spill's own compactor off: a test
// compacts when it says so (compactAll, compactID).
func manualConfig(dir string) Config {
	c := testConfig(dir)
	c.CompactBelow = 0
	c.CompactBytesPerSec = 0
	return c
}

// compactID compacts segment id now, whatever its live share, and reports
// whether it could (a finished segment, no compaction in flight).
func (s *Store) compactID(id uint32) bool {
	var seg *segment
	s.locked(func() {
		seg = s.byID[id]
		if seg == nil || s.compacting != nil || seg == s.active || seg.pending > 0 {
			seg = nil
			return
		}
		seg.compacting = true
		s.compacting = seg
	})
	if seg == nil {
		return false
	}
	s.compactSegment(seg)
	return true
}

// rotate starts a new segment and waits until the one before is written.
func (s *Store) rotate(t testing.TB) {
	t.Helper()
	var err error
	s.locked(func() { err = s.rotateLocked() })
	if err != nil {
		t.Fatal(err)
	}
	s.flush()
}

// segIDs lists the spill's segment ids, oldest first.
func (s *Store) segIDs() []uint32 {
	var ids []uint32
	s.locked(func() {
		for _, seg := range s.segs {
			ids = append(ids, seg.id)
		}
	})
	return ids
}

// checkLive checks that s holds exactly model's objects of keys, and no
// object for the others.
func checkLive(t *testing.T, s *Store, keys []string, model map[string][]byte) {
	t.Helper()
	for _, k := range keys {
		if want, ok := model[k]; ok {
			mustGet(t, s, k, want)
		} else {
			mustMiss(t, s, k, 1)
		}
	}
	if st := s.Stats(); st.Objects != int64(len(model)) {
		t.Fatalf("%d objects, want %d", st.Objects, len(model))
	}
}

// diskBytes is what the files of dir take on the device.
func diskBytes(t testing.TB, dir string) int64 {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, e := range ents {
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(dir, e.Name()), &st); err == nil {
			n += st.Blocks * 512
		}
	}
	return n
}

// tombstonesOn returns the headers of key's tombstones in dir's segment files.
func tombstonesOn(t *testing.T, dir, key string) []header {
	t.Helper()
	var hs []header
	for _, path := range segmentFiles(t, dir) {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for off := 0; off < len(b); {
			h, err := decodeHeader(b[off:min(len(b), off+maxHeader)])
			if err != nil {
				t.Fatalf("%s at %d: %v", path, off, err)
			}
			if h.kind == kindTombstone && h.key == key {
				hs = append(hs, h)
			}
			off += int(h.recLen)
		}
	}
	return hs
}

// restarts checks the live set after a clean restart (hint files) and after
// one without hint files, and returns the spill open again.
func restarts(t *testing.T, s *Store, cfg Config, keys []string, model map[string][]byte) *Store {
	t.Helper()
	for _, hints := range []bool{true, false} {
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if !hints {
			crash(t, cfg.Dir)
		}
		s = open(t, cfg)
		checkLive(t, s, keys, model)
	}
	return s
}

// Put 300 objects, remove 90% of them, compact: the bytes on disk fall to
// what lives, and restarts (with hint files and without) find exactly the
// objects that were not removed. (Before, the removed objects' bytes stayed
// until their segment aged out.)
func TestCompactionReclaims(t *testing.T) {
	dir := t.TempDir()
	cfg := manualConfig(dir)
	s := open(t, cfg)
	const n, size = 300, 20_000
	var keys, gone []string
	model := map[string][]byte{}
	for i := 0; i < n; i++ {
		k := fmt.Sprintf("k%d", i)
		keys = append(keys, k)
		put(t, s, k, data(size, i))
		if i%10 == 0 {
			model[k] = data(size, i)
		} else {
			gone = append(gone, k)
		}
	}
	if _, err := s.RemoveObjects(bg, gone); err != nil {
		t.Fatal(err)
	}
	s.flush()
	before, beforeDisk := s.Stats(), diskBytes(t, dir)
	s.compactAll(0.5)
	after, afterDisk := s.Stats(), diskBytes(t, dir)
	t.Logf("%d objects of %d bytes, 90%% removed: %d bytes on disk before compaction (%d dead), %d after (%d dead); %d compactions of %d bytes, %d copied",
		n, size, beforeDisk, before.DeadBytes, afterDisk, after.DeadBytes, after.Compactions, after.CompactedBytes, after.CompactCopiedBytes)
	if after.Bytes*3 > before.Bytes || afterDisk*3 > beforeDisk || after.DeadBytes*3 > before.DeadBytes {
		t.Fatalf("compaction left %d of %d bytes (%d of %d on disk, %d of %d dead)", after.Bytes, before.Bytes, afterDisk, beforeDisk, after.DeadBytes, before.DeadBytes)
	}
	if after.Compactions < 4 || after.CompactedBytes-after.CompactCopiedBytes < before.Bytes/2 || after.Files != int64(len(segmentFiles(t, dir))) {
		t.Fatalf("stats %+v", after)
	}
	checkLive(t, s, keys, model)
	restarts(t, s, cfg, keys, model)
}

// A tombstone in a compacted segment is copied forward while an older
// segment may hold a record of its key, and only then: not when the key is
// live again (the live object is newer, and the copy would delete it at the
// next start), also while that object is still in a write buffer, and not
// when no older segment is left.
func TestCompactionTombstones(t *testing.T) {
	for _, c := range []struct {
		name  string
		setup func(t *testing.T, s *Store)
		want  []byte // k's object after compaction, nil: none
		tombs int    // k's tombstones on disk after compaction
	}{
		{"older segment", func(*testing.T, *Store) {}, nil, 1},
		{"live again", func(t *testing.T, s *Store) { put(t, s, "k", data(7000, 2)); s.flush() }, data(7000, 2), 0},
		{"live again, buffered", func(t *testing.T, s *Store) { put(t, s, "k", data(7000, 2)) }, data(7000, 2), 0},
		{"oldest", func(t *testing.T, s *Store) {
			var dropped bool
			s.locked(func() { dropped = s.dropOldestLocked() })
			if !dropped {
				t.Fatal("the oldest segment was not dropped")
			}
		}, nil, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := manualConfig(t.TempDir())
			s := open(t, cfg)
			put(t, s, "k", data(5000, 1))
			put(t, s, "f1", data(5000, 3))
			s.rotate(t)
			if had, err := s.RemoveObject(bg, "k"); !had || err != nil {
				t.Fatalf("remove: %v %v", had, err)
			}
			put(t, s, "f2", data(5000, 4))
			s.rotate(t)
			ids := s.segIDs()
			tombSeg := ids[len(ids)-2]
			c.setup(t, s)
			if !s.compactID(tombSeg) {
				t.Fatalf("segment %d was not compacted", tombSeg)
			}
			s.flush()
			keys := []string{"k", "f1", "f2"}
			model := map[string][]byte{"f2": data(5000, 4)}
			if c.name != "oldest" {
				model["f1"] = data(5000, 3)
			}
			if c.want != nil {
				model["k"] = c.want
			}
			checkLive(t, s, keys, model)
			tombs := tombstonesOn(t, cfg.Dir, "k")
			if len(tombs) != c.tombs {
				t.Fatalf("%d tombstones of k on disk, want %d", len(tombs), c.tombs)
			}
			if c.tombs > 0 && tombs[0].format != uint64(tombSeg) {
				t.Fatalf("the copied tombstone says its remove was in segment %d, want %d", tombs[0].format, tombSeg)
			}
			restarts(t, s, cfg, keys, model)
		})
	}
}

// A record moved by compaction never brings back an object removed,
// replaced, dropped as corrupt or dropped with its segment while the copy
// was made: the index is pointed at the copy only if it still names the
// old record, and restarts agree with the index.
func TestCompactionMoveRaces(t *testing.T) {
	for _, race := range []string{"removed", "replaced", "corrupt", "evicted"} {
		t.Run(race, func(t *testing.T) {
			cfg := manualConfig(t.TempDir())
			s := open(t, cfg)
			keys := []string{"k"}
			model := map[string][]byte{"k": data(20_000, 1)}
			put(t, s, "k", model["k"])
			for i := 0; i < 4; i++ {
				k := fmt.Sprintf("f%d", i)
				keys = append(keys, k)
				model[k] = data(20_000, 10+i)
				put(t, s, k, model[k])
			}
			s.rotate(t)
			id := s.segIDs()[0]
			hook, reached, release := holdAt("compact-copy", "k")
			s.setHook(hook)
			done := make(chan bool, 1)
			go func() { done <- s.compactID(id) }()
			wait(t, reached, "compaction's copy of k")
			within(t, time.Minute, "the "+race+" race", func() { compactRace(t, s, cfg, race, id, keys, model) })
			close(release)
			if t.Failed() {
				t.FailNow()
			}
			wait(t, done, "the compaction")
			s.flush()
			checkLive(t, s, keys, model)
			if race != "evicted" {
				if _, err := os.Stat(filepath.Join(cfg.Dir, segmentName(id))); !os.IsNotExist(err) {
					t.Fatalf("the compacted segment is still there: %v", err)
				}
			}
			restarts(t, s, cfg, keys, model)
		})
	}
}

// compactRace does to k what TestCompactionMoveRaces's race says, while
// compaction holds its copy of k, and updates model. It runs off the test's
// goroutine (within), so it reports with t.Errorf.
func compactRace(t *testing.T, s *Store, cfg Config, race string, id uint32, keys []string, model map[string][]byte) {
	switch race {
	case "removed", "replaced":
		if had, err := s.RemoveObject(bg, "k"); !had || err != nil {
			t.Errorf("remove: %v %v", had, err)
			return
		}
		delete(model, "k")
		if race == "replaced" {
			model["k"] = data(30_000, 2)
			if err := s.PutObject(bg, "k", 7, model["k"]); err != nil {
				t.Errorf("put: %v", err)
			}
		}
	case "corrupt":
		// The old record, read and checked by compaction already, is
		// damaged now, and a get drops it.
		path := filepath.Join(cfg.Dir, segmentName(id))
		b, err := os.ReadFile(path)
		if err != nil {
			t.Error(err)
			return
		}
		off := -1
		for o := 0; o < len(b); {
			h, err := decodeHeader(b[o:min(len(b), o+maxHeader)])
			if err != nil {
				break
			}
			if h.kind == kindObject && h.key == "k" {
				off = o
				break
			}
			o += int(h.recLen)
		}
		if off < 0 {
			t.Errorf("no record of k in %s", path)
			return
		}
		b[off+sector+5] ^= 1
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Error(err)
			return
		}
		if _, err := get(s, "k", 20_000); !errors.Is(err, storage.ErrCorrupt) {
			t.Errorf("get of the damaged old record: %v", err)
		}
		delete(model, "k")
	case "evicted":
		var dropped bool
		s.locked(func() { dropped = s.dropOldestLocked() })
		if !dropped {
			t.Error("the segment being compacted was not dropped")
			return
		}
		// What was not moved yet went with it.
		for _, k := range keys {
			if _, err := s.ObjectSize(bg, k, 7); err != nil {
				delete(model, k)
			}
		}
	}
}

// A crash in the middle of a compaction (its copies placed and not written;
// written, the old segment not yet deleted; the old segment deleted) leaves
// a spill whose restart, with hint files or without, finds exactly the live
// objects, and which compacts on.
func TestCompactionCrash(t *testing.T) {
	for _, point := range []string{"compact-copy", "compact-delete", "compact-deleted"} {
		for _, hints := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/hints=%v", point, hints), func(t *testing.T) {
				cfg := manualConfig(t.TempDir())
				s := open(t, cfg)
				var keys, gone []string
				model := map[string][]byte{}
				for i := 0; i < 200; i++ {
					k := fmt.Sprintf("k%d", i)
					keys = append(keys, k)
					put(t, s, k, data(20_000, i))
					if i%5 == 0 {
						model[k] = data(20_000, i)
					} else {
						gone = append(gone, k)
					}
				}
				if _, err := s.RemoveObjects(bg, gone); err != nil {
					t.Fatal(err)
				}
				s.flush()
				var once sync.Once
				halted := false
				s.setHook(func(p, _ string) {
					if p == point {
						once.Do(func() { halted = true; s.halt() })
					}
				})
				s.compactAll(0.5)
				if !halted {
					t.Fatalf("compaction never reached %s", point)
				}
				s.crash()
				if !hints {
					crash(t, cfg.Dir)
				}
				s = open(t, cfg)
				checkLive(t, s, keys, model)
				s.compactAll(0.5)
				checkLive(t, s, keys, model)
				restarts(t, s, cfg, keys, model)
			})
		}
	}
}

// A read on the old segment's fd when compaction deletes it finishes, with
// the right bytes: the fd is closed after it.
func TestCompactionReadInFlight(t *testing.T) {
	cfg := manualConfig(t.TempDir())
	s := open(t, cfg)
	put(t, s, "k", data(20_000, 1))
	put(t, s, "f", data(20_000, 2))
	s.rotate(t)
	id := s.segIDs()[0]
	path := filepath.Join(cfg.Dir, segmentName(id))
	hook, reached, release := holdAt("get-read", "k")
	s.setHook(hook)
	type result struct {
		b   []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		b, err := get(s, "k", 20_000)
		done <- result{b, err}
	}()
	wait(t, reached, "the read")
	if !s.compactID(id) {
		t.Fatal("not compacted")
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("the compacted segment's file is still there: %v", err)
	}
	if !openFile(t, path) {
		t.Fatal("the compacted segment's fd was closed under a read")
	}
	close(release)
	if r := wait(t, done, "the read"); r.err != nil || string(r.b) != string(data(20_000, 1)) {
		t.Fatalf("the read in flight: %v, or wrong bytes", r.err)
	}
	if openFile(t, path) {
		t.Fatal("the compacted segment's fd stayed open after the read")
	}
	mustGet(t, s, "k", data(20_000, 1))
}

// openFile reports whether this process has path open, deleted or not.
func openFile(t *testing.T, path string) bool {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		if l, err := os.Readlink("/proc/self/fd/" + fd.Name()); err == nil && strings.TrimSuffix(l, " (deleted)") == path {
			return true
		}
	}
	return false
}

// A segment with nothing live and no tombstones is deleted with nothing
// copied.
func TestCompactionFullyDead(t *testing.T) {
	cfg := manualConfig(t.TempDir())
	s := open(t, cfg)
	var keys []string
	for i := 0; i < 20; i++ {
		keys = append(keys, fmt.Sprintf("k%d", i))
		put(t, s, keys[i], data(20_000, i))
	}
	s.rotate(t)
	if _, err := s.RemoveObjects(bg, keys); err != nil {
		t.Fatal(err)
	}
	put(t, s, "new", data(1000, 1))
	s.compactAll(0.5)
	st := s.Stats()
	if st.Compactions != 1 || st.CompactCopiedBytes != 0 || st.Files != 1 {
		t.Fatalf("stats %+v", st)
	}
	model := map[string][]byte{"new": data(1000, 1)}
	checkLive(t, s, append(keys, "new"), model)
	restarts(t, s, cfg, append(keys, "new"), model)
}

// The spill's own compactor, aggressive (segments under 90% live) and
// unbounded, under puts, removes and gets from several goroutines: every
// object reads back whole or misses as the workers' own records say, and
// restarts agree.
func TestCompactionConcurrent(t *testing.T) {
	cfg := testConfig(t.TempDir())
	cfg.CompactBelow = 0.9
	cfg.CompactBytesPerSec = 0
	cfg.CapacityBytes = 1 << 30 // no segment is dropped for room
	s := open(t, cfg)
	const workers, per = 4, 120
	models := make([]map[string][]byte, workers)
	var wg sync.WaitGroup
	errs := make(chan error, workers*per*4)
	for w := 0; w < workers; w++ {
		models[w] = map[string][]byte{}
		wg.Go(func() {
			m := models[w]
			for i := 0; i < per; i++ {
				key := fmt.Sprintf("w%d/k%d", w, i)
				want := data(1000+(i%7)*7000, w*1000+i)
				if err := s.PutObject(bg, key, 7, want); err != nil {
					errs <- fmt.Errorf("put %s: %w", key, err)
					continue
				}
				m[key] = want
				if i%3 != 0 {
					// Remove an earlier key, and sometimes put it back.
					old := fmt.Sprintf("w%d/k%d", w, i/2)
					if _, err := s.RemoveObject(bg, old); err != nil {
						errs <- fmt.Errorf("remove %s: %w", old, err)
					}
					delete(m, old)
					if i%5 == 0 {
						b := data(3000, w*1000+i+500)
						if err := s.PutObject(bg, old, 7, b); err != nil {
							errs <- fmt.Errorf("put %s: %w", old, err)
						}
						m[old] = b
					}
				}
				for j := max(0, i-5); j <= i; j++ {
					k := fmt.Sprintf("w%d/k%d", w, j)
					got, err := get(s, k, len(m[k]))
					switch want, ok := m[k]; {
					case !ok && !errors.Is(err, storage.ErrNotFound) && !errors.Is(err, storage.ErrBatch):
						errs <- fmt.Errorf("get %s, removed: %v", k, err)
					case ok && err != nil:
						errs <- fmt.Errorf("get %s: %w", k, err)
					case ok && string(got) != string(want):
						errs <- fmt.Errorf("get %s: wrong bytes", k)
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	within(t, time.Minute, "the compactor", func() { s.waitCompacted() })
	model := map[string][]byte{}
	var keys []string
	for w := range models {
		for i := 0; i < per; i++ {
			keys = append(keys, fmt.Sprintf("w%d/k%d", w, i))
		}
		for k, v := range models[w] {
			model[k] = v
		}
	}
	checkLive(t, s, keys, model)
	st := s.Stats()
	if st.Compactions == 0 || st.CorruptRemoved != 0 || st.WriteErrors != 0 || st.Evictions != 0 {
		t.Fatalf("stats %+v", st)
	}
	restarts(t, s, cfg, keys, model)
}

// waitCompacted waits until the compactor has no segment left to compact.
func (s *Store) waitCompacted() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		busy := s.compacting != nil
		for _, seg := range s.segs {
			busy = busy || s.compactableLocked(seg, s.cfg.CompactBelow)
		}
		if !busy {
			return
		}
		s.cond.Wait()
	}
}

// The pacer spaces bytes out to its rate, whatever the sizes of the calls,
// lets the first through at once, and does not bank idle time.
func TestPacer(t *testing.T) {
	p := pacer{rate: 1 << 20} // 1 MiB/s
	t0 := time.Unix(1000, 0)
	steps := []struct {
		at   time.Duration
		n    int64
		want time.Duration
	}{
		{0, 512 << 10, 0},                                         // at once
		{0, 512 << 10, 500 * time.Millisecond},                    // after the first's half second
		{100 * time.Millisecond, 1 << 20, 900 * time.Millisecond}, // after both
		{10 * time.Second, 1 << 20, 0},                            // idle: at once
		{10 * time.Second, 1, time.Second},                        // but the one before counts
	}
	for i, st := range steps {
		if got := p.delay(t0.Add(st.at), st.n); math.Abs(float64(got-st.want)) > float64(time.Microsecond) {
			t.Fatalf("step %d: delay %v, want %v", i, got, st.want)
		}
	}
	if d := (&pacer{}).delay(t0, 1<<40); d != 0 {
		t.Fatalf("no rate: delay %v", d)
	}
}

// Compaction's knobs are checked at New.
func TestCompactionConfig(t *testing.T) {
	for _, mod := range []func(*Config){
		func(c *Config) { c.CompactBelow = -0.1 },
		func(c *Config) { c.CompactBelow = 0.95 },
		func(c *Config) { c.CompactBelow = math.NaN() },
		func(c *Config) { c.CompactBytesPerSec = -1 },
	} {
		c := testConfig(t.TempDir())
		mod(&c)
		if _, err := New(c); !errors.Is(err, storage.ErrConfig) {
			t.Fatalf("New with compaction below %v at %d B/s: %v", c.CompactBelow, c.CompactBytesPerSec, err)
		}
	}
	if d := DefaultConfig("x"); d.CompactBelow != 0.5 || d.CompactBytesPerSec != 64<<20 {
		t.Fatalf("defaults %+v", d)
	}
}

// New verifies the data of the two newest segments by id, the ones a crash
// can tear, not the two last files: after compaction deleted the segments
// between, an old segment with a damaged record is not cut there (losing the
// records after it); a read drops that record alone.
func TestRecoverVerifiesNewestByID(t *testing.T) {
	dir := t.TempDir()
	cfg := manualConfig(dir)
	cfg.SegmentBytes = 64 << 20
	for i := 0; i < 3; i++ {
		s := open(t, cfg)
		for j := 0; j < 4; j++ {
			put(t, s, fmt.Sprintf("s%d/k%d", i, j), data(20_000, 10*i+j))
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	crash(t, dir)
	segs := segmentFiles(t, dir)
	if len(segs) != 3 {
		t.Fatalf("segments %v", segs)
	}
	b, err := os.ReadFile(segs[0])
	if err != nil {
		t.Fatal(err)
	}
	b[findRecord(t, b, "s0/k1")+sector+7] ^= 1
	if err := os.WriteFile(segs[0], b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(segs[1]); err != nil { // as compaction would have
		t.Fatal(err)
	}
	s := open(t, cfg)
	if st := s.Stats(); st.TornTails != 0 {
		t.Fatalf("the old segment was cut: %+v", st)
	}
	for _, k := range []string{"s0/k0", "s0/k2", "s0/k3"} {
		if _, err := s.ObjectSize(bg, k, 7); err != nil {
			t.Fatalf("%s: %v", k, err)
		}
	}
	if _, err := get(s, "s0/k1", 20_000); !errors.Is(err, storage.ErrCorrupt) {
		t.Fatalf("get of the damaged record: %v", err)
	}
}
