package storage

import "errors"

// Per-key and per-call errors. Backends wrap them with context; callers test with
// errors.Is and count everything but ErrNotFound as a fault of its kind.
var (
	// ErrNotFound: the object does not exist (a miss, not a fault).
	ErrNotFound = errors.New("object not found")
	// ErrCorrupt: the object failed its integrity check (wrong length, checksum or
	// format); it was not served, and the backend removed it where it could.
	ErrCorrupt = errors.New("object corrupt")
	// ErrNoSpace: the store is full (capacity limit or device out of space).
	ErrNoSpace = errors.New("storage full")
	// ErrUnavailable: the backend cannot be reached (service down, connection
	// lost); the call may succeed later.
	ErrUnavailable = errors.New("storage unavailable")
	// ErrTimeout: the call ran past its deadline.
	ErrTimeout = errors.New("storage call timed out")
	// ErrNotRegistered: the pool was never registered (or its registration failed).
	ErrNotRegistered = errors.New("pool not registered with storage")
	// ErrRegistration: the backend refused a pool's memory; the message says which
	// allocator to use.
	ErrRegistration = errors.New("pool registration refused")
	// ErrBatch: a batch that is empty of meaning: more than MaxBatch keys, keys and
	// pages of different lengths, pages outside the pool.
	ErrBatch = errors.New("invalid storage batch")
	// ErrConfig: a backend configuration that cannot work.
	ErrConfig = errors.New("invalid storage configuration")
	// ErrClosed: the backend was closed.
	ErrClosed = errors.New("storage backend closed")
	// ErrIO: any other failure moving bytes.
	ErrIO = errors.New("storage I/O error")
)

// FaultKind names the kind of a storage error for metrics and reports: "timeout",
// "unavailable", "corrupt", "no_space", "not_registered", "closed", "batch", "io";
// "" for nil and ErrNotFound, which are not faults.
func FaultKind(err error) string {
	switch {
	case err == nil, errors.Is(err, ErrNotFound):
		return ""
	case errors.Is(err, ErrTimeout):
		return "timeout"
	case errors.Is(err, ErrUnavailable):
		return "unavailable"
	case errors.Is(err, ErrCorrupt):
		return "corrupt"
	case errors.Is(err, ErrNoSpace):
		return "no_space"
	case errors.Is(err, ErrNotRegistered), errors.Is(err, ErrRegistration):
		return "not_registered"
	case errors.Is(err, ErrClosed):
		return "closed"
	case errors.Is(err, ErrBatch):
		return "batch"
	}
	return "io"
}
