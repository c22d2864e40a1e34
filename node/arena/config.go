package arena

import (
	"fmt"
	"log/slog"
	"math/bits"

	"github.com/stratakv/strata/hostmem"
)

// MaxKeyBytes is the longest key the arena stores.
const MaxKeyBytes = 512

// maxAlignment bounds Config.Alignment: larger alignments only waste memory.
const maxAlignment = 1 << 30

// Config sizes an arena. The zero value is not valid; start from DefaultConfig.
type Config struct {
	// SizeBytes is the memory the arena maps and hands out to objects, rounded down
	// to a multiple of Alignment. It is taken from the host at New (prefaulted by
	// default), so size it to the node's DRAM budget for L3, not to the wish list.
	SizeBytes int64 `json:"sizeBytes"`
	// HighWatermark is the fill (the bytes objects hold: their extents, or their
	// slots), as a fraction of SizeBytes, past which background eviction starts.
	// 0.90 leaves room for the writes that arrive while it runs.
	HighWatermark float64 `json:"highWatermark"`
	// LowWatermark is the fill that background eviction brings the arena down to;
	// the gap to HighWatermark is what one eviction pass frees, so that evictions
	// come in batches rather than one per write.
	LowWatermark float64 `json:"lowWatermark"`
	// Alignment is the power of two the address and allocated length of every
	// object of at least this size are multiples of (smaller ones share slabs).
	// 4096 lets spill and promotion use O_DIRECT on such objects' bytes as they
	// lie. 0 means 4096.
	Alignment int64 `json:"alignment"`
	// SlabBytes is the least extent a slab of small objects takes (objects smaller
	// than Alignment share slabs by size class; see slab.go): larger slabs mean
	// fewer extents, smaller ones less space held by the partly empty slab of each
	// class. It is raised to four slots of the class and rounded up to the
	// alignment. 0 means 64 KiB.
	SlabBytes int64 `json:"slabBytes"`
	// File, when set, is the arena's memory: a file on tmpfs, hugetlbfs or
	// ramfs, created if missing, locked against a second arena and mapped
	// shared, so that it outlives the process. It must be the service's own
	// (owner.go): created by it, or a regular file of its user with mode 0600
	// in directories no other user can change; anything else is ErrUnsafe. An arena started on the file a
	// killed or stopped one used recovers every object that was committed in
	// it (recover.go); one of another geometry, or a damaged one, starts empty
	// and says why in one log line. Size the file system to the arena (tmpfs
	// size=, huge pages for hugetlbfs); a reboot empties it. "" maps anonymous
	// memory from Allocator, gone with the process.
	File string `json:"file"`
	// Warmup populates the memory in the background after New and hands it to
	// objects as it is populated (warm.go), so that New returns at once and no
	// writer pays a page fault per 4 KiB. Off, all of it is handed out at once
	// and first writes fault it in: for sparse arenas (tests, benchmarks).
	Warmup bool `json:"warmup"`
	// TransparentHugePages advises huge pages for the arena's memory (for an
	// arena file, a tmpfs mounted with huge=within_size or advise honours it).
	// Off by default: on this project's machines populating huge pages ran
	// at 0.26 to 6.4 GB/s (the kernel compacts memory for them), 4 KiB pages
	// at a steady 3.3 GB/s, and copies into either were equally fast.
	TransparentHugePages bool `json:"transparentHugePages"`
	// Allocator provides an anonymous arena's memory. Nil means an anonymous
	// mmap allocator (huge pages as TransparentHugePages says), prefaulted in
	// New unless Warmup populates it. An arena file takes its reserve and available-memory
	// reading from it, when set, for the check that the file fits.
	Allocator *hostmem.Allocator `json:"-"`
	// OnEvict is called for each object eviction chooses, before its space is
	// freed, without the arena's lock held (so it may call Acquire, Contains,
	// and Stats, and Remove of other keys, but not Reserve, nor Remove of the
	// object being evicted: both may wait for this very eviction; and several
	// calls may run at once from different goroutines). Evicted.Bytes is valid
	// during the call only. It returns whether the object was kept elsewhere (spilled
	// to SSD); false counts the object as dropped, and it goes either way. The
	// object stays readable during the call; one that is leased meanwhile is kept
	// and becomes most recently used. Nil drops every victim.
	OnEvict func(obj Evicted) bool `json:"-"`
	// OnWarmup, when set, is called on the warm-up's goroutine, without the
	// arena's lock, each time a chunk of memory has been populated and given
	// out: ready of total bytes. It may block, which holds the warm-up (a
	// caller that throttles it; tests).
	OnWarmup func(ready, total int64) `json:"-"`
	// Logger receives a warning when Close finds leases or writes still held, and
	// at debug level each eviction pass and one that stops above the low watermark
	// because the rest is leased or being written; the start of an arena file
	// (why it starts empty, or what recovery found) and the end of the warm-up.
	// Nil means slog.Default().
	Logger *slog.Logger `json:"-"`

	// recoverStep, when set (tests), runs on each of recovery's goroutines
	// before it takes a slab to read, n slabs having been taken, without the
	// arena's lock: blocking it holds recovery.
	recoverStep func(n int)
	// populate, when set (tests), replaces populating a range.
	populate func(off, n int64) error
	// noSeal (benchmarks) seals nothing: what sealing costs a put, compared.
	noSeal bool
	// sealHashed, when set (tests), runs on the sealer after it hashed a
	// batch and before it stores the seals, without the arena's lock:
	// blocking it holds the sealer mid-way.
	sealHashed func()
	// noWatch (tests) starts no watcher of the arena file (fault.go): a
	// truncation is found by its faults alone.
	noWatch bool
}

// DefaultConfig returns a Config for an anonymous arena of size bytes with
// watermarks at 90 % and 85 %, 4 KiB alignment, 64 KiB slabs, and its memory
// warmed up in the background.
func DefaultConfig(size int64) Config {
	return Config{SizeBytes: size, HighWatermark: 0.90, LowWatermark: 0.85, Alignment: 4096, SlabBytes: 64 << 10,
		Warmup: true}
}

// validate checks c and fills its defaults.
func (c *Config) validate() error {
	if c.Alignment == 0 {
		c.Alignment = 4096
	}
	if c.Alignment < 0 || c.Alignment > maxAlignment || bits.OnesCount64(uint64(c.Alignment)) != 1 {
		return fmt.Errorf("arena: alignment %d is not a power of two up to 1 GiB; use 4096: %w", c.Alignment, ErrConfig)
	}
	if c.SizeBytes <= 0 {
		return fmt.Errorf("arena: size must be positive, got %d: %w", c.SizeBytes, ErrConfig)
	}
	if c.SizeBytes < c.Alignment {
		return fmt.Errorf("arena: size %d is smaller than the alignment %d: %w", c.SizeBytes, c.Alignment, ErrConfig)
	}
	if c.SlabBytes == 0 {
		c.SlabBytes = 64 << 10
	}
	if c.SlabBytes < 0 {
		return fmt.Errorf("arena: slab size %d must not be negative; use 0 for 64 KiB: %w", c.SlabBytes, ErrConfig)
	}
	// The negated comparisons also refuse NaN.
	if !(c.LowWatermark > 0 && c.LowWatermark < c.HighWatermark && c.HighWatermark <= 1) {
		return fmt.Errorf("arena: watermarks low %v and high %v: want 0 < low < high <= 1, e.g. 0.85 and 0.90: %w",
			c.LowWatermark, c.HighWatermark, ErrConfig)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}
