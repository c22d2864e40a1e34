package hostmem

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

const hugePageSize = 2 << 20

// mapAnonymous maps private anonymous memory aligned to 2 MiB, so that transparent
// huge pages can back it from the first byte.
func (a *Allocator) mapAnonymous(name string, size int64, thp bool) (*Region, error) {
	align := int64(0)
	if thp && size >= hugePageSize {
		align = hugePageSize
	}
	m, err := mmapRaw(-1, size+align, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("allocate %s: mmap %s: %v: %w", name, FormatBytes(size), err, ErrMap)
	}
	data := m
	if align > 0 {
		// Trim the head and tail so data starts on a 2 MiB boundary.
		base := addrOf(m)
		skip := int((align - int64(base%uint64(align))) % align)
		if skip > 0 {
			if err := munmapRaw(m[:skip]); err != nil {
				_ = munmapRaw(m)
				return nil, fmt.Errorf("allocate %s: trim mapping: %v: %w", name, err, ErrMap)
			}
		}
		tail := m[skip+int(size):]
		if len(tail) > 0 {
			if err := munmapRaw(tail); err != nil {
				_ = munmapRaw(m[skip:])
				return nil, fmt.Errorf("allocate %s: trim mapping: %v: %w", name, err, ErrMap)
			}
		}
		data = m[skip : skip+int(size) : skip+int(size)]
	}
	r := &Region{name: name, data: data, mapping: data, fd: -1, kind: Mmap}
	if thp {
		_ = unix.Madvise(data, unix.MADV_HUGEPAGE) // advice only: THP may be off
	}
	if a.cfg.Prefault {
		prefault(data)
	}
	return r, nil
}

// mapShm creates a sealed memfd of size bytes and maps it shared. The seals stop the
// file from shrinking, so a process that maps it (the node service) can never be
// made to fault by a client truncating it.
func (a *Allocator) mapShm(name string, size int64) (*Region, error) {
	fd, err := unix.MemfdCreate("strata:"+name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("allocate %s: memfd_create: %v: %w", name, err, ErrMap)
	}
	fail := func(what string, err error) (*Region, error) {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("allocate %s: %s: %v: %w", name, what, err, ErrMap)
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		return fail("ftruncate", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		return fail("seal", err)
	}
	m, err := mmapRaw(fd, size, unix.MAP_SHARED)
	if err != nil {
		return fail("mmap", err)
	}
	r := &Region{name: name, data: m, mapping: m, fd: fd, kind: Shm}
	if a.cfg.TransparentHugePages {
		_ = unix.Madvise(m, unix.MADV_HUGEPAGE)
	}
	if a.cfg.Prefault {
		prefault(m)
	}
	return r, nil
}

// mapHugeTLB maps explicit huge pages, falling back to anonymous memory (with THP)
// when the kernel has none free.
func (a *Allocator) mapHugeTLB(name string, size int64) (*Region, error) {
	rounded := roundUp(size, hugePageSize)
	flags := unix.MAP_PRIVATE | unix.MAP_ANONYMOUS | unix.MAP_HUGETLB
	if a.cfg.Prefault {
		flags |= unix.MAP_POPULATE
	}
	// Without MAP_NORESERVE the kernel reserves every huge page at mmap time, so a
	// shortfall is ENOMEM here rather than SIGBUS on first touch.
	m, err := mmapRaw(-1, rounded, flags)
	if err != nil {
		if !errors.Is(err, unix.ENOMEM) && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.EPERM) {
			return nil, fmt.Errorf("allocate %s: mmap hugetlb %s: %v: %w", name, FormatBytes(rounded), err, ErrMap)
		}
		a.log.Warn("hugetlb pages unavailable; falling back to normal pages with transparent huge pages",
			"region", name, "bytes", rounded, "err", err,
			"fix", "reserve huge pages with sysctl vm.nr_hugepages (each 2 MiB) before starting")
		return a.mapAnonymous(name, size, true)
	}
	return &Region{name: name, data: m[:size:size], mapping: m, fd: -1, kind: HugeTLB, hugeTLB: true}, nil
}

// prefault makes every page of m resident. MADV_POPULATE_WRITE (Linux 5.14) does it
// in the kernel without a user fault per page; older kernels get a touch per page.
func prefault(m []byte) {
	if err := unix.Madvise(m, unix.MADV_POPULATE_WRITE); err == nil {
		return
	}
	for i := 0; i < len(m); i += 4096 {
		m[i] = 0
	}
}

// mmapRaw maps length bytes read-write. It bypasses unix.Mmap's bookkeeping, which
// only unmaps whole mappings, because regions trim their mappings for alignment.
func mmapRaw(fd int, length int64, flags int) ([]byte, error) {
	p, err := unix.MmapPtr(fd, 0, nil, uintptr(length), unix.PROT_READ|unix.PROT_WRITE, flags)
	if err != nil {
		return nil, err
	}
	return unsafe.Slice((*byte)(p), int(length)), nil
}

// munmapRaw unmaps exactly the pages of b.
func munmapRaw(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	return unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(b)), uintptr(len(b)))
}
