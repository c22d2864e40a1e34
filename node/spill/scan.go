package spill

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// The scan rebuilds the index from the segments an earlier run left, oldest
// first, so that a later record of a key (or its tombstone) overrides an
// earlier one: from a segment's hint file where it has a whole one, else by
// reading its records, a window of several MiB at a time, at about the
// device's sequential rate (scan_read.go; BenchmarkRescan compares it with a
// raw read of the files). A read per record, as before, ran at the device's
// latency: 29 s for 176k objects after a SIGKILL. A segment ends at its first bad
// record: the rest is a write torn by a crash (or damage) and is cut off. The
// data of the two newest segments is verified too, because a crash tears the
// segment being written (and the one before it may still have had a buffer on
// its way); every read verifies the data it serves. The newest by id: after
// compaction deleted the ones before them, older segments are among the last
// files, but no write of theirs was on its way.
//
// With Config.ScanInBackground it runs after New returns, while puts and
// removes go on, so that the node service listens at once. Until it is done,
// the objects of the earlier run are misses (hidden; getLocked): a segment not
// yet scanned may hold a tombstone or a newer record of any of them. A put
// meanwhile stores its record whatever the index holds of the earlier run, and
// a remove always appends a tombstone and remembers the key (shadow); the scan
// leaves a key alone that this run stored (its entry is in a segment of this
// run) or removed, since their records come after every record of the earlier
// run in file order. Compaction waits for the scan; a segment dropped for room
// meanwhile is skipped or left where the scan was.

// scanWindow is how much of a segment the scan reads at a time: enough for
// the device to read at its sequential rate. A multiple of a block; tests
// lower it to cross windows with little data.
var scanWindow int64 = 4 << 20

// bigRecord: after a record this long the scan reads only the next header
// (two blocks), skipping the data: one small read per MiB or more costs less
// than reading the data.
const bigRecord = 1 << 20

// scanBatch bounds the records indexed in one hold of the mutex.
const scanBatch = 4096

// errScanStopped ends a scan that Close stopped; errSegmentGone, the scan of
// a segment dropped for room meanwhile.
var (
	errScanStopped = errors.New("spill: the scan was stopped")
	errSegmentGone = errors.New("spill: the segment was dropped while it was scanned")
)

