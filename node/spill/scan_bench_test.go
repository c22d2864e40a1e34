package spill

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/internal/vecio"
)

// BenchmarkRescan is the start after a crash: New indexing segments that
// have no hint file (STRATA_RESCAN_BYTES of objects, 512 MiB unless set, of
// 4 KiB, 64 KiB and 1 MiB each), against a raw sequential read of the same
// files, front to back in 4 MiB reads with the same flags (O_DIRECT where
// the spill uses it, so neither reads the page cache). It reports records/s
// and MB/s of the rescan and x-of-raw-read, the rescan's MB/s over the raw
// read's: at 1 the spill indexes at the device's sequential rate; above it
// the scan skips the data of large records.
func BenchmarkRescan(b *testing.B) {
	total := int64(512 << 20)
	if v, err := strconv.ParseInt(os.Getenv("STRATA_RESCAN_BYTES"), 10, 64); err == nil && v > 0 {
		total = v
	}
	for _, size := range []int{4 << 10, 64 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			cfg := DefaultConfig(filepath.Join(b.TempDir(), "spill"))
			cfg.CapacityBytes, cfg.CompactBelow, cfg.Logger = 4*total, 0, quiet
			n := int(total / int64(size))
			s, err := New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			direct := s.Stats().DirectIO
			obj := alignedBytes(int64(size))
			for i := 0; i < n; i++ {
				copy(obj, data(64, i))
				if err := s.PutObject(bg, fmt.Sprintf("prefix/%d", i), 7, obj); err != nil {
					b.Fatal(err)
				}
			}
			if err := s.Close(); err != nil {
				b.Fatal(err)
			}
			segs, _ := filepath.Glob(filepath.Join(cfg.Dir, "*.seg"))
			var scan, raw time.Duration
			var bytes int64
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				dropHints(b, cfg.Dir)
				rd, rb := rawRead(b, segs, direct)
				raw += rd
				bytes = rb
				b.StartTimer()
				start := time.Now()
				s, err := New(cfg)
				if err != nil {
					b.Fatal(err)
				}
				scan += time.Since(start)
				b.StopTimer()
				if got := s.Stats().Recovered; got != int64(n) {
					b.Fatalf("recovered %d objects of %d", got, n)
				}
				if err := s.Close(); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.StopTimer()
			scanS, rawS := scan.Seconds()/float64(b.N), raw.Seconds()/float64(b.N)
			b.ReportMetric(float64(n)/scanS, "records/s")
			b.ReportMetric(float64(bytes)/scanS/1e6, "MB/s")
			b.ReportMetric(float64(bytes)/rawS/1e6, "raw-MB/s")
			b.ReportMetric(rawS/scanS, "x-of-raw-read")
			if !direct {
				b.Logf("the filesystem refuses O_DIRECT: both sides read the page cache")
			}
		})
	}
}

// dropHints removes the hint files, as a SIGKILL leaves the segments.
func dropHints(b *testing.B, dir string) {
	hints, _ := filepath.Glob(filepath.Join(dir, "*.hint"))
	for _, h := range hints {
		if err := os.Remove(h); err != nil {
			b.Fatal(err)
		}
	}
}

// rawRead reads files front to back in 4 MiB reads, with O_DIRECT when
// direct, and returns how long it took and how many bytes it read.
func rawRead(b *testing.B, files []string, direct bool) (time.Duration, int64) {
	buf := vecio.AlignedBytes(4<<20, block)
	flags := unix.O_RDONLY | unix.O_CLOEXEC
	if direct {
		flags |= unix.O_DIRECT
	}
	var n int64
	start := time.Now()
	for _, f := range files {
		fd, err := unix.Open(f, flags, 0)
		if err != nil {
			b.Fatal(err)
		}
		for off := int64(0); ; {
			got, err := preadFull(fd, buf, off)
			n += int64(got)
			off += int64(got)
			if err == io.ErrUnexpectedEOF || got == 0 {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
		}
		_ = unix.Close(fd)
	}
	return time.Since(start), n
}
