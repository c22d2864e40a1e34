package spill

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/internal/vecio"
	"github.com/stratakv/strata/storage"
)

// Past its capacity the spill drops its oldest segment whole: the newest
// objects stay, the oldest go, and the bytes stay under the capacity.
func TestCapacityDropsOldestSegment(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	cfg.CapacityBytes = 1 << 20 // segments of 128 KiB (an eighth)
	s := open(t, cfg)
	if st := s.Stats(); st.SegmentBytes != 128<<10 {
		t.Fatalf("segment bytes %d, want an eighth of the capacity", st.SegmentBytes)
	}
	const n, size = 200, 20_000
	for i := 0; i < n; i++ {
		put(t, s, fmt.Sprintf("k%d", i), data(size, i))
		if st := s.Stats(); st.Bytes > cfg.CapacityBytes {
			t.Fatalf("after put %d: %d bytes, over the capacity %d", i, st.Bytes, cfg.CapacityBytes)
		}
	}
	s.flush()
	st := s.Stats()
	if st.SegmentsDropped == 0 || st.Evictions == 0 || st.Objects+st.Evictions != n {
		t.Fatalf("stats %+v", st)
	}
	mustMiss(t, s, "k0", size)
	for i := n - 10; i < n; i++ {
		mustGet(t, s, fmt.Sprintf("k%d", i), data(size, i))
	}
	// Every object the index holds is readable; the files on disk are the
	// live segments only.
	for i := 0; i < n; i++ {
		k := fmt.Sprintf("k%d", i)
		if _, err := s.ObjectSize(bg, k, 7); err == nil {
			mustGet(t, s, k, data(size, i))
		}
	}
	if files := len(segmentFiles(t, dir)); int64(files) != st.Files {
		t.Fatalf("%d segment files on disk, stats say %d", files, st.Files)
	}
}

// The device's free space bounds the spill as its capacity does.
func TestDeviceFreeSpaceBounds(t *testing.T) {
	cfg := testConfig(t.TempDir())
	cfg.CapacityBytes = 1 << 40
	var onDisk atomic.Int64
	// A device of 2 MiB that this spill alone uses.
	sp := newWithFree(t, cfg, func() int64 { return 2<<20 - onDisk.Load() }, &onDisk)
	for i := 0; i < 300; i++ {
		put(t, sp, fmt.Sprintf("k%d", i), data(20_000, i))
	}
	sp.flush()
	if st := sp.Stats(); st.Bytes > 2<<20 || st.SegmentsDropped == 0 {
		t.Fatalf("stats %+v", st)
	}
	mustGet(t, sp, "k299", data(20_000, 299))
}

// newWithFree opens a spill whose device has free() bytes free; onDisk
// follows the bytes the spill's files take.
func newWithFree(t *testing.T, cfg Config, free func() int64, onDisk *atomic.Int64) *Store {
	t.Helper()
	s := open(t, cfg)
	s.mu.Lock()
	s.freeBytes = func() int64 {
		// Called with s.mu held: the files' bytes are what was written.
		onDisk.Store(s.used - s.unwritten)
		return free()
	}
	s.refreshLimitLocked()
	s.mu.Unlock()
	return s
}

