package arena

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"pgregory.net/rapid"
)

// Arena files. The tests put objects in an arena on a file, end it (Close, or
// a simulated kill that leaves the file as a SIGKILL would), start a new arena
// on the file, and check what it serves: every committed object with its
// bytes, nothing that was still being written, removed or evicted, and never
// a byte of anything else.

// shmDir is a fresh directory on a tmpfs for arena files: /dev/shm. Outside
// CI a machine without one skips; under CI=true it fails.
func shmDir(t testing.TB) string {
	t.Helper()
	skip := func(why string) {
		if os.Getenv("CI") == "true" {
			t.Fatalf("arena file tests need a tmpfs at /dev/shm: %s", why)
		}
		t.Skipf("no tmpfs for arena files: %s", why)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs("/dev/shm", &fs); err != nil {
		skip(err.Error())
	}
	if _, ok := memoryFS(int64(fs.Type)); !ok {
		skip(fmt.Sprintf("/dev/shm is a file system of type %#x", fs.Type))
	}
	if free := int64(fs.Bavail) * fs.Bsize; free < 256<<20 {
		skip(fmt.Sprintf("/dev/shm has %d bytes free", free))
	}
	dir, err := os.MkdirTemp("/dev/shm", "strata-arena-test-")
	if err != nil {
		skip(err.Error())
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// fileConfig is an arena of size bytes on the file at path, handed out at once
// (no warm-up) unless a test turns it on.
func fileConfig(t fataler, path string, size int64) Config {
	cfg := testConfig(t, size)
	cfg.File = path
	return cfg
}

// crash ends a as a SIGKILL would: its goroutines stop, its memory is unmapped
// and the file unlocked, and nothing else happens: pending writes stay
// pending, the superblock says "in use".
func crash(t fataler, a *Arena) {
	t.Helper()
	// The goroutines first: an eviction that ended after the arena is marked
	// closed would release its memory as Close does, superblock and all.
	close(a.stop)
	a.done.Wait()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed = true
	a.cond.Broadcast()
	b := a.back
	a.back, a.mem, a.umap, a.elog.buf = nil, nil, nil, nil
	a.closeIndexLocked()
	if a.rcv.active {
		a.rcv.finish(a)
	}
	unmapBytes(b.mapping)
	if err := unix.Close(b.fd); err != nil {
		t.Fatal(err)
	}
}

// content is what the test expects an arena to hold: key → size.
type content map[string]int

// expect checks that a holds exactly c's objects with their patterns (of
// keys, the others must be absent), once recovery is over.
func (c content) expect(t testing.TB, a *Arena, keys []string) {
	t.Helper()
	waitRecovered(t, a)
	for _, k := range keys {
		size, want := c[k]
		l, err := a.Acquire(k, 1)
		switch {
		case !want && err == nil:
			l.Release()
			t.Fatalf("%s is served, it should be gone", k)
		case !want:
		case err != nil:
			t.Fatalf("%s (%d bytes) is not served: %v", k, size, err)
		default:
			ok := bytes.Equal(l.Bytes(), pattern(k, size))
			l.Release()
			if !ok {
				t.Fatalf("%s: wrong bytes", k)
			}
		}
	}
	if st := a.Stats(); st.Objects != int64(len(c)) {
		t.Fatalf("%d objects, want %d", st.Objects, len(c))
	}
	mustCheck(t, a)
}

func waitRecovered(t testing.TB, a *Arena) {
	t.Helper()
	if err := a.AwaitRecovered(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// fill puts n objects, small and large, and returns them and their keys.
func fill(t testing.TB, a *Arena, n int) (content, []string) {
	c := content{}
	var keys []string
	for i := range n {
		k := fmt.Sprintf("model/tp0/%04d/%s", i, strings.Repeat("k", i%40))
		size := []int{100, 3000, 4096, 20000, 64 << 10, 700}[i%6]
		put(t, a, k, 1, size)
		c[k] = size
		keys = append(keys, k)
	}
	return c, keys
}

func TestFileWarmRestartAfterClose(t *testing.T) {
	path := filepath.Join(shmDir(t), "a")
	cfg := fileConfig(t, path, 8<<20)
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if st := a.Stats().Recovery; st.Warm || !strings.Contains(st.Cold, "new") || st.Starts != 1 {
		t.Fatalf("a new file: %+v", st)
	}
	id := a.Stats().Recovery.ContentID
	c, keys := fill(t, a, 120)
	// A write in flight and a removed object are not there after the restart.
	p, err := a.Reserve("in-flight", 1, 9000)
	if err != nil {
		t.Fatal(err)
	}
	copy(p.Bytes(), pattern("in-flight", 9000))
	p.Abort()
	a.Remove(keys[7])
	delete(c, keys[7])
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}

	b := newArena(t, cfg)
	waitRecovered(t, b)
	st := b.Stats().Recovery
	if !st.Warm || !st.PreviousClean || st.Starts != 2 || st.ContentID != id || st.Recovered != int64(len(c)) || st.Lost != 0 {
		t.Fatalf("after a clean restart: %+v", st)
	}
	c.expect(t, b, append(keys, "in-flight"))
	// The recovered arena takes new objects and evicts as a fresh one does.
	put(t, b, "after", 1, 30000)
	read(t, b, "after", 1, 30000)
	mustCheck(t, b)
}

func TestFileRecoversAfterAKill(t *testing.T) {
	path := filepath.Join(shmDir(t), "a")
	cfg := fileConfig(t, path, 8<<20)
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c, keys := fill(t, a, 200)
	// Writes in flight at the kill, small and large, half written.
	for i, size := range []int{50, 5000, 70000} {
		p, err := a.Reserve(fmt.Sprint("pending-", i), 1, int64(size))
		if err != nil {
			t.Fatal(err)
		}
		copy(p.Bytes()[:size/2], pattern("x", size/2))
		keys = append(keys, fmt.Sprint("pending-", i))
	}
	for _, k := range keys[:10] {
		a.Remove(k)
		delete(c, k)
	}
	crash(t, a)

	b := newArena(t, cfg)
	waitRecovered(t, b)
	st := b.Stats().Recovery
	if !st.Warm || st.PreviousClean || st.Recovered != int64(len(c)) || st.Lost != 0 || st.UnfinishedWrites != 2 {
		// The two large writes in flight left extents; the small one nothing.
		t.Fatalf("after a kill: %+v", st)
	}
	c.expect(t, b, keys)
	// The space of the writes in flight is free again: the arena can be
	// filled as far as a fresh one.
	if st := b.Stats(); st.UsedBytes > int64(len(c))*(70<<10)+8*descSlab {
		t.Fatalf("stats %+v", st)
	}
}

// A start on a file of another geometry, or version, says why in one line and
// starts empty: nothing of the old file is read.
func TestFileOfAnotherGeometryStartsEmpty(t *testing.T) {
	dir := shmDir(t)
	for _, c := range []struct {
		name  string
		tweak func(*Config)
		why   string
	}{
		{"size", func(c *Config) { c.SizeBytes = 16 << 20 }, "holds an arena of 8.0 MiB, this service has --arena 16.0 MiB"},
		{"slabs", func(c *Config) { c.SlabBytes = 128 << 10 }, "slabs"},
		{"alignment", func(c *Config) { c.Alignment = 8192 }, "alignment"},
		{"version", nil, "layout version"},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(dir, c.name)
			a, err := New(fileConfig(t, path, 8<<20))
			if err != nil {
				t.Fatal(err)
			}
			_, keys := fill(t, a, 30)
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			var log bytes.Buffer
			cfg := fileConfig(t, path, 8<<20)
			cfg.Logger = slog.New(slog.NewTextHandler(&log, nil))
			if c.tweak != nil {
				c.tweak(&cfg)
			} else {
				sb := readSuperblock(t, path)
				sb.version = layoutVersion + 1
				writeSuperblock(t, path, sb)
			}
			b := newArena(t, cfg)
			st := b.Stats()
			if st.Recovery.Warm || !strings.Contains(st.Recovery.Cold, c.why) || st.Objects != 0 || st.Recovery.DroppedAtStart != 30 {
				t.Fatalf("on a file of another %s: %+v", c.name, st.Recovery)
			}
			if n := strings.Count(log.String(), "arena file starts empty"); n != 1 || !strings.Contains(log.String(), c.why) {
				t.Fatalf("want one log line saying why; log:\n%s", log.String())
			}
			content{}.expect(t, b, keys)
			// Written anew: the next start on it, with the same geometry, is warm.
			put(t, b, "new", 1, 5000)
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			d := newArena(t, cfg)
			content{"new": 5000}.expect(t, d, append(keys, "new"))
		})
	}
}

func readSuperblock(t *testing.T, path string) superblock {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sb, ok, _ := pickSuperblockOf(raw)
	if !ok {
		t.Fatal("no valid superblock")
	}
	return sb
}

func pickSuperblockOf(raw []byte) (superblock, bool, string) {
	sb, ok, why := pickSuperblock(raw[:min(len(raw), umOffset)], int64(len(raw)))
	return sb, ok, why
}

// writeSuperblock writes sb, valid, over both copies.
func writeSuperblock(t *testing.T, path string, sb superblock) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, sbBytes)
	sb.encode(b)
	for _, off := range []int64{0, sbCopy} {
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
	}
}

