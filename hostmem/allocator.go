// Package hostmem allocates host memory for KV pools as mapped regions outside the
// Go heap: anonymous mmap, memfd shared memory that another process (the node
// service) can map, and hugetlb pages with a fallback. The garbage collector never
// scans or moves a region's bytes, and regions are released explicitly, once.
package hostmem

import (
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Kind names an allocator. Storage backends that move pages without copies say
// which Kind host pools must use.
type Kind string

const (
	// Mmap is anonymous private memory: the default for in-process backends.
	Mmap Kind = "mmap"
	// Shm is a memfd segment mapped shared: its file descriptor can be passed to the
	// node service (SCM_RIGHTS), which maps the same pages and copies to and from them.
	Shm Kind = "shm"
	// HugeTLB is anonymous memory in explicit huge pages (vm.nr_hugepages); when the
	// kernel has too few free, the allocation falls back to Mmap with a warning.
	HugeTLB Kind = "hugetlb"
)

// ParseKind accepts mmap, shm and hugetlb.
func ParseKind(s string) (Kind, error) {
	switch k := Kind(strings.ToLower(s)); k {
	case Mmap, Shm, HugeTLB:
		return k, nil
	}
	return "", fmt.Errorf("allocator %q: want mmap, shm or hugetlb: %w", s, ErrConfig)
}

// Config describes how an Allocator obtains memory.
type Config struct {
	// Kind selects the allocator. Use the kind your L3 backend asks for
	// (storage.Backend.Allocator); Mmap when there is no L3.
	Kind Kind `json:"kind"`
	// Prefault touches every page at allocation so that the first copy into the pool
	// does not pay a page fault per 4 KiB (copying into untouched memory runs at a
	// quarter of memcpy speed) and so that the memory check below sees real use.
	Prefault bool `json:"prefault"`
	// TransparentHugePages asks the kernel to back the region with 2 MiB pages
	// (MADV_HUGEPAGE), which cuts TLB misses on large pools. Harmless where THP is off.
	TransparentHugePages bool `json:"transparentHugePages"`
	// Mlock pins the region in RAM so it is never swapped. It needs RLIMIT_MEMLOCK
	// (ulimit -l) at least the pool size, or CAP_IPC_LOCK; the allocation fails otherwise.
	Mlock bool `json:"mlock"`
	// ReserveBytes is host memory that allocations must leave available for the rest
	// of the process and the machine. An allocation larger than MemAvailable (and the
	// cgroup's headroom) minus ReserveBytes is refused. Size it to what the engine
	// process needs beside its pools; 1 GiB is a floor for small machines.
	ReserveBytes int64 `json:"reserveBytes"`
	// Logger receives the hugetlb fallback warning; nil means slog.Default().
	Logger *slog.Logger `json:"-"`
	// Available reports the bytes allocations may still take before the reserve; nil
	// means AvailableBytes (MemAvailable and the cgroup limit). Set it to budget pools
	// from a figure of your own, or in tests.
	Available func() (int64, error) `json:"-"`
}

// DefaultConfig returns a Config for kind with prefaulting and THP on and a 1 GiB reserve.
func DefaultConfig(kind Kind) Config {
	return Config{Kind: kind, Prefault: true, TransparentHugePages: true, ReserveBytes: 1 << 30}
}

// Allocator hands out Regions. It is safe for concurrent use.
type Allocator struct {
	cfg    Config
	log    *slog.Logger
	avail  func() (int64, error)
	lazy   atomic.Int64 // bytes mapped without prefaulting, not yet visible in MemAvailable
	nextID atomic.Uint64
}

// New validates cfg and returns an Allocator.
func New(cfg Config) (*Allocator, error) {
	if _, err := ParseKind(string(cfg.Kind)); err != nil {
		return nil, err
	}
	if cfg.ReserveBytes < 0 {
		return nil, fmt.Errorf("reserve of %d bytes: must not be negative: %w", cfg.ReserveBytes, ErrConfig)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	avail := cfg.Available
	if avail == nil {
		avail = AvailableBytes
	}
	return &Allocator{cfg: cfg, log: log, avail: avail}, nil
}

// Kind is the kind of memory this allocator returns (before any hugetlb fallback).
func (a *Allocator) Kind() Kind { return a.cfg.Kind }

// Config returns the allocator's configuration.
func (a *Allocator) Config() Config { return a.cfg }

// Allocate maps a region of at least size bytes (rounded up to the page size). The
// name labels the memfd (visible in /proc/PID/fd and maps) and log lines.
func (a *Allocator) Allocate(name string, size int64) (*Region, error) {
	if size <= 0 {
		return nil, fmt.Errorf("allocate %s: size %d must be positive: %w", name, size, ErrConfig)
	}
	if int64(int(size)) != size {
		return nil, fmt.Errorf("allocate %s: size %d does not fit this platform: %w", name, size, ErrConfig)
	}
	size = roundUp(size, int64(os.Getpagesize()))
	if err := a.checkAvailable(name, size); err != nil {
		return nil, err
	}
	var (
		r   *Region
		err error
	)
	switch a.cfg.Kind {
	case HugeTLB:
		r, err = a.mapHugeTLB(name, size)
	case Shm:
		r, err = a.mapShm(name, size)
	default:
		r, err = a.mapAnonymous(name, size, a.cfg.TransparentHugePages)
	}
	if err != nil {
		return nil, err
	}
	if a.cfg.Mlock {
		if err := unix.Mlock(r.data); err != nil {
			_ = r.Close()
			return nil, fmt.Errorf("allocate %s: mlock %d bytes: %v; raise the memlock limit (ulimit -l, LimitMEMLOCK=) or grant CAP_IPC_LOCK, or turn mlock off: %w",
				name, size, err, ErrMap)
		}
		r.locked = true
	}
	if !a.cfg.Prefault && !r.hugeTLB {
		a.lazy.Add(size)
		r.onClose = func() { a.lazy.Add(-size) }
	}
	r.id = a.nextID.Add(1)
	return r, nil
}

func (a *Allocator) checkAvailable(name string, size int64) error {
	avail, err := a.avail()
	if err != nil {
		// Without a reading, refusing every allocation would be worse than trusting the
		// kernel's own overcommit checks.
		a.log.Warn("host memory: cannot read available memory; allocating without the reserve check",
			"region", name, "err", err)
		return nil
	}
	avail -= a.lazy.Load()
	if size > avail-a.cfg.ReserveBytes {
		return fmt.Errorf("allocate %s: %s requested, %s available, %s reserved: ask for less (at most %s fits) or lower the reserve: %w",
			name, FormatBytes(size), FormatBytes(max(avail, 0)), FormatBytes(a.cfg.ReserveBytes), FormatBytes(max(avail-a.cfg.ReserveBytes, 0)), ErrNoMemory)
	}
	return nil
}

func roundUp(n, to int64) int64 { return (n + to - 1) / to * to }

// FormatBytes renders n with a binary unit, e.g. "4.0 GiB".
func FormatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
