package arena

import (
	"errors"
	"fmt"

	"github.com/stratakv/strata/storage"
)

// ErrConfig reports an arena configuration that cannot work.
var ErrConfig = errors.New("invalid arena configuration")

// The errors of the arena's operations. Those with a storage counterpart wrap it,
// so that errors.Is(err, storage.ErrNoSpace) and storage.FaultKind classify an
// arena's error the way they classify any backend's.
var (
	// ErrNotFound: no committed object has the key (it never did, it was evicted or
	// removed, or it is still being written). A miss, not a fault.
	ErrNotFound = fmt.Errorf("arena: %w", storage.ErrNotFound)
	// ErrFormat: the key names an object of another format. Treat it as a miss.
	ErrFormat = errors.New("arena object has another format")
	// ErrExists: Reserve found the key committed or being written. Objects are
	// write-once, so a writer treats this as success and moves no data.
	ErrExists = errors.New("arena object exists")
	// ErrNoSpace: no free extent fits the object even after evicting every object
	// that could be evicted; the rest is leased or being written.
	ErrNoSpace = fmt.Errorf("arena: %w", storage.ErrNoSpace)
	// ErrNotNow: ReserveInto found no room for the object without evicting or
	// waiting for the warm-up; Reserve does both.
	ErrNotNow = errors.New("arena: no room without evicting")
	// ErrKey: a key that is empty or longer than MaxKeyBytes.
	ErrKey = errors.New("invalid arena key")
	// ErrSize: an object size that is not positive.
	ErrSize = errors.New("invalid arena object size")
	// ErrRemoved: Commit of a pending write that a removal of its key doomed
	// meanwhile: nothing was published. A put that raced a remove ends as if
	// it had come first and been removed.
	ErrRemoved = errors.New("arena object removed while it was written")
	// ErrDone: Commit of a pending write that was already committed or aborted.
	ErrDone = errors.New("arena write already finished")
	// ErrClosed: the arena was closed.
	ErrClosed = fmt.Errorf("arena: %w", storage.ErrClosed)
	// ErrFile: the arena file cannot be used (not on tmpfs, hugetlbfs or
	// ramfs, not a regular file, or, for an arena without a warm-up, its file
	// system has no room). The message says what to fix.
	ErrFile = errors.New("arena file cannot be used")
	// ErrLocked: another arena (another node service) has the arena file.
	ErrLocked = errors.New("arena file is in use")
	// ErrUnsafe: the arena file, or a directory on its path, is not the
	// service's own: another user made it or can write it, and so could read
	// every tenant's objects, change them, or forge ones a warm restart would
	// serve. The message names the fix (remove, chown or chmod). It wraps
	// ErrFile: a configuration to change, not a failure to retry.
	ErrUnsafe = fmt.Errorf("arena file is not the service's own: %w", ErrFile)
	// ErrBroken: the arena's memory is gone: its file was truncated (or a
	// page of it faulted) while the arena served. A broken arena serves
	// nothing and takes nothing; the rest of the service goes on, and a
	// restart formats the file anew (fault.go).
	ErrBroken = fmt.Errorf("arena memory is gone: %w", storage.ErrUnavailable)
	// ErrExtent: Extents.Free of a range that is not an allocated extent (a double
	// free, a foreign offset, or the wrong length). The allocator is unchanged.
	ErrExtent = errors.New("not an allocated extent")
)

// errNoRoom: the arena file's file system has no room even for its header;
// New falls back to anonymous memory for this run.
var errNoRoom = errors.New("no room for the arena file")
