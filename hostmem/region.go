package hostmem

import (
	"errors"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// Region is a mapped range of host memory outside the Go heap.
type Region struct {
	name    string
	id      uint64
	data    []byte
	mapping []byte // what munmap releases (data may be an aligned window of it)
	fd      int
	kind    Kind
	hugeTLB bool
	locked  bool
	onClose func()

	once     sync.Once
	closed   bool
	closeErr error
	mu       sync.Mutex
}

// Name is the label the region was allocated with.
func (r *Region) Name() string { return r.name }

// ID is unique among the regions of one Allocator.
func (r *Region) ID() uint64 { return r.id }

// Bytes is the region's memory. The slice is valid until Close; using it afterwards
// faults, so whoever closes a region must know that nobody still copies into it.
func (r *Region) Bytes() []byte { return r.data }

// Size is the region's length in bytes.
func (r *Region) Size() int64 { return int64(len(r.data)) }

// Kind is the memory the region actually got: HugeTLB regions that fell back report Mmap.
func (r *Region) Kind() Kind { return r.kind }

// HugeTLB reports whether the region is backed by explicit huge pages.
func (r *Region) HugeTLB() bool { return r.hugeTLB }

// Locked reports whether the region is mlocked.
func (r *Region) Locked() bool { return r.locked }

// Fd is the memfd that backs a Shm region, for passing to another process; -1 for
// other kinds. The region owns the descriptor: duplicate it to keep it past Close.
func (r *Region) Fd() int { return r.fd }

// Contains reports whether [off, off+n) lies inside the region.
func (r *Region) Contains(off, n int64) bool {
	return off >= 0 && n >= 0 && off <= int64(len(r.data)) && n <= int64(len(r.data))-off
}

// Close unmaps the region and closes its memfd. It runs once; later calls return ErrClosed.
func (r *Region) Close() error {
	ran := false
	r.once.Do(func() {
		ran = true
		r.mu.Lock()
		defer r.mu.Unlock()
		var errs []error
		if r.mapping != nil {
			if err := munmapRaw(r.mapping); err != nil {
				errs = append(errs, fmt.Errorf("munmap %s: %w", r.name, err))
			}
		}
		if r.fd >= 0 {
			if err := unix.Close(r.fd); err != nil {
				errs = append(errs, fmt.Errorf("close memfd of %s: %w", r.name, err))
			}
		}
		r.data, r.mapping, r.fd, r.closed = nil, nil, -1, true
		if r.onClose != nil {
			r.onClose()
		}
		r.closeErr = errors.Join(errs...)
	})
	if !ran {
		return fmt.Errorf("close %s: %w", r.name, ErrClosed)
	}
	return r.closeErr
}

// Closed reports whether Close has run.
func (r *Region) Closed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}
