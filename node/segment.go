package node

import (
	"fmt"
	"os"
	"strings"
	"sync"
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
}

// mapSegment checks that fd is a sealed memfd of size bytes and maps it. The seals
// matter: a client that could shrink its memfd would make the service fault
// (SIGBUS) when it copies; hostmem's shm allocator seals against that.
func mapSegment(fd int, size uint64) ([]byte, error) {
	if size == 0 || size > 1<<46 {
		return nil, fmt.Errorf("segment of %d bytes: want 1 byte to 64 TiB", size)
	}
	link, _ := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil || !strings.HasPrefix(link, "/memfd:") {
		return nil, fmt.Errorf("the descriptor is %s, not a memfd: allocate host pools with the shm allocator (hostmem.Shm, which storage.HostAllocator picks for the node backend)", describeFD(link))
	}
	if seals&unix.F_SEAL_SHRINK == 0 {
		return nil, fmt.Errorf("the memfd is not sealed against shrinking (seals %#x): the service would fault if it shrank; use hostmem's shm allocator, which seals its segments", seals)
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
	// at a third of memcpy speed. The client's pages exist already (its allocator
	// prefaults), so this only fills the service's page tables.
	_ = unix.Madvise(mem, unix.MADV_POPULATE_WRITE)
	return mem, nil
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
	segs []*segment
}

// resolve maps an item's ranges onto the client's segments, taking a reference on
// each segment used. Ranges outside the client's own segments are refused with a
// message that lists the client's segments.
func (c *session) resolve(it wire.Item) (resolved, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var r resolved
	for _, rg := range it.Ranges {
		seg := c.segments[rg.Segment]
		if seg == nil || rg.Offset > uint64(len(seg.mem)) || rg.Length > uint64(len(seg.mem))-rg.Offset {
			for _, s := range r.segs {
				s.refs.Done()
			}
			return resolved{}, wire.BadRange.Error()
		}
		seg.refs.Add(1)
		r.segs = append(r.segs, seg)
		r.runs = append(r.runs, seg.mem[rg.Offset:rg.Offset+rg.Length:rg.Offset+rg.Length])
		r.size += int64(rg.Length)
	}
	return r, nil
}

// badRange explains a refused range.
func (c *session) badRange(it wire.Item) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var have []string
	for id, s := range c.segments {
		have = append(have, fmt.Sprintf("%d %q (%d bytes)", id, s.name, len(s.mem)))
	}
	if len(have) == 0 {
		have = []string{"none"}
	}
	for _, rg := range it.Ranges {
		seg := c.segments[rg.Segment]
		if seg == nil || rg.Offset > uint64(len(seg.mem)) || rg.Length > uint64(len(seg.mem))-rg.Offset {
			return fmt.Sprintf("object %s: range [%#x, +%d) of segment %d is not inside a segment this client registered (it has: %s); "+
				"allocate host pools with the shm allocator (storage.HostAllocator over the node backend) and register them",
				it.Key, rg.Offset, rg.Length, rg.Segment, strings.Join(have, ", "))
		}
	}
	return "range outside the client's segments"
}

func (r resolved) done() {
	for _, s := range r.segs {
		s.refs.Done()
	}
}

// copyFromRuns copies the runs' bytes, in order, into dst.
func copyFromRuns(dst []byte, runs [][]byte) {
	for _, r := range runs {
		n := copy(dst, r)
		dst = dst[n:]
	}
}

// copyToRuns copies src into the runs, in order.
func copyToRuns(runs [][]byte, src []byte) {
	for _, r := range runs {
		n := copy(r, src)
		src = src[n:]
	}
}
