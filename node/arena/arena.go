// Package arena is the node service's DRAM tier: one mapped region of host memory
// that holds L3 objects (byte strings, from page parts of 64 KiB to 8 MiB down to
// small objects of a few hundred bytes) by key, write-once.
//
// Space is handed out by an offset allocator (Extents) in units of the alignment.
// An object of at least the alignment takes an extent of its own and starts on an
// aligned address that O_DIRECT spill I/O can use; a smaller one takes a slot of
// its size class in a slab (slab.go), so that it costs space in proportion to its
// size. Writers Reserve space, fill it, and Commit; readers Acquire a Lease that
// pins the object until Release. When the fill passes the high watermark a
// background goroutine evicts the least recently used objects that nobody reads
// or writes down to the low watermark, handing each to Config.OnEvict (which
// spills it to SSD) before its space is freed; a Reserve that finds no room
// evicts synchronously, and when a few least recently used victims do not make
// room (the free space is fragmented) it evicts whole regions next to the largest
// free extents, so its work is proportional to the size it needs (evict.go).
//
// The arena's memory comes from hostmem, outside the Go heap, and so does its
// index (index.go): fixed-size, pointer-free records and a hash table in mapped
// memory. The garbage collector scans neither, so a collection costs the same
// with 100 objects or 100M, and an object's metadata is about 60 bytes.
//
// With Config.File the memory is a file on tmpfs (or hugetlbfs), mapped shared,
// and every object carries what a restarted service needs to find it again
// (layout.go): a service killed with SIGKILL, or stopped for an upgrade, and
// started again on the same file serves every object that was committed, and
// none that was still being written (recover.go). New returns at once whatever
// the arena's size: the memory is populated in the background and handed to
// the allocator as it is (warm.go), and the objects of a file are recovered in
// the background while the arena serves what it has recovered so far.
package arena

import (
	"errors"
	"fmt"
	"hash/maphash"
	"runtime/debug"
	"sync"
	"time"
	"unsafe"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/internal/offheap"
)

// Arena stores objects in a mapped region. It is safe for concurrent use.
type Arena struct {
	cfg   Config
	unit  int64 // Config.Alignment
	size  int64 // bytes managed: a multiple of unit
	high  int64 // held bytes past which background eviction starts
	low   int64 // held bytes background eviction brings the arena down to
	seed  maphash.Seed
	wake  chan struct{}
	stop  chan struct{}
	done  sync.WaitGroup
	evict func(Evicted) bool
	// secret keys the check words (layout.go); from the file's superblock.
	secret uint64
	// brk is what a broken arena needs (fault.go).
	brk breakage

	mu   sync.Mutex
	cond *sync.Cond // signalled when an eviction in flight ends, a chunk is warmed, recovery ends
	back *backing   // the memory; nil once unmapped
	mem  []byte     // size bytes of data, aligned to unit; nil once unmapped
	umap []uint32   // the unit map (layout.go)
	ext  *Extents
	// The index (index.go), off the Go heap: records (record 0 is the LRU
	// list's sentinel) and the hash table.
	recs offheap.Pool[record]
	tab  offheap.Table
	lruN int
	// owner maps an allocated extent's first unit to its large object's
	// record index, or to slabOwner|id for a slab, or to ownerWithheld or
	// ownerOrphan: what region eviction evicts to free it.
	owner     map[int64]uint32
	slabs     []slab
	freeSlabs []uint32
	partial   []uint32 // per class: 1 + the first slab with a free slot
	// settled holds, for a pending object that a writer of the same key waits
	// for in Await, the channel its Commit or Abort closes: made by the first
	// waiter, bounded by the writes in flight.
	settled map[uint32]chan struct{}
	// removing holds the barriers of removals in progress, by key (remove.go):
	// bounded by the removals in flight.
	removing map[string]*removal
	closed   bool
	// seq is the low bits of the next commit sequence, epoch its high ones
	// (layout.go's trailer): from the superblock, one epoch per start.
	seq, epoch uint64

	warm warmup   // warm.go
	rcv  recovery // recover.go
	elog evictLog // evictlog.go
	seal sealer   // seal.go
	// ready is closed once the arena is done starting: warmed up and
	// recovered (or closed first).
	ready      chan struct{}
	readyDone  bool
	readyAfter time.Duration // from New to ready

	committed      int64 // objects in state committed
	committedBytes int64 // their exact sizes
	pending        int64 // objects in state pending
	pendingBytes   int64 // their allocated lengths
	held           int64 // allocated lengths (extents or slots) of objects not yet freed
	leases         int64 // leases not yet released
	leased         int64 // objects with at least one lease
	inflight       int64 // evictions whose OnEvict runs now
	inflightBytes  int64 // their objects' allocated lengths

	// descFree is the free space in slabs that hold large objects'
	// descriptors (slab.go's markDescLocked).
	descFree int64

	evictions, evictedBytes, spilled, dropped, skipped, noSpace, regionEvictions int64
	removals, removedPending, removeWaits                                        int64
}

