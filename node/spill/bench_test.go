package spill

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/zeebo/xxh3"
	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/internal/benchpeer"
	"github.com/stratakv/strata/internal/vecio"
	"github.com/stratakv/strata/storage"
	"github.com/stratakv/strata/storage/file"
)

// BenchmarkSpillWrite spills 32 MiB of evicted objects per iteration (4 MiB
// or 64 KiB each, from block-aligned mapped memory as the arena hands them
// over) until they are on the device, and compares it, A/B alternated, with
// two peers writing the same bytes in the same directory:
//
//   - x-of-odirect: one file written front to back with O_DIRECT in 4 MiB
//     writes, the device's sequential write throughput (the goal is >= 0.8);
//   - x-of-file-store: the spill this package replaced, storage/file's
//     PutObject (a file per object, O_DIRECT, no fsync, as the node used it):
//     above 1 the segments are faster.
//
// Both sides reach the device without an fsync: O_DIRECT writes return when
// the device has the bytes. The spill wraps around its 1 GiB capacity, so
// dropping old segments is in its time, as the file store's evictions are in
// its.
func BenchmarkSpillWrite(b *testing.B) {
	const batch = 32 << 20
	for _, size := range []int{4 << 20, 64 << 10} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			dir := b.TempDir()
			mem, err := unix.Mmap(-1, 0, batch, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = unix.Munmap(mem) })
			copy(mem, data(batch, 1))
			objs := make([][]byte, batch/size)
			for i := range objs {
				objs[i] = mem[i*size : (i+1)*size : (i+1)*size]
			}

			cfg := DefaultConfig(filepath.Join(dir, "spill"))
			cfg.CapacityBytes = 1 << 30
			cfg.Logger = quiet
			s := open(b, cfg)
			if !s.Stats().DirectIO {
				b.Logf("the filesystem of %s refuses O_DIRECT", dir)
			}

			fc := file.DefaultConfig(filepath.Join(dir, "files"))
			fc.CapacityBytes, fc.Sync, fc.Logger = 1<<30, false, quiet
			fs, err := file.New(fc)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = fs.Close() })

			raw := filepath.Join(dir, "raw")
			ours := func(i int) {
				for j, o := range objs {
					if err := s.PutObject(bg, fmt.Sprintf("obj/%d/%d", i, j), 7, o); err != nil {
						b.Fatal(err)
					}
				}
				s.flush()
			}
			odirect := func(i int) {
				fd, err := unix.Open(raw, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_DIRECT|unix.O_CLOEXEC, 0o644)
				if err != nil {
					b.Fatal(err)
				}
				for off := 0; off < batch; off += 4 << 20 {
					if _, err := vecio.Pwritev(fd, [][]byte{mem[off : off+4<<20]}, int64(off)); err != nil {
						b.Fatal(err)
					}
				}
				if err := unix.Close(fd); err != nil {
					b.Fatal(err)
				}
			}
			files := func(i int) {
				for j, o := range objs {
					if err := fs.PutObject(bg, fmt.Sprintf("obj/%d/%d", i, j), storage.Format(7), o); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.SetBytes(batch)
			benchpeer.CompareAll(b, ours, []benchpeer.Peer{
				{Unit: "x-of-odirect", Run: odirect},
				{Unit: "x-of-file-store", Run: files},
			}, benchpeer.Options{Setup: func(int, bool) { _ = os.Remove(raw) }})
			if st := s.Stats(); st.WriteErrors != 0 {
				b.Fatalf("spill stats %+v", st)
			}
		})
	}
}