// A device that answers ENOSPC although the spill thought it had room: the
// write drops the oldest segment and tries again; nothing is lost.
func TestNoSpaceDropsOldestAndRetries(t *testing.T) {
	cfg := testConfig(t.TempDir())
	s := open(t, cfg)
	for i := 0; i < 150; i++ { // several segments
		put(t, s, fmt.Sprintf("old%d", i), data(30_000, i))
	}
	s.flush()
	var full atomic.Int32
	full.Store(2)
	s.mu.Lock()
	s.pwritev = func(fd int, iovs [][]byte, off int64) (int, error) {
		if full.Add(-1) >= 0 {
			return 0, unix.ENOSPC
		}
		return vecio.Pwritev(fd, iovs, off)
	}
	s.mu.Unlock()
	put(t, s, "small", data(30_000, 100))  // staged: the writer retries
	put(t, s, "large", data(200_000, 101)) // direct: the put retries
	s.flush()
	mustGet(t, s, "small", data(30_000, 100))
	mustGet(t, s, "large", data(200_000, 101))
	st := s.Stats()
	if st.NoSpaceRetries != 2 || st.SegmentsDropped != 2 || st.WriteErrors != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// A write that fails for good loses the objects it carried (they are
// forgotten, never served as garbage), and the spill goes on in a new
// segment.
func TestWriteFault(t *testing.T) {
	cfg := testConfig(t.TempDir())
	s := open(t, cfg)
	var fail atomic.Bool
	fail.Store(true)
	s.mu.Lock()
	s.pwritev = func(fd int, iovs [][]byte, off int64) (int, error) {
		if fail.Load() {
			return 0, unix.EIO
		}
		return vecio.Pwritev(fd, iovs, off)
	}
	s.mu.Unlock()
	put(t, s, "staged", data(10_000, 1))
	if err := s.PutObject(bg, "direct", 7, data(200_000, 2)); !errors.Is(err, storage.ErrIO) {
		t.Fatalf("direct put on a failing device: %v", err)
	}
	s.flush()
	mustMiss(t, s, "staged", 10_000)
	mustMiss(t, s, "direct", 200_000)
	fail.Store(false)
	put(t, s, "after", data(10_000, 3))
	put(t, s, "after-direct", data(200_000, 4))
	s.flush()
	mustGet(t, s, "after", data(10_000, 3))
	mustGet(t, s, "after-direct", data(200_000, 4))
	st := s.Stats()
	if st.WriteErrors != 2 || st.LostObjects != 1 || st.Files < 2 {
		t.Fatalf("stats %+v", st)
	}
	if st.Faults["io"] != 1 {
		t.Fatalf("faults %v", st.Faults)
	}
}

// On a real small device (tmpfs, no O_DIRECT) under a far larger capacity,
// the spill follows the device's free space: puts go on, old segments go.
func TestSmallDevice(t *testing.T) {
	if os.Geteuid() != 0 {
		skipOutsideCI(t, "mounting a tmpfs needs root; CI runs as root")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=2m,mode=0700"); err != nil {
		skipOutsideCI(t, fmt.Sprintf("cannot mount a tmpfs: %v", err))
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	cfg := testConfig(dir)
	cfg.CapacityBytes = 64 << 30
	s := open(t, cfg)
	for i := 0; i < 200; i++ {
		put(t, s, fmt.Sprintf("k%d", i), data(40_000, i))
	}
	put(t, s, "big", data(300_000, 1))
	s.flush()
	st := s.Stats()
	if st.WriteErrors != 0 || st.SegmentsDropped == 0 || st.Bytes > 2<<20 {
		t.Fatalf("stats %+v", st)
	}
	mustGet(t, s, "k199", data(40_000, 199))
	mustGet(t, s, "big", data(300_000, 1))
}

// Stats reports the bound in force: on a device of 64 MiB under a configured
// 64 GiB, 64 MiB (the files' bytes plus the device's free space), with the
// configured capacity beside it; under a configured capacity below the
// device's room, that capacity. (Before, it reported 64 GiB.)
func TestCapacityInForce(t *testing.T) {
	cfg := testConfig(t.TempDir())
	cfg.CapacityBytes = 64 << 30
	var onDisk atomic.Int64
	s := newWithFree(t, cfg, func() int64 { return 64<<20 - onDisk.Load() }, &onDisk)
	check := func(want int64) {
		t.Helper()
		if st := s.Stats(); st.CapacityBytes != want || st.ConfiguredCapacityBytes != cfg.CapacityBytes {
			t.Fatalf("capacity %d (configured %d), want %d (configured %d)", st.CapacityBytes, st.ConfiguredCapacityBytes, want, cfg.CapacityBytes)
		}
	}
	check(64 << 20)
	for i := 0; i < 100; i++ {
		put(t, s, fmt.Sprintf("k%d", i), data(20_000, i))
	}
	s.flush()
	check(64 << 20)

	cfg = testConfig(t.TempDir())
	cfg.CapacityBytes = 8 << 20
	s = newWithFree(t, cfg, func() int64 { return 64<<20 - onDisk.Load() }, &onDisk)
	check(8 << 20)
}