// state is where an object is in its life.
type state uint8

const (
	// pending: reserved, being written; invisible to readers, never evicted.
	pending state = iota
	// committed: visible, evictable when unleased.
	committed
	// gone: out of the index (aborted, removed, evicted); its space is freed when
	// the last lease or the OnEvict call on it ends.
	gone
	// freed: its space is back in the allocator, its record on the free list.
	freed
)

// Evicted is an object chosen for eviction, as OnEvict sees it.
type Evicted struct {
	Key    string
	Format uint64
	// Bytes are the object's bytes (its value only), valid during the OnEvict call
	// only. For an object of at least the arena's alignment, their address and
	// their length rounded up to the alignment are aligned, so O_DIRECT can write
	// them as they lie. A smaller object lies unaligned in a slot of a slab among
	// others: a spill that writes with O_DIRECT must stage it in a buffer of its
	// own, and must never write past len(Bytes).
	Bytes []byte
}

// Owner markers for extents that belong to no object yet.
const (
	// ownerWithheld: memory not populated yet (warm.go).
	ownerWithheld = slabOwner | (1<<31 - 1)
	// ownerOrphan: a large object's extent that recovery has not matched to
	// its descriptor yet (recover.go).
	ownerOrphan = slabOwner | (1<<31 - 2)
)

