package hicache

import "errors"

// ErrConfig reports a cache configuration that cannot work.
var ErrConfig = errors.New("invalid cache configuration")

// ErrDeviceFull reports that L1 has too few free pages even after evicting every
// unlocked page: the running requests hold it all.
var ErrDeviceFull = errors.New("device pool is full of locked pages")

// ErrRequest reports misuse of a Request: finished twice, pages that do not match
// its tokens, a request of another cache.
var ErrRequest = errors.New("invalid request")

// ErrClosed reports use of a closed cache.
var ErrClosed = errors.New("cache is closed")
