package spill

import (
	"fmt"
	"log/slog"

	"github.com/stratakv/strata/internal/undo"
	"github.com/stratakv/strata/storage"
)

// Config places and sizes a spill. The zero value is not valid; start from
// DefaultConfig.
type Config struct {
	// Dir holds the segment files. It is created (mode 0700) if missing; one
	// that exists must belong to the service's user with no access for the
	// group or others (chmod 700), since it holds every tenant's objects.
	Dir string `json:"dir"`
	// CapacityBytes bounds the bytes of the segment files; the device's free
	// space (statfs) bounds them too. Past either, the oldest segment is
	// dropped whole.
	CapacityBytes int64 `json:"capacityBytes"`
	// SegmentBytes is the size a segment file grows to before the next one
	// starts: the unit the spill drops when it is full. It is lowered to an
	// eighth of the capacity (and of the device's free space at New) so a
	// small spill still drops a small part of itself at a time.
	SegmentBytes int64 `json:"segmentBytes"`
	// BufferBytes is each of the two write buffers (mapped memory, outside the
	// Go heap) that objects are staged in: one fills while the other is
	// written. Records larger than a buffer are written straight from the
	// caller's memory. A multiple of 4 KiB.
	BufferBytes int64 `json:"bufferBytes"`
	// CompactBelow is the share of a finished segment that must still hold
	// live objects (and tombstones) for it to stay as it is: below it, the
	// spill compacts the segment, copying what lives in it to the end of the
	// spill and deleting its file, so that removed objects' bytes do not wait
	// for their segment to age out. Each compaction rewrites at most this
	// share of a segment to free the rest: 0.5 (the default) writes at most
	// one byte per byte freed; lower it to write less and keep more dead bytes
	// on disk, raise it (up to 0.9) where disk space is short. 0 turns
	// compaction off.
	CompactBelow float64 `json:"compactBelow"`
	// CompactBytesPerSec bounds the bytes compaction reads and writes per
	// second, so that it never takes the device from serving (one compaction
	// runs at a time, and it waits while puts wait for a write buffer). The
	// default, 64 MiB/s, is a few percent of an NVMe drive's sequential
	// throughput; raise it where removes outpace compaction (Stats.DeadBytes
	// keeps growing), lower it on a device puts and gets already keep busy.
	// 0 means no bound.
	CompactBytesPerSec int64 `json:"compactBytesPerSec"`
	// DirectIO writes and reads with O_DIRECT, bypassing the page cache the
	// engine needs. Where the filesystem refuses it (tmpfs, some network
	// filesystems) the spill logs once and uses buffered I/O.
	DirectIO bool `json:"directIO"`
	// ScanInBackground makes New return once the directory is checked and
	// its segment files are opened, and index the objects an earlier run left
	// in them (from hint files, or by reading the segments a crash left
	// without one) in the background: the node service listens at once
	// instead of after a rescan that takes seconds per GiB. Until Ready is
	// closed those objects are misses; puts and removes work meanwhile, and
	// win over what the scan finds later. Without it New returns after the
	// scan.
	ScanInBackground bool `json:"scanInBackground"`
	// OnScan, when set, is called after each part of the scan of an earlier
	// run's segments: scanned of total bytes. It may block, holding the scan
	// (tests do), but not call the spill.
	OnScan func(scanned, total int64) `json:"-"`
	// Logger receives the rare events worth a line (a torn tail dropped at
	// start-up, an O_DIRECT fallback, a failed write). Nil means slog.Default().
	Logger *slog.Logger `json:"-"`
	// Undo, when set, receives what New creates (the directory and any
	// missing parents, the lock file), so that a caller whose start is
	// refused after New removes them, after Close, with Undo.Undo. A New
	// that fails removes them itself.
	Undo *undo.Log `json:"-"`
	// DeferCompaction leaves the compactor stopped until StartCompaction,
	// so that a caller whose start may still be refused after New does not
	// have the segments of the run before rewritten meanwhile.
	DeferCompaction bool `json:"-"`
}

// DefaultConfig returns a Config for dir with a 64 GiB capacity, 256 MiB
// segments, two 4 MiB write buffers, direct I/O, and compaction of segments
// under half live at up to 64 MiB/s.
func DefaultConfig(dir string) Config {
	return Config{Dir: dir, CapacityBytes: 64 << 30, SegmentBytes: 256 << 20, BufferBytes: 4 << 20, DirectIO: true,
		CompactBelow: 0.5, CompactBytesPerSec: 64 << 20}
}

// minSegment is the smallest segment a small capacity lowers SegmentBytes to.
const minSegment = 64 << 10

func (c *Config) validate() error {
	switch {
	case c.Dir == "":
		return fmt.Errorf("spill: no directory; give one (strata serve --spill-dir): %w", storage.ErrConfig)
	case c.CapacityBytes <= 0:
		return fmt.Errorf("spill %s: capacity %d bytes: want positive (strata serve --spill-capacity): %w", c.Dir, c.CapacityBytes, storage.ErrConfig)
	case c.SegmentBytes < minSegment:
		return fmt.Errorf("spill %s: segments of %d bytes: want at least %d (strata serve --spill-segment): %w", c.Dir, c.SegmentBytes, minSegment, storage.ErrConfig)
	case c.BufferBytes < 2*block || c.BufferBytes%block != 0 || c.BufferBytes > 1<<30:
		return fmt.Errorf("spill %s: write buffers of %d bytes: want a multiple of 4 KiB from 8 KiB to 1 GiB: %w", c.Dir, c.BufferBytes, storage.ErrConfig)
	case !(c.CompactBelow >= 0 && c.CompactBelow <= 0.9):
		return fmt.Errorf("spill %s: compaction below %v of a segment live: want 0 (off) to 0.9: %w", c.Dir, c.CompactBelow, storage.ErrConfig)
	case c.CompactBytesPerSec < 0:
		return fmt.Errorf("spill %s: compaction bound of %d bytes/s: want 0 (none) or more: %w", c.Dir, c.CompactBytesPerSec, storage.ErrConfig)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}
