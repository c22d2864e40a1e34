package offheap

import "errors"

// The errors of Pool and Table. Their users wrap them in their own "no space"
// error (arena.ErrNoSpace, storage.ErrNoSpace), the one their callers handle.
var (
	// ErrMap: the kernel refused to map memory for a pool's chunk or a table's
	// slots. The host is out of address space or memory: hold fewer objects.
	ErrMap = errors.New("cannot map memory off the Go heap")
	// ErrFull: a pool has handed out every index a uint32 holds: hold fewer
	// objects.
	ErrFull = errors.New("off-heap pool holds 2^32-1 elements, its limit")
)