// A damaged file never crashes the arena and never serves wrong bytes: random
// bytes over the whole file, over its superblock, over the unit map, over the
// slabs' slots, a truncated file, one grown.
func TestFileDamagedNeverServesWrongBytes(t *testing.T) {
	dir := shmDir(t)
	const size = 8 << 20
	for _, c := range []struct {
		name   string
		damage func(t *testing.T, f *os.File, g geometry, rng *rand.Rand)
		warm   bool // the file is reused; its objects that the damage left alone are served
	}{
		{"random file", func(t *testing.T, f *os.File, g geometry, rng *rand.Rand) {
			scribble(t, f, 0, g.fileSize, g.fileSize, rng)
		}, false},
		{"random superblock", func(t *testing.T, f *os.File, g geometry, rng *rand.Rand) {
			scribble(t, f, 0, umOffset, umOffset, rng)
		}, false},
		{"one superblock copy", func(t *testing.T, f *os.File, g geometry, rng *rand.Rand) {
			scribble(t, f, 0, sbBytes, sbBytes, rng)
			scribble(t, f, sbCopy, sbBytes, sbBytes, rng)
			raw := make([]byte, umOffset)
			_, _ = f.ReadAt(raw, 0)
			if _, ok, _ := pickSuperblock(raw, g.fileSize); ok {
				t.Skip("random bytes made a valid superblock")
			}
		}, false},
		{"truncated", func(t *testing.T, f *os.File, g geometry, rng *rand.Rand) {
			if err := f.Truncate(g.fileSize / 2); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"grown", func(t *testing.T, f *os.File, g geometry, rng *rand.Rand) {
			if err := f.Truncate(g.fileSize + 4096); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"random unit map", func(t *testing.T, f *os.File, g geometry, rng *rand.Rand) {
			scribble(t, f, umOffset, g.umBytes, g.umBytes/4, rng)
		}, true},
		{"random data", func(t *testing.T, f *os.File, g geometry, rng *rand.Rand) {
			// Whole pages of random bytes: they land on slots (small objects'
			// bytes, keys, trailers, descriptors) and large objects' bytes,
			// which their seals cover (seal.go).
			for range 64 {
				off := g.dataOff + rng.Int64N(size/4096)*4096
				scribble(t, f, off, 4096, 4096, rng)
			}
		}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-"))
			cfg := fileConfig(t, path, size)
			a, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			cont, keys := fill(t, a, 300)
			g := a.back.geo
			// Where each object's slot and bytes lie, to tell which ones the
			// damage left alone.
			spans := map[string][2][2]int64{}
			a.mu.Lock()
			for _, k := range keys {
				r := a.rec(a.lookupLocked(k, hashOf(a, k)))
				spans[k] = [2][2]int64{{r.off, a.slotEnd(r)}, {a.bytesOff(r), a.bytesOff(r) + r.size}}
			}
			a.mu.Unlock()
			crash(t, a)
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			before, _ := os.ReadFile(path)
			rng := rand.New(rand.NewPCG(1, uint64(len(c.name))))
			c.damage(t, f, g, rng)
			f.Close()
			after, _ := os.ReadFile(path)

			b, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			waitRecovered(t, b)
			st := b.Stats()
			if st.Recovery.Warm != c.warm {
				t.Fatalf("warm %v, want %v: %+v", st.Recovery.Warm, c.warm, st.Recovery)
			}
			served, untouched := 0, 0
			for _, k := range keys {
				sp := spans[k]
				large := sp[0][0] != sp[1][0]
				slotIntact := sameBytes(before, after, g.dataOff, [2][2]int64{sp[0], {}})
				intact := slotIntact && sameBytes(before, after, g.dataOff, [2][2]int64{{}, sp[1]})
				// Damage to the unit map loses objects (never serves them
				// wrong), whatever their slots hold.
				mustServe := c.warm && intact && c.name != "random unit map"
				if intact {
					untouched++
				}
				l, err := b.Acquire(k, 1)
				if err != nil {
					if mustServe {
						t.Errorf("%s was left alone by the damage and is not served: %v", k, err)
					}
					continue
				}
				served++
				okBytes := bytes.Equal(l.Bytes(), pattern(k, cont[k]))
				l.Release()
				if !okBytes {
					t.Errorf("%s is served with wrong bytes (large %v, its slot intact %v)", k, large, slotIntact)
				}
			}
			t.Logf("%s: %d of %d objects served (%d untouched), recovery %+v", c.name, served, len(keys), untouched, st.Recovery)
			mustCheck(t, b)
			// And it keeps working.
			put(t, b, "new", 1, 5000)
			read(t, b, "new", 1, 5000)
		})
	}
}

func hashOf(a *Arena, k string) uint64 { return maphash.String(a.seed, k) }

// sameBytes reports whether the data ranges spans (offsets in the data
// region) hold the same bytes in before and after.
func sameBytes(before, after []byte, dataOff int64, spans [2][2]int64) bool {
	for _, s := range spans {
		if s[1] <= s[0] {
			continue
		}
		lo, hi := dataOff+s[0], dataOff+s[1]
		if hi > int64(len(after)) || !bytes.Equal(before[lo:hi], after[lo:hi]) {
			return false
		}
	}
	return true
}

// scribble writes n random bytes at random places of [off, off+span) of f.
func scribble(t *testing.T, f *os.File, off, span, n int64, rng *rand.Rand) {
	t.Helper()
	b := make([]byte, min(n, span))
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	at := off
	if span > int64(len(b)) {
		at += rng.Int64N(span - int64(len(b)) + 1)
	}
	if _, err := f.WriteAt(b, at); err != nil {
		t.Fatal(err)
	}
}

// Two arenas on one file: the second is refused, naming the first's pid.
func TestFileIsLocked(t *testing.T) {
	path := filepath.Join(shmDir(t), "a")
	a := newArena(t, fileConfig(t, path, 4<<20))
	_, err := New(fileConfig(t, path, 4<<20))
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), fmt.Sprint(os.Getpid())) {
		t.Fatalf("a second arena on the file: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	b := newArena(t, fileConfig(t, path, 4<<20))
	if !b.Stats().Recovery.Warm {
		t.Fatal("the file was not reused once the first arena closed")
	}
}

// A file on a disk is refused: it would be written back as objects change.
func TestFileMustBeInMemory(t *testing.T) {
	dir := t.TempDir()
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		t.Fatal(err)
	}
	if _, ok := memoryFS(int64(fs.Type)); ok {
		dir = "/var/tmp"
		if err := unix.Statfs(dir, &fs); err != nil || isMemoryFS(fs) {
			t.Skip("no directory on a disk to try")
		}
		d, err := os.MkdirTemp(dir, "arena")
		if err != nil {
			t.Skip(err)
		}
		t.Cleanup(func() { os.RemoveAll(d) })
		dir = d
	}
	_, err := New(fileConfig(t, filepath.Join(dir, "a"), 4<<20))
	if !errors.Is(err, ErrFile) || !strings.Contains(err.Error(), "tmpfs") {
		t.Fatalf("an arena file on a disk: %v", err)
	}
}