// BenchmarkSpillRead reads 32 MiB of spilled objects per iteration (4 MiB or
// 64 KiB each) from segment files, never from a write buffer, into
// block-aligned mapped memory as the arena hands it over, and compares it,
// A/B alternated, with plain O_DIRECT reads of the same bytes, object by
// object, from one file in the same directory (x-of-odirect: the goal is >=
// 0.8), and with the spill's own reads into memory at an odd address
// (x-of-window), which go through an aligned window and a copy, as every read
// of a record with a 512-byte header did before such records were read
// straight into the caller's memory where the device allows:
//
//	go test -run '^$' -bench SpillRead -benchtime 100x ./node/spill
//
// Both sides bypass the page cache (O_DIRECT). The spill checks each record's
// header, key included, and the data's checksum: checksum-share is the time
// xxh3 takes over the same bytes (the best of 5) as a share of the spill's.
func BenchmarkSpillRead(b *testing.B) {
	const batch = 32 << 20
	for _, size := range []int{4 << 20, 64 << 10} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			dir := b.TempDir()
			mem, err := unix.Mmap(-1, 0, 3*batch+block, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = unix.Munmap(mem) })
			src, dst, odd := mem[:batch:batch], mem[batch:2*batch], mem[2*batch+1:]
			copy(src, data(batch, 1))
			n := batch / size
			obj := func(m []byte, j int) []byte { return m[j*size : (j+1)*size : (j+1)*size] }

			cfg := DefaultConfig(filepath.Join(dir, "spill"))
			cfg.Logger = quiet
			s := open(b, cfg)
			if !s.Stats().DirectIO {
				b.Logf("the filesystem of %s refuses O_DIRECT", dir)
			}
			keys := make([]string, n)
			for j := range n {
				keys[j] = fmt.Sprintf("obj/%d", j)
				if err := s.PutObject(bg, keys[j], 7, obj(src, j)); err != nil {
					b.Fatal(err)
				}
			}
			s.flush()

			raw := filepath.Join(dir, "raw")
			fd, err := unix.Open(raw, unix.O_RDWR|unix.O_CREAT|unix.O_TRUNC|unix.O_DIRECT|unix.O_CLOEXEC, 0o644)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = unix.Close(fd) })
			if _, err := vecio.Pwritev(fd, [][]byte{src}, 0); err != nil {
				b.Fatal(err)
			}

			read := func(into []byte) func(int) {
				return func(int) {
					for j := range n {
						if err := s.GetObject(bg, keys[j], 7, obj(into, j)); err != nil {
							b.Fatal(err)
						}
					}
				}
			}
			ours, window := read(dst), read(odd)
			odirect := func(int) {
				for j := range n {
					if _, err := preadFull(fd, obj(dst, j), int64(j*size)); err != nil {
						b.Fatal(err)
					}
				}
			}
			ours(-1)
			window(-1)
			if string(dst[:batch]) != string(src) || string(odd[:batch]) != string(src) {
				b.Fatal("the spill read other bytes than were put")
			}
			b.SetBytes(batch)
			benchpeer.CompareAll(b, ours, []benchpeer.Peer{
				{Unit: "x-of-odirect", Run: odirect},
				{Unit: "x-of-window", Run: window},
			}, benchpeer.Options{})
			if st := s.Stats(); st.BufferReads != 0 || st.CorruptRemoved != 0 {
				b.Fatalf("spill stats %+v", st)
			}
			sum := time.Duration(1 << 62)
			for range 5 {
				start := time.Now()
				for j := range n {
					_ = xxh3.Hash(obj(dst, j))
				}
				sum = min(sum, time.Since(start))
			}
			b.ReportMetric(float64(sum)/(float64(b.Elapsed())/float64(b.N)), "checksum-share")
		})
	}
}

// BenchmarkSpillCompact puts 256 MiB of 64 KiB objects (from block-aligned
// mapped memory, as the arena hands them over) into 16 MiB segments, removes
// 90% of them in one batch, and lets the spill's own compactor (the default
// Config: segments under half live, 64 MiB/s) run until it has nothing left
// to do. It reports the bytes on disk before and after (disk-MiB-before,
// disk-MiB-after: what du says of the directory), what compaction copied
// (copied-MiB) and how long it took (compact-s):
//
//	go test -run '^$' -bench SpillCompact -benchtime 1x ./node/spill
func BenchmarkSpillCompact(b *testing.B) {
	const total, size = 256 << 20, 64 << 10
	mem, err := unix.Mmap(-1, 0, total, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = unix.Munmap(mem) })
	copy(mem, data(total, 1))
	var before, after, copied, secs float64
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		cfg := DefaultConfig(filepath.Join(b.TempDir(), "spill"))
		cfg.SegmentBytes = 16 << 20
		cfg.Logger = quiet
		s := open(b, cfg)
		var gone []string
		for j := 0; j < total/size; j++ {
			k := fmt.Sprintf("obj/%d", j)
			if err := s.PutObject(bg, k, 7, mem[j*size:(j+1)*size:(j+1)*size]); err != nil {
				b.Fatal(err)
			}
			if j%10 != 0 {
				gone = append(gone, k)
			}
		}
		s.flush()
		before = float64(diskBytes(b, cfg.Dir))
		b.StartTimer()
		start := time.Now()
		if _, err := s.RemoveObjects(bg, gone); err != nil {
			b.Fatal(err)
		}
		within(b, 10*time.Minute, "compaction", func() { s.waitCompacted() })
		secs = time.Since(start).Seconds()
		b.StopTimer()
		s.flush()
		after = float64(diskBytes(b, cfg.Dir))
		st := s.Stats()
		copied = float64(st.CompactCopiedBytes)
		if st.Compactions == 0 || st.Objects != int64(total/size-len(gone)) {
			b.Fatalf("stats %+v", st)
		}
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(before/(1<<20), "disk-MiB-before")
	b.ReportMetric(after/(1<<20), "disk-MiB-after")
	b.ReportMetric(copied/(1<<20), "copied-MiB")
	b.ReportMetric(secs, "compact-s")
}
