package node

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/node/wire"
)

// segment is a client's memfd, mapped into the service.
type segment struct {
	id   uint32
	name string
	fd   int
	mem  []byte
	refs sync.WaitGroup // requests copying to or from it
	// faulted is set by the first copy that faulted on the segment: it is dropped
	// once, logged once.
	faulted atomic.Bool
}

// Filesystem magic numbers (statfs(2)) of the memory a memfd lives in.
const (
	tmpfsMagic     = 0x01021994
	hugetlbfsMagic = 0x958458f6
)

// mapSegment checks that fd is shared memory (a memfd, plain or hugetlb, or a
// tmpfs file such as /dev/shm) of size bytes and maps it. Sealing is not
// required: SGLang's shm allocator creates its memfds with MFD_CLOEXEC only, and
// they can never be sealed. A client that shrinks or hole-punches an unsealed
// segment makes the service's copies fault (SIGBUS); copyFromRuns and copyToRuns
// turn that fault into a failed request and the segment is dropped
// (session.segmentFault), so only that client loses anything; a sealed memfd
// never faults.
func mapSegment(fd int, size uint64) ([]byte, error) {
	if size == 0 || size > 1<<46 {
		return nil, fmt.Errorf("segment of %d bytes: want 1 byte to 64 TiB", size)
	}
	link, _ := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
	var fs unix.Statfs_t
	shm := unix.Fstatfs(fd, &fs) == nil && (fs.Type == tmpfsMagic || uint32(fs.Type) == hugetlbfsMagic)
	if !shm {
		return nil, fmt.Errorf("the descriptor is %s, not a memfd or other shared memory: allocate host pools with a shared-memory allocator "+
			"(hostmem.Shm, which storage.HostAllocator picks for the node backend; in SGLang, \"allocator\": \"shm\" in inline JSON extra config)", describeFD(link))
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("stat the memfd: %v", err)
	}
	if uint64(st.Size) != size {
		return nil, fmt.Errorf("the memfd holds %d bytes, the request says %d", st.Size, size)
	}
	p, err := unix.MmapPtr(fd, 0, nil, uintptr(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map the memfd: %v", err)
	}
	mem := unsafe.Slice((*byte)(p), int(size))
	// Map every page now: otherwise the first copy into or out of each 4 KiB page
	// of the client's pool takes a fault in the service, and the first batches run
	// at a third of memcpy speed. Only when the memfd is fully backed, though: its
	// pages exist (the client's allocator prefaults), so this only fills the
	// service's page tables. On a sparse memfd (ftruncate only) populating would
	// allocate the client's memory on the service's account, seconds per GiB, and
	// can get the service OOM-killed in its memory cgroup; such a segment takes
	// its faults on first use instead, each charged where the client put it.
	if fullyBacked(&st, size) {
		_ = unix.Madvise(mem, unix.MADV_POPULATE_WRITE)
	}
	return mem, nil
}

// fullyBacked reports whether the file st describes has a block allocated for
// each of its size bytes (st_blocks counts 512-byte units, for tmpfs and
// hugetlbfs alike).
func fullyBacked(st *unix.Stat_t, size uint64) bool {
	return st.Blocks >= 0 && uint64(st.Blocks)*512 >= size
}

// chargeRegistered counts size more bytes of registered memory against
// Config.MaxRegisteredBytes, or says why not (and counts nothing).
func (s *Server) chargeRegistered(name string, size int64) string {
	limit := s.cfg.MaxRegisteredBytes
	for {
		cur := s.registeredBytes.Load()
		if limit > 0 && cur+size > limit {
			return fmt.Sprintf("segment %q of %d bytes would bring the node service to %d bytes of registered memory, over its --max-registered of %d: "+
				"raise it, or run fewer or smaller host pools on this node; this pool runs without L3", name, size, cur+size, limit)
		}
		if s.registeredBytes.CompareAndSwap(cur, cur+size) {
			return ""
		}
	}
}

func describeFD(link string) string {
	if link == "" {
		return "unknown"
	}
	return "\"" + link + "\""
}

func (s *segment) release() {
	s.refs.Wait()
	if s.mem != nil {
		_ = unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(s.mem)), uintptr(len(s.mem)))
		s.mem = nil
	}
	_ = unix.Close(s.fd)
}

