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
package arena

import (
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"os"
	"sync"
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

	mu     sync.Mutex
	cond   *sync.Cond // signalled when an eviction in flight ends
	region *hostmem.Region
	mem    []byte // size bytes of region, aligned to unit; nil once unmapped
	ext    *Extents
	// The index (index.go), off the Go heap: records (record 0 is the LRU list's
	// sentinel), key blocks of objects in extents of their own, and the hash table.
	recs offheap.Pool[record]
	keys offheap.Pool[keyBlock]
	tab  offheap.Table
	lruN int
	// owner maps an allocated extent's first unit to its object's record index, or
	// to slabOwner|id for a slab: what region eviction evicts to free it.
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

	committed      int64 // objects in state committed
	committedBytes int64 // their exact sizes
	pending        int64 // objects in state pending
	pendingBytes   int64 // their allocated lengths
	held           int64 // allocated lengths (extents or slots) of objects not yet freed
	leases         int64 // leases not yet released
	leased         int64 // objects with at least one lease
	inflight       int64 // evictions whose OnEvict runs now
	inflightBytes  int64 // their objects' allocated lengths

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
		cfg:    cfg,
		unit:   unit,
		size:   size,
		high:   int64(cfg.HighWatermark * float64(size)),
		low:    int64(cfg.LowWatermark * float64(size)),
		seed:   maphash.MakeSeed(),
		wake:   make(chan struct{}, 1),
		stop:   make(chan struct{}),
		evict:  cfg.OnEvict,
		region: region,
		mem:    mem,
	}
	if err := a.resetIndexLocked(); err != nil {
		_ = region.Close()
		return nil, err
	}
	a.cond = sync.NewCond(&a.mu)
	a.done.Add(1)
	go a.background()
	return a, nil
}