func isMemoryFS(fs unix.Statfs_t) bool { _, ok := memoryFS(int64(fs.Type)); return ok }

// Recovery keeps the LRU order of the commits: after a restart the objects
// committed first are evicted first, and one read since the restart is kept.
func TestFileRecoveryKeepsCommitOrder(t *testing.T) {
	path := filepath.Join(shmDir(t), "a")
	const obj = 64 << 10
	cfg := fileConfig(t, path, 32*obj+descSlab)
	cfg.HighWatermark, cfg.LowWatermark = 1, 0.99
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Commit order 31, 30, ..., 0: the opposite of where they lie.
	var ps []*Pending
	for i := range 32 {
		p, err := a.Reserve(fmt.Sprint(i), 1, obj)
		if err != nil {
			t.Fatal(err)
		}
		copy(p.Bytes(), pattern(fmt.Sprint(i), obj))
		ps = append(ps, p)
	}
	for i := 31; i >= 0; i-- {
		if err := ps[i].Commit(); err != nil {
			t.Fatal(err)
		}
	}
	crash(t, a)
	var mu sync.Mutex
	var victims []string
	cfg.OnEvict = func(e Evicted) bool { mu.Lock(); victims = append(victims, e.Key); mu.Unlock(); return true }
	b := newArena(t, cfg)
	<-b.Ready()              // recovered, and the LRU list in the commits' order
	read(t, b, "31", 1, obj) // used since: the most recent now
	put(t, b, "new", 1, 3*obj)
	mu.Lock()
	defer mu.Unlock()
	if got := fmt.Sprint(victims); got != "[30 29 28]" {
		t.Fatalf("victims %s after a restart, want [30 29 28]: the least recently committed first", got)
	}
}

