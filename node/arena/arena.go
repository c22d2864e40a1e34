// Package arena is the node service's DRAM tier: one mapped region of host memory
// that holds L3 objects (byte strings of 64 KiB to 8 MiB, one per page part) by
// key, write-once.
//
// Space is handed out by an offset allocator (Extents) in units of the alignment,
// so every object starts on an address that O_DIRECT spill I/O can use. Writers
// Reserve an extent, fill it, and Commit; readers Acquire a Lease that pins the
// object until Release. When the fill passes the high watermark a background
// goroutine evicts the least recently used objects that nobody reads or writes
// down to the low watermark, handing each to Config.OnEvict (which spills it to
// SSD) before its space is freed; a Reserve that finds no room evicts
// synchronously. The arena's memory comes from hostmem, outside the Go heap: the
// garbage collector never scans it, and a 64 GiB arena costs the heap only its
// index.
package arena

import (
	"fmt"
	"os"
	"sync"
	"unsafe"

	"github.com/stratakv/strata/hostmem"
)

// Arena stores objects in a mapped region. It is safe for concurrent use.
type Arena struct {
	cfg   Config
	unit  int64 // Config.Alignment
	size  int64 // bytes managed: a multiple of unit
	high  int64 // used bytes past which background eviction starts
	low   int64 // used bytes background eviction brings the arena down to
	wake  chan struct{}
	stop  chan struct{}
	done  sync.WaitGroup
	evict func(Evicted) bool

	mu       sync.Mutex
	cond     *sync.Cond // signalled when an eviction in flight ends
	region   *hostmem.Region
	mem      []byte // size bytes of region, aligned to unit; nil once unmapped
	ext      *Extents
	objects  map[string]*object // pending and committed objects by key
	detached map[*object]struct{}
	lru      lruList // committed objects that can be evicted, most recent first
	closed   bool

	committed      int64 // objects in state committed
	committedBytes int64 // their exact sizes
	pending        int64 // objects in state pending
	pendingBytes   int64 // their allocated lengths
	leases         int64 // leases not yet released
	leased         int64 // objects with at least one lease
	inflight       int64 // evictions whose OnEvict runs now
	inflightBytes  int64 // their objects' allocated lengths

	evictions, evictedBytes, spilled, dropped, skipped, noSpace int64
}

// state is where an object is in its life.
type state uint8

const (
	// pending: reserved, being written; invisible to readers, never evicted.
	pending state = iota
	// committed: visible, evictable when unleased.
	committed
	// gone: out of the index (aborted, removed, evicted); its extent is freed when
	// the last lease or the OnEvict call on it ends.
	gone
	// freed: its extent is back in the allocator.
	freed
)

// object is one stored byte string and its bookkeeping.
type object struct {
	key      string
	format   uint64
	off      int64 // byte offset in the region, a multiple of the alignment
	size     int64 // the object's bytes
	span     int64 // the allocated length: size rounded up to the alignment
	state    state
	leases   int32
	evicting bool // OnEvict runs on it now: its bytes must stay
	touched  bool // acquired while evicting: recently used after all
	// settled is closed when a pending object is committed or aborted, for
	// writers of the same key waiting in Await.
	settled chan struct{}

	prev, next *object // lruList links
	inLRU      bool
}

// Evicted is an object chosen for eviction, as OnEvict sees it.
type Evicted struct {
	Key    string
	Format uint64
	// Bytes are the object's bytes, valid during the OnEvict call only. Their
	// address and the length rounded up to the arena's alignment are aligned.
	Bytes []byte
}

