package file

import (
	"fmt"
	"log/slog"

	"github.com/stratakv/strata/storage"
)

// Config sizes and places a file store. The zero value is not valid; start from
// DefaultConfig.
type Config struct {
	// Dir is the directory that holds the objects. It is created if missing; an
	// existing directory that this process cannot write is a read-only store.
	Dir string `json:"dir"`
	// CapacityBytes bounds the bytes on disk (object files with their 4 KiB headers,
	// counted in whole 4 KiB blocks); past it the least recently used objects go
	// first. Size it to the free space of the device minus what other users of the
	// disk need: a full device fails puts with storage.ErrNoSpace instead of evicting.
	CapacityBytes int64 `json:"capacityBytes"`
	// DirectIO bypasses the page cache (O_DIRECT) for the 4 KiB-aligned part of
	// each object; the unaligned edges go through a small aligned bounce buffer.
	// Faster and steadier on NVMe, and it keeps the cache's traffic out of the page
	// cache that the engine also needs. Where the filesystem refuses O_DIRECT
	// (ramfs, some network filesystems) the store logs once and uses buffered I/O.
	DirectIO bool `json:"directIO"`
	// Sync makes every put durable before it reports success: the object file is
	// flushed (fdatasync) before its rename and the directory after it. Without it
	// a crash can leave torn objects, which Get detects and removes.
	Sync bool `json:"sync"`
	// IOWorkers is the number of files one batch reads or writes at once. Per-file
	// latency (open, fsync, rename) hides behind the overlap; 4 is plenty for one
	// NVMe device. 0 means 4.
	IOWorkers int `json:"ioWorkers"`
	// Logger receives the rare events worth a line: the O_DIRECT fallback, stale
	// temporary files removed at start-up. Nil means slog.Default().
	Logger *slog.Logger `json:"-"`
}

// DefaultConfig returns a Config for dir with a 64 GiB budget, direct I/O, durable
// puts and 4 I/O workers.
func DefaultConfig(dir string) Config {
	return Config{Dir: dir, CapacityBytes: 64 << 30, DirectIO: true, Sync: true, IOWorkers: 4}
}

// maxIOWorkers bounds IOWorkers: more files in flight than this only queues in the
// device.
const maxIOWorkers = 64

// validate checks cfg and fills its defaults.
func (c *Config) validate() error {
	if c.Dir == "" {
		return fmt.Errorf("file store: no directory; give one (strata bench --l3-dir, strata serve --spill-dir): %w", storage.ErrConfig)
	}
	if c.CapacityBytes <= 0 {
		return fmt.Errorf("file store %s: capacity must be positive, got %d: %w", c.Dir, c.CapacityBytes, storage.ErrConfig)
	}
	if c.IOWorkers == 0 {
		c.IOWorkers = 4
	}
	if c.IOWorkers < 0 || c.IOWorkers > maxIOWorkers {
		return fmt.Errorf("file store %s: %d I/O workers, want 1 to %d: %w", c.Dir, c.IOWorkers, maxIOWorkers, storage.ErrConfig)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}