// The helper process: the test binary run with helperEnv set opens the arena
// file named there and acts as the test asks, then waits to be killed.
const helperEnv = "STRATA_ARENA_TEST_HELPER"

// runHelper recovers the arena file of helperEnv and, once recovery has read
// its first slab, puts a new object and a second copy of one not recovered
// yet, says "paused" on stdout and waits for SIGKILL: a kill in the middle of
// a recovery with writes of its own.
func runHelper() int {
	cfg := DefaultConfig(8 << 20)
	cfg.File, cfg.Warmup = os.Getenv(helperEnv), false
	cfg.Logger = slog.New(slog.DiscardHandler)
	paused := make(chan struct{})
	var blocked atomic.Int32
	cfg.recoverStep = func(n int) {
		if n >= 1 {
			if blocked.Add(1) == recoverWorkers {
				close(paused)
			}
			select {} // until killed
		}
	}
	a, err := New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	<-paused
	write := func(key string, size int) error {
		p, err := a.Reserve(key, 1, int64(size))
		if err != nil {
			return err
		}
		copy(p.Bytes(), pattern(key, size))
		return p.Commit()
	}
	if err := write("during-recovery", 20000); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	// A key recovery has not reached yet: its old copy is in the file, the
	// new one too.
	for i := 299; i >= 0; i-- {
		k := fmt.Sprintf("model/tp0/%04d/%s", i, strings.Repeat("k", i%40))
		if !a.Contains(k, 1) {
			if err := write(k, []int{100, 3000, 4096, 20000, 64 << 10, 700}[i%6]); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 2
			}
			fmt.Println("copied", k)
			break
		}
	}
	// Sealed before the kill: this test is about recovery, not about the
	// moments a kill loses before the sealer (seal_test.go).
	for deadline := time.Now().Add(10 * time.Second); a.Stats().Unsealed > 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			fmt.Fprintln(os.Stderr, "the sealer did not seal two objects in 10 s")
			return 2
		}
	}
	fmt.Println("paused")
	select {}
}

