package arena

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The superblock's two copies, and a full tmpfs at the start (file.go).

// A new arena file has both superblock copies valid from its first start on:
// a service killed during its first run, with one copy damaged, is recovered
// from the other.
func TestFileNewHasBothSuperblocks(t *testing.T) {
	for _, damaged := range []string{"newer", "older"} {
		t.Run(damaged, func(t *testing.T) {
			path := filepath.Join(shmDir(t), "a")
			cfg := fileConfig(t, path, 8<<20)
			a, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			c, keys := fill(t, a, 60)
			crash(t, a) // a kill in the first run: the superblock as it left it
			raw := fileBytes(t, path)
			var gens [2]uint64
			for i, off := range []int{0, sbCopy} {
				sb, ok, _ := decodeSuperblock(raw[off:])
				if !ok {
					t.Fatalf("superblock copy %d of a new file is not valid", i)
				}
				gens[i] = sb.gen
			}
			slot := 0
			if (gens[1] > gens[0]) == (damaged == "newer") {
				slot = 1
			}
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			must(t, err)
			at := int64(slot*sbCopy + 40)
			_, err = f.WriteAt([]byte{raw[at] ^ 0x10}, at) // one flipped bit
			must(t, errors.Join(err, f.Close()))

			b := newArena(t, cfg)
			if st := b.Stats().Recovery; !st.Warm {
				t.Fatalf("one damaged superblock copy emptied the arena: %+v", st)
			}
			c.expect(t, b, keys)
		})
	}
}

// tmpfsDir mounts a tmpfs of size bytes for the rest of the test, or skips
// (mounting needs CAP_SYS_ADMIN, which a container may lack even as root).
func tmpfsDir(t *testing.T, size string) string {
	t.Helper()
	dir := filepath.Join(shmDir(t), "mnt")
	must(t, os.Mkdir(dir, 0o700))
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+size+",mode=0700"); err != nil {
		t.Skipf("cannot mount a tmpfs (%v): needs CAP_SYS_ADMIN", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// fillFS takes every free byte of dir's file system with a file of its own,
// as another user of /dev/shm would.
func fillFS(t *testing.T, dir string) {
	t.Helper()
	var fs unix.Statfs_t
	must(t, unix.Statfs(dir, &fs))
	f, err := os.Create(filepath.Join(dir, "someone-else"))
	must(t, err)
	defer f.Close()
	must(t, unix.Fallocate(int(f.Fd()), 0, 0, int64(fs.Bavail)*fs.Bsize))
	must(t, unix.Statfs(dir, &fs))
	if fs.Bavail != 0 {
		t.Fatalf("%d blocks still free", fs.Bavail)
	}
}

// After a kill that left the file partly populated, a full tmpfs does not
// keep the service from starting (a refusal was ErrFile, exit 2, and systemd
// never retried): it starts warm with what fits, says so once, and leaves the
// rest unused.
func TestFileStartsWarmOnAFullTmpfs(t *testing.T) {
	dir := tmpfsDir(t, "64m")
	path := filepath.Join(dir, "a")
	cfg := fileConfig(t, path, 48<<20)
	cfg.Warmup = true
	var arena atomic.Pointer[Arena]
	cfg.OnWarmup = func(ready, total int64) {
		// The first chunk is populated; the kill comes before the next.
		for arena.Load() == nil {
			time.Sleep(time.Millisecond)
		}
		<-arena.Load().stop
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	arena.Store(a)
	waitFor(t, "the first chunk", func() bool { return a.Stats().ReadyBytes > 0 })
	put(t, a, "k", 1, 70000)
	crash(t, a)
	fillFS(t, dir)

	cfg.OnWarmup = nil
	log := logTo(&cfg)
	b, err := New(cfg)
	if err != nil {
		t.Fatalf("a restart on a full tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	within(t, "Ready", func() { <-b.Ready() })
	st := b.Stats()
	if !st.Recovery.Warm || st.Recovery.Recovered != 1 || st.UnusableBytes == 0 || st.UnusableBytes >= st.SizeBytes {
		t.Fatalf("restart on a full tmpfs: %+v", st)
	}
	read(t, b, "k", 1, 70000)
	put(t, b, "more", 1, 70000) // in what fits
	read(t, b, "more", 1, 70000)
	if n := strings.Count(log.String(), "short of room"); n != 1 {
		t.Fatalf("%d warnings about the room, want 1:\n%s", n, log.String())
	}
	mustCheck(t, b)
}

// A start that formats the file anew counts the old file's own pages as room:
// they were free by the time it needs them.
func TestFileReformatCountsItsOwnPages(t *testing.T) {
	dir := tmpfsDir(t, "64m")
	path := filepath.Join(dir, "a")
	cfg := fileConfig(t, path, 48<<20)
	cfg.Warmup = true
	a := newArena(t, cfg)
	within(t, "Ready", func() { <-a.Ready() })
	must(t, a.Close())
	fillFS(t, dir)

	cfg.SizeBytes = 32 << 20 // another geometry: formatted anew
	log := logTo(&cfg)
	b, err := New(cfg)
	if err != nil {
		t.Fatalf("a start that formats the file anew on a full tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	within(t, "Ready", func() { <-b.Ready() })
	if st := b.Stats(); st.Recovery.Warm || st.UnusableBytes != 0 || strings.Contains(log.String(), "short of room") {
		t.Fatalf("reformat: %+v\n%s", st, log.String())
	}
	put(t, b, "k", 1, 70000)
	read(t, b, "k", 1, 70000)
}

// A tmpfs without room even for the arena's header: the arena is anonymous
// memory for this run, with one warning, instead of a refusal.
func TestFileNoRoomFallsBackToAnonymous(t *testing.T) {
	dir := tmpfsDir(t, "16m")
	fillFS(t, dir)
	path := filepath.Join(dir, "a")
	cfg := fileConfig(t, path, 8<<20)
	cfg.Warmup = true
	log := logTo(&cfg)
	a, err := New(cfg)
	if err != nil {
		t.Fatalf("New on a full tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = a.Close() })
	st := a.Stats().Recovery
	if st.File != "" || !strings.Contains(st.Cold, "no room") || !strings.Contains(log.String(), "this run's arena is anonymous memory") {
		t.Fatalf("New on a full tmpfs: %+v\n%s", st, log.String())
	}
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Fatalf("the arena file this start created and did not use is left behind: %v", err)
	}
	put(t, a, "k", 1, 70000)
	read(t, a, "k", 1, 70000)
}