// resolved is an item's bytes in the client's segments.
type resolved struct {
	runs []([]byte)
	size int64
	// segs are the segments of runs, in order (to find the one a fault hit).
	segs []*segment
	// refs are the references done gives back: segs for an item resolved on
	// its own, none for one of a batch (the batch holds them, see batchRanges).
	refs []*segment
	// win is what the client's deadline allows the copies (window.go).
	win *window
}

// inside reports whether the n bytes at off lie in seg (nil: no such segment).
func inside(seg *segment, off, n uint64) bool {
	return seg != nil && off <= uint64(len(seg.mem)) && n <= uint64(len(seg.mem))-off
}

// runInside reports whether every range of run lies in seg: its ranges
// ascend, so the first range's start and the last one's end (wire.Run.End)
// tell.
func runInside(seg *segment, run wire.Run) bool {
	return inside(seg, run.Offset, run.End()-run.Offset)
}

// resolve maps an item's ranges (or its runs' ranges) onto the client's
// segments, taking a reference on each segment used. Ranges outside the
// client's own segments are refused with a message that lists the client's
// segments.
func (c *session) resolve(it wire.Item, w *window) (resolved, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := resolved{win: w}
	fail := func() (resolved, error) {
		for _, s := range r.refs {
			s.refs.Done()
		}
		return resolved{}, wire.BadRange.Error()
	}
	hold := func(seg *segment) {
		if !slices.Contains(r.refs, seg) {
			seg.refs.Add(1)
			r.refs = append(r.refs, seg)
		}
	}
	for _, rg := range it.Ranges {
		seg := c.segments[rg.Segment]
		if !inside(seg, rg.Offset, rg.Length) {
			return fail()
		}
		hold(seg)
		r.segs = append(r.segs, seg)
		r.runs = append(r.runs, seg.mem[rg.Offset:rg.Offset+rg.Length:rg.Offset+rg.Length])
		r.size += int64(rg.Length)
	}
	for _, run := range it.Runs {
		seg := c.segments[run.Segment]
		if !runInside(seg, run) {
			return fail()
		}
		hold(seg)
		r.runs = appendRun(r.runs, seg.mem, run)
		for range run.Count {
			r.segs = append(r.segs, seg)
		}
		r.size += int64(run.Count) * int64(run.Length)
	}
	return r, nil
}

// appendRun appends the ranges of run, which lies in mem (runInside), to runs.
func appendRun(runs [][]byte, mem []byte, run wire.Run) [][]byte {
	runs = slices.Grow(runs, int(run.Count))
	for k, off := uint32(0), run.Offset; k < run.Count; k, off = k+1, off+run.Stride {
		runs = append(runs, mem[off:off+run.Length:off+run.Length])
	}
	return runs
}

// batchRanges is every item of a Put or Get resolved onto the client's
// segments at once: one lock, a few allocations and one reference per segment
// for the whole batch, instead of a lock, two allocations and a reference per
// range of each item, which cost more than copying an object of a few KiB.
// An item's runs are expanded into its ranges here, each range checked
// inside its segment.
type batchRanges struct {
	runs []([]byte)
	segs []*segment // segs[j] holds runs[j]
	// items[i] places item i's runs in runs; its size is -1 when a range lies
	// outside the client's segments, or overlaps another item's (a Get; see
	// overlap).
	items []batchItem
	held  []*segment // each segment used, referenced once until done
	bytes int64      // of the items that resolved
	win   *window    // the request's, for every item
	// overlap says why each item refused for overlapping another is refused
	// (overlap.go); nil when none is.
	overlap map[int]string
}

type batchItem struct {
	first, end int32
	size       int64
}