// A kill during recovery, with writes of its own, loses nothing: the next
// start recovers the file's objects, the one written meanwhile, and keeps one
// copy of the key written twice.
func TestFileKilledDuringRecovery(t *testing.T) {
	path := filepath.Join(shmDir(t), "a")
	cfg := fileConfig(t, path, 8<<20)
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c, keys := fill(t, a, 300)
	crash(t, a)

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := bufio.NewScanner(out)
	copied := ""
	for lines.Scan() {
		if k, ok := strings.CutPrefix(lines.Text(), "copied "); ok {
			copied = k
		}
		if lines.Text() == "paused" {
			break
		}
	}
	if copied == "" {
		t.Fatalf("the helper did not pause in recovery with a copy written (%v): %s", lines.Err(), stderr.String())
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	b := newArena(t, cfg)
	waitRecovered(t, b)
	st := b.Stats().Recovery
	c["during-recovery"] = 20000
	if !st.Warm || st.Lost != 0 || st.Duplicates != 1 || st.Recovered != int64(len(c)) || st.Starts != 3 {
		t.Fatalf("after a kill during recovery: %+v", st)
	}
	c.expect(t, b, append(keys, "during-recovery"))
}

// While it recovers, the arena serves what it has read, takes new objects
// (a second copy of a key not read yet wins over the old one), and holds a
// Remove until recovery ends, so that the removed object cannot come back.
func TestFileServesWhileRecovering(t *testing.T) {
	path := filepath.Join(shmDir(t), "a")
	cfg := fileConfig(t, path, 8<<20)
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c, keys := fill(t, a, 300)
	crash(t, a)

	paused, resume := make(chan struct{}), make(chan struct{})
	var blocked atomic.Int32
	cfg.recoverStep = func(n int) {
		if n >= 1 {
			if blocked.Add(1) == recoverWorkers {
				close(paused) // every goroutine of recovery waits: nothing moves
			}
			<-resume
		}
	}
	b := newArena(t, cfg)
	<-paused
	if st := b.Stats(); !st.Recovery.Recovering || st.Ready || st.Recovery.SlabsRead < 1 || st.Recovery.SlabsRead > recoverWorkers {
		t.Fatalf("paused after a slab or two: %+v", st.Recovery)
	}
	var got, notYet []string
	for _, k := range keys {
		if b.Contains(k, 1) {
			got = append(got, k)
		} else {
			notYet = append(notYet, k)
		}
	}
	if len(got) == 0 || len(notYet) == 0 {
		t.Fatalf("after one slab of %d: %d objects recovered, %d not", b.Stats().Recovery.Slabs, len(got), len(notYet))
	}
	read(t, b, got[0], 1, c[got[0]])
	put(t, b, "new", 1, 30000)
	put(t, b, notYet[0], 1, c[notYet[0]]) // its old copy is still to be read
	removed := make(chan bool, 1)
	go func() { removed <- b.Remove(notYet[1]) }()
	waitFor(t, "the remove to wait for recovery", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.rcv.waits > 0
	})
	select {
	case <-removed:
		t.Fatal("a remove returned while recovery had not read its key")
	default:
	}
	close(resume)
	if ok := <-removed; !ok {
		t.Fatal("the remove after recovery found nothing")
	}
	delete(c, notYet[1])
	c["new"] = 30000
	c.expect(t, b, append(keys, "new"))
	if st := b.Stats().Recovery; st.Duplicates != 1 || st.Lost != 0 {
		t.Fatalf("recovery: %+v", st)
	}
	// And the removed object stays gone across another restart.
	crash(t, b)
	cfg.recoverStep = nil
	d := newArena(t, cfg)
	c.expect(t, d, append(keys, "new"))
}

