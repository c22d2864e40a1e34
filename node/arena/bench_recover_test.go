package arena

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BenchmarkRecovery measures what a restart on an arena file costs: an arena
// is filled, ended as a SIGKILL would end it, and a new one started on the
// file; an op is that start (New) and its recovery to the last object.
//
//	go test -run '^$' -bench Recovery -benchtime 3x ./node/arena
//
// The small objects' case holds 1M of them, or the counts of
// STRATA_BENCH_OBJECTS (bench_scale_test.go), in an arena of 537 bytes each.
//
// index-ms is New alone (the allocator rebuilt from the unit map: then the
// arena serves), recover-ms the whole recovery, ms/GiB and ms/Mobjects the
// latter per GiB of objects and per million objects, and check-ms the part
// of it that only verifies the slots' check words (what re-attaching an index
// kept in the file would still have to do on a file it cannot trust). For
// large objects, whose bytes recovery hashes against their seals (seal.go),
// recover/raw-hash and recover/memcpy compare the whole recovery with an xxh3
// and a memcpy of the same bytes from a fresh mapping of the file, by as many
// goroutines (raw-hash-ms), and recover-B/ns is its rate (GB/s).
func BenchmarkRecovery(b *testing.B) {
	type recoveryCase struct {
		name  string
		arena int64
		n     int
		size  func(i int) int
	}
	var cases []recoveryCase
	for _, n := range objectCounts(b, 1_000_000) {
		// 512 MiB held 1M of them: slabs of 64-256 B values and their trailers.
		cases = append(cases, recoveryCase{"small-" + countName(n), roundUp(int64(n)*537, 1<<20), n, func(i int) int { return int(smallSize(i)) }})
	}
	cases = append(cases,
		recoveryCase{"64KiB-1GiB", 1<<30 + 16<<20, 16384, func(int) int { return 64 << 10 }},
		recoveryCase{"2MiB-1GiB", 1<<30 + 16<<20, 512, func(int) int { return 2 << 20 }},
	)
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			path := filepath.Join(shmDir(b), "a")
			cfg := fileConfig(b, path, c.arena)
			cfg.Allocator = nil
			cfg.HighWatermark, cfg.LowWatermark = 1, 0.99
			a, err := New(cfg)
			if err != nil {
				b.Skip(err)
			}
			var bytes int64
			buf := make([]byte, 0, 80)
			for i := range c.n {
				k := string(smallKey(buf, i))
				p, err := a.Reserve(k, 1, int64(c.size(i)))
				if err != nil {
					b.Fatal(err)
				}
				if err := p.Commit(); err != nil {
					b.Fatal(err)
				}
				bytes += int64(c.size(i))
			}
			crash(b, a)
			var index, total, check, hash, copied time.Duration
			for b.Loop() {
				start := time.Now()
				r, err := New(cfg)
				if err != nil {
					b.Fatal(err)
				}
				index += time.Since(start)
				waitRecovered(b, r)
				total += time.Since(start)
				if st := r.Stats(); st.Objects != int64(c.n) || st.Recovery.Lost != 0 {
					b.Fatalf("recovered %+v", st.Recovery)
				}
				b.StopTimer()
				check += checkAll(r)
				h, c := hashAndCopyLarge(b, r)
				hash += h
				copied += c
				crash(b, r)
				b.StartTimer()
			}
			n := float64(b.N)
			ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 / n }
			b.ReportMetric(ms(index), "index-ms")
			b.ReportMetric(ms(total), "recover-ms")
			b.ReportMetric(ms(total)/(float64(bytes)/(1<<30)), "ms/GiB")
			b.ReportMetric(ms(total)/(float64(c.n)/1e6), "ms/Mobjects")
			b.ReportMetric(ms(check), "check-ms")
			if hash > 0 {
				// Large objects: recovery hashes their bytes against their
				// seals (seal.go); its peers are a raw xxh3 and a memcpy of
				// the same bytes by as many goroutines, from a fresh mapping.
				b.ReportMetric(ms(hash), "raw-hash-ms")
				b.ReportMetric(float64(bytes)/(float64(total)/n), "recover-B/ns")
				b.ReportMetric(float64(hash)/float64(total), "recover/raw-hash")
				b.ReportMetric(float64(copied)/float64(total), "recover/memcpy")
			}
			fi, _ := os.Stat(path)
			b.ReportMetric(float64(fi.Size())/(1<<20), "file-MiB")
		})
	}
}

// checkAll computes the check word of every object's slot, as recovery does:
// the verification alone.
func checkAll(a *Arena) time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	start := time.Now()
	var x uint32
	for idx := uint32(1); idx < a.recs.Len(); idx++ {
		if r := a.rec(idx); r.state == committed {
			x ^= a.checkOf(r.off, a.slotEnd(r))
		}
	}
	d := time.Since(start)
	if x == 1 {
		fmt.Fprint(os.Stderr, "") // keep x
	}
	return d
}

// hashAndCopyLarge times, for the large objects of a, what recovery's check
// of their seals has as its limits: xxh3 of their bytes, and a copy of them,
// each by hashWorkers goroutines over the objects in turn, each from a fresh
// mapping of the file, as a restarted service has (its first touch of each
// page costs a fault, which is most of the time).
func hashAndCopyLarge(b *testing.B, a *Arena) (hash, copied time.Duration) {
	a.mu.Lock()
	var spans [][2]int64
	var most int64
	for idx := uint32(1); idx < a.recs.Len(); idx++ {
		if r := a.rec(idx); r.state == committed && r.flags&flagLarge != 0 {
			spans = append(spans, [2]int64{a.bytesOff(r), r.size})
			most = max(most, r.size)
		}
	}
	dataOff, fileSize, path := a.back.geo.dataOff, a.back.geo.fileSize, a.cfg.File
	a.mu.Unlock()
	if len(spans) == 0 {
		return 0, 0
	}
	workers := hashWorkers()
	run := func(f func(w int, mem []byte, off, size int64)) time.Duration {
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			b.Fatal(err)
		}
		defer unix.Close(fd)
		m, err := unix.Mmap(fd, 0, int(fileSize), unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			b.Fatal(err)
		}
		defer unix.Munmap(m)
		mem := m[dataOff:]
		start := time.Now()
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for i := w; i < len(spans); i += workers {
					f(w, mem, spans[i][0], spans[i][1])
				}
			})
		}
		wg.Wait()
		return time.Since(start)
	}
	sums := make([]uint64, workers)
	hash = run(func(w int, mem []byte, off, size int64) { sums[w] ^= a.sealOf(off, mem[off:off+size]) })
	dst := make([][]byte, workers)
	for w := range dst {
		dst[w] = make([]byte, most)
		clear(dst[w])
	}
	copied = run(func(w int, mem []byte, off, size int64) { copy(dst[w], mem[off:off+size]) })
	if sums[0] == 1 {
		fmt.Fprint(os.Stderr, "") // keep the sums
	}
	return hash, copied
}