// resetIndexLocked starts an empty index and allocator.
func (a *Arena) resetIndexLocked() error {
	a.closeIndexLocked()
	a.ext = NewExtents(a.size / a.unit)
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
	a.keys.Close()
	a.tab.Close()
	a.slabs, a.freeSlabs, a.lruN = nil, nil, 0
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

// unmapLocked releases the region and the index once the arena is closed and
// nothing pins it.
func (a *Arena) unmapLocked() error {
	if !a.closed || a.region == nil || a.leases > 0 || a.pending > 0 || a.inflight > 0 {
		return nil
	}
	r := a.region
	a.region, a.mem = nil, nil
	// What was stored is gone: Stats shows an empty arena and the counters.
	a.closeIndexLocked()
	a.ext = NewExtents(a.size / a.unit)
	clear(a.owner)
	clear(a.settled)
	a.committed, a.committedBytes, a.held = 0, 0, 0
	if err := r.Close(); err != nil {
		return fmt.Errorf("close arena: %w", err)
	}
	return nil
}

// rec is record i.
func (a *Arena) rec(i uint32) *record { return a.recs.Get(i) }

// spanOf is the space r holds: its slot, or its extent.
func (a *Arena) spanOf(r *record) int64 {
	if r.flags&flagSlab != 0 {
		return a.slabs[r.ref-1].slot
	}
	return (r.size + a.unit - 1) / a.unit * a.unit
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
	if r.flags&flagSlab != 0 {
		k := a.mem[r.off+r.size : r.off+r.size+int64(r.keyLen)]
		return string(k) == key
	}
	for b := r.ref; len(key) > 0; {
		kb := a.keys.Get(b - 1)
		n := min(len(key), keyBlockData)
		if string(kb.data[:n]) != key[:n] {
			return false
		}
		key, b = key[n:], kb.next
	}
	return true
}

// keyString is r's key.
func (a *Arena) keyString(r *record) string {
	if r.flags&flagSlab != 0 {
		return string(a.mem[r.off+r.size : r.off+r.size+int64(r.keyLen)])
	}
	k := make([]byte, 0, r.keyLen)
	for b := r.ref; b != 0; {
		kb := a.keys.Get(b - 1)
		n := min(int(r.keyLen)-len(k), keyBlockData)
		k = append(k, kb.data[:n]...)
		b = kb.next
	}
	return string(k)
}

// storeKeyBlocks copies key into a chain of key blocks and returns 1 + the first.
func (a *Arena) storeKeyBlocks(key string) (uint32, error) {
	var first, last uint32
	for len(key) > 0 {
		b, err := a.keys.Alloc()
		if err != nil {
			a.freeKeyBlocks(first)
			return 0, indexErr(err)
		}
		kb := a.keys.Get(b)
		n := copy(kb.data[:], key)
		key = key[n:]
		if last == 0 {
			first = b + 1
		} else {
			a.keys.Get(last - 1).next = b + 1
		}
		last = b + 1
	}
	return first, nil
}

func (a *Arena) freeKeyBlocks(b uint32) {
	for b != 0 {
		next := a.keys.Get(b - 1).next
		a.keys.Release(b - 1)
		b = next
	}
}

// placeLocked finds space for a new pending object and indexes it; false when
// there is no room (a class without a free slot and no extent for a new slab,
// or no extent for the object).
func (a *Arena) placeLocked(key string, h, format uint64, size int64, class int) (*Pending, bool, error) {
	var off int64
	var ref uint32
	var flags uint8
	if class >= 0 {
		id, o, ok := a.slotAllocLocked(class)
		if !ok {
			return nil, false, nil
		}
		off, ref, flags = o, id+1, flagSlab
	} else {
		u, ok := a.ext.Alloc((size + a.unit - 1) / a.unit)
		if !ok {
			return nil, false, nil
		}
		off = u * a.unit
		kb, err := a.storeKeyBlocks(key)
		if err != nil {
			_ = a.ext.Free(u, (size+a.unit-1)/a.unit)
			return nil, false, err
		}
		ref = kb
	}
	idx, err := a.recs.Alloc()
	if err == nil {
		err = a.tab.Insert(idx, uint32(h))
		if err != nil {
			a.recs.Release(idx)
		}
	}
	if err != nil {
		err = indexErr(err)
		if class >= 0 {
			a.slotFreeLocked(ref-1, off)
		} else {
			a.freeKeyBlocks(ref)
			_ = a.ext.Free(off/a.unit, (size+a.unit-1)/a.unit)
		}
		return nil, false, err
	}
	r := a.rec(idx)
	*r = record{hash: h, format: format, off: off, size: size, ref: ref, keyLen: uint16(len(key)), state: pending, flags: flags}
	if class >= 0 {
		s := &a.slabs[ref-1]
		copy(a.mem[off+size:], key)
		binary.LittleEndian.PutUint32(a.mem[off+s.slot-slotIndexBytes:], idx)
	} else {
		a.owner[off/a.unit] = idx
	}
	span := a.spanOf(r)
	ch := make(chan struct{})
	a.settled[idx] = ch
	a.pending++
	a.pendingBytes += span
	a.held += span
	a.kickLocked()
	return &Pending{a: a, idx: idx, key: key, b: a.mem[off : off+size : off+size]}, true, nil
}

// unindexLocked takes a committed object out of the index and the LRU list.
func (a *Arena) unindexLocked(idx uint32) {
	r := a.rec(idx)
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
	if r.flags&flagSlab != 0 {
		a.slotFreeLocked(r.ref-1, r.off)
	} else {
		u := r.off / a.unit
		delete(a.owner, u)
		a.freeKeyBlocks(r.ref)
		if err := a.ext.Free(u, span/a.unit); err != nil {
			panic(fmt.Sprintf("arena: freeing object at %d: %v", r.off, err)) // a bookkeeping bug: never outside input
		}
	}
	a.held -= span
	*r = record{state: freed}
	a.recs.Release(idx)
}

// usedLocked is the bytes objects hold, in extents of their own or in slots: the
// fill the watermarks apply to. Committed, pending, and removed but still leased
// objects count.
func (a *Arena) usedLocked() int64 { return a.held }

// kickLocked wakes the background evictor when the fill, or the allocated
// extents, are past the high watermark.
func (a *Arena) kickLocked() {
	if a.usedLocked() > a.high || a.ext.UsedUnits()*a.unit > a.high {
		select {
		case a.wake <- struct{}{}:
		default:
		}
	}
}
