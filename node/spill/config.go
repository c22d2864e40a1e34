package spill

import (
	"fmt"
	"log/slog"

	"github.com/stratakv/strata/storage"
)

// Config places and sizes a spill. The zero value is not valid; start from
// DefaultConfig.
type Config struct {
	// Dir holds the segment files. It is created if missing.
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
	// DirectIO writes and reads with O_DIRECT, bypassing the page cache the
	// engine needs. Where the filesystem refuses it (tmpfs, some network
	// filesystems) the spill logs once and uses buffered I/O.
	DirectIO bool `json:"directIO"`
	// Logger receives the rare events worth a line (a torn tail dropped at
	// start-up, an O_DIRECT fallback, a failed write). Nil means slog.Default().
	Logger *slog.Logger `json:"-"`
}

// DefaultConfig returns a Config for dir with a 64 GiB capacity, 256 MiB
// segments, two 4 MiB write buffers and direct I/O.
func DefaultConfig(dir string) Config {
	return Config{Dir: dir, CapacityBytes: 64 << 30, SegmentBytes: 256 << 20, BufferBytes: 4 << 20, DirectIO: true}
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
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}