// New maps the arena's memory and starts its background evictor. With
// Config.File it opens (or creates) and locks the arena file, and when the
// file holds an arena of the same geometry it rebuilds the allocator from it
// and starts recovering its objects in the background (Stats().Recovery says
// how far it got); with Config.Warmup the memory is populated in the
// background. Either way New returns in about a millisecond per 16 GiB.
func New(cfg Config) (_ *Arena, err error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	start := time.Now()
	unit := cfg.Alignment
	size := cfg.SizeBytes / unit * unit
	if size/unit > 1<<32-1 {
		return nil, fmt.Errorf("arena: %d units of %d bytes; the unit map holds 2^32: raise the alignment or lower the size: %w", size/unit, unit, ErrConfig)
	}
	var (
		a  *Arena
		b  *backing
		op opened
	)
	// A New that fails removes an arena file it created (after closing it,
	// in the deferred calls below); one that was there stays.
	defer func() {
		if err != nil && b != nil && b.made != nil {
			removeMade(b.path, b.made)
		}
	}()
	// Until New returns, nobody else touches the file's memory: a fault in it
	// (the file truncated meanwhile) fails New.
	defer func(old bool) {
		debug.SetPanicOnFault(old)
		if r := recover(); r != nil {
			f, ok := r.(interface{ Addr() uintptr })
			if !ok || b == nil || !b.holds(f.Addr()) {
				panic(r)
			}
			if a != nil {
				a.closeIndexLocked()
			}
			_ = b.replace()
			_ = b.close(false, 0, 0)
			err = fmt.Errorf("arena file %s was truncated while the arena started; it is left empty: start again: %w", cfg.File, ErrBroken)
		}
	}(debug.SetPanicOnFault(true))
	anonymous := "the arena is anonymous memory (no --arena-file)"
	if cfg.File != "" {
		b, op, err = openFile(&cfg, unit, size)
		switch {
		case errors.Is(err, errNoRoom):
			// A full tmpfs is a state of the moment, not a configuration to
			// change: this run serves from anonymous memory, the next start
			// tries the file again.
			cfg.Logger.Warn("the arena file's file system has no room for an arena: this run's arena is anonymous memory, and a restart starts it empty",
				"file", cfg.File, "err", err, "fix", "free room on the arena file's tmpfs or mount it larger; the next start uses the file again")
			anonymous = "the arena file's file system had no room (" + cfg.File + "): anonymous memory for this run"
			cfg.File = ""
		case err != nil:
			return nil, err
		default:
			b.begin()
		}
	}
	if cfg.File == "" {
		alloc := cfg.Allocator
		if alloc == nil {
			ac := hostmem.DefaultConfig(hostmem.Mmap)
			ac.Prefault = !cfg.Warmup // the warm-up populates it instead, in the background
			ac.TransparentHugePages = cfg.TransparentHugePages
			ac.Logger = cfg.Logger
			if alloc, err = hostmem.New(ac); err != nil {
				return nil, fmt.Errorf("arena: %w", err)
			}
		}
		if b, err = openAnonymous(&cfg, alloc, unit, size); err != nil {
			return nil, err
		}
		op.why = anonymous
	}

	a = &Arena{
		cfg:    cfg,
		unit:   unit,
		size:   size,
		high:   int64(cfg.HighWatermark * float64(size)),
		low:    int64(cfg.LowWatermark * float64(size)),
		seed:   maphash.MakeSeed(),
		wake:   make(chan struct{}, 1),
		stop:   make(chan struct{}),
		evict:  cfg.OnEvict,
		back:   b,
		mem:    b.data,
		umap:   b.umap,
		secret: b.sb.secret,
		epoch:  b.sb.epoch,
		ready:  make(chan struct{}),
	}
	a.seal = sealer{on: b.fd >= 0 && !cfg.noSeal, wake: make(chan struct{}, sealWorkers())}
	if b.fd >= 0 {
		a.brk.file = b
		a.brk.lo = uintptr(unsafe.Pointer(unsafe.SliceData(b.mapping)))
		a.brk.hi = a.brk.lo + uintptr(len(b.mapping))
	}
	a.cond = sync.NewCond(&a.mu)
	if err := a.resetIndexLocked(); err != nil {
		_ = b.close(false, 0, 0)
		return nil, err
	}
	a.rcv.begin(b, op, start)
	a.elog.buf = b.log
	var exts []umExtent
	if op.warm {
		a.readLog()
		var bad int64
		exts, bad = b.unitsOf(unit)
		a.rcv.badUnits = bad
	}
	if err := a.rebuildAllocator(exts); err != nil {
		a.closeIndexLocked()
		_ = b.close(false, 0, 0)
		return nil, err
	}
	a.rcv.indexTook = time.Since(start)
	if !op.warm && cfg.File != "" {
		cfg.Logger.Info("arena file starts empty", "file", cfg.File, "why", op.why, "objectsDropped", op.prev.objects,
			"size", size)
	}
	a.done.Add(1)
	go a.background()
	if a.seal.on {
		for range cap(a.seal.wake) {
			a.done.Add(1)
			go a.sealLoop()
		}
	}
	if a.rcv.active {
		a.done.Add(1)
		go a.recoverObjects()
	} else {
		a.rcv.finish(a)
	}
	if a.warm.active() {
		a.done.Add(1)
		go a.warmUp()
	}
	if b.fd >= 0 {
		a.watchFile(b)
	}
	a.mu.Lock()
	a.checkReadyLocked()
	a.mu.Unlock()
	return a, nil
}

