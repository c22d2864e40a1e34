package arena

import (
	"cmp"
	"context"
	"runtime/debug"
	"slices"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Recovery: a service started on an arena file that holds an arena of its
// geometry finds the objects that were committed in it, whether the last
// service shut down cleanly or was killed (layout.go says what the file
// holds). In two steps:
//
//  1. In New, the allocator is rebuilt from the unit map alone: every extent
//     it records is allocated again (a slab, unread yet, or a large object's
//     bytes, matched to no descriptor yet), and the rest is free. That is one
//     pass over 4 bytes per unit (16 MiB for a 16 GiB arena), so New returns
//     within milliseconds, and from then on the arena takes new objects into
//     its free space without ever touching memory recovery has not read.
//  2. In the background, slab after slab, each slot's trailer is read: a slot
//     whose check word matches its trailer, key and place is a committed
//     object (its descriptor, for a large object, must name an extent the unit
//     map has, of the right length) and is indexed again, evictable and
//     readable at once; every other slot is free. When every slab is read, the
//     large extents no descriptor named (writes in flight at the kill) are
//     freed, and the recovered objects that nobody used since are put in the
//     LRU order of their commits.
//
// Meanwhile the arena serves: a Get finds what is recovered so far and misses
// the rest, a Put of a key whose old copy is not read yet stores a new copy
// (the scan then drops the old one), and a Remove waits until recovery ends,
// so that no removed object can come back with a slab read after it. A slot
// with a nonzero check word that does not match (random bytes, a damaged file)
// is counted as lost and cleared; nothing is ever served from it.

// recovery is what the start found and what recovery did.
type recovery struct {
	file      string
	warm      bool   // the file's objects are recovered
	why       string // why the arena started empty, when it did
	prevClean bool   // the service before shut down cleanly
	prevObjs  int64  // objects the file held at its last clean close
	contentID uint64
	starts    uint64

	active    bool          // recovering now
	ordering  bool          // recovered, the LRU order still being made
	doneCh    chan struct{} // closed when recovery ends (or the arena closes)
	unscanned []uint32      // slabs to read, in offset order
	next      int           // the next of them to read
	read      int           // how many have been read and indexed
	orphans   int64         // large extents no descriptor has named yet

	badUnits, recovered, recoveredBytes, lost, duplicates, orphansFreed int64
	badSeals, unsealed                                                  int64  // seal.go
	waits                                                               int64  // removals that waited for the end
	touched                                                             uint64 // keeps indexSlabLocked's loads

	started   time.Time
	indexTook time.Duration // rebuilding the allocator (step 1)
	took      time.Duration // the whole recovery, from New
	order     seqOrder      // (sequence, record) of recovered objects
}

// begin notes what opening the backing found.
func (r *recovery) begin(b *backing, op opened, start time.Time) {
	r.file, r.warm, r.why, r.started = b.path, op.warm, op.why, start
	r.prevClean = op.warm && op.prev.state == sbClean
	r.prevObjs = op.prev.objects
	r.contentID, r.starts = b.sb.contentID, b.sb.starts
	r.doneCh = make(chan struct{})
}

// finish ends recovery: called once, with the lock held or before the arena
// is shared.
func (r *recovery) finish(a *Arena) {
	r.active = false
	r.took = time.Since(r.started)
	close(r.doneCh)
	if a.cond != nil {
		a.cond.Broadcast()
	}
	if a.ready != nil {
		a.checkReadyLocked()
	}
}

// rebuildAllocator builds the allocator from the extents the unit map
// records, withholding the free memory for the warm-up.
func (a *Arena) rebuildAllocator(exts []umExtent) error {
	spans := make([]Span, 0, len(exts))
	var slots int64 // the most objects the slabs can hold
	for _, e := range exts {
		spans = append(spans, Span{e.u, e.n})
		if e.class >= 0 {
			span := e.n * a.unit
			slot := classes[e.class]
			slots += span / slot
			id := a.newSlabLocked(slab{off: e.u * a.unit, span: span, slot: slot, class: uint8(e.class), live: true,
				nslots: uint32(span / slot), unscanned: true})
			a.rcv.unscanned = append(a.rcv.unscanned, id)
		} else {
			a.owner[e.u] = ownerOrphan
			a.rcv.orphans++
		}
	}
	all := spans
	if a.cfg.Warmup {
		all = a.warmPieces(spans)
	} else {
		a.warm.readyBytes = a.size
	}
	ext, err := RebuildExtents(a.size/a.unit, all)
	if err != nil {
		return err
	}
	a.ext = ext
	for _, c := range a.warm.chunks {
		for _, p := range c.pieces {
			a.owner[p.Off] = ownerWithheld
		}
	}
	a.rcv.active = len(exts) > 0
	// The hash table is grown once for what recovery may index (bounded
	// below what objects of 256 B would fill), rather than doubled and
	// migrated all along, which made lookups of keys not indexed yet, most
	// of recovery's, probe two tables.
	if err := a.tab.Presize(int(min(slots, a.size/256))); err != nil {
		return indexErr(err)
	}
	return nil
}

// recoverWorkers is how many goroutines read slabs at once: reading and
// checking a slot needs no lock (nobody else touches a slab recovery has not
// read), only indexing what it found does.
const recoverWorkers = 2

// recoverObjects reads the slabs (with a helper), then frees the orphans,
// which ends recovery, and orders the LRU list (step 2 above). A fault in the
// file's memory (it was truncated) breaks the arena, which ends recovery too
// (fault.go).
func (a *Arena) recoverObjects() {
	defer a.done.Done()
	defer a.rcv.order.close()
	defer a.guard(debug.SetPanicOnFault(true), nil)
	var wg sync.WaitGroup
	for range recoverWorkers - 1 {
		wg.Go(a.readSlabs)
	}
	a.readSlabs()
	wg.Wait()
	order, ok := a.endRecovery()
	if !ok {
		return
	}
	// Most recent first: each goes to the back in turn, so the least recently
	// committed ends last, the first victim.
	slices.SortFunc(order, func(x, y seqIdx) int { return cmp.Compare(y.seq, x.seq) })
	const batch = 1 << 16
	for i := 0; i < len(order); i += batch {
		select {
		case <-a.stop:
			return
		default:
		}
		a.mu.Lock()
		for _, p := range order[i:min(i+batch, len(order))] {
			if r := a.rec(p.idx); r.flags&flagRecovered != 0 && r.flags&flagInLRU != 0 {
				a.lruRemove(p.idx)
				a.lruPushBack(p.idx)
			}
		}
		a.mu.Unlock()
	}
	a.mu.Lock()
	a.rcv.ordering = false
	a.checkReadyLocked()
	a.mu.Unlock()
}

// endRecovery frees the orphans and ends recovery, once every slab is read,
// and returns the recovered objects to order; false when the arena closed or
// broke first.
func (a *Arena) endRecovery() ([]seqIdx, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed || a.broken() {
		return nil, false
	}
	for u, o := range a.owner {
		if o == ownerOrphan {
			_, n := umDecode(a.umap[u])
			delete(a.owner, u)
			a.setUnit(u, 0)
			if err := a.ext.Free(u, n); err != nil {
				panic("arena: freeing an orphan extent: " + err.Error()) // a bookkeeping bug
			}
			a.rcv.orphansFreed++
		}
	}
	a.rcv.orphans = 0
	// Every object is indexed and every extent accounted for: recovery is
	// over (removals may go on). What is left only orders the LRU list.
	a.rcv.ordering = true
	a.rcv.finish(a)
	a.kickLocked()
	a.cfg.Logger.Info("arena recovered", "file", a.rcv.file, "objects", a.rcv.recovered, "bytes", a.rcv.recoveredBytes,
		"lost", a.rcv.lost, "duplicates", a.rcv.duplicates, "unfinishedWrites", a.rcv.orphansFreed,
		"previousShutdownClean", a.rcv.prevClean, "took", a.rcv.took.Round(time.Microsecond))
	if a.rcv.lost > 0 || a.rcv.badUnits > 0 {
		a.cfg.Logger.Warn("arena file held damaged objects; they were dropped, never served",
			"file", a.rcv.file, "lostObjects", a.rcv.lost, "ofThemBytesNotMatchingTheirSeal", a.rcv.badSeals,
			"badUnitMapWords", a.rcv.badUnits,
			"fix", "nothing to do; if it recurs, check the machine's memory (ECC errors) and who else can write the file")
	}
	if a.rcv.unsealed > 0 {
		a.cfg.Logger.Warn("arena file held objects committed just before the service before was killed, not sealed yet; "+
			"their bytes cannot be checked, so they were dropped",
			"file", a.rcv.file, "objects", a.rcv.unsealed,
			"fix", "stop the service with SIGTERM, which seals every object before it exits")
	}
	return a.rcv.order.pairs(), true
}

// readSlabs reads slabs until none is left (or the arena closes or breaks):
// each is read and checked without the lock, and what it holds indexed with
// it. Each worker guards its own goroutine.
func (a *Arena) readSlabs() {
	defer a.guard(debug.SetPanicOnFault(true), nil)
	var rs slabRead
	for {
		select {
		case <-a.stop:
			return
		default:
		}
		if h := a.cfg.recoverStep; h != nil {
			a.mu.Lock()
			n := a.rcv.next
			a.mu.Unlock()
			h(n)
		}
		id, s, ok := a.nextSlab()
		if !ok {
			return
		}
		rs.reset()
		a.readSlab(&s, &rs)
		a.indexSlab(id, &rs)
	}
}

// nextSlab takes the next slab to read, and a copy of it (the slab is not
// changed until it is indexed); false when none is left or the arena closed
// or broke.
func (a *Arena) nextSlab() (uint32, slab, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed || a.broken() || a.rcv.next == len(a.rcv.unscanned) {
		return 0, slab{}, false
	}
	id := a.rcv.unscanned[a.rcv.next]
	a.rcv.next++
	return id, a.slabs[id], true
}

// AwaitRecovered waits until the arena has recovered the objects of its file
// (at once for an anonymous arena, or one that started empty), or ctx ends.
func (a *Arena) AwaitRecovered(ctx context.Context) error {
	select {
	case <-a.rcv.doneCh:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// awaitRecoveredLocked waits, with the lock, until recovery has ended or the
// arena is closed.
func (a *Arena) awaitRecoveredLocked() {
	for a.rcv.active && !a.closed && !a.broken() {
		a.rcv.waits++
		a.cond.Wait()
	}
}

// seqIdx is a recovered object's commit sequence and record.
type seqIdx struct {
	seq uint64
	idx uint32
	_   uint32
}

// seqOrder collects seqIdx pairs in memory mapped outside the Go heap (16
// bytes per recovered object, for as long as recovery runs). Should the
// mapping fail it stops collecting, and the objects keep the order they were
// found in.
type seqOrder struct {
	buf    []seqIdx
	n      int
	failed bool
}

func (o *seqOrder) add(p seqIdx) {
	if o.failed {
		return
	}
	if o.n == len(o.buf) {
		grown := max(1<<16, 2*len(o.buf))
		m, err := mapBytes(-1, int64(grown)*int64(unsafe.Sizeof(p)), unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE, 0)
		if err != nil {
			o.failed = true
			return
		}
		next := unsafe.Slice((*seqIdx)(unsafe.Pointer(unsafe.SliceData(m))), grown)
		copy(next, o.buf[:o.n])
		o.unmap()
		o.buf = next
	}
	o.buf[o.n] = p
	o.n++
}

// pairs is what was collected: valid until close.
func (o *seqOrder) pairs() []seqIdx { return o.buf[:o.n] }

func (o *seqOrder) unmap() {
	if len(o.buf) > 0 {
		unmapBytes(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(o.buf))), len(o.buf)*int(unsafe.Sizeof(seqIdx{}))))
	}
	o.buf = nil
}

func (o *seqOrder) close() {
	o.unmap()
	o.n = 0
}
