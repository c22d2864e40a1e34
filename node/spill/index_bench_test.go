package spill

import (
	"fmt"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/stratakv/strata/internal/memstat"
)

// rssBytes is the process's resident memory; a benchmark that cannot read it
// states nothing.
func rssBytes(b *testing.B) int64 {
	n, err := memstat.RSSBytes()
	if err != nil {
		b.Fatal(err)
	}
	return n
}

// fillIndex indexes n objects of 1 KiB in segments of 256 MiB, as puts would
// (the index, each segment's key list), without writing them: the segments
// are not files. It returns the segments, for unfillIndex.
func fillIndex(b *testing.B, s *Store, n int) []*segment {
	const rec = 1536 // a 512-byte header and 1 KiB of data
	per := int((256 << 20) / rec)
	s.mu.Lock()
	defer s.mu.Unlock()
	var segs []*segment
	var seg *segment
	for i := range n {
		if i%per == 0 {
			seg = &segment{id: s.nextID, fd: -1, hinted: true, dropped: true}
			s.nextID++
			segs = append(segs, seg)
			s.byID[seg.id] = seg
		}
		h := hashKey(fmt.Sprintf("model/llama-3-8b/tp0/%x", i))
		e := entry{seg: seg.id, hdrLen: sector, off: int64(i%per) * rec, size: 1024, format: 7}
		if err := s.indexLocked(seg, h, e); err != nil {
			b.Fatal(err)
		}
	}
	return segs
}

// unfillIndex forgets what fillIndex indexed.
func unfillIndex(s *Store, segs []*segment) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, seg := range segs {
		_, bytes := s.idx.dropSegment(seg.head)
		s.liveBytes -= bytes
		seg.head = 0
		delete(s.byID, seg.id)
	}
}

// BenchmarkIndexMemory indexes 1M and 10M small objects and states what each
// costs the service in memory, and what a garbage collection costs with them
// indexed:
//
//	go test -run '^$' -bench IndexMemory -benchtime 1x ./node/spill
//
// metaB/object is the Go heap's growth plus the index's mapped bytes, per
// object; heapB/object the Go heap part alone; rssB/object the growth of the
// resident set; gc-ms the wall time of a runtime.GC() with the objects
// indexed, gcCPU-ms the collector's CPU time in it (each the best of 5). One
// op indexes every object. (The Go map this index replaced: 134 and 111
// metaB/object at 1M and 10M, and a collection's CPU time 6-7 times as high
// at 10M as at 1M.)
func BenchmarkIndexMemory(b *testing.B) {
	for _, n := range []int{1_000_000, 10_000_000} {
		b.Run(fmt.Sprintf("objects=%dM", n/1_000_000), func(b *testing.B) {
			cfg := DefaultConfig(filepath.Join(b.TempDir(), "spill"))
			cfg.Logger = quiet
			s := open(b, cfg)
			for b.Loop() {
				b.StopTimer()
				heap0, rss0 := memstat.HeapInuse(), rssBytes(b)
				b.StartTimer()
				segs := fillIndex(b, s, n)
				b.StopTimer()
				heap1, rss1 := memstat.HeapInuse(), rssBytes(b)
				// The best of 5 collections: one alone swings with whatever
				// else the machine runs.
				gcWall, gcCPU := time.Duration(1<<62), 1e9
				for range 5 {
					gc0 := memstat.GCCPUSeconds()
					start := time.Now()
					runtime.GC()
					gcWall, gcCPU = min(gcWall, time.Since(start)), min(gcCPU, memstat.GCCPUSeconds()-gc0)
				}
				st := s.Stats()
				if st.Objects != int64(n) {
					b.Fatalf("%d objects indexed, want %d", st.Objects, n)
				}
				heap := float64(heap1 - heap0)
				b.ReportMetric((heap+float64(st.IndexBytes))/float64(n), "metaB/object")
				b.ReportMetric(heap/float64(n), "heapB/object")
				b.ReportMetric(float64(rss1-rss0)/float64(n), "rssB/object")
				b.ReportMetric(float64(gcWall.Microseconds())/1e3, "gc-ms")
				b.ReportMetric(gcCPU*1e3, "gcCPU-ms")
				unfillIndex(s, segs)
				b.StartTimer()
			}
		})
	}
}