// New maps the arena's memory and starts its background evictor.
func New(cfg Config) (*Arena, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	alloc := cfg.Allocator
	if alloc == nil {
		var err error
		if alloc, err = hostmem.New(hostmem.DefaultConfig(hostmem.Mmap)); err != nil {
			return nil, fmt.Errorf("arena: %w", err)
		}
	}
	unit := cfg.Alignment
	size := cfg.SizeBytes / unit * unit
	// Regions start on a page (anonymous ones of 2 MiB and more on a 2 MiB
	// boundary); a larger alignment needs slack to slide the start to.
	slack := int64(0)
	if unit > int64(os.Getpagesize()) {
		slack = unit
	}
	region, err := alloc.Allocate("arena", size+slack)
	if err != nil {
		return nil, fmt.Errorf("arena of %s: %w", hostmem.FormatBytes(size), err)
	}
	mem := region.Bytes()
	skip := (unit - int64(uintptr(unsafe.Pointer(unsafe.SliceData(mem))))%unit) % unit
	mem = mem[skip : skip+size : skip+size]

	a := &Arena{
		cfg:      cfg,
		unit:     unit,
		size:     size,
		high:     int64(cfg.HighWatermark * float64(size)),
		low:      int64(cfg.LowWatermark * float64(size)),
		wake:     make(chan struct{}, 1),
		stop:     make(chan struct{}),
		evict:    cfg.OnEvict,
		region:   region,
		mem:      mem,
		ext:      NewExtents(size / unit),
		objects:  map[string]*object{},
		detached: map[*object]struct{}{},
	}
	a.cond = sync.NewCond(&a.mu)
	a.lru.init()
	a.done.Add(1)
	go a.background()
	return a, nil
}

// Close stops background eviction, waiting for an OnEvict call in progress, and
// releases the arena's memory. Its objects are dropped without OnEvict. Later
// calls fail with ErrClosed, except Release, Abort and Stats. If leases or
// pending writes are still held, the memory stays mapped (their bytes stay valid)
// until the last of them ends, and Close logs a warning: the server should end its
// connections first.
func (a *Arena) Close() error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return fmt.Errorf("close arena: %w", ErrClosed)
	}
	a.closed = true
	a.mu.Unlock()
	close(a.stop)
	a.done.Wait()

	a.mu.Lock()
	defer a.mu.Unlock()
	if a.leases > 0 || a.pending > 0 || a.inflight > 0 {
		a.cfg.Logger.Warn("arena closed while in use; its memory is released when the last lease or write ends",
			"leases", a.leases, "pendingWrites", a.pending, "evictionsInFlight", a.inflight,
			"fix", "end the server's connections (Release every lease, Abort every pending write) before Close")
		return nil
	}
	return a.unmapLocked()
}

// unmapLocked releases the region once the arena is closed and nothing pins it.
func (a *Arena) unmapLocked() error {
	if !a.closed || a.region == nil || a.leases > 0 || a.pending > 0 || a.inflight > 0 {
		return nil
	}
	r := a.region
	a.region, a.mem = nil, nil
	// What was stored is gone: Stats shows an empty arena and the counters.
	a.lru.init()
	clear(a.objects)
	clear(a.detached)
	a.ext = NewExtents(a.size / a.unit)
	a.committed, a.committedBytes = 0, 0
	if err := r.Close(); err != nil {
		return fmt.Errorf("close arena: %w", err)
	}
	return nil
}

// unindexLocked takes a committed object out of the index and the LRU list.
func (a *Arena) unindexLocked(o *object) {
	delete(a.objects, o.key)
	a.lru.remove(o)
	o.state = gone
	a.committed--
	a.committedBytes -= o.size
}

// freeLocked returns a gone object's extent to the allocator unless something
// still pins it, in which case the last pin to go calls it again.
func (a *Arena) freeLocked(o *object) {
	if o.state != gone {
		return
	}
	if o.leases > 0 || o.evicting {
		a.detached[o] = struct{}{}
		return
	}
	delete(a.detached, o)
	o.state = freed
	if a.region == nil {
		return // unmapped at Close: the allocator no longer matters
	}
	if err := a.ext.Free(o.off/a.unit, o.span/a.unit); err != nil {
		panic(fmt.Sprintf("arena: freeing object %q: %v", o.key, err)) // a bookkeeping bug: never outside input
	}
}

// bytesOf is o's bytes in the region, capped so that append cannot reach the next object.
func (a *Arena) bytesOf(o *object) []byte { return a.mem[o.off : o.off+o.size : o.off+o.size] }

// usedLocked is the bytes in allocated extents: committed, pending, and removed
// but still leased objects.
func (a *Arena) usedLocked() int64 { return a.ext.UsedUnits() * a.unit }

// kickLocked wakes the background evictor when the fill is past the high watermark.
func (a *Arena) kickLocked() {
	if a.usedLocked() > a.high {
		select {
		case a.wake <- struct{}{}:
		default:
		}
	}
}
