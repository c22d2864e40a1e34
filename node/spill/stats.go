package spill

import (
	"sync/atomic"
	"time"

	"github.com/stratakv/strata/storage"
)

// Stats is a snapshot of a spill. The field names that the file store's Stats
// also has mean the same there.
type Stats struct {
	// Bytes is what the segment files take, records being written included;
	// Files is how many there are, Objects the objects they hold and
	// LiveBytes those objects' bytes. DeadBytes is the part of Bytes that
	// holds no live object (removed, dropped and moved objects, tombstones,
	// padding): compaction reclaims it, or it goes with its segment.
	Bytes     int64 `json:"bytes"`
	Files     int64 `json:"files"`
	Objects   int64 `json:"objects"`
	LiveBytes int64 `json:"liveBytes"`
	DeadBytes int64 `json:"deadBytes"`
	// CapacityBytes is the bound on Bytes in force: the smaller of the
	// configured one (ConfiguredCapacityBytes, --spill-capacity) and the
	// device's free space plus what the spill's files take. SegmentBytes is
	// the size a segment grows to, BufferedBytes the bytes staged and not yet
	// written.
	CapacityBytes           int64 `json:"capacityBytes"`
	ConfiguredCapacityBytes int64 `json:"configuredCapacityBytes"`
	SegmentBytes            int64 `json:"segmentBytes"`
	BufferedBytes           int64 `json:"bufferedBytes"`
	// IndexBytes is the memory the index has mapped (outside the Go heap):
	// about 60-70 bytes an object.
	IndexBytes int64 `json:"indexBytes"`
	// Reads counts objects read and verified (BufferReads of them served from
	// a write buffer), ReadBytes their bytes; Misses, objects looked for and
	// not found.
	Reads       int64 `json:"reads"`
	ReadBytes   int64 `json:"readBytes"`
	BufferReads int64 `json:"bufferReads"`
	Misses      int64 `json:"misses"`
	// Writes counts objects stored (DirectWrites of them written straight from
	// the caller's memory), WriteBytes their bytes, Flushes the write buffers
	// written.
	Writes       int64 `json:"writes"`
	WriteBytes   int64 `json:"writeBytes"`
	DirectWrites int64 `json:"directWrites"`
	Flushes      int64 `json:"flushes"`
	// WritesSkipped counts puts of a key the spill held (write-once);
	// FormatConflicts, those whose key it held in another format.
	WritesSkipped   int64 `json:"writesSkipped"`
	FormatConflicts int64 `json:"formatConflicts"`
	// Removed counts objects removed; RemovesNotDurable, those of them whose
	// tombstone may not have been written (they may be back after a restart).
	Removed           int64 `json:"removed"`
	RemovesNotDurable int64 `json:"removesNotDurable"`
	// CorruptRemoved counts records that failed a check on read (or could not
	// be read) and were dropped; CorruptDropped, those of them dropped for
	// good with a tombstone (the rest are read again after a restart).
	CorruptRemoved int64 `json:"corruptRemoved"`
	CorruptDropped int64 `json:"corruptDropped"`
	// Compactions counts segments compacted (their live records copied to the
	// end of the spill, their file deleted), CompactedBytes those segments'
	// bytes and CompactCopiedBytes the bytes copied: CompactedBytes minus
	// CompactCopiedBytes is the space compaction gave back.
	Compactions        int64 `json:"compactions"`
	CompactedBytes     int64 `json:"compactedBytes"`
	CompactCopiedBytes int64 `json:"compactCopiedBytes"`
	// Evictions counts objects dropped with their segment to stay under the
	// capacity, SegmentsDropped the segments.
	Evictions       int64 `json:"evictions"`
	SegmentsDropped int64 `json:"segmentsDropped"`
	// NoSpaceRetries counts writes the device refused as full, retried after
	// dropping the oldest segment.
	NoSpaceRetries int64 `json:"noSpaceRetries"`
	// WriteErrors counts writes that failed; LostObjects, objects already
	// staged that a failed buffer write took with it.
	WriteErrors int64 `json:"writeErrors"`
	LostObjects int64 `json:"lostObjects"`
	// Recovered counts the objects of an earlier run held once they are
	// indexed; TornTails, segments whose tail was a bad record then and was
	// cut off.
	Recovered int64 `json:"recovered"`
	TornTails int64 `json:"tornTails"`
	// Ready is false while the segments an earlier run left are being
	// indexed (Config.ScanInBackground): their objects are misses until then.
	// ScannedBytes of ScanBytes are read; ScanTook is how long it took, once
	// Ready.
	Ready        bool          `json:"ready"`
	ScanBytes    int64         `json:"scanBytes"`
	ScannedBytes int64         `json:"scannedBytes"`
	ScanTook     time.Duration `json:"scanTook,omitempty"`
	// RefusedFiles counts files under a segment's or hint file's name that
	// were not regular files of the service's user at start-up: never read.
	RefusedFiles int64 `json:"refusedFiles"`
	// HintsRead counts the segments New indexed from their hint files
	// instead of reading them; HintsWritten, the hint files written.
	HintsRead    int64 `json:"hintsRead"`
	HintsWritten int64 `json:"hintsWritten"`
	// DirectIO reports whether O_DIRECT is in use (false after a fallback).
	DirectIO bool `json:"directIO"`
	// Faults counts errors of PutObject and GetObject by storage.FaultKind.
	Faults map[string]int64 `json:"faults"`
}

