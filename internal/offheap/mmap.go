package offheap

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// mapAnon maps n bytes of zeroed memory outside the Go heap. MAP_NORESERVE:
// only the pages written cost memory, so a table's or chunk's untouched tail
// costs address space alone.
func mapAnon(n int) ([]byte, error) {
	p, err := unix.MmapPtr(-1, 0, nil, uintptr(n), unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("map %d bytes: %v; the host is out of address space or memory: %w", n, err, ErrMap)
	}
	return unsafe.Slice((*byte)(p), n), nil
}

func unmapAnon(b []byte) {
	if len(b) > 0 {
		_ = unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(b)), uintptr(len(b)))
	}
}

// mapSlice maps n zeroed elements of T, which must hold no pointers: the
// garbage collector never sees this memory.
func mapSlice[T any](n int) ([]T, error) {
	var zero T
	mem, err := mapAnon(n * int(unsafe.Sizeof(zero)))
	if err != nil {
		return nil, err
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(mem))), n), nil
}

// unmapSlice unmaps what mapSlice mapped; nil is a no-op.
func unmapSlice[T any](s []T) {
	var zero T
	unmapAnon(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(zero))))
}

// Slice maps n zeroed elements of T, which must hold no pointers, outside the
// Go heap: memory the collector neither scans nor counts, and whose pages cost
// memory only once written. Free gives it back.
func Slice[T any](n int) ([]T, error) { return mapSlice[T](n) }

// Free unmaps what Slice mapped; nil is a no-op. Nothing may use s after.
func Free[T any](s []T) { unmapSlice(s) }