// resolveBatch resolves every item's ranges (see resolve). An item with a range
// outside the client's segments is marked, not refused here: item tells. For
// a Get (into), items whose ranges overlap another item's are marked too
// (refuseOverlaps).
func (c *session) resolveBatch(items []wire.Item, w *window, into bool) *batchRanges {
	total := 0
	for i := range items {
		total += items[i].Spans()
	}
	b := &batchRanges{runs: make([][]byte, 0, total), segs: make([]*segment, 0, total), items: make([]batchItem, len(items)), win: w}
	c.mu.Lock()
	var last *segment
	find := func(id uint32) *segment {
		if last != nil && last.id == id {
			return last
		}
		seg := c.segments[id]
		if seg != nil && !slices.Contains(b.held, seg) {
			seg.refs.Add(1)
			b.held = append(b.held, seg)
		}
		last = seg
		return seg
	}
	for i := range items {
		first := len(b.runs)
		size := int64(0)
		for _, rg := range items[i].Ranges {
			seg := find(rg.Segment)
			if !inside(seg, rg.Offset, rg.Length) {
				size = -1
				break
			}
			b.runs = append(b.runs, seg.mem[rg.Offset:rg.Offset+rg.Length:rg.Offset+rg.Length])
			b.segs = append(b.segs, seg)
			size += int64(rg.Length)
		}
		for _, run := range items[i].Runs {
			seg := find(run.Segment)
			if size < 0 || !runInside(seg, run) {
				size = -1
				break
			}
			b.runs = appendRun(b.runs, seg.mem, run)
			for range run.Count {
				b.segs = append(b.segs, seg)
			}
			size += int64(run.Count) * int64(run.Length)
		}
		if size < 0 {
			b.runs, b.segs = b.runs[:first], b.segs[:first]
		} else {
			b.bytes += size
		}
		b.items[i] = batchItem{first: int32(first), end: int32(len(b.runs)), size: size}
	}
	c.mu.Unlock()
	if into {
		b.refuseOverlaps(items)
	}
	return b
}

// item returns item i's ranges, or false when one lies outside the client's
// segments or overlaps another item's, or lies in a segment that faulted (and
// was dropped) since the batch was resolved: such an item fails as it would
// have had it been resolved on its own.
func (b *batchRanges) item(i int) (resolved, bool) {
	it := b.items[i]
	if it.size < 0 {
		return resolved{}, false
	}
	segs := b.segs[it.first:it.end:it.end]
	for _, s := range segs {
		if s.faulted.Load() {
			return resolved{}, false
		}
	}
	return resolved{runs: b.runs[it.first:it.end:it.end], size: it.size, segs: segs, win: b.win}, true
}

// done gives back the batch's references to its segments.
func (b *batchRanges) done() {
	for _, s := range b.held {
		s.refs.Done()
	}
	b.held = nil
}

// badRange explains a refused range of it, item i of its request (-1: not
// known), naming the range or the run that lies outside the client's
// segments.
func (c *session) badRange(it wire.Item, i int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var have []string
	for id, s := range c.segments {
		have = append(have, fmt.Sprintf("%d %q (%d bytes)", id, s.name, len(s.mem)))
	}
	if len(have) == 0 {
		have = []string{"none"}
	}
	slices.Sort(have)
	name := "object " + it.Key
	if i >= 0 {
		name = fmt.Sprintf("object %s (item %d)", it.Key, i)
	}
	const fix = "allocate host pools with the shm allocator (storage.HostAllocator over the node backend) and register them"
	for j, rg := range it.Ranges {
		if !inside(c.segments[rg.Segment], rg.Offset, rg.Length) {
			return fmt.Sprintf("%s: range %d, [%#x, +%d) of segment %d, is not inside a segment this client registered (it has: %s); %s",
				name, j, rg.Offset, rg.Length, rg.Segment, strings.Join(have, ", "), fix)
		}
	}
	for j, run := range it.Runs {
		if !runInside(c.segments[run.Segment], run) {
			return fmt.Sprintf("%s: run %d, %d ranges of %d bytes every %d bytes in [%#x, %#x) of segment %d, is not inside a segment this client registered (it has: %s); %s",
				name, j, run.Count, run.Length, run.Stride, run.Offset, run.End(), run.Segment, strings.Join(have, ", "), fix)
		}
	}
	return name + ": a range outside the client's segments"
}

func (r resolved) done() {
	for _, s := range r.refs {
		s.refs.Done()
	}
}

// copyFromRuns copies the runs' bytes, in order, into dst. The runs are a
// client's memory: if the client shrank or hole-punched its (unsealed) memfd, the
// copy faults, and the fault comes back as a *copyFault instead of killing the
// service (see guard).
func copyFromRuns(dst []byte, runs [][]byte) error {
	return guard(func() {
		for _, r := range runs {
			n := copy(dst, r)
			dst = dst[n:]
		}
	})
}