// Ready is closed once the arena is done starting: its memory is warmed up
// (Config.Warmup) and the objects of its file are recovered; or it is closed.
// Until then it serves what it has (Stats().ReadyBytes, Recovery).
func (a *Arena) Ready() <-chan struct{} { return a.ready }

// checkReadyLocked closes a.ready when nothing is starting any more.
func (a *Arena) checkReadyLocked() {
	if !a.readyDone && (a.closed || a.broken() || !a.rcv.active && !a.rcv.ordering && !a.warm.running) {
		a.readyDone = true
		a.readyAfter = time.Since(a.rcv.started)
		close(a.ready)
	}
}

// resetIndexLocked starts an empty index.
func (a *Arena) resetIndexLocked() error {
	a.closeIndexLocked()
	a.owner = map[int64]uint32{}
	a.settled = map[uint32]chan struct{}{}
	a.removing = map[string]*removal{}
	a.partial = make([]uint32, len(classes))
	var err error
	if a.tab, err = offheap.NewTable(); err != nil {
		return indexErr(err)
	}
	if _, err := a.recs.Alloc(); err != nil { // record 0: the LRU list's sentinel
		a.tab.Close()
		return indexErr(err)
	}
	return nil
}

// closeIndexLocked unmaps the index.
func (a *Arena) closeIndexLocked() {
	a.recs.Close()
	a.tab.Close()
	a.slabs, a.freeSlabs, a.lruN = nil, nil, 0
}

// Close stops background eviction, warm-up and recovery, waiting for an
// OnEvict call in progress, and releases the arena's memory. Its objects are
// dropped without OnEvict: from an anonymous arena for good; an arena file
// keeps them for the next service, and its superblock says it was closed
// cleanly. Later calls fail with ErrClosed, except Release, Abort and Stats.
// If leases or pending writes are still held, the memory stays mapped (their
// bytes stay valid) until the last of them ends, and Close logs a warning: the
// server should end its connections first.
func (a *Arena) Close() error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return fmt.Errorf("close arena: %w", ErrClosed)
	}
	a.closed = true
	a.cond.Broadcast()
	a.mu.Unlock()
	close(a.stop)
	a.done.Wait()

	a.mu.Lock()
	defer a.mu.Unlock()
	if a.rcv.active {
		a.rcv.finish(a) // cut short: the next service on the file recovers the rest
	}
	a.checkReadyLocked()
	if a.leases > 0 || a.pending > 0 || a.inflight > 0 {
		a.cfg.Logger.Warn("arena closed while in use; its memory is released when the last lease or write ends",
			"leases", a.leases, "pendingWrites", a.pending, "evictionsInFlight", a.inflight,
			"fix", "end the server's connections (Release every lease, Abort every pending write) before Close")
		return nil
	}
	return a.unmapLocked()
}

// unmapLocked releases the region and the index once the arena is closed and
// nothing pins it.
func (a *Arena) unmapLocked() error {
	if !a.closed || a.back == nil || a.leases > 0 || a.pending > 0 || a.inflight > 0 {
		return nil
	}
	b := a.back
	a.back, a.mem, a.umap, a.elog.buf = nil, nil, nil, nil
	// No commit can happen any more (Commit after Close drops its object), so
	// what the file holds is what the next service recovers.
	objects, bytes := a.committed, a.committedBytes
	// What was stored is gone from this process: Stats shows an empty arena
	// and the counters.
	a.closeIndexLocked()
	a.ext = NewExtents(a.size / a.unit)
	clear(a.owner)
	clear(a.settled)
	a.committed, a.committedBytes, a.held = 0, 0, 0
	a.warm.chunks = nil
	if err := b.close(true, objects, bytes); err != nil {
		return fmt.Errorf("close arena: %w", err)
	}
	return nil
}
