package hostmem

import "errors"

// ErrConfig reports an allocator configuration that cannot work.
var ErrConfig = errors.New("invalid host memory configuration")

// ErrNoMemory reports an allocation that would leave less than the configured
// reserve of available memory.
var ErrNoMemory = errors.New("not enough available host memory")

// ErrClosed reports use of a region after Close.
var ErrClosed = errors.New("host memory region is closed")

// ErrMap reports a failed mapping or memory syscall.
var ErrMap = errors.New("host memory mapping failed")