type counters struct {
	reads, readBytes, bufferReads, misses      atomic.Int64
	writes, writeBytes, directWrites, flushes  atomic.Int64
	skipped, conflicts, removed, corrupt       atomic.Int64
	evictions, segmentsDropped, noSpaceRetries atomic.Int64
	writeErrors, lost, recovered, tornTails    atomic.Int64
	hintsRead, hintsWritten, refused           atomic.Int64
	corruptDropped, removesNotDurable          atomic.Int64
	compactions, compacted, compactCopied      atomic.Int64
	faults                                     storage.FaultCounts
}

// Stats returns the spill's state. It is safe to call at any time, also
// after Close.
func (s *Store) Stats() Stats {
	st := s.snapshot()
	c := &s.st
	st.Reads, st.ReadBytes, st.BufferReads, st.Misses = c.reads.Load(), c.readBytes.Load(), c.bufferReads.Load(), c.misses.Load()
	st.Writes, st.WriteBytes, st.DirectWrites, st.Flushes = c.writes.Load(), c.writeBytes.Load(), c.directWrites.Load(), c.flushes.Load()
	st.WritesSkipped, st.FormatConflicts, st.Removed, st.CorruptRemoved = c.skipped.Load(), c.conflicts.Load(), c.removed.Load(), c.corrupt.Load()
	st.Evictions, st.SegmentsDropped, st.NoSpaceRetries = c.evictions.Load(), c.segmentsDropped.Load(), c.noSpaceRetries.Load()
	st.WriteErrors, st.LostObjects, st.Recovered, st.TornTails = c.writeErrors.Load(), c.lost.Load(), c.recovered.Load(), c.tornTails.Load()
	st.HintsRead, st.HintsWritten = c.hintsRead.Load(), c.hintsWritten.Load()
	st.CorruptDropped, st.RemovesNotDurable = c.corruptDropped.Load(), c.removesNotDurable.Load()
	st.Compactions, st.CompactedBytes, st.CompactCopiedBytes = c.compactions.Load(), c.compacted.Load(), c.compactCopied.Load()
	st.Faults = c.faults.All()
	st.Ready, st.ScannedBytes, st.ScanBytes = s.ScanProgress()
	st.ScanTook = time.Duration(s.scan.took.Load())
	st.RefusedFiles = c.refused.Load()
	return st
}

// snapshot is the part of Stats that s.mu guards. It looks at the device's
// free space again, so that CapacityBytes is the bound in force now.
func (s *Store) snapshot() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refreshLimitLocked()
	return Stats{
		Bytes:                   s.used,
		Files:                   int64(len(s.segs)),
		Objects:                 int64(s.idx.n - s.pendingPuts),
		IndexBytes:              s.idx.bytes(),
		LiveBytes:               s.liveBytes,
		DeadBytes:               s.used - s.liveRec,
		CapacityBytes:           s.limitLocked(),
		ConfiguredCapacityBytes: s.cfg.CapacityBytes,
		SegmentBytes:            s.segBytes,
		BufferedBytes:           s.unwritten,
		DirectIO:                s.direct,
	}
}
