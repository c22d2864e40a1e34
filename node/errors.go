package node

import "errors"

// ErrConfig reports a service configuration that cannot run.
var ErrConfig = errors.New("invalid node service configuration")

// ErrClosed reports use of a closed service.
var ErrClosed = errors.New("node service closed")

// errMemoryBusy reports a request that found the request memory budget full
// for as long as it could wait.
var errMemoryBusy = errors.New("request memory budget full")
