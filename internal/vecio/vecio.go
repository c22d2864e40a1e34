// Package vecio holds the vectored, positioned file I/O that the file store
// (storage/file) and the node service's spill (node/spill) both build on: the
// syscalls retried on EINTR, the bookkeeping of a short vectored transfer, and
// buffers at an address O_DIRECT accepts.
package vecio

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// Advance drops the first n bytes of iovs, and any empty runs that follow. It
// may shorten iovs[0] in place: callers pass scratch slices built per call.
func Advance(iovs [][]byte, n int) [][]byte {
	for n > 0 && len(iovs) > 0 {
		if n < len(iovs[0]) {
			iovs[0] = iovs[0][n:]
			return iovs
		}
		n -= len(iovs[0])
		iovs = iovs[1:]
	}
	for len(iovs) > 0 && len(iovs[0]) == 0 {
		iovs = iovs[1:]
	}
	return iovs
}

// Pwritev is pwritev(2), retried when a signal interrupts it.
func Pwritev(fd int, iovs [][]byte, off int64) (int, error) {
	for {
		n, err := unix.Pwritev(fd, iovs, off)
		if err != unix.EINTR {
			return n, err
		}
	}
}

// Preadv is preadv(2), retried when a signal interrupts it.
func Preadv(fd int, iovs [][]byte, off int64) (int, error) {
	for {
		n, err := unix.Preadv(fd, iovs, off)
		if err != unix.EINTR {
			return n, err
		}
	}
}

// Open is open(2), retried when a signal interrupts it (opening a file on a
// slow device can be).
func Open(path string, flags int, mode uint32) (int, error) {
	for {
		fd, err := unix.Open(path, flags, mode)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// AlignedBytes returns n bytes starting at a multiple of align, a power of two,
// as O_DIRECT transfers need. The Go heap does not move objects, so the
// alignment holds for the slice's life; the bytes are pointer-free, so the
// collector never scans them.
func AlignedBytes(n, align int) []byte {
	raw := make([]byte, n+align)
	skip := (align - int(uintptr(unsafe.Pointer(unsafe.SliceData(raw)))%uintptr(align))) % align
	return raw[skip : skip+n : skip+n]
}