// TestFileRecoveryModel: whatever mix of writes, aborts, removals and
// evictions ran before a kill (at any point, writes in flight included), the
// arena started on the file afterwards holds exactly the objects committed and
// not removed or evicted since, with their bytes.
func TestFileRecoveryModel(t *testing.T) {
	dir := shmDir(t)
	n := 0
	rapid.Check(t, func(t *rapid.T) {
		n++
		path := filepath.Join(dir, fmt.Sprint(n))
		defer os.Remove(path)
		const unit = 4096
		cfg := fileConfig(t, path, unit*int64(rapid.IntRange(24, 64).Draw(t, "units")))
		cfg.HighWatermark, cfg.LowWatermark = 1, 0.99 // evictions by Reserve only
		want := map[string]int{}                      // committed objects: key → size
		cfg.OnEvict = func(e Evicted) bool { delete(want, e.Key); return true }
		a, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		keys := []string{"a", "b", "c", "d", "e", "f", strings.Repeat("g", 100), strings.Repeat("h", 300)}
		pend := map[string]*Pending{}
		torn := map[string]bool{} // pending writes left half written: aborted, never committed
		for range rapid.IntRange(1, 60).Draw(t, "ops") {
			key := rapid.SampledFrom(keys).Draw(t, "key")
			switch rapid.IntRange(0, 9).Draw(t, "op") {
			case 0, 1, 2, 3:
				if pend[key] != nil {
					continue
				}
				size := rapid.OneOf(rapid.IntRange(1, unit-1), rapid.IntRange(unit, 5*unit)).Draw(t, "size")
				p, err := a.Reserve(key, 1, int64(size))
				if err != nil {
					continue // exists, or no room: nothing changes
				}
				copy(p.Bytes(), pattern(key, size))
				pend[key] = p
			case 4, 5, 6:
				if p := pend[key]; p != nil && !torn[key] {
					if err := p.Commit(); err == nil {
						want[key] = len(p.b)
					}
					delete(pend, key)
				}
			case 7:
				if p := pend[key]; p != nil {
					p.Abort()
					delete(pend, key)
					delete(torn, key)
				}
			case 8:
				a.Remove(key)
				delete(want, key)
			case 9:
				if p := pend[key]; p != nil {
					// Half written at the kill: never served.
					clear(p.Bytes()[:len(p.b)/2])
					torn[key] = true
				}
			}
		}
		crash(t, a)
		cfg.OnEvict = nil
		b, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		if err := b.AwaitRecovered(context.Background()); err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			size, ok := want[k]
			l, err := b.Acquire(k, 1)
			switch {
			case ok && err != nil:
				t.Fatalf("committed %s (%d bytes) is not recovered: %v", k, size, err)
			case !ok && err == nil:
				l.Release()
				t.Fatalf("%s is recovered, but it was not committed, or was removed or evicted", k)
			case ok:
				same := bytes.Equal(l.Bytes(), pattern(k, size))
				l.Release()
				if !same {
					t.Fatalf("%s recovered with other bytes", k)
				}
			}
		}
		if st := b.Stats(); st.Objects != int64(len(want)) || st.Recovery.Lost != 0 {
			t.Fatalf("recovered %+v, want %d objects", st.Recovery, len(want))
		}
		if err := b.Check(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestFileConcurrentWhileStarting: 6 goroutines write, read and remove objects
// in an arena that is still recovering its file and warming its memory, under
// eviction; every object read holds its key's bytes, the arena's invariants
// hold, and after another kill the file holds exactly what the arena held.
func TestFileConcurrentWhileStarting(t *testing.T) {
	path := filepath.Join(shmDir(t), "a")
	const size = 12 << 20
	cfg := fileConfig(t, path, size)
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, keys := fill(t, a, 600)
	crash(t, a)

	cfg.Warmup = true
	var bad atomic.Int64
	cfg.OnEvict = func(e Evicted) bool {
		if !bytes.Equal(e.Bytes, pattern(e.Key, len(e.Bytes))) {
			bad.Add(1)
		}
		return true
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 9))
			for i := range 300 {
				var key string
				if rng.IntN(2) == 0 {
					key = keys[rng.IntN(len(keys))]
				} else {
					key = fmt.Sprintf("w%d-%d", w, i)
				}
				switch rng.IntN(10) {
				case 0:
					b.Remove(key)
				case 1, 2, 3, 4:
					l, err := b.Acquire(key, 1)
					if err == nil {
						if !bytes.Equal(l.Bytes(), pattern(key, len(l.Bytes()))) {
							bad.Add(1)
						}
						l.Release()
					}
				default:
					n := []int{90, 2000, 5000, 40000}[rng.IntN(4)]
					if strings.HasPrefix(key, "model/") {
						n = -1 // the file's keys keep their sizes (fill's)
					}
					if n < 0 {
						continue
					}
					p, err := b.Reserve(key, 1, int64(n))
					if err != nil {
						continue
					}
					copy(p.Bytes(), pattern(key, n))
					_ = p.Commit()
				}
			}
		})
	}
	wg.Wait()
	<-b.Ready()
	if bad.Load() > 0 {
		t.Fatalf("%d reads or evictions saw other bytes than their key's", bad.Load())
	}
	mustCheck(t, b)
	// What the arena holds now is what a restart finds, once no background
	// eviction can take an object between the two.
	pauseEvictor(b)
	held := content{}
	for _, k := range append(keys, allKeys(6, 300)...) {
		if l, err := b.Acquire(k, 1); err == nil {
			held[k] = len(l.Bytes())
			l.Release()
		}
	}
	crash(t, b)
	cfg.OnEvict = nil
	d := newArena(t, cfg)
	held.expect(t, d, append(keys, allKeys(6, 300)...))
}

func allKeys(workers, n int) []string {
	var out []string
	for w := range workers {
		for i := range n {
			out = append(out, fmt.Sprintf("w%d-%d", w, i))
		}
	}
	return out
}