// scanState is the scan of an earlier run's segments.
type scanState struct {
	segs    []*segment // oldest first, as found by New
	total   int64      // their bytes at New
	scanned atomic.Int64
	took    atomic.Int64  // nanoseconds, once done
	ready   chan struct{} // closed once the scan is done
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// startScan starts the scan of the segments openSegments found.
func (s *Store) startScan() {
	sc := &s.scan
	sc.segs = append([]*segment(nil), s.segs...)
	for _, seg := range sc.segs {
		sc.total += seg.size
	}
	sc.ready = make(chan struct{})
	sc.ctx, sc.cancel = context.WithCancel(context.Background())
	s.scanning = true
	s.shadow = map[[16]byte]struct{}{}
	sc.wg.Add(1)
	go s.scanAll()
}

// stopScan stops the scan at its next window and waits for it to end.
func (s *Store) stopScan() {
	if s.scan.cancel != nil {
		s.scan.cancel()
		s.scan.wg.Wait()
	}
}

// Ready is closed once the objects an earlier run left are indexed (at once
// when New waited for them): from then on they are served.
func (s *Store) Ready() <-chan struct{} { return s.scan.ready }

// ScanProgress says whether the scan of an earlier run's segments is done,
// and how many of their bytes it has read.
func (s *Store) ScanProgress() (done bool, scanned, total int64) {
	select {
	case <-s.scan.ready:
		done = true
	default:
	}
	return done, s.scan.scanned.Load(), s.scan.total
}

func (s *Store) scanAll() {
	defer s.scan.wg.Done()
	start := time.Now()
	var base int64
	var err error
	var newest uint32
	if n := len(s.scan.segs); n > 0 {
		newest = s.scan.segs[n-1].id
	}
	for _, seg := range s.scan.segs {
		s.testHook("scan", segmentName(seg.id))
		size := seg.size // set at New, changed only by the scan
		if err = s.scanSegment(seg, base, seg.id+1 >= newest); err != nil {
			break
		}
		base += size
		s.progress(base)
	}
	s.endScan(err, time.Since(start))
}

// progress records that the scan has read scanned bytes.
func (s *Store) progress(scanned int64) {
	s.scan.scanned.Store(scanned)
	if fn := s.cfg.OnScan; fn != nil {
		fn(scanned, s.scan.total)
	}
}

// scanSegment indexes seg's records, from its hint file or from its
// records, base bytes into the scan.
func (s *Store) scanSegment(seg *segment, base int64, verify bool) error {
	if !s.holdSeg(seg) {
		return nil // dropped for room meanwhile
	}
	defer s.unhold(nil, seg)
	s.testHook("scan-held", segmentName(seg.id))
	size := seg.size
	if hs := s.readHints(seg.id, size); hs != nil {
		for len(hs) > 0 {
			n := min(len(hs), scanBatch)
			if err := s.applyScanned(seg, hs[:n], false); err != nil {
				return ignoreGone(err)
			}
			hs = hs[n:]
		}
		s.st.hintsRead.Add(1)
		s.locked(func() { seg.unscanned = false })
		return nil
	}
	end, why, err := s.scanRecords(seg, size, base, verify)
	if err != nil {
		return ignoreGone(err)
	}
	if !s.finishScanned(seg, size, end, why) {
		return nil
	}
	s.writeHints(seg) // for the next start
	return nil
}

func ignoreGone(err error) error {
	if errors.Is(err, errSegmentGone) {
		return nil
	}
	return err
}

// applyScanned indexes hs, records of seg (an earlier run's), in order, and
// with keep keeps them as its hints. A record leaves alone a key this run
// stored or removed: its record is newer. errSegmentGone: seg was dropped.
func (s *Store) applyScanned(seg *segment, hs []hint, keep bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if seg.dropped {
		return errSegmentGone
	}
	for _, h := range hs {
		if keep {
			seg.hints = append(seg.hints, h)
		}
		if h.kind == kindTombstone {
			seg.tombs++
			seg.tombBytes += tombLen(h)
		}
		if _, removed := s.shadow[h.hash]; removed {
			continue
		}
		if e, ok := s.idx.get(h.hash); ok && e.seg >= s.firstNew {
			continue
		}
		switch h.kind {
		case kindObject:
			if err := s.indexLocked(seg, h.hash, entry{seg: seg.id, hdrLen: h.hdrLen, off: h.off, size: h.size, format: h.format}); err != nil {
				return err
			}
		case kindTombstone:
			s.unindexLocked(h.hash)
		}
	}
	return nil
}

// finishScanned cuts seg, read to end of its size bytes, after its last good
// record, or removes it when it has none; it reports whether seg stays.
func (s *Store) finishScanned(seg *segment, size, end int64, why string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if seg.dropped {
		return false
	}
	if end < size {
		s.st.tornTails.Add(1)
		s.log.Warn("spill: a segment ends in a bad record (a write torn by a crash, or damage); the rest of it is dropped",
			"segment", seg.path, "at", end, "bytes", size-end, "why", why)
		if err := unix.Ftruncate(seg.fd, end); err != nil {
			s.log.Warn("spill: cannot cut a segment's bad tail; it stays unread", "segment", seg.path, "err", err)
		}
		s.used -= size - end
		seg.size = end
	}
	if end == 0 {
		s.removeSegmentLocked(seg)
		return false
	}
	seg.unscanned = false
	return true
}

// endScan ends the scan: after an error (the index out of memory) the
// earlier run's objects are forgotten, since the segments not scanned may
// remove any of them; the files stay for the next start, and age out.
func (s *Store) endScan(err error, took time.Duration) {
	s.mu.Lock()
	if err != nil && !errors.Is(err, errScanStopped) {
		s.log.Error("spill: indexing the segments of an earlier run failed; none of their objects are served, and new ones are stored as usual",
			"dir", s.dir, "err", err)
		for _, seg := range s.scan.segs {
			if !seg.dropped {
				_, bytes := s.idx.dropSegment(seg.head)
				seg.head = 0
				s.liveBytes -= bytes
				s.liveRec -= seg.liveRec
				seg.liveRec, seg.noCompact = 0, true
			}
		}
	}
	recovered := s.idx.n
	for _, seg := range s.segs {
		if seg.id >= s.firstNew {
			s.idx.live(seg.head, -1, func(uint32, [16]byte, entry) { recovered-- })
		}
	}
	s.scanning = false
	s.shadow = nil
	segs, used := len(s.segs), s.used
	s.mu.Unlock()
	s.st.recovered.Store(int64(recovered))
	s.scan.took.Store(int64(took))
	if recovered > 0 || s.st.tornTails.Load() > 0 {
		s.log.Info("spill: recovered the objects of an earlier run", "dir", s.dir, "objects", recovered, "segments", segs,
			"bytes", used, "tornTails", s.st.tornTails.Load(), "hintsRead", s.st.hintsRead.Load(), "took", took.Round(time.Millisecond),
			"MBps", int64(float64(s.scan.scanned.Load())/max(took.Seconds(), 1e-6)/1e6))
	}
	close(s.scan.ready)
	if s.compactKick != nil {
		select {
		case s.compactKick <- struct{}{}: // the segments found at start-up
		default:
		}
	}
}

// getLocked returns h's entry as calls see it: while the scan is on, an entry
// of an earlier run's segment is hidden, since a segment not yet scanned may
// remove or replace it.
func (s *Store) getLocked(h [16]byte) (entry, bool) {
	e, ok := s.idx.get(h)
	if ok && s.scanning && e.seg < s.firstNew {
		return entry{}, false
	}
	return e, ok
}

// shadowLocked makes a remove of h win over the scan: the earlier run's entry
// the scan may have found is forgotten, and the scan leaves h alone from now
// on.
func (s *Store) shadowLocked(h [16]byte) {
	if !s.scanning {
		return
	}
	if e, ok := s.idx.get(h); ok && e.seg < s.firstNew {
		s.unindexLocked(h)
	}
	s.shadow[h] = struct{}{}
}

// tombLen is the record length of the tombstone h: its header's, or, in a
// hint file of a version that did not keep it, a sector (most keys' size).
func tombLen(h hint) int64 {
	if h.hdrLen == 0 {
		return sector
	}
	return int64(h.hdrLen)
}
