package pool

import "errors"

// ErrConfig reports a pool or group specification that cannot be built.
var ErrConfig = errors.New("invalid pool configuration")

// ErrFull reports an allocation of more pages than are free.
var ErrFull = errors.New("pool has too few free pages")

// ErrDoubleFree reports freeing a page that is not allocated.
var ErrDoubleFree = errors.New("page is not allocated")

// ErrForeignPage reports a page index that does not belong to the pool or group.
var ErrForeignPage = errors.New("page does not belong to this pool")

// ErrMismatch reports device and host pools that cannot exchange pages (different
// names, geometries or page sizes).
var ErrMismatch = errors.New("device and host pools do not match")

// ErrClosed reports use of a closed group or copy engine.
var ErrClosed = errors.New("pool is closed")
