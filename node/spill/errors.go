package spill

import "errors"

// ErrOtherFormat is wrapped, together with storage.ErrNotFound, by ObjectSize
// when the key holds an object of another format: a miss for a reader, and for
// a writer a reason to refuse the put rather than report it stored (objects
// are write-once, so the put would store nothing).
var ErrOtherFormat = errors.New("object stored in another format")

// ErrRemoveNotDurable is wrapped by RemoveObjects when a tombstone could not
// be written: the object is removed, so no read serves it, but it may be back
// after a restart. The error also wraps the cause (storage.ErrNoSpace,
// storage.ErrIO, a context's error).
var ErrRemoveNotDurable = errors.New("remove may not survive a restart")

// ErrUnsafeDir is wrapped, together with storage.ErrConfig, by New when the
// spill directory, or a file the spill itself needs in it (its lock file), is
// not private to the service's user: owned by another user, or open to the
// group or others. Another local user could then read every tenant's evicted
// objects and key names, or plant files and links that the service (often
// root) would read, serve or write through. The error names the chown or
// chmod that fixes it.
var ErrUnsafeDir = errors.New("spill directory is not private to the service's user")