// copyToRuns copies src into the runs, in order; a fault in the client's memory
// is returned as a *copyFault, like copyFromRuns.
func copyToRuns(runs [][]byte, src []byte) error {
	return guard(func() {
		for _, r := range runs {
			n := copy(r, src)
			src = src[n:]
		}
	})
}

// bounce returns a buffer of the service's own for a tier that cannot write into
// the arena (it has no room) to read an object into, before copyToRuns copies it
// to the client. Only copyFromRuns and copyToRuns, under the fault guard, ever
// touch a client's memory: another package writing there directly could fault on
// a goroutine without the guard (redisstore reads on its own goroutines), which
// kills the service, or have the kernel turn the fault into an EFAULT error that
// names no segment. The extra copy is paid only when the arena is full of objects
// being read or written, or the object is larger than the arena.
func bounce(size int64) []byte { return make([]byte, size) }

// copyFault is a memory fault (SIGBUS, SIGSEGV) at Addr during a copy.
type copyFault struct{ Addr uintptr }

func (f *copyFault) Error() string { return fmt.Sprintf("memory fault at %#x", f.Addr) }

// guard runs fn with the runtime's panic-on-fault set for this goroutine, so
// that a fault in a mapped segment panics (and is recovered here) instead of
// crashing the process. It costs two stores and a deferred call per copy, not
// per byte. Panics that are not memory faults are bugs and go on.
func guard(fn func()) (err error) {
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if r := recover(); r != nil {
			f, ok := r.(interface{ Addr() uintptr })
			if !ok {
				panic(r)
			}
			err = &copyFault{Addr: f.Addr()}
		}
	}()
	fn()
	return nil
}

// segmentFault handles a copy that faulted while serving item it with ranges r:
// it finds the client segment the fault hit, drops it (later ranges naming it
// are refused; it is unmapped once no request uses it), logs once per segment,
// and returns the item's failed result. A fault outside the client's segments is
// a bug of the service and crashes it.
func (c *session) segmentFault(it wire.Item, r resolved, err error) wire.Result {
	var cf *copyFault
	if !errors.As(err, &cf) {
		return wire.Result{Status: wire.Internal, Message: wire.ClipMessage(err.Error())}
	}
	var seg *segment
	for _, s := range r.segs {
		base := uintptr(unsafe.Pointer(unsafe.SliceData(s.mem)))
		if cf.Addr >= base && cf.Addr < base+uintptr(len(s.mem)) {
			seg = s
			break
		}
	}
	if seg == nil {
		panic(fmt.Sprintf("node service: memory fault at %#x outside the client's segments while serving %s", cf.Addr, it.Key))
	}
	off := cf.Addr - uintptr(unsafe.Pointer(unsafe.SliceData(seg.mem)))
	why := fmt.Sprintf("segment %d %q faulted at offset %#x while serving %s: the client shrank or punched holes in its memfd; "+
		"the segment is dropped and requests naming it fail: keep host pool memfds at their registered size "+
		"(seal them with F_SEAL_SHRINK) and register the pool again", seg.id, seg.name, off, it.Key)
	c.srv.st.badRanges.Add(1)
	if seg.faulted.CompareAndSwap(false, true) {
		c.mu.Lock()
		if c.segments[seg.id] == seg {
			delete(c.segments, seg.id)
			c.registered -= int64(len(seg.mem))
			c.srv.registeredBytes.Add(-int64(len(seg.mem)))
		}
		c.noteRefusedLocked(why)
		c.mu.Unlock()
		c.srv.log.Warn("client segment faulted; dropped it", "client", c.id, "name", c.name, "pid", c.pid,
			"segment", seg.name, "offset", off, "reason", why)
		// release waits for the requests that use the segment, this one included,
		// so it runs on its own goroutine; the session's shutdown no longer sees
		// the segment, so it cannot release it twice.
		c.srv.wg.Add(1)
		go func() {
			defer c.srv.wg.Done()
			seg.release()
		}()
	}
	return wire.Result{Status: wire.BadRange, Message: wire.ClipMessage(why)}
}
