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
	"fmt"
	"hash/maphash"
	"sync"
	"time"

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
	// settled holds, for each pending object, the channel its Commit or Abort
	// closes, for writers of the same key waiting in Await: bounded by the writes
	// in flight.
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
func New(cfg Config) (*Arena, error) {
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
		b   *backing
		op  opened
		err error
	)
	if cfg.File != "" {
		if b, op, err = openFile(&cfg, unit, size); err != nil {
			return nil, err
		}
	} else {
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
		op.why = "the arena is anonymous memory (no --arena-file)"
	}

	a := &Arena{
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
	if !a.readyDone && (a.closed || !a.rcv.active && !a.rcv.ordering && !a.warm.running) {
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

// rec is record i.
func (a *Arena) rec(i uint32) *record { return a.recs.Get(i) }

// slabOf is the slab r's slot is in.
func (a *Arena) slabOf(r *record) *slab { return &a.slabs[r.ref-1] }

// slotEnd is the end of r's slot: its trailer ends there.
func (a *Arena) slotEnd(r *record) int64 { return r.off + a.slabOf(r).slot }

// bytesOff is where r's bytes lie: in its slot, or in its extent.
func (a *Arena) bytesOff(r *record) int64 {
	if r.flags&flagLarge == 0 {
		return r.off
	}
	off, _ := a.descriptor(a.slotEnd(r))
	return off
}

// bytesOf is r's bytes.
func (a *Arena) bytesOf(r *record) []byte {
	off := a.bytesOff(r)
	return a.mem[off : off+r.size : off+r.size]
}

// keyOff is where r's key lies: after its bytes in its slot, or at the start
// of its descriptor slot.
func (a *Arena) keyOff(r *record) int64 {
	if r.flags&flagLarge == 0 {
		return r.off + r.size
	}
	return r.off
}

// extUnits is the units of a large object's extent.
func (a *Arena) extUnits(size int64) int64 { return (size + a.unit - 1) / a.unit }

// spanOf is the space r holds: its slot, and a large object's extent.
func (a *Arena) spanOf(r *record) int64 {
	span := a.slabOf(r).slot
	if r.flags&flagLarge != 0 {
		span += a.extUnits(r.size) * a.unit
	}
	return span
}

// placeOf is the first unit of the region r lies in, for region eviction: its
// extent, or its slab.
func (a *Arena) placeOf(r *record) int64 {
	if r.flags&flagLarge != 0 {
		return a.bytesOff(r) / a.unit
	}
	return a.slabOf(r).off / a.unit
}

// leasesOf is r's lease count. It lives in r.prev, which the LRU list does not
// use while the object is off it, and an object is off it while leased: the
// count of the few objects leased at once needs no table of its own.
func leasesOf(r *record) uint32 {
	if r.flags&flagInLRU != 0 {
		return 0
	}
	return r.prev
}

// lookupLocked is the record of the indexed object key, 0 when there is none.
func (a *Arena) lookupLocked(key string, h uint64) uint32 {
	return a.tab.Find(uint32(h), func(idx uint32) bool {
		r := a.rec(idx)
		return r.hash == h && int(r.keyLen) == len(key) && a.keyEqual(r, key)
	})
}

// keyEqual reports whether r's key is key, comparing the stored bytes.
func (a *Arena) keyEqual(r *record, key string) bool {
	k := a.keyOff(r)
	return string(a.mem[k:k+int64(r.keyLen)]) == key
}

// keyString is r's key.
func (a *Arena) keyString(r *record) string {
	k := a.keyOff(r)
	return string(a.mem[k : k+int64(r.keyLen)])
}

// nextSeqLocked is the next commit sequence: the start's epoch in the top 24
// bits, a counter in the low 40; a counter that runs out starts a new epoch,
// recorded before it is used.
func (a *Arena) nextSeqLocked() uint64 {
	if a.seq == 1<<40 {
		a.epoch++
		a.seq = 0
		if a.back != nil {
			a.back.sb.epoch = a.epoch
			a.back.writeSuperblock()
		}
	}
	a.seq++
	return a.epoch<<40 | a.seq
}

// placeLocked finds space for a new pending object and indexes it; false when
// there is no room (a class without a free slot and no extent for a new slab,
// or no extent for the object).
func (a *Arena) placeLocked(key string, h, format uint64, size int64, class int) (*Pending, bool, error) {
	var off, ext int64
	var ref uint32
	var flags uint8
	large := class < 0
	if large {
		class = a.descClass(len(key))
		units := a.extUnits(size)
		u, ok := a.ext.Alloc(units)
		if !ok {
			return nil, false, nil
		}
		id, o, ok := a.slotAllocLocked(class)
		if !ok {
			_ = a.ext.Free(u, units)
			return nil, false, nil
		}
		ext, off, ref, flags = u*a.unit, o, id+1, flagLarge
		a.markDescLocked(id, 1)
	} else {
		id, o, ok := a.slotAllocLocked(class)
		if !ok {
			return nil, false, nil
		}
		off, ref = o, id+1
	}
	idx, err := a.recs.Alloc()
	if err == nil {
		err = a.tab.Insert(idx, uint32(h))
		if err != nil {
			a.recs.Release(idx)
		}
	}
	if err != nil {
		if large {
			a.markDescLocked(ref-1, -1)
			_ = a.ext.Free(ext/a.unit, a.extUnits(size))
		}
		a.slotFreeLocked(ref-1, off)
		return nil, false, indexErr(err)
	}
	r := a.rec(idx)
	*r = record{hash: h, format: format, off: off, size: size, ref: ref, keyLen: uint16(len(key)), state: pending, flags: flags}
	end := a.slotEnd(r)
	t := trailer{format: format, keyLen: uint16(len(key)), kind: kindSmall, rec: idx}
	if large {
		t.kind = kindLarge
		copy(a.mem[off:], key)
		a.writeDescriptor(end, ext, size)
		a.owner[ext/a.unit] = idx
		a.setUnit(ext/a.unit, umWord(umLarge, a.extUnits(size)))
	} else {
		t.size = uint16(size)
		copy(a.mem[off+size:], key)
	}
	a.writeTrailer(end, t)
	span := a.spanOf(r)
	ch := make(chan struct{})
	a.settled[idx] = ch
	a.pending++
	a.pendingBytes += span
	a.held += span
	a.kickLocked()
	bo := a.bytesOff(r)
	return &Pending{a: a, idx: idx, key: key, b: a.mem[bo : bo+size : bo+size]}, true, nil
}

// unindexLocked takes a committed object out of the index and the LRU list,
// and clears its commit mark: a restarted service will not find it.
func (a *Arena) unindexLocked(idx uint32) {
	r := a.rec(idx)
	a.clearCheck(a.slotEnd(r))
	a.tab.Remove(idx, uint32(r.hash))
	a.lruRemove(idx)
	r.state = gone
	a.committed--
	a.committedBytes -= r.size
}

// freeLocked returns a gone object's space to the allocator and its record to
// the free list, unless something still pins it, in which case the last pin to
// go calls it again.
func (a *Arena) freeLocked(idx uint32) {
	r := a.rec(idx)
	if r.state != gone || leasesOf(r) > 0 || r.flags&flagEvicting != 0 {
		return
	}
	span := a.spanOf(r)
	if r.flags&flagLarge != 0 {
		u := a.bytesOff(r) / a.unit
		delete(a.owner, u)
		a.setUnit(u, 0)
		if err := a.ext.Free(u, a.extUnits(r.size)); err != nil {
			panic(fmt.Sprintf("arena: freeing object at %d: %v", u*a.unit, err)) // a bookkeeping bug: never outside input
		}
		a.markDescLocked(r.ref-1, -1)
	}
	a.slotFreeLocked(r.ref-1, r.off)
	a.held -= span
	*r = record{state: freed}
	a.recs.Release(idx)
}

// usedLocked is the bytes objects hold, in extents of their own or in slots: the
// fill the watermarks apply to. Committed, pending, and removed but still leased
// objects count.
func (a *Arena) usedLocked() int64 { return a.held }

// extentsUsedLocked is the bytes in allocated extents, less memory withheld
// for the warm-up or that could not be populated: what the objects and their
// slabs take.
func (a *Arena) extentsUsedLocked() int64 {
	return (a.ext.UsedUnits() - a.warm.withheld - a.warm.failed) * a.unit
}

// regionFillLocked is the fill region eviction works on: the allocated
// extents, less the free space of slabs that hold descriptors (which region
// eviction never frees).
func (a *Arena) regionFillLocked() int64 { return a.extentsUsedLocked() - a.descFree }

// kickLocked wakes the background evictor when the fill, or the allocated
// extents, are past the high watermark.
func (a *Arena) kickLocked() {
	if a.usedLocked() > a.high || a.regionFillLocked() > a.high {
		select {
		case a.wake <- struct{}{}:
		default:
		}
	}
}
